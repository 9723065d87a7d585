"""Gangs across NVLink domains, and the NIC next to each GPU: rayaccel vs Ray's own choices, one run.

A placement-model benchmark: no Ray cluster runs. Every policy places the same seeded
stream on the same simulated cluster, and the same model scores every placement.

**Part 1, gangs on a two-rack NVL72 cluster.** 36 compute trays (4 GPUs each), two NVLink
domains of 18 (one GB200 NVL72 rack each), each rack its own network block under one
spine. A stream of multi-node jobs, 2-16 trays each (uniform), one ``{"GPU": 4}`` bundle
per tray (a worker per tray); Poisson arrivals at 85% of the cluster's trays, durations
exponential (mean 1.0); the queue is FIFO with backfill (every waiting job is tried at
each event). Policies:

* ``rayaccel``: :func:`rayaccel.placement.place_gang` with each tray's
  :class:`~rayaccel.placement.domains.NodePlace` (domain, levels), as ``rayaccel.gang``
  gets it from the node labels;
* ``ray PACK``: Ray's ``BundlePackSchedulingPolicy`` (``src/ray/raylet/scheduling/policy/
  bundle_scheduling_policy.cc``): bundles sorted (all equal here), the first bundle goes
  to the candidate node with the highest ``LeastResourceScorer`` score (``scorer.cc``:
  sum of (available - requested) / available: 0 for every free tray, so the first in the
  candidate map's iteration order wins), every other bundle that fits joins it, the node
  leaves the candidates, repeat. The map is an ``absl::flat_hash_map`` keyed by node id:
  modeled as a fixed random order of the trays (seeded);
* ``ray topology_strategy``: ``topology_strategy={"ray.io/gpu-domain": "STRICT_PACK",
  "ray.io/node-id": "STRICT_SPREAD"}`` over rayaccel's labels
  (``label_domain_bundle_scheduling_policy.cc``): domains in the group map's iteration
  order (a fixed random order, seeded), the first domain with room wins, inside it the
  node-level policy; a job no domain holds now waits (Ray retries it), one bigger than
  every domain would never run (none here: at most 16 of 18 trays);
* ``rayaccel, one domain``: rayaccel's choice, but a job that would span domains waits
  instead (it spans only when no domain has room, so this is exactly Ray's waiting rule
  with rayaccel's best-fit choice of the domain: the difference to ``ray
  topology_strategy`` is what fragmentation-aware domain choice buys);
* ``random``: random free trays.

Metrics: share of jobs inside one NVLink domain; mean modeled ring all-reduce
(:func:`rayaccel.placement.domains.ring_allreduce`: NVLink at 900 GB/s per direction
inside a domain, 50 GB/s through one 400 Gb/s NIC across domains); queueing delay.

**Part 2, the NIC next to each GPU** (every capture of the corpus with RDMA NICs): the
NICs rayaccel names for a GPU (the RDMA NICs at PIX, else PXB, from it) vs what
``RAY_RDT_NIC_PINNING=1`` gives (Ray's ``nic_allocator.py``, in Ray's repository after
2.60 -- not in the 2.60 wheel: ``/sys/class/infiniband`` devices sorted by name, each
RDT actor gets the first one not yet taken, no PCIe affinity). One actor per GPU,
arriving in GPU order, then in random orders (mean of 20). Share of GPUs whose NIC is
at PIX/PXB from them (of GPUs that have such a NIC).

Part 1 also times rayaccel's decision alone (``place_gang`` with places) on 36, 288 and
1,008 trays.

Run: python benchmarks/crossnode_gangs.py [--quick] [--seed S]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from rayaccel import catalog  # noqa: E402
from rayaccel.placement import NodeState, place_gang  # noqa: E402
from rayaccel.placement.domains import NodePlace, ring_allreduce  # noqa: E402
from rayaccel.topology import near_nics  # noqa: E402

TRAYS_PER_RACK = 18
RACKS = ("rack-a", "rack-b")
SIZES = range(2, 17)
LOAD = 0.85
POLICIES = ("rayaccel", "ray PACK", "ray topology_strategy", "rayaccel, one domain", "random")


def tray_topology():
    """The compute tray: ``gb200-nvl72-tray`` when the catalog has it, else ``gb200-nvl4`` (same GPUs and links)."""
    for name in ("gb200-nvl72-tray", "gb200-nvl4"):
        if name in catalog.names():
            return name, catalog.load(name)
    raise SystemExit("no GB200 tray in the catalog")


# ------------------------------------------------------------------ part 1: gangs
class Cluster:
    """36 trays, whole-tray jobs: a tray is free or held by one job."""

    def __init__(self, topo, seed: int):
        self.topo = topo
        self.names = [f"{r[-1]}{i}" for r in RACKS for i in range(TRAYS_PER_RACK)]
        self.places = [NodePlace(r, {"block": f"block-{r[-1]}", "spine": "s0"})
                       for r in RACKS for _ in range(TRAYS_PER_RACK)]
        self.free = set(range(len(self.names)))
        rng = random.Random(seed * 7919 + 1)
        self.hash_order = list(range(len(self.names)))  # an absl::flat_hash_map's iteration order, fixed
        rng.shuffle(self.hash_order)
        self.domain_order = list(RACKS)
        rng.shuffle(self.domain_order)
        self.idle = NodeState(topo)
        self.full = NodeState(topo, busy=frozenset(topo.indices))
        self.rng = random.Random(seed * 104729 + 3)

    def domain(self, i: int) -> str:
        return self.places[i].domain

    def choose(self, policy: str, n: int) -> list[int] | None:
        if len(self.free) < n:
            return None
        if policy.startswith("rayaccel"):
            states = [NodeState(self.topo, busy=self.full.busy if i not in self.free else frozenset(),
                                node_id=str(i)) for i in range(len(self.names))]
            g = place_gang(states, n, 4, places=self.places)
            if g and policy == "rayaccel, one domain" and g.scope not in ("node", "domain"):
                return None  # it spans domains only when no domain has room: wait, as Ray's STRICT_PACK does
            return [int(w.node) for w in g.workers] if g else None
        if policy == "ray PACK":
            return [i for i in self.hash_order if i in self.free][:n]
        if policy == "ray topology_strategy":
            for d in self.domain_order:
                cand = [i for i in self.hash_order if i in self.free and self.domain(i) == d]
                if len(cand) >= n:
                    return cand[:n]
            return None
        return self.rng.sample(sorted(self.free), n)

    def model(self, trays: list[int]) -> float:
        return ring_allreduce([(self.topo, self.places[i], self.topo.indices) for i in trays]).allreduce_bandwidth_gbps


def stream(seed: int, jobs: int) -> list[tuple[float, int, float]]:
    """(arrival, trays, duration) per job: Poisson arrivals at LOAD of the cluster's trays."""
    rng = random.Random(seed)
    total = len(RACKS) * TRAYS_PER_RACK
    mean_size = statistics.mean(SIZES)
    rate = LOAD * total / mean_size  # jobs per unit time (mean duration 1.0)
    t, out = 0.0, []
    for _ in range(jobs):
        t += rng.expovariate(rate)
        out.append((t, rng.choice(SIZES), rng.expovariate(1.0)))
    return out


