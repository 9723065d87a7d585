"""End-to-end overhead of ``rayaccel.remote`` against plain ``ray.remote(num_gpus=1)``.

One simulated 2-node cluster (2 x DGX-1 V100) whose nodes advertise both
rayaccel's device resources and Ray's own ``GPU`` resource, so both run on the
same raylets in one run:

* throughput: N small 1-GPU tasks submitted at once, then ``ray.get`` on all;
* start latency: one task at a time, submit -> first line of the task body
  (median and p99), and the full round trip.

Plain Ray GPU tasks default to ``max_calls=1`` (a new worker process per task);
rayaccel reuses workers on simulated nodes. The fair overhead baseline is thus
plain Ray with ``max_calls=0`` (worker reuse); the default is shown too, with
fewer tasks. In the throughput run every device is busy after the first 16
tasks, so the rest overflow to rayaccel's dispatcher (:mod:`rayaccel.ray.dispatch`);
the last row turns it off (``RAYACCEL_DISPATCH=0``: overflow queued in Ray).
Usage: ``python benchmarks/ray_overhead.py [--quick] [--tasks N]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


def _body(t_submit: float) -> float:
    return time.time() - t_submit


def _throughput(submit, n: int) -> float:
    import ray

    t0 = time.perf_counter()
    refs = [submit(0.0) for _ in range(n)]
    ray.get(refs)
    return n / (time.perf_counter() - t0)


def _latency(submit, n: int) -> tuple[float, float, float]:
    import ray

    start, rtt = [], []
    for _ in range(n):
        t0 = time.perf_counter()
        start.append(ray.get(submit(time.time())))
        rtt.append(time.perf_counter() - t0)
    start.sort()
    return statistics.median(start) * 1e3, start[int(0.99 * (len(start) - 1))] * 1e3, statistics.median(rtt) * 1e3


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="200 tasks, 50 latency samples")
    ap.add_argument("--tasks", type=int, default=None)
    ap.add_argument("--latency-samples", type=int, default=None)
    args = ap.parse_args(argv)
    n = args.tasks or (200 if args.quick else 1000)
    m = args.latency_samples or (50 if args.quick else 200)

    import ray

    import rayaccel.ray as rr
    from rayaccel.ray.cluster import SimulatedCluster

    c = SimulatedCluster(["dgx1-v100", "dgx1-v100"], num_cpus=8, ray_gpus=True,
                         logging_level="ERROR", log_to_driver=False)
    try:
        from rayaccel.ray import dispatch

        ra = rr.remote(gpus=1)(_body)

        def ra_queue_in_ray(t):
            dispatch.ENABLED = False
            try:
                return ra.remote(t)
            finally:
                dispatch.ENABLED = True

        plain = ray.remote(num_gpus=1, max_calls=0)(_body)
        plain_default = ray.remote(num_gpus=1)(_body)
        variants = [("rayaccel.remote(gpus=1)", ra.remote, n),
                    ("ray.remote(num_gpus=1, max_calls=0)", plain.remote, n),
                    ("ray.remote(num_gpus=1) [default max_calls=1]", plain_default.remote, max(20, n // 10)),
                    ("rayaccel.remote(gpus=1) [RAYACCEL_DISPATCH=0]", ra_queue_in_ray, n)]
        for _, submit, _ in variants:
            _throughput(submit, 32)  # warm the worker pools
        # interleave the variants round by round so machine noise hits them alike
        tputs: dict = {name: [] for name, _, _ in variants}
        lats: dict = {name: [] for name, _, _ in variants}
        for _ in range(1 if args.quick else 3):
            for name, submit, count in variants:
                tputs[name].append(_throughput(submit, count))
                lats[name].append(_latency(submit, m if "default" not in name else max(10, m // 5)))
        rows = []
        for name, _, count in variants:
            med, p99, rtt = (statistics.median(x[i] for x in lats[name]) for i in range(3))
            rows.append((name, count, statistics.median(tputs[name]), med, p99, rtt))
    finally:
        c.shutdown()

    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"rayaccel vs plain Ray on the same simulated cluster (2 x dgx1-v100, {os.cpu_count()} CPUs)")
    for col in ("variant", "tasks", "tasks/s", "start p50 ms", "start p99 ms", "round trip p50 ms"):
        t.add_column(col, justify="left" if col == "variant" else "right")
    for name, count, tput, med, p99, rtt in rows:
        t.add_row(name, str(count), f"{tput:.0f}", f"{med:.2f}", f"{p99:.2f}", f"{rtt:.2f}")
    Console(width=140).print(t)
    ours, base = rows[0], rows[1]
    print(f"rayaccel / plain Ray (worker reuse): time per task {base[2] / ours[2]:.2f}x, "
          f"start latency p50 {ours[3] / base[3]:.2f}x, round trip p50 {ours[5] / base[5]:.2f}x (target <= 1.2x)")
    off = rows[3]
    print(f"dispatcher off (overflow queued in Ray on the least-loaded set): time per task "
          f"{base[2] / off[2]:.2f}x of plain Ray")
    print(f"vs plain Ray's default GPU tasks (new process per task): throughput {ours[2] / rows[2][2]:.1f}x faster")
    return 0


if __name__ == "__main__":
    sys.exit(main())
