"""Stage 3 of a node's decision, the tie-breaks: among the sets tied on criteria 1-3, in this order.

Each returns the sets it keeps and, when it set some apart, why (a :class:`~._explain.Cut`):

1. :func:`by_near` -- ``near`` (data locality, only when asked): the modeled seconds to
   bring 1 GiB from each near device to the nearest chosen device
   (:func:`rayaccel.transfer.locality_cost`), summed; the lowest wins.
2. :func:`by_fragmentation` -- criterion 4, computed on nodes of up to 16 devices over
   *every* tied set (no cap), compares what each candidate leaves free, ``R``:

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

   Both are functions of ``R`` up to the node's symmetries (devices with identical
   link rows are interchangeable), so each is computed once per class of isomorphic
   remainders (:func:`._index.canonical`) and cached per topology.
3. :func:`resolve_classes` -- not a criterion: when the score stage kept one set per
   symmetry class, each class is replaced by its member with the best PCIe paths.
4. :func:`by_pcie` -- criterion 5, the PCIe paths under the links (summed per pair:
   same switch PIX > PXB > same root complex PHB > same socket NODE > SYS).
5. the lowest device indices (:func:`~._symmetry.lex_key`), in the caller.

Also here: :func:`takes_straggler`, the cluster placer's view of criterion 4 for
one-device jobs.
"""

from __future__ import annotations

from functools import partial

from ..transfer import Endpoint, locality_cost
from ._explain import CRITERIA, Cut
from ._filter import free_mask, list_devices
from ._index import TopoIndex, canonical, index_of, pool_mask
from ._score import NEAR_TIE_CAP, Scored, key_of, pcie_of
from ._symmetry import best_member, lex_key, near_classes
from ._table import Table, group_bits, pack_quality, table_of
from ._table import best as table_best
from .search import best_sets

#: Bytes assumed on each ``near`` device when modeling the locality cost.
NEAR_BYTES = 1 << 30
#: Sets tied on criteria 1-2 that ``near`` compares (table nodes; in key order).
NEAR_SCAN = 1024


def by_near(sc: Scored, cands: list[int]) -> Cut:
    """``near`` among the sets tied on criteria 1-2.

    Candidates: every set tied with the best on weakest link and total bandwidth (up
    to :data:`NEAR_SCAN`, table nodes), or above the table size the tied sets found
    plus, for each free near device, the best sets that hold it when they tie on
    criteria 1-2. The lowest locality cost wins; criteria 2b-3 then rank what is left
    (so the sets kept may differ from ``cands`` even when ``near`` told none apart).
    """
    ix, request, mask, req, res, near = sc.ix, sc.request, sc.mask, sc.req, sc.res, sc.near
    k = request.gpus
    tb = sc.tb
    flags = dict(nvlink=request.direct, nic=request.nic, same_numa=request.same_numa)
    if tb is not None:
        group = None
        free_near = sum(1 << d for d in near if mask >> d & 1)
        if free_near and (req | free_near).bit_count() <= k and len(near) == free_near.bit_count():
            # every near device free: the sets that hold them all cost 0 -- if they tie on criteria 1-2
            r = table_best(tb, mask, k, cap=NEAR_SCAN, req=req | free_near, coarse=True, **flags)
            if r is not None and r.key[:2] == res.key[:2]:
                group = r.sets + [m for m in res.sets if m & free_near != free_near][:1]
        if group is None:
            group = table_best(tb, mask, k, cap=NEAR_SCAN, req=req, coarse=True, **flags).sets
    else:
        group = list(res.sets)
        for d in near[:4]:
            if mask >> d & 1 and not req >> d & 1 and req.bit_count() < k:
                r = best_sets(ix, mask, k, tie_cap=NEAR_TIE_CAP, required=req | (1 << d),
                              classes=near_classes(ix, request.nic, near), **flags)
                if r is not None and r.key[:2] == res.key[:2]:
                    group += [m for m in r.sets if m not in group]
    costs = {m: near_cost(ix, near, m) for m in group}
    low = min(costs.values())
    cheap = [m for m in group if costs[m] == low]
    keys = {m: key_of(ix, m, request.nic)[1][:4] for m in cheap}  # criteria 1-3; the PCIe paths come after 4
    top = max(keys.values())
    left = [m for m in cheap if keys[m] == top]
    if len(cheap) == len(group):  # near told no set apart
        return Cut(left)
    other = min((m for m in group if costs[m] != low), key=lambda m: (costs[m], ix.devices_of(m)))
    line = (f"decided by: near (data locality): modeled {low / 1e6:.3g} ms to bring 1 GiB from each of device "
            f"{list_devices(list(request.near))} to the set, vs {costs[other] / 1e6:.3g} ms for {list(ix.devices_of(other))} "
            f"({len(group)} sets tie on weakest link and bandwidth)")
    # near is the first tie-break, so no earlier criterion can have decided: ``then`` is never used
    return Cut(left, "near", line, line, dropped=[m for m in group if m not in left][:5])


