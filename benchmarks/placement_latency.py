"""Decision latency of the cluster placer for 1, 10, 100, 1,000 and 10,000 nodes.

Nodes cycle through the catalog's machines of up to 16 devices, each with a
random busy state. A decision is one ``place(nodes, Request(gpus=k))`` with k
drawn from 1, 2, 4, 8; between decisions one random node changes state (as a
job would start or end), so every decision sees one node it has not seen in
that state. Caches are warm after a first pass (steady state), which is how a
long-running placer sees the cluster. Figures: p50 and p99 over the decisions
of one repeat; the median over repeats. Also the cold first decision
(every node searched once, for k=2).

Run: python benchmarks/placement_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _placement_common import catalog_machines

from rayaccel.placement import NodeState, Request, place


def run(n_nodes, topos, decisions, repeats, rng):
    nodes = []
    for i in range(n_nodes):
        t = topos[i % len(topos)]
        busy = frozenset(d.index for d in t.devices if rng.random() < 0.5)
        nodes.append(NodeState(t, busy=busy, node_id=f"n{i}"))
    t0 = time.perf_counter()
    place(nodes, Request(gpus=2))
    cold = time.perf_counter() - t0
    for k in (1, 4, 8):  # warm every request size once (steady state)
        place(nodes, Request(gpus=k))
    p50s, p99s = [], []
    for _ in range(repeats):
        times = []
        for _ in range(decisions):
            i = rng.randrange(n_nodes)
            t = nodes[i].topology
            nodes[i] = NodeState(t, busy=frozenset(d.index for d in t.devices if rng.random() < 0.5), node_id=nodes[i].node_id)
            req = Request(gpus=rng.choice((1, 2, 4, 8)))
            t0 = time.perf_counter()
            place(nodes, req)
            times.append(time.perf_counter() - t0)
        times.sort()
        p50s.append(statistics.median(times))
        p99s.append(times[min(len(times) - 1, int(0.99 * len(times)))])
    return cold, statistics.median(p50s), statistics.median(p99s)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer decisions and repeats")
    args = ap.parse_args(argv)
    machines, note = catalog_machines()
    topos = [t for _, t in machines if 2 <= len(t.devices) <= 16]
    rng = random.Random(0)
    decisions, repeats = (100, 3) if args.quick else (400, 5)
    print(f"placement decision latency; machines: {note} ({len(topos)} types); {decisions} decisions x {repeats} repeats")
    print(f"{'nodes':>7} {'cold first (ms)':>16} {'p50 (ms)':>9} {'p99 (ms)':>9}")
    for n in (1, 10, 100, 1000, 10000):
        reps = repeats if n < 10000 else max(1, repeats // 2)
        cold, p50, p99 = run(n, topos, decisions if n < 10000 else decisions // 2, reps, rng)
        print(f"{n:>7} {cold * 1e3:>16.2f} {p50 * 1e3:>9.3f} {p99 * 1e3:>9.3f}")
    print("p50/p99: one place() call with warm caches while one node changes per decision; median over repeats.")


if __name__ == "__main__":
    main()
