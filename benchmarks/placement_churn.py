"""Placement under churn: a job stream on 64 nodes of mixed topologies, every policy in one run.

Job sizes: 1 GPU 70%, 2 GPUs 10%, 4 GPUs 15%, 8 GPUs 5% of jobs. Source: the
job-size sampler of the Gavel simulator (Narayanan et al., OSDI'20),
``scheduler/utils.py::_generate_scale_factor``, commented "Sample the scale
factor from the Philly distribution" (Microsoft Philly trace, Jeon et al.,
ATC'19); the same function is reused by later schedulers built on Gavel. What
was checked: that code, as stored in a Gavel-derived scheduler/utils.py. What
was NOT checked: these shares against the raw trace (msr-fiddle/philly-traces
keeps it as a 1 GB Git LFS object, not available here) or the ATC'19 paper's
text. Jobs above 8 GPUs (multi-node in Philly) are out of scope: 8 is the
largest single-node size. Arrivals are Poisson at
90% of the cluster's GPU capacity, durations exponential (mean 1.0), FIFO queue
with backfill (every waiting job is tried at each event).

Node choice: rayaccel uses its cluster placer (``place``; see
``rayaccel.placement.cluster.node_rank``: multi-GPU jobs get their machine
type's best interconnect, then partly used nodes first, then best fit, then the
better-wired set; 1-GPU jobs go to partly used nodes first, then first fit);
first_free / besteffort / random take the first node with enough free devices
(Ray's and the Kubernetes device plugin's device choice are per node) and then
choose devices their way.

Metrics for multi-GPU jobs: share placed on their best possible interconnect
(weakest link as strong as the best k-set of an idle node of that type), mean
modeled ring all-reduce bandwidth, mean queueing delay. Two fragmentations,
sampled at arrivals (Poisson arrivals see time averages, so these are
time-averaged shares):

* ``frag nodes``: the share of free GPUs that sit on partly used nodes (how
  well the cluster placer packs whole nodes);
* ``frag groups``: the share of free GPUs *stranded* inside their node: not in
  any free group that a 2-, 4- or 8-GPU job could take at its type's best
  interconnect (groups counted greedily, largest size first, each a best-found
  set whose weakest link equals the idle node's best for that size). This is
  what the node allocator's criterion 4 (keep the largest well-connected free
  groups whole) is for.

Run: python benchmarks/placement_churn.py [--quick]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics

from _placement_common import catalog_machines

from rayaccel.placement import NodeState, Request, place
from rayaccel.placement.baselines import besteffort, first_free, random_policy
from rayaccel.placement.node import allocate

MIX = {1: 0.70, 2: 0.10, 4: 0.15, 8: 0.05}
MIX_SOURCE = ("Gavel simulator's Philly job-size sampler (scheduler/utils.py _generate_scale_factor, "
              "'Sample the scale factor from the Philly distribution'); not re-checked against the raw "
              "Philly trace or the ATC'19 paper (not available here)")
LAYOUT = [("dgx1-v100", 16), ("pcie-8gpu-2socket", 16), ("hgx-h100", 8), ("dgx-a100", 8), ("mi300x-8x", 8),
          ("l40s-4x-pcie", 4), ("a100-pcie-2x-nvbridge", 4)]


def build_nodes():
    machines, note = catalog_machines()
    by = dict(machines)
    nodes = []
    layout = [(n, c) for n, c in LAYOUT if n in by] or [(n, 64 // len(by)) for n in by]
    i = 0
    while len(nodes) < 64:
        name, count = layout[i % len(layout)]
        for _ in range(count):
            if len(nodes) < 64 and len(by[name].devices) <= 16:
                nodes.append(NodeState(by[name], node_id=f"{name}-{len(nodes)}"))
        i += 1
    return nodes, note


def best_weakest(topo, k, cache={}):
    key = (id(topo), k)
    if key not in cache:
        a = allocate(NodeState(topo), Request(gpus=k))
        cache[key] = a.score.weakest_rank if a else None
    return cache[key]


_COVER: dict = {}


def stranded(state) -> int:
    """Free GPUs of ``state`` in no best-wired free group of 8, 4 or 2 (see the module docstring). Cached."""
    from rayaccel.placement._index import index_of
    from rayaccel.placement.search import best_sets

    topo = state.topology
    ix = index_of(topo)
    free = ((1 << ix.n) - 1) & ~ix.mask_of(state.busy)
    ck = (ix.key, free)
    got = _COVER.get(ck)
    if got is None:
        left = free
        for s in (8, 4, 2):
            want = best_weakest(topo, s)
            while left.bit_count() >= s and want is not None:
                r = best_sets(ix, left, s, tie_cap=1)
                if r is None or ix.levels[r.key[0]] != want:
                    break
                left &= ~r.sets[0]
        got = _COVER[ck] = left.bit_count()
    return got


def simulate(policy, nodes0, jobs, rng):
    nodes = list(nodes0)
    pos = {n.node_id: i for i, n in enumerate(nodes)}
    events = []  # (time, seq, kind, payload)
    for j, (t, k, dur) in enumerate(jobs):
        heapq.heappush(events, (t, j, "arrive", j))
    queue: list[int] = []
    waits, best_hits, bws, multi, frag, gfrag = [], 0, [], 0, [], []
    seq = len(jobs)
    while events:
        t, _, kind, payload = heapq.heappop(events)
        if kind == "arrive":
            queue.append(payload)
            free_total = sum(len(n.topology.devices) - len(n.busy) for n in nodes)
            partly = sum(len(n.topology.devices) - len(n.busy) for n in nodes if n.busy)
            frag.append(partly / free_total if free_total else 0.0)
            gfrag.append(sum(stranded(n) for n in nodes) / free_total if free_total else 0.0)
        else:
            i, devs = payload
            nodes[i] = NodeState(nodes[i].topology, nodes[i].busy - frozenset(devs), node_id=nodes[i].node_id)
        still = []
        for j in queue:
            arr, k, dur = jobs[j]
            req = Request(gpus=k)
            if policy == "rayaccel":
                a = place(nodes, req)
            else:
                a = None
                for n in nodes:
                    if len(n.topology.devices) - len(n.busy) >= k:
                        fn = {"first_free": first_free, "besteffort": besteffort}.get(policy)
                        a = fn(n, req) if fn else random_policy(n, req, rng)
                        a = a if a else None
                        if a is not None:
                            a = type(a)(**{**{f: getattr(a, f) for f in a.__dataclass_fields__}, "node": n.node_id})
                        break
            if not a:
                still.append(j)
                continue
            i = pos[a.node]
            nodes[i] = nodes[i].with_busy(a.devices)
            waits.append(t - arr)
            if k > 1:
                multi += 1
                topo = nodes[i].topology
                if a.score.weakest_rank == best_weakest(topo, k):
                    best_hits += 1
                bws.append(a.score.allreduce_bandwidth_gbps)
            seq += 1
            heapq.heappush(events, (t + dur, seq, "done", (i, a.devices)))
        queue = still
    return {"best": best_hits / max(multi, 1), "bw": statistics.mean(bws) if bws else 0.0,
            "wait": statistics.mean(waits), "wait_p95": sorted(waits)[int(0.95 * len(waits))],
            "frag": statistics.mean(frag), "gfrag": statistics.mean(gfrag), "multi": multi}


def run_policies(nodes, jobs, seed, policies=("rayaccel", "first_free", "besteffort", "random")):
    """Every policy on the same job stream; {policy: metrics}."""
    return {pol: simulate(pol, nodes, jobs, random.Random(seed + 1)) for pol in policies}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1,500 jobs instead of 6,000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    nodes, note = build_nodes()
    capacity = sum(len(n.topology.devices) for n in nodes)
    rng = random.Random(args.seed)
    n_jobs = 1500 if args.quick else 6000
    sizes, weights = zip(*MIX.items())
    mean_size = sum(s * w for s, w in MIX.items())
    rate = 0.9 * capacity / mean_size  # jobs per unit time at 90% load (mean duration 1)
    t, jobs = 0.0, []
    for _ in range(n_jobs):
        t += rng.expovariate(rate)
        jobs.append((t, rng.choices(sizes, weights)[0], rng.expovariate(1.0)))
    kinds = sorted({n.topology.name or "?" for n in nodes})
    print(f"placement churn: {len(nodes)} nodes ({', '.join(kinds)}), {capacity} GPUs, {n_jobs} jobs, "
          f"load 90%; machines: {note}")
    print(f"job sizes {MIX} (share of jobs by GPU count): {MIX_SOURCE}")
    res = run_policies(nodes, jobs, args.seed)
    print(f"{'policy':12} {'multi-GPU jobs':>14} {'on best interconnect':>21} {'vs first_free':>13} "
          f"{'mean all-reduce GB/s':>21} {'mean wait':>9} {'p95 wait':>9} {'frag nodes':>10} {'frag groups':>11}")
    for pol, r in res.items():
        print(f"{pol:12} {r['multi']:>14} {100 * r['best']:>20.1f}% {r['best'] / max(res['first_free']['best'], 1e-9):>12.2f}x "
              f"{r['bw']:>21.1f} {r['wait']:>9.3f} {r['wait_p95']:>9.3f} {r['frag']:>10.4f} {r['gfrag']:>11.4f}")
    print("best interconnect = weakest link equal to the best k-set of an idle node of that type; "
          "wait in mean job durations; frag nodes = share of free GPUs on partly used nodes (lower packs better); "
          "frag groups = share of free GPUs in no free best-interconnect group of 8, 4 or 2 on their node (lower keeps "
          "groups whole).")


if __name__ == "__main__":
    main()
