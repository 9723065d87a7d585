"""A communication model: ring all-reduce over a device set.

NCCL's ring all-reduce moves every byte over each link of a ring, so its bus
bandwidth is bounded by the slowest link of the ring. We model it as the best
ring's bottleneck: the ring order over the set that maximizes its weakest
consecutive link (then its total), using the per-direction link bandwidths of
:mod:`rayaccel.topology`. Exact (bitmask dynamic programming) up to 10 devices,
nearest-neighbour plus 2-opt beyond; uniform sets (all pairs equal) are trivial.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import RequestError
from ..topology import NodeTopology
from ._index import TopoIndex, index_of

_EXACT_RING = 10


def allreduce_bandwidth_gbps(topology: NodeTopology, devices: Iterable[int]) -> float:
    """Modeled ring all-reduce bandwidth of ``devices``, GB/s (0.0 for fewer than 2 devices).

    Raises:
        RequestError: a device index the topology does not have.
    """
    ix = index_of(topology)
    devs = list(devices)
    for d in devs:
        if d not in ix.pos:
            raise RequestError(f"no device {d}", "devices", f"indices of the topology: {list(ix.indices)}")
    order = ring(ix, [ix.pos[d] for d in devs])
    return ring_bottleneck_mgbps(ix, order) / 1000.0


def ring_bottleneck_mgbps(ix: TopoIndex, order: list[int]) -> int:
    """Weakest consecutive link of a ring (positions), milli-GB/s; 0 for fewer than 2."""
    if len(order) < 2:
        return 0
    B = ix.bw
    return min(B[order[i]][order[(i + 1) % len(order)]] for i in range(len(order)))


def ring(ix: TopoIndex, positions: list[int]) -> list[int]:
    """Positions in the ring order that maximizes (bottleneck, total) of consecutive links. Cached."""
    ps = sorted(set(positions))
    k = len(ps)
    if k <= 2:
        return ps
    mask = 0
    for p in ps:
        mask |= 1 << p
    ck = ("ring", mask)
    hit = ix.cache.get(ck)
    if hit is not None:
        return hit
    B = ix.bw
    vals = {B[a][b] for i, a in enumerate(ps) for b in ps[i + 1:]}
    if len(vals) == 1:
        out = ps
    elif k <= _EXACT_RING:
        out = _dp_ring(B, ps)
    else:
        out = _two_opt(B, _greedy(B, ps))
    ix.cache[ck] = out
    return out


def _dp_ring(B, ps: list[int]) -> list[int]:
    k = len(ps)
    full = (1 << k) - 1
    NEG = (-1, -1)
    # dp[mask][j] = (bottleneck, total) of the best path from ps[0] through mask ending at j
    dp = [[NEG] * k for _ in range(1 << k)]
    parent = [[-1] * k for _ in range(1 << k)]
    dp[1][0] = (10**12, 0)
    for mask in range(1, 1 << k):
        if not mask & 1:
            continue
        row = dp[mask]
        for j in range(k):
            cur = row[j]
            if cur is NEG or not mask >> j & 1:
                continue
            bj = B[ps[j]]
            for nx in range(1, k):
                if mask >> nx & 1:
                    continue
                w = bj[ps[nx]]
                cand = (min(cur[0], w), cur[1] + w)
                nm = mask | (1 << nx)
                if cand > dp[nm][nx]:
                    dp[nm][nx] = cand
                    parent[nm][nx] = j
    best, last = NEG, -1
    for j in range(1, k):
        cur = dp[full][j]
        if cur is NEG:
            continue
        w = B[ps[j]][ps[0]]
        cand = (min(cur[0], w), cur[1] + w)
        if cand > best:
            best, last = cand, j
    order = []
    mask = full
    while last != -1:
        order.append(ps[last])
        prev = parent[mask][last]
        mask &= ~(1 << last)
        last = prev
    return order[::-1]


def _greedy(B, ps: list[int]) -> list[int]:
    left = set(ps[1:])
    out = [ps[0]]
    while left:
        cur = out[-1]
        nxt = max(sorted(left), key=lambda u: B[cur][u])
        out.append(nxt)
        left.discard(nxt)
    return out


def _key(B, order: list[int]) -> tuple[int, int]:
    ws = [B[order[i]][order[(i + 1) % len(order)]] for i in range(len(order))]
    return (min(ws), sum(ws))


def _two_opt(B, order: list[int]) -> list[int]:
    best = _key(B, order)
    improved = True
    rounds = 0
    while improved and rounds < 50:
        improved = False
        rounds += 1
        for i in range(1, len(order) - 1):
            for j in range(i + 1, len(order)):
                cand = order[:i] + order[i:j + 1][::-1] + order[j + 1:]
                ck = _key(B, cand)
                if ck > best:
                    order, best, improved = cand, ck, True
    return order
