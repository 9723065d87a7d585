"""Exact best-set search by precomputed bitmask tables, for nodes of up to :data:`TABLE_UP_TO` devices.

Per topology (built once, ~0.1 s for 16 devices, kept in the topology index):

* ``key[m]`` for every device subset ``m`` (a bitmask over positions): criteria
  1-3 packed in one int -- weakest-link level, total pair bandwidth
  (milli-GB/s), number of NUMA nodes -- and, lowest, the PCIe-path score under
  the links (criterion 5, summed :data:`~._index.PCIE_PATH_SCORE`), so that a
  larger int is a better set. Tied sets are those equal above the PCIe field
  (criterion 4 decides among them before the PCIe paths do). Each entry is computed in O(1) from ``m`` without its
  lowest device, using per-device row minima / row sums over 8-bit halves of
  the mask.
* ``direct[m]``: every pair of ``m`` directly linked (NVLink/xGMI/NeuronLink).
* per set size ``k`` (lazily): all k-subsets sorted best first (ties in
  lexicographic order of their positions), and where each tie group ends.
* (lazily, for criterion 4) per size ``s``: a bitset over all masks, bit ``R``
  set when ``R`` contains an *s-group*: an s-set as good as the idle node's best
  s-set on weakest link and NUMA nodes (criteria 1 and 3). Built from the
  members by superset closure with big-int shifts (``n`` shifts per size).

A query (free mask ``F``, size ``k``, required mask ``Q``, constraints) is
exact for criteria 1-3:

* scan the sorted k-subsets and take the first one inside ``F`` that holds
  ``Q`` and meets the constraints (any earlier set is not inside ``F`` or fails
  them, so nothing better exists); its tie group gives the tied sets (up to
  ``cap``, or all of them with ``cap=None``; the whole group when ``nic`` must
  break the tie). The scan stops after ``4 * C(f - q, k - q) + 32`` sets, and then
* enumerate the ``C(f - q, k - q)`` candidate sets directly (few, since the scan
  only runs long when ``F`` holds few of them).

So a query costs O(min(scan position, C(f, k))) table reads, with no Python
objects built per candidate beyond ints.
"""

from __future__ import annotations

from itertools import combinations, islice
from math import comb

from ._index import TopoIndex, canonical
from ._search_result import SearchResult

#: Nodes of up to this many devices get the tables (2**n entries).
TABLE_UP_TO = 16
# key layout (low to high): PCIe-path score (10 bits: at most 120 pairs x 5), 31 - NUMA nodes
# (5 bits), total milli-GB/s (30 bits), weakest-link level.
_NUMA_SHIFT = 10
_BW_SHIFT = 15
_LVL_SHIFT = 45
_PCIE_MASK = (1 << _NUMA_SHIFT) - 1
_BW_MASK = (1 << (_LVL_SHIFT - _BW_SHIFT)) - 1
_RUNNER_SCAN = 512


