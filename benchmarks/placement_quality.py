"""Placement quality: rayaccel vs first_free (Ray) vs besteffort (go-gpuallocator) vs random.

For every catalog machine and every importable capture, every k from 2 to the
device count, the idle node and S random partly busy states (S=100 for nodes
of up to 8 devices, 10 for 9-16; --quick: 10 / 2): the share of choices that
are optimal on criteria 1+2 (weakest link, then total bandwidth; brute force
over all k-subsets), and the modeled ring all-reduce bandwidth of the choice
divided by the best over all k-subsets of the free devices (exhaustive when
there are <= 3000 subsets, else over 3000 random subsets plus every policy's
choice: marked ~). Nodes above 16 devices are skipped (brute force is out of
reach; see placement_latency.py for their cost).

Run: python benchmarks/placement_quality.py [--quick]
"""

from __future__ import annotations

import argparse
import itertools
import math
import random
import statistics
import time

from _placement_common import capture_machines, catalog_machines

from rayaccel.placement import NodeState, Request
from rayaccel.placement._index import index_of
from rayaccel.placement.baselines import besteffort, first_free, random_policy
from rayaccel.placement.model import ring, ring_bottleneck_mgbps
from rayaccel.placement.node import allocate

POLICIES = {"rayaccel": allocate, "first_free": first_free, "besteffort": besteffort,
            "random": lambda s, r: random_policy(s, r, _RNG)}
_RNG = random.Random(3)
SAMPLE = 3000


def _key(ix, ps):
    weak, tot = None, 0
    for a, b in itertools.combinations(ps, 2):
        tot += ix.bw[a][b]
        w = ix.levels[ix.level[a][b]]
        weak = w if weak is None or w < weak else weak
    return (weak or (99, 0.0), tot)


def _ar(ix, ps):
    return ring_bottleneck_mgbps(ix, ring(ix, list(ps)))


def run_machine(topo, states, rng):
    ix = index_of(topo)
    n = ix.n
    ok = [i for i in range(n) if i not in ix.failed]
    opt = {p: 0 for p in POLICIES}
    ratios = {p: [] for p in POLICIES}
    times = []
    cases = 0
    sampled = False
    busy_sets = [frozenset()] + [frozenset(i for i in ok if rng.random() < rng.uniform(0.1, 0.7)) for _ in range(states)]
    for busy in busy_sets:
        free = [i for i in ok if i not in busy]
        state = NodeState(topo, busy=frozenset(ix.indices[i] for i in busy))
        for k in range(2, len(free) + 1):
            req = Request(gpus=k)
            combos = math.comb(len(free), k)
            if combos <= SAMPLE:
                subsets = list(itertools.combinations(free, k))
            else:
                sampled = True
                subsets = [tuple(sorted(rng.sample(free, k))) for _ in range(SAMPLE)]
            best_key = max(_key(ix, s) for s in subsets) if combos <= SAMPLE else None
            choices = {}
            for name, pol in POLICIES.items():
                t0 = time.perf_counter()
                a = pol(state, req)
                if name == "rayaccel":
                    times.append(time.perf_counter() - t0)
                choices[name] = tuple(sorted(ix.pos[d] for d in a.devices))
            if best_key is None:  # exact optimum from the (exhaustive) brute force is out of reach: use all subsets lazily
                best_key = max(_key(ix, s) for s in itertools.combinations(free, k))
            best_ar = max(_ar(ix, s) for s in list(subsets) + list(choices.values()))
            cases += 1
            for name, ps in choices.items():
                opt[name] += _key(ix, ps) == best_key
                ratios[name].append(_ar(ix, ps) / best_ar if best_ar else 1.0)
    return cases, opt, ratios, times, sampled


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer busy states (10 / 2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    machines, note = catalog_machines()
    caps, cnote = capture_machines()
    rng = random.Random(args.seed)
    print(f"placement quality ({'quick' if args.quick else 'full'}); machines: {note}; captures: {cnote}")
    hdr = (f"{'machine':36} {'n':>3} {'cases':>6} | {'optimal on criteria 1+2 (%)':^35} | {'all-reduce / best (mean)':^35} | rayaccel ms")
    sub = f"{'':36} {'':>3} {'':>6} | " + " ".join(f"{p[:8]:>8}" for p in POLICIES) + " | " + " ".join(f"{p[:8]:>8}" for p in POLICIES) + " | p50  p99"
    print(hdr)
    print(sub)
    tot_cases = 0
    tot_opt = {p: 0 for p in POLICIES}
    all_ratios = {p: [] for p in POLICIES}
    for name, topo in machines + caps:
        n = len(topo.devices)
        if n < 2 or n > 16:
            print(f"{name[:36]:36} {n:>3}  skipped ({'one device' if n < 2 else 'over 16 devices: no brute force'})")
            continue
        states = (10 if args.quick else 100) if n <= 8 else (2 if args.quick else 10)
        cases, opt, ratios, times, sampled = run_machine(topo, states, rng)
        tot_cases += cases
        for p in POLICIES:
            tot_opt[p] += opt[p]
            all_ratios[p] += ratios[p]
        times.sort()
        p50 = statistics.median(times) * 1e3
        p99 = times[min(len(times) - 1, int(0.99 * len(times)))] * 1e3
        print(f"{name[:36]:36} {n:>3} {cases:>6} | " + " ".join(f"{100 * opt[p] / cases:8.1f}" for p in POLICIES) + " | "
              + " ".join(f"{statistics.mean(ratios[p]):8.3f}" for p in POLICIES) + f" | {p50:.2f} {p99:.2f}" + (" ~" if sampled else ""))
    print(f"{'ALL':36} {'':>3} {tot_cases:>6} | " + " ".join(f"{100 * tot_opt[p] / max(tot_cases, 1):8.1f}" for p in POLICIES)
          + " | " + " ".join(f"{statistics.mean(all_ratios[p]):8.3f}" for p in POLICIES))
    print("optimal = same (weakest link, total pair bandwidth) as the brute-force best k-subset of the free devices;"
          " all-reduce = modeled ring bottleneck (rayaccel.placement.model); ~ = best all-reduce over sampled subsets;"
          " rayaccel ms = first (uncached) decision per state and k.")


if __name__ == "__main__":
    main()