def simulate(policy: str, jobs: list, topo, seed: int) -> dict:
    c = Cluster(topo, seed)
    events: list = [(a, 1, k) for k, (a, _, _) in enumerate(jobs)]  # (time, kind 0 = departure / 1 = arrival, job)
    heapq.heapify(events)
    waiting: list[int] = []
    held: dict[int, list[int]] = {}
    start: dict[int, float] = {}
    one_domain = 0
    bw: list[float] = []
    decide_s = 0.0
    while events:
        t, kind, k = heapq.heappop(events)
        if kind == 0:
            c.free |= set(held.pop(k))
        else:
            waiting.append(k)
        still = []
        for j in waiting:
            t0 = time.perf_counter()
            trays = c.choose(policy, jobs[j][1])
            decide_s += time.perf_counter() - t0
            if trays is None:
                still.append(j)
                continue
            assert len(set(trays)) == jobs[j][1] and set(trays) <= c.free
            c.free -= set(trays)
            held[j] = trays
            start[j] = t
            one_domain += len({c.domain(i) for i in trays}) == 1
            bw.append(c.model(trays))
            heapq.heappush(events, (t + jobs[j][2], 0, j))
        waiting = still
    waits = [start[j] - jobs[j][0] for j in range(len(jobs))]
    return {"one_domain": one_domain / len(jobs), "allreduce": statistics.mean(bw),
            "wait_mean": statistics.mean(waits), "wait_p95": statistics.quantiles(waits, n=20)[-1],
            "decide_ms": 1000 * decide_s / len(jobs)}


# ------------------------------------------------------------------ part 2: NICs (rayaccel.topology.near_nics)
def ray_pinning(topology, order: list[int]) -> dict[int, str | None]:
    """``RAY_RDT_NIC_PINNING=1``: RDMA devices sorted by name; each actor, in arrival order, gets the first free."""
    pool = sorted(f"{n.name}:1" for n in topology.nics if n.rdma)
    out: dict[int, str | None] = {}
    for d in order:
        out[d] = pool.pop(0) if pool else None
    return out


def nic_table(seed: int) -> tuple[list, str]:
    from rayaccel.discovery.capture import import_captures
    from rayaccel.errors import RayaccelError

    rows, skipped = [], 0
    for p in sorted((ROOT / "tests" / "data" / "captures").glob("*.txt")):
        try:
            topo = import_captures([p]).topology
        except RayaccelError:
            skipped += 1
            continue
        if not any(n.rdma for n in topo.nics):
            continue
        devs = list(topo.indices)
        level = {(n.name + ":1"): n for n in topo.nics if n.rdma}

        def at_switch(d, nic):
            return nic is not None and level[nic].path_to(d) in ("PIX", "PXB")

        have = [d for d in devs if near_nics(topo, [d])]
        ours = sum(all(at_switch(d, x) for x in near_nics(topo, [d])) for d in have)
        in_order = ray_pinning(topo, devs)
        ray_ordered = sum(at_switch(d, in_order[d]) for d in have)
        rng = random.Random(seed)
        shuffled = []
        for _ in range(20):
            order = devs[:]
            rng.shuffle(order)
            got = ray_pinning(topo, order)
            shuffled.append(sum(at_switch(d, got[d]) for d in have))
        rows.append((p.stem[:44], len(devs), len(level), len(have), ours, ray_ordered, statistics.mean(shuffled)))
    return rows, f"{len(rows)} captures with RDMA NICs ({skipped} captures did not import)"


