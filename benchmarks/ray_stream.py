"""A stream of mixed plain-Ray GPU jobs through real Ray: rayaccel nodes vs plain Ray nodes.

Method. The same seeded stream of ``--jobs`` jobs runs twice through real Ray on a
simulated 3-node cluster (DGX-1 V100, 8-GPU two-socket PCIe box, DGX-1 V100): once with
rayaccel nodes, once with plain Ray nodes of the same machines. Jobs are ordinary Ray
code, unchanged: 85% tasks ``.options(num_gpus=k)``, 15% placement groups of k
``{"GPU": 1}`` bundles with one actor per bundle (how vLLM and Ray Train reserve GPUs).
Sizes 1/2/4/8 with probabilities 60/20/15/5%; each job holds its devices for 0.1-0.8 s;
arrivals are Poisson at a rate that keeps the cluster about two-thirds busy; Ray itself
chooses the node in both runs. Every job reports the GPUs it got from inside its workers.

Reported per side: the share of multi-GPU jobs whose set has the best weakest link its
node offers for that size (the best interconnect), and their mean modeled ring all-reduce
bandwidth (GB/s) -- the same measures as ``placement_churn.py``, here through real Ray.

Run: python benchmarks/ray_stream.py [--quick] [--jobs N] [--seed S]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

MACHINES = ("dgx1-v100", "pcie-8gpu-2socket", "dgx1-v100")
SIZES = ((1, 0.60), (2, 0.20), (4, 0.15), (8, 0.05))


def stream(n: int, seed: int) -> list[dict]:
    rng = random.Random(seed)
    jobs, t = [], 0.0
    mean_hold = 0.45
    gpus = 24
    mean_size = sum(k * p for k, p in SIZES)
    rate = 0.66 * gpus / (mean_size * mean_hold)  # jobs per second at ~2/3 utilisation
    for i in range(n):
        t += rng.expovariate(rate)
        k = rng.choices([k for k, _ in SIZES], [p for _, p in SIZES])[0]
        jobs.append({"i": i, "at": t, "k": k, "hold": rng.uniform(0.1, 0.8), "pg": rng.random() < 0.15})
    return jobs


def _run(jobs: list[dict], plain: bool) -> list[dict]:
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rayaccel.ray.driver.cluster import SimulatedCluster

    c = SimulatedCluster(list(MACHINES), plain=range(len(MACHINES)) if plain else (), num_cpus=12,
                         logging_level="ERROR", log_to_driver=False)
    names = {n.node_id: n.topology.name for n in c.nodes}
    try:
        @ray.remote(num_cpus=0)
        def hold(seconds):
            import time

            t0 = time.time()
            ids = [int(i) for i in ray.get_gpu_ids()]
            time.sleep(seconds)
            return ray.get_runtime_context().get_node_id(), ids, t0

        @ray.remote(num_cpus=0, num_gpus=1)
        class Member:
            def hold(self, seconds):
                import time

                time.sleep(seconds)
                return ray.get_runtime_context().get_node_id(), [int(i) for i in ray.get_gpu_ids()]

        # warm up the worker pool on every node
        ray.get([hold.options(num_gpus=1).remote(0.0) for _ in range(24)])
        out, pending = [], []
        groups: dict[int, tuple] = {}  # job -> (placement group, members): freed as soon as the job ends

        def reap(block: bool) -> None:
            """Collect finished jobs; a finished group's actors and reservation go at once."""
            while pending:
                refs = [r for _, rs in pending for r in rs]
                # any finished job frees its group at once (waiting for all would hold finished groups' GPUs)
                first, _ = ray.wait(refs, num_returns=1 if block else len(refs), timeout=600 if block else 0)
                done = set(first) | set(ray.wait(refs, num_returns=len(refs), timeout=0)[0])
                keep = []
                for j, rs in pending:
                    if all(r in done for r in rs):
                        got = ray.get(rs)
                        devs = sorted(d for g in got for d in g[1])
                        out.append({"i": j["i"], "k": j["k"], "pg": j["pg"], "node": names[got[0][0]],
                                    "devices": devs})
                        if j["i"] in groups:
                            pg, ms = groups.pop(j["i"])
                            for m in ms:
                                ray.kill(m)
                            remove_placement_group(pg)
                    else:
                        keep.append((j, rs))
                if len(keep) == len(pending) and block and not done:
                    raise TimeoutError(f"{len(keep)} jobs did not finish within 600 s")
                pending[:] = keep
                if not block:
                    return

        t0 = time.monotonic()
        for j in jobs:
            reap(block=False)
            wait = j["at"] - (time.monotonic() - t0)
            if wait > 0:
                time.sleep(wait)
            if j["pg"]:
                pg = placement_group([{"GPU": 1}] * j["k"], strategy="STRICT_PACK")
                ms = [Member.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
                    pg, placement_group_bundle_index=b)).remote() for b in range(j["k"])]
                pending.append((j, [m.hold.remote(j["hold"]) for m in ms]))
                groups[j["i"]] = (pg, ms)
            else:
                pending.append((j, [hold.options(num_gpus=j["k"]).remote(j["hold"])]))
        reap(block=True)
    finally:
        c.shutdown()
    return out


