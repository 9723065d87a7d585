"""Exact search for the best k-device set on one node (criteria 1-3 of docs/ARCHITECTURE.md).

Algorithm (per call, over the free devices of a node):

1. Criterion 1 by thresholds: for each link level ``t`` present among free
   pairs, strongest first, keep the graph of pairs with level >= t, prune it to
   its (k-1)-core, and look for a k-clique. The first ``t`` with a clique is the
   best possible weakest link (no stronger threshold had one).
2. Criteria 2 and 3 by branch and bound over the cliques of that graph,
   maximizing (total pair bandwidth, -NUMA nodes, NIC proximity). The bandwidth
   bound for adding ``r`` more devices from candidates ``C`` is the sum of the
   ``r`` largest ``conn(v) + 1/2 * (r-1 largest bw(v, u), u in C)`` (each pair
   among new devices is counted half by each end, so it never under-estimates);
   the NUMA bound counts the NUMA nodes still needed to hold ``r`` more devices.
   Required devices seed the search (the clique starts from them). The PCIe
   paths under the links (criterion 5, after fragmentation) order the tied sets
   found.
3. Symmetry: devices whose link rows are identical (twins: same level,
   bandwidth and PCIe path to every other device, same NUMA node, same NIC proximity) are
   interchangeable, so within a twin class only prefixes are explored. An
   all-to-all NVSwitch domain collapses to one class per NUMA node, which makes
   large uniform domains (NVL72) exact and fast.

Nodes of up to 16 devices do not use this search: :mod:`._table` answers them
exactly from precomputed bitmask tables (much faster); this branch and bound
serves larger nodes (NVL72). The search is exact for any node when it finishes. Nodes above
:data:`EXACT_UP_TO` devices get an expansion budget; when it runs out the result
is marked ``optimal=False`` and carries ``bound_gbps``, an upper bound on the
total bandwidth any set could reach at that weakest-link level.
Results are memoised per (topology content, free mask, k, flags).
"""

from __future__ import annotations

from ..topology import PCIE_CLASSES
from ._index import TopoIndex, twin_classes
from ._search_result import SearchResult
from ._table import best as table_best
from ._table import table_of

#: Nodes of up to this many devices are searched without a budget (always exact).
EXACT_UP_TO = 16
#: Expansion budget for larger nodes.
BUDGET = 200_000
_DIRECT_CLASS = len(PCIE_CLASSES) + 1


class _Out(Exception):
    pass


def best_sets(ix: TopoIndex, free_mask: int, k: int, *, nvlink: bool = False, nic: bool = False,
              same_numa: bool = False, tie_cap: int | None = 12, required: int = 0,
              classes: list[int] | None = None) -> SearchResult | None:
    """The best ``k``-sets among ``free_mask`` (positions), or None when no set meets the constraints.

    Args:
        ix: the topology index. free_mask: bit i set when position i is free.
        k: set size (>= 1). nvlink: every pair must be directly linked.
        nic: at least one device must have an RDMA NIC at PIX/PXB (and more is better).
        same_numa: all devices on one NUMA node. tie_cap: how many tied sets to keep
            (None: every tied set; only on nodes with tables, else 12).
        required: positions (mask) every set must contain.
        classes: twin classes to use above the table size (default :func:`twin_classes`);
            a caller that tells some devices apart (``near``) passes finer ones.
    """
    ck = (free_mask, k, nvlink, nic, same_numa, tie_cap, required, None if classes is None else tuple(classes))
    cache = ix.results
    hit = cache.get(ck)
    if hit is not None or ck in cache:
        return hit
    tb = table_of(ix)
    if tb is not None:
        result = table_best(tb, free_mask, k, nvlink, nic, same_numa, tie_cap, required)
        if len(cache) > 100_000:
            cache.clear()
        cache[ck] = result
        return result
    cap = 12 if tie_cap is None else tie_cap
    free = [i for i in range(ix.n) if free_mask >> i & 1]
    if required & ~free_mask:
        result = None
    elif same_numa:
        groups: dict = {}
        for i in free:
            groups.setdefault(ix.numa[i], []).append(i)
        result = None
        for g in groups.values():
            gm = sum(1 << i for i in g)
            if required & ~gm:
                continue
            r = _search(ix, g, k, nvlink, nic, cap, required, classes)
            result = _merge(result, r, cap)
    else:
        result = _search(ix, free, k, nvlink, nic, cap, required, classes)
    if len(cache) > 100_000:
        cache.clear()
    cache[ck] = result
    return result


