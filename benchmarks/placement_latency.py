"""Decision latency of the cluster placer for 1, 10, 100, 1,000 and 10,000 nodes.

Method. Nodes cycle through the catalog's machines of 2-16 devices (8- and
16-device types dominate), each with a random busy state (each device busy
with probability 1/2). A decision is one ``place(nodes, Request(gpus=k))``, k
drawn uniformly from 1, 2, 4, 8. Before each decision one random node gets a
new random busy state (as a job would start or end); nothing else changes (the
placed job is not applied, so the cluster does not fill up). Per-node answers
are cached per (request, node state), so a decision for size k re-searches
every node whose state changed since the last size-k decision -- about four on
average, since sizes are drawn from four (column "fresh/dec": mean and max)
-- unless that (machine type, busy state) was seen before. Caches are warmed
by one pass per size first (steady state, as a long-running placer sees the
cluster). Only the winning node's allocation is materialized (ring order,
all-reduce model, runners-up). Timing: wall clock (time.perf_counter) around
place(), the garbage collector left on; "p99 cpu" is the same decisions timed
by this thread's CPU time, which leaves out preemption by other processes on
a shared machine. p50/p99 are over the decisions of one repeat; the table
gives the median over repeats. "cold first": the first decision on a fresh
cluster (every node searched once, k=2; per-topology tables of earlier rows
already built).

Run: python benchmarks/placement_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from _placement_common import catalog_machines

from rayaccel.placement import NodeState, Request, place


SIZES = (1, 2, 4, 8)


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
    p50s, p99s, cpu99s = [], [], []
    changed = {k: set() for k in SIZES}  # nodes changed since the last decision of each size
    fresh = []
    for _ in range(repeats):
        times, cpu = [], []
        for _ in range(decisions):
            i = rng.randrange(n_nodes)
            t = nodes[i].topology
            nodes[i] = NodeState(t, busy=frozenset(d.index for d in t.devices if rng.random() < 0.5), node_id=nodes[i].node_id)
            for s in changed.values():
                s.add(i)
            k = rng.choice(SIZES)
            fresh.append(len(changed[k]))
            changed[k] = set()
            req = Request(gpus=k)
            c0 = time.thread_time()
            t0 = time.perf_counter()
            place(nodes, req)
            times.append(time.perf_counter() - t0)
            cpu.append(time.thread_time() - c0)
        times.sort()
        cpu.sort()
        p50s.append(statistics.median(times))
        p99s.append(times[min(len(times) - 1, int(0.99 * len(times)))])
        cpu99s.append(cpu[min(len(cpu) - 1, int(0.99 * len(cpu)))])
    return cold, statistics.median(p50s), statistics.median(p99s), statistics.median(cpu99s), fresh


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer decisions and repeats")
    args = ap.parse_args(argv)
    machines, note = catalog_machines()
    topos = [t for _, t in machines if 2 <= len(t.devices) <= 16]
    rng = random.Random(0)
    decisions, repeats = (100, 3) if args.quick else (400, 5)
    print(f"placement decision latency; machines: {note} ({len(topos)} types); {decisions} decisions x {repeats} repeats")
    print(f"{'nodes':>7} {'cold first (ms)':>16} {'p50 (ms)':>9} {'p99 (ms)':>9} {'p99 cpu (ms)':>13} {'fresh/dec':>10}")
    for n in (1, 10, 100, 1000, 10000):
        reps = repeats if n < 10000 else max(1, repeats // 2)
        cold, p50, p99, cpu99, fresh = run(n, topos, decisions if n < 10000 else decisions // 2, reps, rng)
        fr = f"{statistics.mean(fresh):.1f}/{max(fresh)}"
        print(f"{n:>7} {cold * 1e3:>16.2f} {p50 * 1e3:>9.3f} {p99 * 1e3:>9.3f} {cpu99 * 1e3:>13.3f} {fr:>10}")
    print("one place() call, warm caches, one node re-drawn before each decision, GC on; p50/p99 over the decisions of")
    print("a repeat, median over repeats; fresh/dec: nodes changed since the last decision of that size (mean/max).")


if __name__ == "__main__":
    main()