def by_fragmentation(sc: Scored, cands: list[int], n_tied: int) -> Cut:
    """Criterion 4 over ``cands`` (table nodes, two or more sets); ``n_tied``: how many sets they stand for."""
    ix, tb, state, k = sc.ix, sc.tb, sc.state, sc.request.gpus
    pool = free_mask(ix, state) if state.busy_partitions else ((1 << ix.n) - 1) & ~state.key[1]
    left, qual, part = fragmentation(ix, tb, pool_mask(ix), pool, cands, k)
    if part is None:
        return Cut(left, quality=qual)
    ties = f"{len(cands)}" if sc.sigs is None else f"{n_tied}+ (in {len(cands)} symmetry classes)"
    tail = f" ({ties} sets tie on criteria 1-3)"
    # the sentence is written only if the allocation is materialized (it scans the tied sets)
    return Cut(left, "criterion 4", partial(_why_fragmentation, ix, part, left[0], cands, qual, k, "decided by: ", tail),
               partial(_why_fragmentation, ix, part, left[0], cands, qual, k, "then: ", tail), quality=qual)


def fragmentation(ix: TopoIndex, tb: Table, usable: int, pool: int, cands: list[int], k: int):
    """Criterion 4 over ``cands`` (masks): (winners, {mask: quality}, which part decided).

    ``pool``: devices free for exclusive use (the remainder is ``pool & ~m``);
    ``usable``: the GPU pool (:func:`._index.pool_mask`: where groups live).
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


def _why_fragmentation(ix: TopoIndex, part: str, chosen: int, cands: list[int], qual: dict, k: int,
                       head: str, tail: str) -> str:
    mine = qual[chosen]
    if part == "4a":
        other = max((m for m in cands if qual[m][0] != mine[0]), key=lambda m: (qual[m][0], lex_key(ix, m)))
        diff = mine[0] & ~qual[other][0]
        s = diff.bit_length() - 1
        line = (f"criterion 4 (fragmentation): leaves a free {s}-device group as good as an idle node's best "
                f"{s}-set (weakest link and NUMA) whole; {list(ix.devices_of(other))} would break it")
    else:
        line = (f"criterion 4 (fragmentation): every set keeps the same free groups; this one leaves the free devices "
                f"best packed into further size-{max(k, 2)} sets")
    return head + line + tail


def resolve_classes(sc: Scored, left: list[int], cands: list[int], qual: dict) -> tuple[list[int], list[int], dict]:
    """Each symmetry class's member with the best PCIe paths (then lowest positions), for ``left``, ``cands``, ``qual``."""
    r = sc.request
    best_of = {m: best_member(sc.tb, sc.mask, r.gpus, sc.req, r.direct, r.nic, r.same_numa, sc.res.hit, sc.sigs[m])
               for m in left}
    qual = {best_of.get(m, m): q for m, q in qual.items()}
    return [best_of[m] for m in left], [best_of.get(m, m) for m in cands], qual


def by_pcie(sc: Scored, left: list[int]) -> Cut:
    """Criterion 5: the sets whose PCIe paths under the links score highest."""
    if len(left) < 2:
        return Cut(left)
    ix = sc.ix
    pc = {m: pcie_of(ix, m) for m in left}
    top = max(pc.values())
    best_pc = [m for m in left if pc[m] == top]
    if len(best_pc) == len(left):
        return Cut(left)
    upto = 4 if sc.tb is not None else 3
    return Cut(best_pc, "criterion 5", partial(_why_pcie_first, ix, pc, top, left, upto),
               f"then: {CRITERIA[4]}: score {top} for {len(best_pc)} of the {len(left)} sets left "
               f"(tied on criteria 1-{upto})")


def _why_pcie_first(ix: TopoIndex, pc: dict, top: int, left: list[int], upto: int) -> str:
    other = max((m for m in left if pc[m] != top), key=lambda m: (pc[m], lex_key(ix, m)))
    return (f"decided by: {CRITERIA[4]}: score {top} vs {pc[other]} for {list(ix.devices_of(other))} "
            f"({len(left)} sets tie on criteria 1-{upto})")


def near_costs(ix: TopoIndex) -> list[list[int]]:
    """Nanoseconds to bring :data:`NEAR_BYTES` from position ``d`` to position ``s`` (0 when equal). Cached."""
    got = ix.cache.get("near")
    if got is None:
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


def takes_straggler(state, chosen: int) -> int:
    """1 when the single device ``chosen`` (a position mask) has no free partner forming a best pair, else 0.

    A best pair: an s-group of size 2 (:meth:`~._table.Table.groups`: the node's best
    weakest link for a pair, on one NUMA node). Nodes above the table size: 0.
    """
    ix = index_of(state.topology)
    tb = table_of(ix)
    if tb is None:
        return 0
    usable = pool_mask(ix)
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