def _merge(a: SearchResult | None, b: SearchResult | None, cap: int) -> SearchResult | None:
    if a is None or b is None:
        return a or b
    if b.key > a.key:
        a, b = b, a
    if a.key == b.key:
        a.sets = (a.sets + b.sets)[:cap]
    else:
        a.runners = sorted(a.runners + [(b.key, m) for m in b.sets] + b.runners, key=lambda x: x[0], reverse=True)[:5]
    a.optimal = a.optimal and b.optimal
    a.expansions += b.expansions
    return a


def _search(ix: TopoIndex, free: list[int], k: int, nvlink: bool, nic: bool, cap: int, required: int = 0,
            classes: list[int] | None = None) -> SearchResult | None:
    if len(free) < k or k < 1:
        return None
    near = ix.nic_near
    req = [i for i in free if required >> i & 1]
    if len(req) > k:
        return None
    if k == 1:
        top = len(ix.levels)
        pool = req or free
        scored = sorted(((top, 0, -1, int(near[v]) if nic else 0, 0), 1 << v) for v in pool if not nic or near[v])
        if not scored:
            return None
        best = max(s[0] for s in scored)
        return SearchResult(best, [m for s, m in scored if s == best][:cap],
                            [(s, m) for s, m in scored if s != best][:5])
    lv = ix.level
    present = sorted({lv[a][b] for i, a in enumerate(free) for b in free[i + 1:]}, reverse=True)
    if req:
        ceiling = min((lv[a][b] for i, a in enumerate(req) for b in req[i + 1:]), default=None)
        if ceiling is not None:
            present = [t for t in present if t <= ceiling]
    if nvlink:
        present = [t for t in present if ix.levels[t][0] == _DIRECT_CLASS]
    budget = None if ix.n <= EXACT_UP_TO else BUDGET
    cls = classes if classes is not None else twin_classes(ix, nic)
    total = 0
    for t in present:
        alive = _core(ix, free, k, t)
        if len(alive) < k or any(r not in alive for r in req):
            continue
        if req:
            alive = [v for v in alive if v in req or all(lv[v][r] >= t for r in req)]
            if len(alive) < k:
                continue
        s = _Clique(ix, k, t, nic, cap, cls, budget)
        s.run(alive, req)
        total += s.expansions
        if s.best is not None:
            ties = sorted(s.ties, key=lambda m: -_pcie_sum(ix, m))  # the PCIe paths (criterion 5) order the ties
            runners = sorted(s.runners, reverse=True)[:5]
            res = SearchResult((t, *s.best, _pcie_sum(ix, ties[0])), ties,
                               [((t, *kk, _pcie_sum(ix, m)), m) for kk, m in runners],
                               optimal=not s.exhausted, expansions=total)
            if s.exhausted:
                res.bound_mgbps = s.root_bound
            return res
    return None


def _uniform(ix: TopoIndex):
    """(level, milli-GB/s) when every pair of the node has that one link, else None. Cached."""
    got = ix.cache.get("uniform", 0)
    if got == 0:
        vals = {(ix.level[a][b], ix.bw[a][b]) for a in range(ix.n) for b in range(a + 1, ix.n)}
        got = ix.cache["uniform"] = vals.pop() if len(vals) == 1 else None
    return got


