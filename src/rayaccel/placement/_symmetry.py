"""The node's symmetry over sets: tied sets known by class, and the class member a tie-break keeps.

Devices with identical level and bandwidth rows (twins, :func:`._index.twin_classes`)
on the same NUMA node are interchangeable for criteria 1-4, so when many sets tie on
criteria 1-3 the score stage (:mod:`._score`) keeps one per symmetry class
(:func:`tie_classes`), the tie-breaks compare those, and :func:`best_member` gives
back the class member with the best PCIe paths (criterion 5). :func:`lex_key` orders
sets for the last tie-break, the lowest indices.
"""

from __future__ import annotations

from itertools import combinations, product

from ._index import TopoIndex, twin_classes
from ._table import _NUMA_SHIFT, Table, _ok

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


def near_classes(ix: TopoIndex, with_nic: bool, near: list[int]) -> list[int]:
    """Twin classes with each ``near`` position in a class of its own (the search must tell them apart)."""
    cls = list(twin_classes(ix, with_nic))
    top = max(cls, default=-1)
    for i, p in enumerate(near):
        cls[p] = top + 1 + i
    return cls
