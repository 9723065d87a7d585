"""What decides among sets tied on criteria 1-3: ``near`` (data locality), then fragmentation.

Criterion 4 (fragmentation), computed on nodes of up to 16 devices over *every*
tied set (no cap), compares what each candidate leaves free, ``R``:

a. **groups kept whole**: for each size ``s`` (largest first), whether ``R``
   still holds an *s-group* -- an s-set as good as the idle node's best s-set on
   weakest link and NUMA nodes (criteria 1 and 3). On a DGX-1 that is an NVLink
   quad at s=4 and an NV2 pair at s=2; on an 8x A10 with two NVLink quads a
   1- or 2-GPU job takes from the broken quad; on an NVSwitch box it keeps whole
   NUMA nodes. This is what protects later requests of *any* size. Bandwidth
   sums are left out on purpose: at large sizes they would let noise decide
   before the sizes where groups exist.
b. **packing at the request's size**: pack ``R`` greedily into best sets of
   size max(k, 2) (repeatedly take the best set of that size from what is left)
   and sum the weakest-link levels, then the bandwidths, of those sets. A
   1-GPU job thus takes a device whose partner is busy instead of breaking up an
   NVLink pair (k8s-device-plugin#1193).

Both are functions of ``R`` up to the node's symmetries (devices with
identical link rows are interchangeable), so each is computed once per class of
isomorphic remainders (:func:`canonical`) and cached per topology.

``near`` (a soft preference, ahead of criterion 4): the modeled seconds to
bring 1 GiB from each near device to the nearest chosen device
(:func:`rayaccel.transfer.locality_cost`), summed; the lowest wins.
"""

from __future__ import annotations

from ._index import TopoIndex
from ._table import _NUMA_SHIFT, Table, _ok, group_bits, pack_quality

#: Bytes assumed on each ``near`` device when modeling the locality cost.
NEAR_BYTES = 1 << 30


def canonical(ix: TopoIndex, rest: int) -> int:
    """A representative of ``rest`` under the twin symmetries (same count per twin class, lowest positions).

    Twins that differ in health or MIG mode are kept apart (they are not interchangeable).
    """
    got = ix.cache.get("canon")
    if got is None:
        from .search import twin_classes

        cls = twin_classes(ix, False, pcie=False)  # criterion 4 does not look at the PCIe paths
        mig = {d.index for d in ix.topology.devices if d.mig_mode}
        members: dict[tuple, list[int]] = {}
        for p, c in enumerate(cls):
            members.setdefault((c, p in ix.failed, ix.indices[p] in mig), []).append(p)
        singles = 0
        groups = []
        for ps in members.values():
            if len(ps) == 1:
                singles |= 1 << ps[0]
            else:
                cm = sum(1 << p for p in ps)
                prefix = [0]
                for p in ps:
                    prefix.append(prefix[-1] | (1 << p))
                groups.append((cm, prefix))
        got = ix.cache["canon"] = (singles, tuple(groups))
    singles, groups = got
    out = rest & singles
    for cm, prefix in groups:
        out |= prefix[(rest & cm).bit_count()]
    return out


def fragmentation(ix: TopoIndex, tb: Table, usable: int, pool: int, cands: list[int], k: int):
    """Criterion 4 over ``cands`` (masks): (winners, their quality, {mask: quality}, which part decided).

    ``pool``: devices free for exclusive use (the remainder is ``pool & ~m``);
    ``usable``: devices that are not failed or in MIG mode (where groups live).
    The quality is ``(groups kept, packing levels, packing milli-GB/s)``; "decided"
    is ``"4a"``, ``"4b"`` or None (still tied).
    """
    pool &= usable
    a_of = {}
    for m in cands:
        a_of[m] = group_bits(tb, usable, canonical(ix, pool & ~m))
    top_a = max(a_of.values())
    left = [m for m in cands if a_of[m] == top_a]
    decided = "4a" if len(left) < len(cands) else None
    quality = {m: (a_of[m],) for m in cands}
    if len(left) > 1:
        b_of = {m: pack_quality(tb, canonical(ix, pool & ~m), k) for m in left}
        top_b = max(b_of.values())
        win = [m for m in left if b_of[m] == top_b]
        if len(win) < len(left) and decided is None:
            decided = "4b"
        for m in left:
            quality[m] = (a_of[m], *b_of[m])
        left = win
    return left, quality, decided


def near_costs(ix: TopoIndex) -> list[list[int]]:
    """Nanoseconds to bring :data:`NEAR_BYTES` from position ``d`` to position ``s`` (0 when equal). Cached."""
    got = ix.cache.get("near")
    if got is None:
        from ..transfer import Endpoint, locality_cost

        topo = ix.topology
        eps = [Endpoint("node", d, topo) for d in ix.indices]
        got = [[round(locality_cost(eps[s], [(eps[d], NEAR_BYTES)]) * 1e9) for s in range(ix.n)] for d in range(ix.n)]
        ix.cache["near"] = got
    return got


def near_cost(ix: TopoIndex, near: list[int], m: int) -> int:
    """Summed over ``near`` positions: nanoseconds to the nearest chosen device of ``m``."""
    cost = near_costs(ix)
    ps = [p for p in range(ix.n) if m >> p & 1]
    return sum(min(cost[d][p] for p in ps) for d in near)


def near_classes(ix: TopoIndex, with_nic: bool, near: list[int]) -> list[int]:
    """Twin classes with each ``near`` position in a class of its own (the search must tell them apart)."""
    from .search import twin_classes

    cls = list(twin_classes(ix, with_nic))
    top = max(cls, default=-1)
    for i, p in enumerate(near):
        cls[p] = top + 1 + i
    return cls


