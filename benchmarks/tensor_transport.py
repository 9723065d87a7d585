"""Tensors between Ray actors: the ``rayaccel`` transport vs Ray's object store, RDT ``nixl`` and ``gloo``, in one run.

    python benchmarks/tensor_transport.py            # 1, 16, 64, 256, 1024 MiB; 5 repeats
    python benchmarks/tensor_transport.py --quick    # 1, 16, 64 MiB; 3 repeats
    python benchmarks/tensor_transport.py --sizes 4,512 --repeats 7

A SimulatedCluster of two simulated DGX-A100 nodes (both on this machine). One
producer actor on node 0 holds a float32 tensor; a consumer on node 0 ("same node")
and one on node 1 ("across nodes") each receive it from an actor method, four ways:

* ``rayaccel``: ``@ray.method(tensor_transport="rayaccel")`` (shared memory on one
  node, NIXL across nodes);
* ``object store``: the same method without a transport (Ray's default);
* ``nixl``: ``tensor_transport="nixl"`` (RDT's NIXL transport, UCX);
* ``gloo``: ``tensor_transport="gloo"`` over a gloo collective group of the three actors.

One figure is the wall time of ``ray.get(consumer.take.remote(producer.<way>.remote()))``:
the producer's method (and whatever it does with the tensor), the transfer, and the
consumer reading one byte of every 4 KiB page (so a mapped tensor is really mapped in).
The consumer returns a checksum of those bytes, checked against the producer's: every
transfer is verified. The four ways run interleaved (the order rotating each round), so a
change in the machine's load hits them alike; medians over ``--repeats`` rounds after one
warm-up each; ratios are the other way's median over the ``rayaccel`` median, same run.

The physical limit of each path, measured or modeled in the same run: ``memcpy`` is a
warm ``torch`` copy of the same bytes in this process (one node's memory bandwidth, the
bound of any one-copy path); across nodes the modeled rate of the DGX-A100's RDMA NIC
(``rayaccel.transfer.MODEL["rdma_nic_gbps"]``) -- on this machine both "nodes" share
memory, so a cross-node figure can beat it. ``cuda_ipc`` / ``nccl`` rows need a GPU.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MiB = 1 << 20
FULL = (1, 16, 64, 256, 1024)
QUICK = (1, 16, 64)
WAYS = ("rayaccel", "object store", "nixl", "gloo")


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 or s > 4096 for s in sizes):
        raise SystemExit(f"error: --sizes {text!r}: expected MiB as integers 1..4096, comma-separated (e.g. 1,64)")
    return sizes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1, 16, 64 MiB and 3 repeats")
    ap.add_argument("--sizes", help="tensor sizes in MiB, comma-separated (default 1,16,64,256,1024)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per cell (default 5; 3 with --quick)")
    args = ap.parse_args()
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK if args.quick else FULL)
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or repeats > 100:
        raise SystemExit(f"error: --repeats {repeats}: expected 1..100")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray
    import torch
    from ray.experimental.collective import create_collective_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    importlib.import_module("rayaccel.ray")  # makes tensor_transport="rayaccel" known in this driver
    from rayaccel.ray.driver.cluster import SimulatedCluster
    from rayaccel.transfer import MODEL

    store_bytes = max(256 * MiB, int(max(sizes) * MiB * 2.2))

    @ray.remote(enable_tensor_transport=True, num_gpus=1)
    class Producer:
        def make(self, nbytes: int) -> int:
            self.t = None
            gc.collect()
            g = torch.Generator().manual_seed(nbytes)
            self.t = torch.randint(0, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=g).view(torch.float32)
            return int(self.t.view(torch.uint8)[::4096].sum())

        def store(self):
            return self.t

        @ray.method(tensor_transport="rayaccel")
        def rayaccel(self):
            return self.t

        @ray.method(tensor_transport="nixl")
        def nixl(self):
            return self.t

        @ray.method(tensor_transport="gloo")
        def gloo(self):
            return self.t

    @ray.remote(enable_tensor_transport=True, num_gpus=1)
    class Consumer:
        def take(self, t) -> int:
            return int(t.view(torch.uint8)[::4096].sum())

    cluster = SimulatedCluster(["dgx-a100", "dgx-a100"], num_cpus=4, object_store_memory=store_bytes,
                               logging_level="ERROR", log_to_driver=False)
    try:
        n0, n1 = cluster.node_ids
        pin = lambda n: NodeAffinitySchedulingStrategy(n, soft=False)  # noqa: E731
        prod = Producer.options(scheduling_strategy=pin(n0)).remote()
        near = Consumer.options(scheduling_strategy=pin(n0)).remote()
        far = Consumer.options(scheduling_strategy=pin(n1)).remote()
        create_collective_group([prod, near, far], backend="torch_gloo")
        method = {"rayaccel": prod.rayaccel, "object store": prod.store, "nixl": prod.nixl, "gloo": prod.gloo}
        results: dict[tuple, list[float]] = {}
        limits: dict[int, float] = {}
        print(f"# 2 simulated DGX-A100 nodes on one machine ({os.cpu_count()} CPUs); {repeats} repeats per cell, "
              f"medians; ratio = way / rayaccel (same run)", flush=True)
        for mib in sizes:
            n = mib * MiB
            expect = ray.get(prod.make.remote(n))
            limits[mib] = _memcpy_s(torch, n, repeats)
            for where, cons in (("same node", near), ("across nodes", far)):
                def once(way: str) -> float:
                    t0 = time.perf_counter()
                    got = ray.get(cons.take.remote(method[way].remote()))
                    dt = time.perf_counter() - t0
                    if got != expect:
                        raise SystemExit(f"error: {way} {where} {mib} MiB delivered different bytes "
                                         f"(checksum {got} != {expect})")
                    return dt

                for way in WAYS:  # warm-up: agents, groups, first registrations
                    once(way)
                for r in range(repeats):  # interleaved, the order rotating: load drifts hit every way alike
                    for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
                        results.setdefault((mib, where, way), []).append(once(way))
                print(f"  {mib:5d} MiB {where:12s} " + "  ".join(
                    f"{w} {statistics.median(results[(mib, where, w)]) * 1e3:.1f} ms" for w in WAYS), flush=True)
        _table(sizes, results, limits, MODEL["rdma_nic_gbps"], torch.cuda.is_available())
    finally:
        cluster.shutdown()
    return 0


def _memcpy_s(torch, n: int, repeats: int) -> float:
    src = torch.ones(n // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _table(sizes, results, limits, rdma_gbps: float, gpu: bool) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print("| size | where | rayaccel | object store (ratio) | nixl (ratio) | gloo (ratio) | cuda_ipc / nccl | physical limit |")
    print("|---|---|---|---|---|---|---|---|")
    for mib in sizes:
        for where in ("same node", "across nodes"):
            r = med[(mib, where, "rayaccel")]
            cells = [f"{med[(mib, where, w)] * 1e3:.1f} ms ({med[(mib, where, w)] / r:.2f}x)" for w in WAYS[1:]]
            gbps = mib * MiB / r / 1e9
            if where == "same node":
                limit = f"memcpy {limits[mib] * 1e3:.1f} ms ({mib * MiB / limits[mib] / 1e9:.1f} GB/s)"
            else:
                limit = f"RDMA NIC (modeled) {mib * MiB / (rdma_gbps * 1e9) * 1e3:.1f} ms ({rdma_gbps:.0f} GB/s)"
            gpu_cell = "not run (GPU present: scripts/device_check.py)" if gpu else "n/a: no GPU"
            print(f"| {mib} MiB | {where} | {r * 1e3:.1f} ms ({gbps:.2f} GB/s) | {' | '.join(cells)} | {gpu_cell} | "
                  f"{limit} |")


if __name__ == "__main__":
    sys.exit(main())
