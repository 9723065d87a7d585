"""A communication model: ring all-reduce over a device set.

NCCL's ring all-reduce moves every byte over each link of a ring, so its bus
bandwidth is bounded by the slowest link of the ring. We model it as the best
ring's bottleneck: the ring order over the set that maximizes its weakest
consecutive link (then its total), using the per-direction link bandwidths of
:mod:`rayaccel.topology`. Exact up to 8 devices (a nearest-neighbour ring proven
optimal by upper bounds, else bitmask dynamic programming); beyond, 2-opt from the
nearest-neighbour ring unless the bounds prove it optimal; uniform sets are trivial.
"""

from __future__ import annotations

from typing import Iterable

from ..errors import RequestError
from ..topology import NodeTopology
from ._index import TopoIndex, index_of

_EXACT_RING = 8


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
    """Positions in the ring order that maximizes (bottleneck, total) of consecutive links. Cached per set.

    Cheap first: a nearest-neighbour ring is kept when it meets the upper
    bounds (bottleneck <= the largest threshold at which every device keeps two
    links and the set stays connected; total <= half the sum over devices of
    their two strongest links), which proves it optimal. Else exact bitmask DP up
    to :data:`_EXACT_RING` devices, 2-opt beyond (no optimality claim there).
    """
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
    else:
        out = _greedy(B, ps)
        if _key(B, out) != _bounds(B, ps, vals):
            out = _dp_ring(B, ps) if k <= _EXACT_RING else _two_opt(B, out)
    ix.cache[ck] = out
    return out


def _bounds(B, ps: list[int], vals: set) -> tuple[int, int]:
    """Upper bounds (bottleneck, total) over all rings through ``ps`` (see :func:`ring`)."""
    k = len(ps)
    bott = min(vals)
    for t in sorted(vals, reverse=True):
        if all(sum(1 for b in ps if b != a and B[a][b] >= t) >= 2 for a in ps):
            seen = {ps[0]}
            stack = [ps[0]]
            while stack:
                a = stack.pop()
                for b in ps:
                    if b not in seen and B[a][b] >= t:
                        seen.add(b)
                        stack.append(b)
            if len(seen) == k:
                bott = t
                break
    total2 = 0
    for a in ps:
        row = sorted((B[a][b] for b in ps if b != a), reverse=True)
        total2 += row[0] + row[1]
    return bott, total2 // 2


def _dp_ring(B, ps: list[int]) -> list[int]:
    """Exact, in two passes over subsets of ps[1:] (start fixed at ps[0]).

    (bottleneck, total) is not decomposable lexicographically -- a prefix with a
    higher bottleneck can lose on total once the ring closes through a weaker
    link -- so pass 1 finds the best bottleneck b* (max-min DP) and pass 2 the
    largest total over rings using only links >= b* (max-sum DP).
    """
    m = len(ps) - 1
    rows = [[B[ps[i + 1]][ps[j + 1]] for j in range(m)] for i in range(m)]
    start = [B[ps[0]][ps[j + 1]] for j in range(m)]
    bstar = _path_dp(rows, start, m, None)[0]
    _, order = _path_dp(rows, start, m, bstar)
    return [ps[0]] + [ps[j + 1] for j in order]


def _path_dp(rows, start, m: int, floor: int | None) -> tuple[int, list[int]]:
    """floor None: max over rings of the min link; else: max total over rings whose links are all >= floor."""
    size = 1 << m
    dp = [[-1] * m for _ in range(size)]
    parent = [[-1] * m for _ in range(size)]
    for j in range(m):
        w = start[j]
        if floor is None or w >= floor:
            dp[1 << j][j] = w
    for mask in range(1, size):
        row = dp[mask]
        for j in range(m):
            cur = row[j]
            if cur < 0:
                continue
            rj = rows[j]
            for nx in range(m):
                if mask >> nx & 1:
                    continue
                w = rj[nx]
                if floor is None:
                    val = cur if cur < w else w
                elif w < floor:
                    continue
                else:
                    val = cur + w
                nm = mask | (1 << nx)
                if val > dp[nm][nx]:
                    dp[nm][nx] = val
                    parent[nm][nx] = j
    full = size - 1
    best, last = -1, -1
    for j in range(m):
        cur = dp[full][j]
        if cur < 0:
            continue
        w = start[j]
        if floor is None:
            val = cur if cur < w else w
        elif w < floor:
            continue
        else:
            val = cur + w
        if val > best:
            best, last = val, j
    order = []
    mask = full
    while last != -1:
        order.append(last)
        prev = parent[mask][last]
        mask &= ~(1 << last)
        last = prev
    return best, order[::-1]


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
