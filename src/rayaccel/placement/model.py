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
    their two strongest links), which proves it optimal. Else exact up to
    :data:`_EXACT_RING` devices (branch and bound, bitmask DP past a step budget),
    2-opt beyond (no optimality claim there).
    """
    ps = sorted(set(positions))
    k = len(ps)
    if k <= 2:
        return ps
    mask = 0
    for p in ps:
        mask |= 1 << p
    rings = ix.rings
    hit = rings.get(mask)
    if hit is not None:
        return hit
    B = ix.bw
    vals = {B[a][b] for i, a in enumerate(ps) for b in ps[i + 1:]}
    if len(vals) == 1:
        out = ps
    else:
        out = _greedy(B, ps)
        bound = _bounds(B, ps, vals)
        if _key(B, out) != bound:
            out = _exact_ring(B, ps, out, bound, vals) if k <= _EXACT_RING else _two_opt(B, out)
    if len(rings) > 100_000:
        rings.clear()
    rings[mask] = out
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


def _exact_ring(B, ps: list[int], start: list[int], bound: tuple[int, int], vals: set) -> list[int]:
    """The best ring by branch and bound, in two passes (same answer as :func:`_dp_ring`, usually much faster).

    Pass 1: the best bottleneck b*: the strongest threshold between the start
    ring's bottleneck and the upper bound at which the links >= it hold a
    Hamiltonian cycle. Pass 2: the largest total over rings using only links
    >= b*, pruning a partial path when its total plus half the sum of the best
    remaining incidences (two per unvisited device, one at each open end)
    cannot beat the best ring found; it stops at once on reaching the bound.
    Past :data:`_BB_BUDGET` search steps it hands over to the DP (bounded worst case).
    """
    found: dict = {}
    try:
        return _bb_ring(B, ps, start, bound, vals, found)
    except _Budget:  # the DP, told what the branch and bound already knows (the bottleneck bounds, or b*)
        return _dp_ring(B, ps, found.get("bstar"), _key(B, start)[0], bound[0])


class _Budget(Exception):
    pass


#: Branch-and-bound steps before :func:`_exact_ring` falls back to the bitmask DP (150: the steps a
#: failing search wastes cost more than the DP saves past it; trn1 8-sets p99 0.53 -> 0.37 ms, mean unchanged).
_BB_BUDGET = 150


def _bb_ring(B, ps: list[int], start: list[int], bound: tuple[int, int], vals: set, found: dict) -> list[int]:
    k = len(ps)
    steps = [0]
    W = [[B[a][b] if a != b else -1 for b in ps] for a in ps]
    lo = _key(B, start)[0]
    bstar, order = lo, [ps.index(p) for p in start]
    for t in sorted((v for v in vals if lo < v <= bound[0]), reverse=True):
        cyc = _ham_cycle(W, k, t, steps)
        if cyc is not None:
            bstar, order = t, cyc
            break
    found["bstar"] = bstar
    tops = []
    for a in range(k):
        row = sorted((w for w in W[a] if w >= bstar), reverse=True)
        tops.append((row[0], row[0] + row[1]))
    ub2 = sum(t2 for _, t2 in tops)  # twice the bound on any ring's total at b*
    best = [sum(W[order[i]][order[(i + 1) % k]] for i in range(k)), order]
    if 2 * best[0] < ub2:
        adj = [sorted((b for b in range(k) if b != a and W[a][b] >= bstar), key=lambda b: -W[a][b]) for a in range(k)]
        rest2 = sum(t2 for _, t2 in tops[1:])

        def dfs(path: list[int], seen: int, cur: int, rem2: int) -> bool:
            steps[0] += 1
            if steps[0] > _BB_BUDGET:
                raise _Budget
            end = path[-1]
            if len(path) == k:
                w = W[end][0]
                if w >= bstar and cur + w > best[0]:
                    best[0], best[1] = cur + w, list(path)
                    return 2 * best[0] >= ub2
                return False
            for nx in adj[end]:
                if seen >> nx & 1:
                    continue
                w = W[end][nx]
                r2 = rem2 - tops[nx][1]
                # remaining incidences: two per unvisited device, one at nx (open end), one at 0 (closing)
                if 2 * (cur + w) + r2 + tops[nx][0] + tops[0][0] <= 2 * best[0]:
                    continue
                path.append(nx)
                if dfs(path, seen | (1 << nx), cur + w, r2):
                    return True
                path.pop()
            return False

        dfs([0], 1, 0, rest2)
    return [ps[i] for i in best[1]]


def _ham_cycle(W, k: int, t: int, steps: list[int]) -> list[int] | None:
    """A Hamiltonian cycle (local indices from 0) using only links >= t, or None. Raises _Budget (see steps)."""
    adj = [[b for b in range(k) if b != a and W[a][b] >= t] for a in range(k)]
    if any(len(x) < 2 for x in adj):
        return None
    path = [0]

    def dfs(seen: int) -> bool:
        steps[0] += 1
        if steps[0] > _BB_BUDGET:
            raise _Budget
        end = path[-1]
        if len(path) == k:
            return W[end][0] >= t
        for nx in adj[end]:
            if not seen >> nx & 1:
                path.append(nx)
                if dfs(seen | (1 << nx)):
                    return True
                path.pop()
        return False

    return path if dfs(1) else None


def _dp_ring(B, ps: list[int], bstar: int | None = None, lo: int | None = None, hi: int | None = None) -> list[int]:
    """Exact, in two passes over subsets of ps[1:] (start fixed at ps[0]).

    (bottleneck, total) is not decomposable lexicographically -- a prefix with a
    higher bottleneck can lose on total once the ring closes through a weaker
    link -- so pass 1 finds the best bottleneck b* (max-min DP) and pass 2 the
    largest total over rings using only links >= b* (max-sum DP).
    """
    m = len(ps) - 1
    rows = [[B[ps[i + 1]][ps[j + 1]] for j in range(m)] for i in range(m)]
    start = [B[ps[0]][ps[j + 1]] for j in range(m)]
    if bstar is None:
        bstar = _best_bottleneck(rows, start, m, lo, hi)
    _, order = _path_dp(rows, start, m, bstar)
    return [ps[0]] + [ps[j + 1] for j in order]


def _best_bottleneck(rows, start, m: int, lo: int | None = None, hi: int | None = None) -> int:
    """The largest t such that links >= t hold a Hamiltonian cycle through ps[0] (the max-min DP's value).

    Thresholds from the strongest down (only those in (lo, hi] when given: ``lo`` a
    bottleneck some ring reaches, ``hi`` an upper bound), each checked by a bitset
    path DP: ``ends[mask]`` = the devices a path from ps[0] through exactly ``mask``
    can end on.
    """
    full = (1 << m) - 1
    vals = sorted({w for r in rows for w in r} | set(start), reverse=True)
    if lo is not None:
        vals = [t for t in vals if t > lo and (hi is None or t <= hi)]
    for t in vals:
        first = sum(1 << j for j in range(m) if start[j] >= t)
        adj = [sum(1 << b for b in range(m) if b != a and rows[a][b] >= t) for a in range(m)]
        if first.bit_count() < (2 if m > 1 else 1) or any((a | first >> i & 1) == 0 for i, a in enumerate(adj)):
            continue
        ends = [0] * (full + 1)
        for j in range(m):
            if first >> j & 1:
                ends[1 << j] |= 1 << j
        for mask in range(1, full):
            e = ends[mask]
            while e:
                low = e & -e
                j = low.bit_length() - 1
                e ^= low
                nxt = adj[j] & ~mask
                while nxt:
                    lb = nxt & -nxt
                    nxt ^= lb
                    ends[mask | lb] |= lb
        if ends[full] & first:
            return t
    return lo if lo is not None else -1


def _path_dp(rows, start, m: int, floor: int | None) -> tuple[int, list[int]]:
    """floor None: max over rings of the min link; else: max total over rings whose links are all >= floor."""
    size = 1 << m
    dp = [[-1] * m for _ in range(size)]
    parent = [[-1] * m for _ in range(size)]
    for j in range(m):
        w = start[j]
        if floor is None or w >= floor:
            dp[1 << j][j] = w
    # Only live states (dp >= 0, a bitset per mask) and links >= floor, in ascending (mask, j, nx)
    # order as a full scan would visit them: the same updates, so the same ring.
    adjm = [sum(1 << nx for nx in range(m) if nx != j and (floor is None or rows[j][nx] >= floor))
            for j in range(m)]
    live = [0] * size
    for j in range(m):
        if dp[1 << j][j] >= 0:
            live[1 << j] |= 1 << j
    for mask in range(1, size):
        lv = live[mask]
        if not lv:
            continue
        row = dp[mask]
        while lv:
            lj = lv & -lv
            lv ^= lj
            j = lj.bit_length() - 1
            cur = row[j]
            rj = rows[j]
            nb = adjm[j] & ~mask
            while nb:
                low = nb & -nb
                nb ^= low
                nx = low.bit_length() - 1
                w = rj[nx]
                val = (cur if cur < w else w) if floor is None else cur + w
                nm = mask | low
                if val > dp[nm][nx]:
                    dp[nm][nx] = val
                    parent[nm][nx] = j
                    live[nm] |= low
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
