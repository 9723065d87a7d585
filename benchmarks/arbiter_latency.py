"""The arbiter's decision time at a grant, on 8-, 16- and 72-device nodes (target: p99 <= 0.5 ms).

Method. One node's arbiter (state in a private directory on /dev/shm, as on a real
node) serves a random stream of grants and releases emulating Ray: whole grants
take the lowest free slots (sizes 1, 2, 4, 8 drawn uniformly, capped by what is
free), a holder ends with probability 1/2 before each grant, and every tenth
grant is a 1/4 GPU share. A decision is one ``Arbiter.grant`` call as the worker
hook makes it: take the file lock, read the state, reap dead holders, choose the
set (the node table's precomputed plans where the pool has <= 8 devices, else the
exact placer with its per-state caches cleared, so nothing is free), permute the
slot map, write the state back. Columns: the whole decision ("grant"), and side by
side in the same run on the same states: the placer alone ("placement": ``allocate``
on the free devices, caches cleared), the lock + state read/write alone ("state
I/O": an empty grant), and the floor for that I/O: a raw write + rename of the same
state bytes on the same tmpfs ("raw write"). p50/p99 over ``--decisions`` decisions
after a warm-up of 50, median of ``--repeats`` repeats; wall clock.

Run: python benchmarks/arbiter_latency.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import time

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.decide import GrantRequest
from rayaccel.arbiter.state import encode_state
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.placement import NodeState, Request, allocate
from rayaccel.placement import node as placement_node
from rayaccel.placement.pools import gpu_pool

MACHINES = ("dgx1-v100", "dgx2-v100", "nvl72")


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def run(machine: str, decisions: int, seed: int) -> dict:
    topo = catalog.load(machine)
    n = len(gpu_pool(topo))
    root = "/dev/shm" if os.path.isdir("/dev/shm") else None
    d = tempfile.mkdtemp(prefix="arb-bench-", dir=root)
    alive: set[int] = set()
    arb = Arbiter(d, build_table(topo, "0" * 12, True), topology=topo, alive=lambda p: p in alive)
    rng = random.Random(seed)
    raw_tmp, raw_dst = os.path.join(d, ".raw.tmp"), os.path.join(d, "raw.json")
    used = [0.0] * n
    held: dict[int, list[tuple[int, float]]] = {}
    grant_ms, place_ms, io_ms, raw_ms = [], [], [], []
    pid = 1000
    for i in range(decisions + 50):
        if held and rng.random() < 0.5:
            p = rng.choice(list(held))
            for s, f in held.pop(p):
                used[s] -= f
            alive.discard(p)
        pid += 1
        if i % 10 == 9:
            fits = [s for s in range(n) if used[s] <= 0.75 + 1e-9]
            if not fits:
                continue
            s = min(fits, key=lambda s: (1 - used[s] - 0.25, s))
            slots = [(s, 0.25)]
        else:
            free = [s for s in range(n) if used[s] == 0]
            if not free:
                continue
            k = min(rng.choice((1, 2, 4, 8)), len(free))
            slots = [(s, 1.0) for s in free[:k]]
        for s, f in slots:
            used[s] += f
        held[pid] = slots
        alive.add(pid)
        st = arb.read()
        pool = st.pools["GPU"]
        pinned = {pool[s] for h in st.holders.values() for s, _ in h.slots.get("GPU", ())}
        busy = frozenset(set(topo.indices) - (set(pool) - pinned))
        placement_node._CACHE.clear()
        placement_node._DECISIONS.clear()
        t0 = time.perf_counter()
        g = arb.grant(GrantRequest(pid=pid, key=f"task:{i}", slots={"GPU": tuple(slots)}))
        t1 = time.perf_counter()
        placement_node._CACHE.clear()
        placement_node._DECISIONS.clear()
        k = sum(1 for _, f in slots if f >= 1) or 1
        t2 = time.perf_counter()
        allocate(NodeState(topo, busy=busy), Request(gpus=k))
        t3 = time.perf_counter()
        arb.grant(GrantRequest(pid=-5, key="io"))
        t4 = time.perf_counter()
        data = encode_state(arb.read())
        t5 = time.perf_counter()
        fd = os.open(raw_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.write(fd, data)
        os.close(fd)
        os.replace(raw_tmp, raw_dst)
        t6 = time.perf_counter()
        assert g.waiting is None, g.waiting
        if i >= 50:
            grant_ms.append((t1 - t0) * 1e3)
            place_ms.append((t3 - t2) * 1e3)
            io_ms.append((t4 - t3) * 1e3)
            raw_ms.append((t6 - t5) * 1e3)
    return {"grant": (_pct(grant_ms, 0.5), _pct(grant_ms, 0.99)), "placement": (_pct(place_ms, 0.5), _pct(place_ms, 0.99)),
            "io": (_pct(io_ms, 0.5), _pct(io_ms, 0.99)), "raw": (_pct(raw_ms, 0.5), _pct(raw_ms, 0.99)), "devices": n,
            "plans": arb.chooser.answered, "placed": arb.chooser.placed}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--decisions", type=int, default=1000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="300 decisions, 1 repeat")
    a = ap.parse_args()
    if a.quick:
        a.decisions, a.repeats = 300, 1
    print(f"arbiter decision at a grant: {a.decisions} decisions x {a.repeats} repeats (median of repeats), ms")
    print(f"{'machine':<12} {'devices':>7} | {'grant p50':>9} {'grant p99':>9} | {'placement p50':>13} {'p99':>6} | "
          f"{'state I/O p50':>13} {'p99':>6} | {'raw write p50':>13} {'p99':>6} | {'from plans':>10} | target p99 <= 0.5")
    for m in MACHINES:
        runs = [run(m, a.decisions, seed) for seed in range(a.repeats)]

        def med(key: str, j: int) -> float:
            return statistics.median(r[key][j] for r in runs)

        ok = "yes" if med("grant", 1) <= 0.5 else "NO"
        share = runs[0]["plans"] / max(1, runs[0]["plans"] + runs[0]["placed"])
        print(f"{m:<12} {runs[0]['devices']:>7} | {med('grant', 0):9.3f} {med('grant', 1):9.3f} | "
              f"{med('placement', 0):13.3f} {med('placement', 1):6.3f} | {med('io', 0):13.3f} {med('io', 1):6.3f} | "
              f"{med('raw', 0):13.3f} {med('raw', 1):6.3f} | {share:10.0%} | {ok}")


if __name__ == "__main__":
    main()
