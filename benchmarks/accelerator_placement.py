"""Placement of Ray's non-GPU accelerator slots under churn: rayaccel's ``choose_units`` vs Ray's lowest-free choice.

For each catalog machine of the families beyond GPUs (AWS Neuron, Google TPU, Intel Gaudi,
Huawei Ascend) one job stream runs through two policies, each with its own free state:

* ``rayaccel``: :func:`rayaccel.placement.choose_units` (strict: a grant that cannot get its
  shape waits for one, FIFO with backfill);
* ``ray``: what Ray 2.60 hands out -- the lowest free slot ids (Neuron: the lowest free core
  ids; TPU: any free chips, here the lowest; Gaudi / Ascend: the lowest free device ids).

Job sizes, in the family's unit (assumptions, no public trace of these accelerators was
found): Neuron cores 1: 35%, 2: 35%, 4: 15%, 8: 10%, 16: 5% (inference on one device's cores,
training on whole devices); TPU chips 1: 50%, 2: 30%, 4: 15%, 8: 5% (8 only on 8-chip
hosts; Ray accepts 1, 2, 4, 8); Gaudi / Ascend devices 1: 70%, 2: 10%, 4: 15%, 8: 5% (the
Philly-trace shares of benchmarks/placement_churn.py). Poisson arrivals at 90% of the
node's units, exponential durations (mean 1.0).

Metrics, per machine and policy:

* ``one device``: Neuron requests of up to a device's cores that sit on one device;
* ``ring``: Neuron requests of several devices' cores on the fewest whole devices that form
  a ring over NeuronLink (a linked pair for 2 devices), or a path where an idle node has no
  ring of that many devices (an odd count on the bipartite 4x4 torus; inf2's ring of 12);
* ``ring, when one was free``: the same among grants of whole devices made while the free
  whole devices held such a ring (what a placement can do at that moment);
* ``block``: TPU grants that are a contiguous block of the host's chip grid (what libtpu's
  bounds can describe);
* ``best link``: Gaudi / Ascend grants of 2+ devices whose weakest link is as strong as the
  idle node's best set of that size (Ascend 910: inside one HCCS group), and ``1 NUMA``
  (devices on one NUMA node; 8-device jobs of a 2-NUMA server cannot be; unknown NUMA: -);
* ``wait``: mean queueing delay (rayaccel waits for a shape; Ray only for a count);
* ``decide``: choose_units time per grant made, p50 / p99 (Ray's choice is not timed).

Run: python benchmarks/accelerator_placement.py [--quick] [--seed S]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import time

from _placement_common import ROOT  # noqa: F401 - puts src/ on the path

from rayaccel import catalog
from rayaccel.discovery.rayspec import HPU, NEURON, NPU, TPU
from rayaccel.placement import NodeState, Rejection, Request, choose_units, node_units, plan

MACHINES = [("trn1-32xlarge", NEURON), ("trn2-48xlarge", NEURON), ("inf2-48xlarge", NEURON), ("tpu-v4-8", TPU),
            ("tpu-v5p-8", TPU), ("tpu-v5e-8", TPU), ("tpu-v6e-8", TPU), ("gaudi2-hls2-8x", HPU),
            ("gaudi3-hls3-8x", HPU), ("atlas-800-910a-8x", NPU), ("atlas-800t-a2-910b3", NPU)]
SIZES = {"core": [(1, 35), (2, 35), (4, 15), (8, 10), (16, 5)], "chip": [(1, 50), (2, 30), (4, 15), (8, 5)],
         "device": [(1, 70), (2, 10), (4, 15), (8, 5)]}


def _sizes(spec, n_units: int) -> tuple[list[int], list[int]]:
    rows = [(k, w) for k, w in SIZES[spec.unit] if k <= n_units]
    return [k for k, _ in rows], [w for _, w in rows]


def stream(topo, spec, jobs: int, seed: int) -> list[tuple[float, float, int]]:
    """(arrival, duration, units) for ``jobs`` jobs at 90% load."""
    rng = random.Random(seed)
    n = len(node_units(topo, spec))
    ks, ws = _sizes(spec, n)
    mean_k = sum(k * w for k, w in zip(ks, ws)) / sum(ws)
    rate = 0.9 * n / mean_k  # arrivals per unit time so that load = 90% of the units
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(rate)
        out.append((t, rng.expovariate(1.0), rng.choices(ks, ws)[0]))
    return out


def ray_choice(free: set[int], k: int):
    return tuple(sorted(free)[:k]) if len(free) >= k else None


class Metrics:
    def __init__(self):
        self.one = [0, 0]
        self.ring = [0, 0]
        self.ring_free = [0, 0]
        self.block = [0, 0]
        self.best = [0, 0]
        self.numa = [0, 0]
        self.waits: list[float] = []
        self.decide_ms: list[float] = []

    @staticmethod
    def share(p) -> str:
        return f"{100 * p[0] / p[1]:.1f}%" if p[1] else "-"


def judge(m: Metrics, topo, spec, units: tuple[int, ...], dev_of: dict[int, int], best_rank: dict[int, tuple],
          free_before: set[int]):
    devs = list(dict.fromkeys(dev_of[u] for u in units))
    if spec.unit == "core":
        per = len(node_units(topo, spec)) // len(topo.devices)
        if len(units) <= per:
            m.one[1] += 1
            m.one[0] += len(devs) == 1
        else:
            m.ring[1] += 1
            whole = all(sum(1 for u in units if dev_of[u] == d) == per for d in devs) or len(units) % per
            good = bool(whole) and len(devs) == -(-len(units) // per) and _ring_or_path(topo, devs)
            m.ring[0] += good
            if len(units) % per == 0 and _free_ring_exists(topo, free_before, dev_of, per, len(units) // per):
                m.ring_free[1] += 1
                m.ring_free[0] += good
    elif spec.unit == "chip":
        m.block[1] += 1
        m.block[0] += _is_block(topo, units)
    elif len(devs) > 1:
        m.best[1] += 1
        m.best[0] += _weakest(topo, devs) >= best_rank[len(devs)]
        numas = {topo.device(d).numa_node for d in devs}
        if None not in numas:  # unknown NUMA nodes are not counted
            m.numa[1] += 1
            m.numa[0] += len(numas) == 1


_RING_POSSIBLE: dict[tuple[str, int], bool] = {}


def _ring_or_path(topo, devs) -> bool:
    """A ring over direct links when an idle node has a ring of that many devices, else a path."""
    n = len(devs)
    if n == 1:
        return True
    adj = {d: {e for e in devs if e != d and topo.link(d, e) is not None and topo.link(d, e).direct} for d in devs}
    if n == 2:
        return devs[1] in adj[devs[0]]
    key = (topo.name, n)
    if key not in _RING_POSSIBLE:
        from rayaccel.placement.units import _plan

        _RING_POSSIBLE[key] = _plan(topo, NEURON).graph.ring_possible(n)
    return _hamiltonian(adj, devs, cycle=_RING_POSSIBLE[key])


def _free_ring_exists(topo, free: set[int], dev_of: dict[int, int], per: int, n: int) -> bool:
    """Whether the whole free devices held a ring of ``n`` (a path where no ring of ``n`` exists) before the grant."""
    from rayaccel.placement._rings import _rings
    from rayaccel.placement.units import _plan

    plan = _plan(topo, NEURON)
    counts: dict[int, int] = {}
    for u in free:
        counts[dev_of[u]] = counts.get(dev_of[u], 0) + 1
    mask = sum(1 << i for i, d in enumerate(plan.devices) if counts.get(d) == per)
    if mask.bit_count() < n:
        return False
    if n == 1:
        return True
    if plan.graph.ring_possible(n):
        return bool(_rings(plan.graph, mask, n, 1))
    return _path_exists(plan.graph.adj, mask, n)


def _path_exists(adj: list[int], mask: int, n: int) -> bool:
    """A simple path through ``n`` devices of ``mask`` over direct links (depth-first, small n)."""
    def go(v: int, seen: int, length: int) -> bool:
        if length == n:
            return True
        nbrs = adj[v] & mask & ~seen
        while nbrs:
            low = nbrs & -nbrs
            w = low.bit_length() - 1
            if go(w, seen | low, length + 1):
                return True
            nbrs ^= low
        return False

    return any(go(v, 1 << v, 1) for v in range(len(adj)) if mask >> v & 1)


def _hamiltonian(adj, devs, cycle: bool) -> bool:
    starts = devs[:1] if cycle else devs

    def go(path, seen):
        if len(path) == len(devs):
            return not cycle or path[0] in adj[path[-1]]
        return any(go(path + [nb], seen | {nb}) for nb in adj[path[-1]] if nb not in seen)

    return any(go([s], {s}) for s in starts)


def _is_block(topo, chips) -> bool:
    pts = [topo.device(c).coords for c in chips]
    lo = [min(p[i] for p in pts) for i in range(3)]
    hi = [max(p[i] for p in pts) for i in range(3)]
    vol = (hi[0] - lo[0] + 1) * (hi[1] - lo[1] + 1) * (hi[2] - lo[2] + 1)
    return vol == len(chips) == len(set(pts))


def _weakest(topo, devs):
    return min(topo.rank(a, b) for i, a in enumerate(devs) for b in devs[i + 1:])


def simulate(topo, spec, jobs, policy: str) -> Metrics:
    m = Metrics()
    units = node_units(topo, spec)
    dev_of = {u.id: u.device for u in units}
    best_rank = {}
    if spec.unit == "device":
        for k in range(2, len(topo.devices) + 1):
            a = plan(NodeState(topo), Request(gpus=k))
            best_rank[k] = a.score.weakest_rank if a and a.score and a.score.weakest_rank else (0, 0.0)
    free = {u.id for u in units}
    events: list[tuple[float, int, tuple[int, ...]]] = []  # (end time, seq, units)
    queue: list[tuple[float, float, int]] = []
    seq = 0

    def try_start(now: float) -> None:
        nonlocal seq
        i = 0
        while i < len(queue):
            arr, dur, k = queue[i]
            if policy == "ray":
                got = ray_choice(free, k)
            else:
                t0 = time.perf_counter()
                c = choose_units(topo, spec, free, k)
                dt = (time.perf_counter() - t0) * 1e3
                got = None if isinstance(c, Rejection) else c.units
                if got is not None:
                    m.decide_ms.append(dt)
            if got is None:
                i += 1
                continue
            queue.pop(i)
            before = set(free)
            free.difference_update(got)
            judge(m, topo, spec, got, dev_of, best_rank, before)
            m.waits.append(now - arr)
            seq += 1
            heapq.heappush(events, (now + dur, seq, got))

    for arr, dur, k in jobs:
        while events and events[0][0] <= arr:
            end, _, got = heapq.heappop(events)
            free.update(got)
            try_start(end)
        queue.append((arr, dur, k))
        try_start(arr)
    while events:
        end, _, got = heapq.heappop(events)
        free.update(got)
        try_start(end)
    return m


def _pct(xs, q) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="400 jobs per machine instead of 3,000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    n_jobs = 400 if args.quick else 3000
    print(f"# {n_jobs} jobs per machine at 90% load, seed {args.seed}; rayaccel = choose_units, ray = lowest free ids\n")
    print("| machine | unit | policy | one device | ring | ring, when one was free | block | best link | 1 NUMA "
          "| mean wait | decide p50 / p99 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for name, spec in MACHINES:
        topo = catalog.load(name)
        jobs = stream(topo, spec, n_jobs, args.seed)
        for policy in ("rayaccel", "ray"):
            m = simulate(topo, spec, jobs, policy)
            decide = (f"{_pct(m.decide_ms, 0.5):.3f} / {_pct(m.decide_ms, 0.99):.3f} ms" if m.decide_ms else "-")
            wait = f"{statistics.fmean(m.waits):.3f}" if m.waits else "-"
            print(f"| {name} | {spec.unit} | {policy} | {m.share(m.one)} | {m.share(m.ring)} | {m.share(m.ring_free)} "
                  f"| {m.share(m.block)} | "
                  f"{m.share(m.best)} | {m.share(m.numa)} | {wait} | {decide} |")


if __name__ == "__main__":
    main()