def takes_straggler(state, chosen: int) -> int:
    """1 when the single device ``chosen`` (a position mask) has no free partner forming a best pair, else 0.

    A best pair: an s-group of size 2 (:meth:`~._table.Table.groups`: the node's best
    weakest link for a pair, on one NUMA node). Nodes above the table size: 0.
    """
    from ._index import index_of
    from ._table import table_of
    from .node import _plain_mask

    ix = index_of(state.topology)
    tb = table_of(ix)
    if tb is None:
        return 0
    usable = _plain_mask(ix)
    others = usable & ~state.key[1] & ~chosen
    if not others:
        return 1
    for s, bits in tb.groups(usable):
        if s == 2:
            while others:
                low = others & -others
                m = chosen | low
                if bits[m >> 3] >> (m & 7) & 1:
                    return 0
                others ^= low
            return 1
    return 0  # every pair of the node is a best pair


#: Above this many tied sets, criterion 4 runs on one set per symmetry class (see :func:`tie_classes`).
SCAN_CAP = 64
#: At most this many symmetry classes of tied sets are enumerated.
CLASS_CAP = 4096


def tie_classes(ix: TopoIndex, tb: Table, free: int, k: int, req: int, nvlink: bool, nic: bool, same_numa: bool,
                top: int) -> list[tuple[int, tuple]] | None:
    """One representative per symmetry class of the sets tied on criteria 1-3, or None when there are too many.

    Devices with identical level and bandwidth rows (twins, PCIe paths aside) on the
    same NUMA node are interchangeable for criteria 1-4, so a tied set is known up to
    symmetry by how many devices it takes from each twin class (its *signature*).
    This enumerates the signatures that sum to ``k`` and keeps those whose canonical
    set (the lowest free positions of each class) is tied with ``top`` (the coarse key:
    criteria 1-3) and meets the constraints; required devices are classes of their own.
    Returns ``[(representative mask, ((class mask, count), ...))]``.
    """
    from .search import twin_classes

    cls = list(twin_classes(ix, nic, pcie=False))
    top_id = max(cls, default=-1)
    for i, p in enumerate(q for q in range(ix.n) if req >> q & 1):
        cls[p] = top_id + 1 + i
    members: dict[int, list[int]] = {}
    for p in range(ix.n):
        if free >> p & 1:
            members.setdefault(cls[p], []).append(p)
    groups = list(members.values())
    bound = 1
    for g in groups:
        bound *= len(g) + 1
        if bound > CLASS_CAP:
            return None
    prefixes = []
    for g in groups:
        pre = [0]
        for p in g:
            pre.append(pre[-1] | (1 << p))
        prefixes.append((pre[-1], pre))
    out: list[tuple[int, tuple]] = []
    key = tb.key
    nic_mask = tb.nic_mask
    best_nic = -1

    def rec(j: int, left: int, m: int, counts: tuple) -> bool:
        nonlocal best_nic, out
        if left == 0:
            if key[m] >> _NUMA_SHIFT != top or not _ok(tb, m, nvlink, nic, same_numa, req):
                return True
            if nic:
                c = (m & nic_mask).bit_count()
                if c < best_nic:
                    return True
                if c > best_nic:
                    best_nic, out = c, []
            out.append((m, counts))
            return len(out) <= CLASS_CAP
        if j == len(groups):
            return True
        cm, pre = prefixes[j]
        for c in range(min(left, len(pre) - 1), -1, -1):
            if not rec(j + 1, left - c, m | pre[c], counts + ((cm, c),) if c else counts):
                return False
        return True

    if not rec(0, k, 0, ()):
        return None
    return out


def best_member(tb: Table, free: int, k: int, req: int, nvlink: bool, nic: bool, same_numa: bool,
                start: int | None, signature: tuple) -> int:
    """The member of a symmetry class with the best PCIe paths (then the lowest positions).

    ``signature``: ``((class mask, count), ...)`` as from :func:`tie_classes`; classes not
    named are taken 0 times. ``start``: the first tied set's index in the sorted
    k-subsets (the tie group is scanned from there, in key order); None (few sets,
    found by enumeration): the members are enumerated.
    """
    from itertools import combinations, product

    named = 0
    for cm, _ in signature:
        named |= cm
    if start is not None:
        masks, ends = tb.sorted_sets(k)
        outside = tb.full & ~free
        for m in masks[start:ends[start]]:
            if m & outside or m & ~named:
                continue
            if all((m & cm).bit_count() == c for cm, c in signature) and _ok(tb, m, nvlink, nic, same_numa, req):
                return m
    choices = [[sum(c) for c in combinations([1 << p for p in range(tb.n) if (free & cm) >> p & 1], cnt)]
               for cm, cnt in signature]
    best = None
    for parts in product(*choices):
        m = sum(parts)
        if _ok(tb, m, nvlink, nic, same_numa, req):
            key = (tb.key[m] & ((1 << _NUMA_SHIFT) - 1), _lex(m))
            if best is None or key > best[0]:
                best = (key, m)
    if best is None:  # pragma: no cover - tie_classes only returns classes with a valid member
        raise AssertionError("a signature from tie_classes has no member")
    return best[1]


def _lex(m: int) -> int:
    return (_REV8[m & 255] << 8) | _REV8[(m >> 8) & 255]


_REV8 = bytes(int(f"{i:08b}"[::-1], 2) for i in range(256))


def lex_key(ix: TopoIndex, m: int):
    """A key whose maximum is the set with the lowest positions (lexicographically), cheap on <= 16 devices."""
    if ix.n <= 16:
        return (_REV8[m & 255] << 8) | _REV8[(m >> 8) & 255]
    return tuple(-p for p in range(ix.n) if m >> p & 1)