def _pcie_sum(ix: TopoIndex, mask: int) -> int:
    ps = [p for p in range(ix.n) if mask >> p & 1]
    P = ix.pcie
    return sum(P[a][u] for i, a in enumerate(ps) for u in ps[i + 1:])


def _core(ix: TopoIndex, free: list[int], k: int, t: int) -> list[int]:
    lv = ix.level
    alive = set(free)
    changed = True
    while changed:
        changed = False
        for v in list(alive):
            deg = 0
            for u in alive:
                if u != v and lv[v][u] >= t:
                    deg += 1
            if deg < k - 1:
                alive.discard(v)
                changed = True
    return sorted(alive)


class _Clique:
    def __init__(self, ix: TopoIndex, k: int, t: int, nic: bool, cap: int, cls: list[int], budget: int | None):
        self.ix, self.k, self.t, self.nic, self.cap, self.cls, self.budget = ix, k, t, nic, cap, cls, budget
        self.best: tuple | None = None  # (bw, -numa, nic); the PCIe-path score orders the ties afterwards
        self.ties: list[int] = []
        self.runners: list[tuple[tuple, int]] = []
        self.expansions = 0
        self.exhausted = False
        self.root_bound: int | None = None

    def run(self, alive: list[int], req: list[int] = ()) -> None:
        ix = self.ix
        B, P = ix.bw, ix.pcie
        mask = bw = pc = nic_count = 0
        numas: dict = {}
        for v in req:
            for u in req:
                if u < v:
                    bw += B[v][u]
                    pc += P[v][u]
            mask |= 1 << v
            numas[ix.numa[v]] = numas.get(ix.numa[v], 0) + 1
            nic_count += ix.nic_near[v]
        cands = [v for v in alive if not mask >> v & 1]
        b0 = B[alive[0]][alive[1]] if len(alive) > 1 else 0
        uniform = _uniform(ix) == (self.t, b0) or \
            all(B[a][u] == b0 and ix.level[a][u] == self.t for i, a in enumerate(alive) for u in alive[i + 1:])
        try:
            if uniform:  # one NVSwitch-like domain: every k-set has the same bandwidth; only NUMA (and NICs) differ
                self.root_bound = b0 * self.k * (self.k - 1) // 2
                self._dfs_uniform(mask, numas, nic_count, cands, b0)
            else:
                conn = {v: sum(B[v][u] for u in req) for v in cands}
                self._dfs(mask, bw, numas, nic_count, cands, conn, root=True)
        except _Out:
            self.exhausted = True

    def _dfs_uniform(self, mask: int, numas: dict, nic_count: int, cands: list[int], b: int) -> None:
        """The search when every pair is alike: the bandwidth is fixed, so only the NUMA bound prunes."""
        self.expansions += 1
        if self.budget is not None and self.expansions > self.budget:
            raise _Out
        ix = self.ix
        r = self.k - mask.bit_count()
        if r == 0:
            self._leaf(mask, b * self.k * (self.k - 1) // 2, numas, nic_count)
            return
        if len(cands) < r:
            return
        best = self.best
        if best is not None:
            numa_lb = self._numa_lb(numas, cands, r)
            if numa_lb > -best[1]:
                return
            if len(self.ties) >= self.cap and numa_lb == -best[1] and (not self.nic or nic_count + r <= best[2]):
                return
        cls, near, numa = self.cls, ix.nic_near, ix.numa
        skipped: set[int] = set()
        if r == 1:  # the leaves, inline: only those that can tie or win
            bw_total = b * self.k * (self.k - 1) // 2
            have = len(numas)
            for v in cands:
                c = cls[v]
                if c in skipped:
                    continue
                skipped.add(c)
                cnt = have + (numa[v] not in numas)
                if best is not None and (-cnt < best[1] or (-cnt == best[1] and len(self.ties) >= self.cap
                                                            and (not self.nic or nic_count + near[v] <= best[2]))):
                    continue
                numas[numa[v]] = numas.get(numa[v], 0) + 1
                self._leaf(mask | (1 << v), bw_total, numas, nic_count + near[v])
                numas[numa[v]] -= 1
                if not numas[numa[v]]:
                    del numas[numa[v]]
                best = self.best
            return
        nc = len(cands)
        for idx in range(nc):
            if nc - idx < r:
                break
            v = cands[idx]
            c = cls[v]
            if c in skipped:
                continue
            skipped.add(c)
            nv = numa[v]
            numas[nv] = numas.get(nv, 0) + 1
            self._dfs_uniform(mask | (1 << v), numas, nic_count + near[v], cands[idx + 1:], b)
            numas[nv] -= 1
            if not numas[nv]:
                del numas[nv]

    def _leaf(self, mask: int, bw: int, numas: dict, nic_count: int) -> None:
        if self.nic and nic_count == 0:
            return
        key = (bw, -len(numas), nic_count if self.nic else 0)
        if self.best is None or key > self.best:
            if self.best is not None:
                self.runners.extend((self.best, m) for m in self.ties[:2])
            self.best, self.ties = key, [mask]
        elif key == self.best:
            if len(self.ties) < self.cap:
                self.ties.append(mask)
        else:
            self.runners.append((key, mask))
        if len(self.runners) > 20:
            self.runners = sorted(self.runners, reverse=True)[:5]

    def _dfs(self, mask: int, bw: int, numas: dict, nic_count: int, cands: list[int], conn: dict,
             root=False) -> None:
        self.expansions += 1
        if self.budget is not None and self.expansions > self.budget:
            raise _Out
        ix = self.ix
        r = self.k - bin(mask).count("1")
        if r == 0:
            self._leaf(mask, bw, numas, nic_count)
            return
        if len(cands) < r:
            return
        B = ix.bw
        # bandwidth bound (doubled to stay in integers)
        if r == 1:
            gains = [2 * conn[v] for v in cands]
        else:
            gains = []
            for v in cands:
                row = B[v]
                others = sorted((row[u] for u in cands if u != v), reverse=True)
                gains.append(2 * conn[v] + sum(others[: r - 1]))
        gains.sort(reverse=True)
        bound2 = 2 * bw + sum(gains[:r])
        if root:
            self.root_bound = bound2 // 2
        best = self.best
        if best is not None:
            if bound2 < 2 * best[0]:
                return
            if bound2 == 2 * best[0]:
                numa_lb = self._numa_lb(numas, cands, r)
                if numa_lb > -best[1]:
                    return
                full = len(self.ties) >= self.cap
                if full and numa_lb == -best[1] and (not self.nic or nic_count + r <= best[2]):
                    return
        lv, t, cls, near, numa = ix.level, self.t, self.cls, ix.nic_near, ix.numa
        skipped: set[int] = set()
        nc = len(cands)
        for idx in range(nc):
            if nc - idx < r:
                break
            v = cands[idx]
            c = cls[v]
            if c in skipped:
                continue
            skipped.add(c)
            row_l = lv[v]
            new = [u for u in cands[idx + 1:] if row_l[u] >= t]
            if len(new) < r - 1:
                continue
            row_b = B[v]
            nconn = {u: conn[u] + row_b[u] for u in new}
            nv = numa[v]
            numas[nv] = numas.get(nv, 0) + 1
            self._dfs(mask | (1 << v), bw + conn[v], numas, nic_count + near[v], new, nconn)
            numas[nv] -= 1
            if not numas[nv]:
                del numas[nv]

    def _numa_lb(self, numas: dict, cands: list[int], r: int) -> int:
        numa = self.ix.numa
        inside = 0
        other: dict = {}
        for v in cands:
            if numa[v] in numas:
                inside += 1
            else:
                other[numa[v]] = other.get(numa[v], 0) + 1
        need = r - inside
        if need <= 0:
            return len(numas)
        extra = 0
        for cnt in sorted(other.values(), reverse=True):
            extra += 1
            need -= cnt
            if need <= 0:
                break
        return len(numas) + extra