class Table:
    """The tables of one topology (see module docstring)."""

    def __init__(self, ix: TopoIndex):
        n = ix.n
        self.n = n
        self.ix = ix
        self.full = (1 << n) - 1
        top = len(ix.levels)
        numa_ids: dict = {}
        nid = [numa_ids.setdefault(ix.numa[p], len(numa_ids)) for p in range(n)]
        self.nic_mask = sum(1 << p for p in range(n) if ix.nic_near[p])
        dmask = [sum(1 << j for j in range(n) if j != p and ix.direct[p][j]) for p in range(n)]
        lv, bw, pc = ix.level, ix.bw, ix.pcie
        inf = top
        # per device p, per 8-bit half h of the other devices: min level / summed bandwidth
        # and summed PCIe-path score (shifted into place) to them
        halves = []
        for p in range(n):
            per = []
            for base in (0, 8):
                mins = [inf] * 256
                sums = [0] * 256
                for h in range(1, 256):
                    low = h & -h
                    j = low.bit_length() - 1 + base
                    r = h ^ low
                    if j < n:
                        mins[h] = min(mins[r], lv[p][j])
                        sums[h] = sums[r] + (bw[p][j] << _BW_SHIFT) + pc[p][j]
                    else:
                        mins[h], sums[h] = mins[r], sums[r]
                per.append((mins, sums))
            halves.append(per)
        size = 1 << n
        lvl = [top] * size
        tot = [0] * size
        nb = [0] * size
        direct = bytearray(size)
        direct[0] = 1
        key = [0] * size
        for m in range(1, size):
            low = m & -m
            p = low.bit_length() - 1
            r = m ^ low
            if r:
                (mlo, slo), (mhi, shi) = halves[p]
                a, b = r & 255, r >> 8
                l = lvl[r]
                x = mlo[a]
                if x < l:
                    l = x
                x = mhi[b]
                if x < l:
                    l = x
                lvl[m] = l
                tot[m] = t = tot[r] + slo[a] + shi[b]
                nb[m] = g = nb[r] | (1 << nid[p])
                direct[m] = direct[r] and not (r & ~dmask[p])
            else:
                l, t = top, 0
                nb[m] = g = 1 << nid[p]
                direct[m] = 1
            key[m] = (l << _LVL_SHIFT) | t | ((31 - g.bit_count()) << _NUMA_SHIFT)
        self.key = tuple(key)  # tuples of ints drop out of the garbage collector's scans (lists do not)
        self.direct = direct
        self._sorted: dict[int, tuple[list[int], list[int]]] = {}
        self.quality: dict = {}  # (rest mask, size) -> criterion-4 packing quality
        self._groups: dict[int, list[tuple[int, bytes]]] = {}  # usable mask -> [(size, bitset bytes)]
        self.group_bits: dict = {}  # (usable mask, rest mask) -> criterion-4 group bits

    def sorted_sets(self, k: int) -> tuple[list[int], list[int]]:
        """(all k-subsets best first, index where each one's tie group ends: equal keys above the PCIe field)."""
        got = self._sorted.get(k)
        if got is None:
            n, key = self.n, self.key
            masks = [sum(1 << p for p in c) for c in combinations(range(n), k)]
            rev = {m: int(format(m, f"0{n}b")[::-1], 2) for m in masks}
            masks.sort(key=lambda m: (key[m], rev[m]), reverse=True)
            ends = [0] * len(masks)
            end = len(masks)
            for i in range(len(masks) - 1, -1, -1):
                if i + 1 < len(masks) and key[masks[i]] >> _NUMA_SHIFT != key[masks[i + 1]] >> _NUMA_SHIFT:
                    end = i + 1
                ends[i] = end
            got = self._sorted[k] = (tuple(masks), tuple(ends))
        return got

    def decode(self, m: int, nic: bool) -> tuple:
        """The SearchResult key tuple of set ``m``: (level, milli-GB/s, -NUMA nodes, near NICs, PCIe-path score)."""
        k = self.key[m]
        return (k >> _LVL_SHIFT, (k >> _BW_SHIFT) & _BW_MASK, ((k >> _NUMA_SHIFT) & 31) - 31,
                (m & self.nic_mask).bit_count() if nic else 0, k & _PCIE_MASK)

    def groups(self, usable: int) -> list[tuple[int, bytes]]:
        """Criterion 4's s-groups: ``[(s, bitset)]``, bit ``R`` of ``bitset`` set when mask ``R`` holds an s-group.

        An s-group is an s-subset of ``usable`` whose weakest link and NUMA count equal
        the best an s-subset of ``usable`` reaches (criterion 1, then 3). Sizes at which
        every s-subset qualifies are left out (they tell no remainder from another).
        Built once per usable mask: one pass over the subsets, then a superset closure
        per size by big-int shifts.
        """
        got = self._groups.get(usable)
        if got is not None:
            return got
        n, key = self.n, self.key
        best = [-1] * (n + 1)
        total = [0] * (n + 1)
        subs = list(_submasks(usable))
        for m in subs:
            k = key[m]
            v = ((k >> _LVL_SHIFT) << 5) | ((k >> _NUMA_SHIFT) & 31)
            c = m.bit_count()
            total[c] += 1
            if v > best[c]:
                best[c] = v
        nbytes = max(1, (1 << n) // 8)
        arrays = {c: bytearray(nbytes) for c in range(2, n)}
        count = [0] * (n + 1)
        for m in subs:
            c = m.bit_count()
            if 2 <= c < n:
                k = key[m]
                if ((k >> _LVL_SHIFT) << 5) | ((k >> _NUMA_SHIFT) & 31) == best[c]:
                    arrays[c][m >> 3] |= 1 << (m & 7)
                    count[c] += 1
        out = []
        for c in range(n - 1, 1, -1):
            if count[c] == 0 or count[c] == total[c]:
                continue
            f = int.from_bytes(arrays[c], "little")
            for i in range(n):
                f |= (f & _clear_pattern(n, i)) << (1 << i)
            out.append((c, f.to_bytes(nbytes, "little")))
        self._groups[usable] = out
        return out


def table_of(ix: TopoIndex) -> Table | None:
    """The (cached) :class:`Table` of ``ix``, or None above :data:`TABLE_UP_TO` devices."""
    if ix.n > TABLE_UP_TO:
        return None
    tb = ix.cache.get("table")
    if tb is None:
        tb = ix.cache["table"] = Table(ix)
    return tb


def _submasks(mask: int):
    """Every non-empty subset of ``mask`` (all of range(1, 2**n) when ``mask`` is full)."""
    if mask & (mask + 1) == 0:
        yield from range(1, mask + 1)
        return
    m = mask
    while m:
        yield m
        m = (m - 1) & mask


_CLEAR: dict = {}


def _clear_pattern(n: int, i: int) -> int:
    """The bitset over masks ``0 .. 2**n - 1`` of those with bit ``i`` clear. Cached."""
    got = _CLEAR.get((n, i))
    if got is None:
        step = 1 << i
        p = (1 << step) - 1
        length = 2 * step
        while length < (1 << n):
            p |= p << length
            length *= 2
        got = _CLEAR[(n, i)] = p
    return got


def _ok(tb: Table, m: int, nvlink: bool, nic: bool, same_numa: bool, req: int = 0) -> bool:
    if m & req != req:
        return False
    if nvlink and not tb.direct[m]:
        return False
    if same_numa and ((tb.key[m] >> _NUMA_SHIFT) & 31) != 30:
        return False
    return not nic or bool(m & tb.nic_mask)


def best(tb: Table, free: int, k: int, nvlink: bool = False, nic: bool = False, same_numa: bool = False,
         cap: int | None = 12, req: int = 0, coarse: bool = False):
    """Exact best k-sets inside ``free`` that contain ``req``: a :class:`~.search.SearchResult` or None.

    ``cap`` bounds the tied sets returned (None: all of them). With ``coarse``, the
    tied sets are all those equal to the best on criteria 1-2 only (weakest link and
    total bandwidth; ``nic`` then filters but does not rank), in key order.
    See the module docstring.
    """
    f = free.bit_count()
    q = req.bit_count()
    if k < 1 or f < k or req & ~free or q > k:
        return None
    constrained = bool(nvlink or nic or same_numa or req)
    nic_mask = tb.nic_mask
    if f == k or q == k:
        m = free if f == k else req
        if constrained and not _ok(tb, m, nvlink, nic, same_numa, req):
            return None
        return SearchResult(tb.decode(m, nic), [m])
    masks, ends = tb.sorted_sets(k)
    total = comb(f - q, k - q)
    limit = 4 * total + 32
    outside = tb.full & ~free
    hit = -1
    for i, m in enumerate(islice(masks, limit)):
        if not m & outside and (not constrained or _ok(tb, m, nvlink, nic, same_numa, req)):
            hit = i
            break
    if hit < 0:
        if limit >= len(masks):
            return None
        return _enumerate(tb, free, k, nvlink, nic, same_numa, cap, req, coarse)
    if coarse:
        top = tb.key[masks[hit]] >> _BW_SHIFT
        room = len(masks) if cap is None else cap
        ties = []
        for m in islice(masks, hit, None):
            if tb.key[m] >> _BW_SHIFT != top:
                break
            if not m & outside and (not constrained or _ok(tb, m, nvlink, nic, same_numa, req)):
                ties.append(m)
                if len(ties) >= room:
                    break
        res = SearchResult(tb.decode(ties[0], nic), ties)
        res.expansions = hit + 1
        return res
    end = ends[hit]
    ties: list[int] = []
    best_nic = -1
    room = len(masks) if cap is None else cap
    for m in islice(masks, hit, end):
        if m & outside or (constrained and not _ok(tb, m, nvlink, nic, same_numa, req)):
            continue
        if nic:
            c = (m & nic_mask).bit_count()
            if c > best_nic:
                best_nic, ties = c, [m]
                continue
            if c < best_nic:
                continue
        if len(ties) < room:
            ties.append(m)
        elif not nic:
            break
    runners = []
    for m in islice(masks, end, end + _RUNNER_SCAN):
        if not m & outside and (not constrained or _ok(tb, m, nvlink, nic, same_numa, req)):
            runners.append((tb.decode(m, nic), m))
            if len(runners) >= 3:
                break
    if nic:
        runners.sort(reverse=True)
    res = SearchResult(tb.decode(ties[0], nic), ties, runners)
    res.expansions = hit + 1
    res.hit = hit
    return res


def _enumerate(tb: Table, free: int, k: int, nvlink: bool, nic: bool, same_numa: bool, cap: int | None,
               req: int = 0, coarse: bool = False):
    key = tb.key
    bits = [1 << p for p in range(tb.n) if (free & ~req) >> p & 1]
    constrained = nvlink or nic or same_numa
    scored = []
    nic_mask = tb.nic_mask
    for c in combinations(bits, k - req.bit_count()):
        m = sum(c) | req
        if constrained and not _ok(tb, m, nvlink, nic, same_numa):
            continue
        s = key[m]
        # compare on (criteria 1-3, NICs), the PCIe field below them
        s = ((((s >> _NUMA_SHIFT) << 5) | ((m & nic_mask).bit_count() if nic else 0)) << _NUMA_SHIFT) | (s & _PCIE_MASK)
        scored.append((s, m))
    if not scored:
        return None
    if coarse:
        shift = _BW_SHIFT + 5
        scored.sort(key=lambda x: (x[0], -x[1]), reverse=True)
        top = scored[0][0] >> shift
        ties = [m for s, m in scored if s >> shift == top][:cap]
        return SearchResult(tb.decode(ties[0], nic), ties)
    top = max(s >> _NUMA_SHIFT for s, _ in scored)
    scored.sort(key=lambda x: (x[0], -x[1]), reverse=True)
    ties = [m for s, m in scored if s >> _NUMA_SHIFT == top][:cap]
    rest = [x for x in scored if x[0] >> _NUMA_SHIFT != top][:3]
    res = SearchResult(tb.decode(ties[0], nic), ties, [(tb.decode(m, nic), m) for _, m in rest])
    res.expansions = len(scored)
    return res


def group_bits(tb: Table, usable: int, rest: int) -> int:
    """Criterion 4a of the remainder ``rest``: bit ``s`` set when it still holds an s-group (see :meth:`Table.groups`).

    Compared as an int, larger groups count first. Cached per (usable, rest).
    """
    ck = (usable, rest)
    got = tb.group_bits.get(ck)
    if got is None:
        got = 0
        byte, bit = rest >> 3, rest & 7
        for s, bs in tb.groups(usable):
            if bs[byte] >> bit & 1:
                got |= 1 << s
        if len(tb.group_bits) > 200_000:
            tb.group_bits.clear()
        tb.group_bits[ck] = got
    return got


#: Pairs are packed exactly (a maximum matching) among at most this many free devices; greedily above
#: (the matching's cost grows as 2**free: 10 keeps a cold decision well under a millisecond).
EXACT_PAIRS_UP_TO = 10


def _pairs(tb: Table, r: int) -> tuple[int, int, int]:
    """The best packing of ``r`` into disjoint pairs: a maximum matching, exact (memoized per topology).

    Judged like :func:`pack_quality`. Greedy best-pair-first is not exact: on a DGX-1V with
    devices 0 and 3 taken, taking 6-7 first leaves 4-5 (one NVLink lane) where 4-7 and
    5-6 pack three NV2 pairs.
    """
    memo = tb.quality.setdefault("pairs", {})
    got = memo.get(r)
    if got is not None:
        return got
    c = canonical(tb.ix, r)  # remainders alike up to the node's symmetries pack alike
    if c != r:
        got = memo[r] = _pairs(tb, c)
        return got
    if r.bit_count() < 2:
        got = (0, 0, 0)
    else:
        low = r & -r
        rr = r & ~low
        got = _pairs(tb, rr)  # the lowest device left unpaired
        j = rr
        while j:
            b = j & -j
            j &= ~b
            kk = tb.key[low | b]
            sub = _pairs(tb, rr & ~b)
            cand = (sub[0] + (kk >> _LVL_SHIFT), sub[1] + ((kk >> _BW_SHIFT) & _BW_MASK),
                    sub[2] + ((kk >> _NUMA_SHIFT) & 31))
            if cand > got:
                got = cand
    memo[r] = got
    return got


def pack_quality(tb: Table, rest: int, k: int) -> tuple[int, int, int]:
    """Criterion 4: pack ``rest`` into best sets of size max(k, 2). Cached.

    Returns (sum of levels, sum of milli-GB/s, sum of NUMA scores): the packed sets
    judged by criteria 1, 2 and 3 in turn, like the sets later requests will take (a
    remainder whose best pairs span sockets packs worse than one whose pairs do not).
    Pairs are packed exactly (:func:`_pairs`, a maximum matching) among up to
    :data:`EXACT_PAIRS_UP_TO` free devices; larger sets, and pairs among more devices,
    greedily, the best set first.
    """
    s = max(k, 2)
    ck = (rest, s)
    got = tb.quality.get(ck)
    if got is not None:
        return got
    if s == 2 and rest.bit_count() <= EXACT_PAIRS_UP_TO:
        got = tb.quality[ck] = _pairs(tb, rest)
        return got
    lv = bw = nu = 0
    r = rest
    if s <= 3 and r.bit_count() > s:  # one pass over the (short) sorted list is the same greedy choice
        need = s
        for m in tb.sorted_sets(s)[0]:
            if not m & ~r:
                kk = tb.key[m]
                lv += kk >> _LVL_SHIFT
                bw += (kk >> _BW_SHIFT) & _BW_MASK
                nu += (kk >> _NUMA_SHIFT) & 31
                r &= ~m
                if r.bit_count() < need:
                    break
    while r.bit_count() >= s:
        if r.bit_count() == s:
            m = r
        else:
            res = best(tb, r, s, cap=1)
            if res is None:
                break
            m = res.sets[0]
        kk = tb.key[m]
        lv += kk >> _LVL_SHIFT
        bw += (kk >> _BW_SHIFT) & _BW_MASK
        nu += (kk >> _NUMA_SHIFT) & 31
        r &= ~m
    if len(tb.quality) > 200_000:
        tb.quality.clear()
    got = tb.quality[ck] = (lv, bw, nu)
    return got