def decision_times(topo, seed: int, repeats: int) -> list[tuple[int, float, float]]:
    """place_gang's decision time on 2, 16 and 56 racks of 18 trays (half the trays busy, 4 racks per block):
    (trays, p50 ms, p90 ms) over ``repeats`` gangs of 2-16 trays."""
    out = []
    for racks in (2, 16, 56):
        rng = random.Random(seed)
        n = racks * TRAYS_PER_RACK
        nodes = [NodeState(topo, busy=frozenset(topo.indices) if rng.random() < 0.5 else frozenset(), node_id=str(i))
                 for i in range(n)]
        places = [NodePlace(f"r{i // TRAYS_PER_RACK}", {"block": f"b{i // (4 * TRAYS_PER_RACK)}", "spine": "s"})
                  for i in range(n)]
        ts = []
        for _ in range(repeats):
            w = rng.choice(SIZES)
            t0 = time.perf_counter()
            place_gang(nodes, w, 4, places=places)
            ts.append(time.perf_counter() - t0)
        ts.sort()
        out.append((n, 1000 * statistics.median(ts), 1000 * ts[int(0.9 * (len(ts) - 1))]))
    return out


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="400 jobs instead of 3,000")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    name, topo = tray_topology()
    n_jobs = 400 if args.quick else 3000
    jobs = stream(args.seed, n_jobs)
    print(f"Part 1: {n_jobs} jobs of 2-16 trays (x 4 GPUs) on 2 racks x {TRAYS_PER_RACK} trays ({name}), "
          f"load {LOAD:.0%}, seed {args.seed}; placement model, no Ray cluster\n")
    res = {p: simulate(p, jobs, topo, args.seed) for p in POLICIES}
    base = res["ray PACK"]["allreduce"]
    w = 22
    print(f"{'':<34}" + "".join(f"{p:>{w}}" for p in POLICIES))
    print(f"{'jobs inside one NVLink domain':<34}" + "".join(f"{res[p]['one_domain']:>{w}.1%}" for p in POLICIES))
    print(f"{'mean modeled all-reduce, GB/s':<34}" + "".join(
        f"{res[p]['allreduce']:>{w - 9}.1f} ({res[p]['allreduce'] / base:.2f}x)" for p in POLICIES))
    print(f"{'mean queueing delay':<34}" + "".join(f"{res[p]['wait_mean']:>{w}.3f}" for p in POLICIES))
    print(f"{'p95 queueing delay':<34}" + "".join(f"{res[p]['wait_p95']:>{w}.3f}" for p in POLICIES))
    print(f"{'decision time per job, ms':<34}" + "".join(f"{res[p]['decide_ms']:>{w}.3f}" for p in POLICIES))
    print("\n(all-reduce ratio vs ray PACK; delays in mean job durations)\n")
    print("rayaccel's gang decision (place_gang with places), half the trays busy:")
    for n, p50, p90 in decision_times(topo, args.seed, 10 if args.quick else 40):
        print(f"  {n:>5} trays: p50 {p50:.2f} ms, p90 {p90:.2f} ms")
    print()

    rows, note = nic_table(args.seed)
    print(f"Part 2: the NIC for each GPU, {note}")
    print(f"{'capture':<46}{'GPUs':>5}{'RDMA':>6}{'with PIX/PXB NIC':>18}{'rayaccel':>10}"
          f"{'Ray, GPU order':>16}{'Ray, random order':>19}")
    tot = [0, 0, 0, 0.0]
    for cap, g, nics, have, ours, ray_o, ray_r in rows:
        print(f"{cap:<46}{g:>5}{nics:>6}{have:>18}{ours:>10}{ray_o:>16}{ray_r:>19.1f}")
        tot[0] += have
        tot[1] += ours
        tot[2] += ray_o
        tot[3] += ray_r
    if tot[0]:
        print(f"{'GPUs with a NIC at PIX/PXB: ' + str(tot[0]) + ', of them given one there:':<75}{tot[1]:>10}"
              f"{tot[2]:>16}{tot[3]:>19.1f}")
        print(f"{'share at PIX/PXB (of GPUs that have such a NIC)':<75}{tot[1] / tot[0]:>10.1%}"
              f"{tot[2] / tot[0]:>16.1%}{tot[3] / tot[0]:>19.1%}")


if __name__ == "__main__":
    main()
