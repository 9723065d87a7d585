"""Decision latency: the cluster placer for 1 to 10,000 nodes, and cold single-node decisions.

Method. Nodes cycle through the catalog's machines of 2-16 devices (8- and
16-device types dominate), each with a random busy state (each device busy
with probability 1/2). A decision is one ``place(nodes, Request(gpus=k))``, k
drawn uniformly from 1, 2, 4, 8. Before each decision one random node gets a
new random busy state (as a job would start or end); nothing else changes (the
placed job is not applied, so the cluster does not fill up). Per-node answers
are cached per (request, node state), so a decision for size k re-searches
every node whose state changed since the last size-k decision -- about four on
average, since sizes are drawn from four (column "fresh/dec": mean and max)
-- unless that (machine type, busy state) was seen before. place() keeps the
ranks of the last node list per request and re-ranks only the nodes whose
(frozen) state object changed, so a decision costs one identity pass over the
list plus those fresh nodes. Caches are warmed by one pass per size first
(steady state, as a long-running placer sees the cluster). Only the winning
node's allocation is materialized (ring order, all-reduce model, runners-up). Timing: wall clock (time.perf_counter) around
place(), the garbage collector left on; "p99 cpu" is the same decisions timed
by this thread's CPU time, which leaves out preemption by other processes on
a shared machine. p50/p99 are over the decisions of one repeat; the table
gives the median over repeats. "cold first": the first decision on a fresh
cluster (every node searched once, k=2; per-topology tables of earlier rows
already built).

Cold single-node decisions (second table): what the Ray layer's in-worker
arbiter pays at a GPU grant on a state it has not seen: ``allocate(NodeState,
Request(gpus=k))`` with every per-state cache cleared before each call (the
per-topology tables stay: "first" is the first decision on the machine type in
the process, tables included). 300 random states (devices busy with probability
0, 1/4 or 1/2), k from 1, 2, 4, 8; thread CPU time. Side by side: Ray's own
choice (first_free, lowest free indices) on the same states.

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


def _clear_per_state(topo) -> None:
    """Only what is keyed by the node state: a new state in a long-running process (topology caches warm)."""
    from rayaccel.placement import node
    from rayaccel.placement._index import index_of

    for name in ("_CACHE", "_DECISIONS"):
        if hasattr(node, name):
            getattr(node, name).clear()
    index_of(topo).results.clear()


def _clear_state_caches(topo) -> None:
    from rayaccel.placement import node
    from rayaccel.placement._index import index_of

    node._CACHE.clear()
    node._DECISIONS.clear()
    ix = index_of(topo)
    ix.results.clear()
    ix.rings.clear()
    tb = ix.cache.get("table")
    if tb is not None:
        tb.quality.clear()
        tb.group_bits.clear()


def cold_single(machines, decisions, rng):
    """Rows (name, n, first ms, p50 ms, p99 ms, first_free p50 ms) of cold single-node decisions."""
    from rayaccel.placement.baselines import first_free
    from rayaccel.placement.node import allocate

    rows = []
    for name, topo in machines:
        t0 = time.thread_time()
        allocate(NodeState(topo), Request(gpus=1))
        first = time.thread_time() - t0
        ours, theirs = [], []
        for _ in range(decisions):
            busy = frozenset(d.index for d in topo.devices if rng.random() < rng.choice((0.0, 0.25, 0.5)))
            st = NodeState(topo, busy=busy)
            req = Request(gpus=rng.choice(SIZES))
            _clear_state_caches(topo)
            t0 = time.thread_time()
            allocate(st, req)
            ours.append(time.thread_time() - t0)
            t0 = time.thread_time()
            first_free(st, req)
            theirs.append(time.thread_time() - t0)
        warm = []  # the same kind of states again, only the per-state caches cleared
        for _ in range(decisions):
            busy = frozenset(d.index for d in topo.devices if rng.random() < rng.choice((0.0, 0.25, 0.5)))
            st = NodeState(topo, busy=busy)
            req = Request(gpus=rng.choice(SIZES))
            _clear_per_state(topo)
            t0 = time.thread_time()
            allocate(st, req)
            warm.append(time.thread_time() - t0)
        ours.sort()
        theirs.sort()
        warm.sort()
        p99 = lambda xs: xs[min(len(xs) - 1, int(0.99 * len(xs)))] * 1e3  # noqa: E731
        rows.append((name, len(topo.devices), first * 1e3, statistics.median(ours) * 1e3, p99(ours),
                     statistics.median(warm) * 1e3, p99(warm), statistics.median(theirs) * 1e3))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer decisions and repeats")
    args = ap.parse_args(argv)
    machines, note = catalog_machines()
    topos = [t for _, t in machines if 2 <= len(t.devices) <= 16]
    rng = random.Random(0)
    decisions, repeats = (100, 3) if args.quick else (400, 5)
    cold_rows = cold_single([(nm, t) for nm, t in machines if len(t.devices) >= 2], 100 if args.quick else 300,
                            random.Random(1))  # first: before the cluster rows build every table
    print(f"placement decision latency; machines: {note} ({len(topos)} types); {decisions} decisions x {repeats} repeats")
    print(f"{'nodes':>7} {'cold first (ms)':>16} {'p50 (ms)':>9} {'p99 (ms)':>9} {'p99 cpu (ms)':>13} {'fresh/dec':>10}")
    for n in (1, 10, 100, 1000, 10000):
        cold, p50, p99, cpu99, fresh = run(n, topos, decisions, repeats, rng)
        fr = f"{statistics.mean(fresh):.1f}/{max(fresh)}"
        print(f"{n:>7} {cold * 1e3:>16.2f} {p50 * 1e3:>9.3f} {p99 * 1e3:>9.3f} {cpu99 * 1e3:>13.3f} {fr:>10}")
    print("one place() call, warm caches, one node re-drawn before each decision, GC on; p50/p99 over the decisions of")
    print("a repeat, median over repeats; fresh/dec: nodes changed since the last decision of that size (mean/max).")
    print()
    print(f"cold single-node decisions (per-state caches cleared before each; {100 if args.quick else 300} states per machine)")
    print(f"{'machine':24} {'n':>3} {'first (ms)':>10} {'p50 (ms)':>9} {'p99 (ms)':>9} {'warm p50':>9} {'warm p99':>9} "
          f"{'first_free p50':>15}")
    for name, n, first, p50, p99, wp50, wp99, ff in cold_rows:
        print(f"{name:24} {n:>3} {first:>10.1f} {p50:>9.3f} {p99:>9.3f} {wp50:>9.3f} {wp99:>9.3f} {ff:>15.3f}")
    print("allocate() on a state not seen before (thread CPU time); first = first decision on that machine type in the")
    print("process (its tables built); p50/p99: every per-state and per-topology cache of criterion 4 and the rings")
    print("cleared before each; warm: only the per-state caches (a new state in a long-running process);")
    print("first_free = Ray's choice on the same states, for scale.")


if __name__ == "__main__":
    main()