def _best(topo, k: int, cache: dict) -> tuple:
    from rayaccel.placement import NodeState, Request, allocate

    key = (topo.name, k)
    if key not in cache:
        a = allocate(NodeState(topo), Request(gpus=k))
        cache[key] = a.score.weakest_rank if a else None
    return cache[key]


def _weakest_rank(topo, devs: list[int]) -> tuple:
    worst = None
    for i, a in enumerate(devs):
        for b in devs[i + 1:]:
            l = topo.link(a, b)
            r = l.rank if l is not None else (0, 0.0)
            worst = r if worst is None or r < worst else worst
    return worst


def score(results: list[dict]) -> dict:
    from rayaccel import catalog
    from rayaccel.placement import allreduce_bandwidth_gbps

    cache: dict = {}
    multi = [r for r in results if r["k"] > 1]
    best, bw = 0, []
    for r in multi:
        topo = catalog.load(r["node"])
        if _weakest_rank(topo, r["devices"]) >= _best(topo, r["k"], cache):
            best += 1
        bw.append(allreduce_bandwidth_gbps(topo, r["devices"]))
    return {"multi": len(multi), "best_share": best / len(multi) if multi else 0.0,
            "mean_gbps": statistics.fmean(bw) if bw else 0.0,
            "pg_best": sum(1 for r in multi if r["pg"] and _weakest_rank(catalog.load(r["node"]), r["devices"])
                           >= _best(catalog.load(r["node"]), r["k"], cache)),
            "pg_multi": sum(1 for r in multi if r["pg"])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="100 jobs")
    a = ap.parse_args()
    if a.quick:
        a.jobs = 100
    jobs = stream(a.jobs, a.seed)
    t = time.monotonic()
    ours = score(_run(jobs, plain=False))
    t_ours = time.monotonic() - t
    t = time.monotonic()
    ray_ = score(_run(jobs, plain=True))
    t_ray = time.monotonic() - t
    print(f"{a.jobs} mixed plain-Ray GPU jobs (seed {a.seed}) through real Ray on {', '.join(MACHINES)}")
    print(f"{'':<44} {'rayaccel':>9} {'plain Ray':>10} {'ratio':>6}")
    print(f"{'multi-GPU jobs on their best interconnect':<44} {ours['best_share']:9.1%} {ray_['best_share']:10.1%} "
          f"{ours['best_share'] / ray_['best_share'] if ray_['best_share'] else float('nan'):6.2f}")
    print(f"{'  of which placement groups':<44} {ours['pg_best']:>4}/{ours['pg_multi']:<4} "
          f"{ray_['pg_best']:>5}/{ray_['pg_multi']:<4}")
    print(f"{'mean modeled all-reduce of multi-GPU jobs, GB/s':<44} {ours['mean_gbps']:9.1f} {ray_['mean_gbps']:10.1f} "
          f"{ours['mean_gbps'] / ray_['mean_gbps'] if ray_['mean_gbps'] else float('nan'):6.2f}")
    print(f"{'multi-GPU jobs':<44} {ours['multi']:9d} {ray_['multi']:10d}")
    print(f"{'wall time of the run, s':<44} {t_ours:9.1f} {t_ray:10.1f}")


if __name__ == "__main__":
    main()
