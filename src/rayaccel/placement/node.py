"""The node allocator: the best set of whole devices on one node.

Criteria (docs/ARCHITECTURE.md "What the best set means"), in order:

1. the weakest link among chosen pairs is as strong as possible;
2. then the total pair bandwidth is as large as possible;
* ``near`` (when asked): the lowest modeled cost of bringing the data on the
  near devices to the set (:mod:`._tiebreak`);
3. then the fewest NUMA nodes (and, with ``nic=True``, the most devices near an
   RDMA NIC);
4. then the least fragmentation, over every set tied so far (nodes of up to 16
   devices): keep the largest well-connected free groups whole, then pack what
   is left best at the request's size (:mod:`._tiebreak`);
5. then the PCIe paths under the links are as close as possible (summed per
   pair: same switch PIX > PXB > same root complex PHB > same socket NODE >
   SYS): among NVLink pairs that tie on everything else, the one that also
   shares a PCIe switch wins, as go-gpuallocator's link weights have it;
6. then the lowest device indices.

``required`` devices are a hard constraint: every candidate set holds them.
Criteria 1-3 come from the exact search of :mod:`.search` (bitmask tables up to
16 devices). :meth:`Allocation.explain` names the criterion that decided.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial

from ..errors import RequestError
from ..units import format_bytes
from ._index import TopoIndex, index_of
from ._table import pack_quality, table_of
from ._table import _NUMA_SHIFT
from ._tiebreak import SCAN_CAP, best_member, fragmentation, lex_key, near_classes, near_cost, tie_classes
from .model import ring, ring_bottleneck_mgbps
from .request import Request
from .result import Allocation, Rejection, Score
from .search import EXACT_UP_TO, SearchResult, best_sets
from .state import NodeState, _ranges

#: Tied sets kept above :data:`~.search.EXACT_UP_TO` devices (criterion 4 is not computed there).
TIE_CAP = 12
#: Tied sets kept above the table size when ``near`` must choose among them.
NEAR_TIE_CAP = 64
_CACHE: dict = {}  # (state key, request) -> Allocation | Rejection
_DECISIONS: dict = {}  # (state key, request) -> Decision | Allocation | Rejection
_CACHE_MAX = 200_000


@dataclass(eq=False, slots=True)
class Decision:
    """A node's choice of devices before the costly parts of its :class:`Allocation`.

    Criteria 1-4 are settled here (the chosen set is final); what only a person
    or the winning node needs -- the ring order, the all-reduce model, the
    scores of the runners-up -- is left to :func:`materialize`. The cluster
    placer ranks nodes on decisions and materializes only the winner.

    Attributes:
        state / request: what was decided on. chosen: the set (position mask).
        res: the search result (tied sets, runners, optimality). quality: criterion 4
        of the chosen set, or None. losers: ``(mask, quality)`` of tied sets not chosen.
        why: sentences on the choice (some deferred as zero-argument callables until
            :func:`materialize` writes them), the first naming the criterion that decided; when
            that criterion left several sets, ``"then: ..."`` lines name the later ones that chose among them.
        decided_by: that criterion (the first in order that set the chosen set apart from a set
            tied with it so far), e.g. ``"criterion 2"``, ``"near"``, ``"tie: lowest indices"``.
        weakest_rank: Link.rank of the weakest pair (None for one device).
        key: equal to ``Score.key()`` of the materialized allocation.
    """

    state: NodeState
    request: Request
    chosen: int
    res: SearchResult
    quality: tuple | None
    losers: tuple
    why: tuple[str, ...]
    weakest_rank: tuple | None
    key: tuple
    decided_by: str | None = None
    alloc: Allocation | None = None


def allocate(state: NodeState, request: Request) -> Allocation | Rejection:
    """Place ``request`` on one node. Results are cached per (state key, request)."""
    hit = allocate_raw(state, request)
    if state.node_id is not None and hit.node != state.node_id:
        return replace(hit, node=state.node_id)
    return hit


def allocate_raw(state: NodeState, request: Request) -> Allocation | Rejection:
    """Like :func:`allocate` but the cached answer as is (its ``node`` may name another node of equal state)."""
    ck = (state.key, request)
    hit = _CACHE.get(ck)
    if hit is None:
        d = decide(state, request)
        hit = materialize(d) if isinstance(d, Decision) else d
        if len(_CACHE) >= _CACHE_MAX:
            _CACHE.clear()
        _CACHE[ck] = hit
    return hit


def decide(state: NodeState, request: Request) -> Decision | Allocation | Rejection:
    """The node's choice: a :class:`Decision` for whole devices (an Allocation for MIG / shared). Cached."""
    ck = (state.key, request)
    hit = _DECISIONS.get(ck)
    if hit is None:
        if request.kind == "mig":
            from .mig import place_instance

            hit = place_instance(state, request)
        elif request.kind == "shared":
            from .memory import place_shared

            hit = place_shared(state, request)
        else:
            hit = _decide_devices(state, request)
        if len(_DECISIONS) >= _CACHE_MAX:
            _DECISIONS.clear()
        _DECISIONS[ck] = hit
    return hit


def _plain_mask(ix: TopoIndex) -> int:
    """Positions usable for whole-device requests on an idle node (not failed, not in MIG mode). Cached."""
    got = ix.cache.get("plain")
    if got is None:
        mig = {d.index for d in ix.topology.devices if d.mig_mode}
        got = ix.cache["plain"] = sum(1 << i for i, d in enumerate(ix.indices) if i not in ix.failed and d not in mig)
    return got


def _failed_mask(ix: TopoIndex) -> int:
    return sum(1 << i for i in ix.failed)


def free_mask(ix: TopoIndex, state: NodeState) -> int:
    """Positions free for exclusive use (not busy, no shared memory, no busy MIG instance, not failed)."""
    taken = state.taken()
    m = 0
    for i, d in enumerate(ix.indices):
        if d not in taken and i not in ix.failed:
            m |= 1 << i
    return m


def _unfit(ix: TopoIndex, state: NodeState, request: Request) -> dict[int, str]:
    """Device index -> why it cannot take part in ``request`` (devices absent here are eligible)."""
    taken = state.taken()
    busy_parts = {p.parent for p in state.topology.partitions() if p.key in state.busy_partitions}
    devs = {d.index: d for d in state.topology.devices}
    out: dict[int, str] = {}
    for i, idx in enumerate(ix.indices):
        d = devs[idx]
        if i in ix.failed:
            out[idx] = "failed"
        elif idx in state.busy:
            out[idx] = "busy"
        elif idx in busy_parts:
            out[idx] = "with busy MIG instances"
        elif idx in taken:
            out[idx] = "holding shared memory reservations"
        elif d.mig_mode:
            out[idx] = "in MIG mode (use mig=...)"
        elif request.vendor and d.vendor.lower() != request.vendor.lower():
            out[idx] = f"not vendor {request.vendor}"
        elif request.model and request.model.lower() not in (d.model or "").lower():
            out[idx] = f"not model ~{request.model!r}"
        elif request.gpu_memory is not None and d.memory_bytes is None:
            out[idx] = "of unknown memory size"
        elif request.gpu_memory is not None and d.memory_bytes < request.gpu_memory:  # type: ignore[operator]
            out[idx] = f"memory: has {format_bytes(d.memory_bytes)}, {format_bytes(request.gpu_memory)} asked"  # type: ignore[arg-type]
    return out


def eligible(ix: TopoIndex, state: NodeState, request: Request) -> tuple[int, list[str]]:
    """(mask of devices eligible for ``request``, sentences on why the others are not)."""
    unfit = _unfit(ix, state, request)
    mask = 0
    why: dict[str, list[int]] = {}
    notes: list[str] = []
    for i, idx in enumerate(ix.indices):
        r = unfit.get(idx)
        if r is None:
            mask |= 1 << i
        elif r.startswith("memory: "):
            notes.append(f"device {idx} {r[len('memory: '):]}")
        else:
            why.setdefault(r, []).append(idx)
    reasons = [f"{len(v)} {'is' if len(v) == 1 else 'are'} {k}: {_list(v)}" for k, v in why.items()]
    return mask, reasons + notes[:6]


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:12])) + (" ..." if len(xs) > 12 else "")


def score_of(ix: TopoIndex, mask: int, result: SearchResult | None = None, with_nic: bool = False,
             quality: tuple | None = None, allreduce: bool = True) -> Score:
    """The :class:`Score` of the set ``mask`` (positions); ``allreduce=False`` skips the ring model (None)."""
    ps = [i for i in range(ix.n) if mask >> i & 1]
    weak = None
    tb = table_of(ix)
    if tb is not None:  # sums from the table; the weakest pair is the first one at the weakest level
        lvl, total, neg_numa, _, pcie = tb.decode(mask, False)
        if len(ps) > 1:
            weak = _first_pair_at(ix.level, ps, lvl)
        numa_nodes = -neg_numa
    else:
        total = pcie = 0
        numa_nodes = len({ix.numa[p] for p in ps})
        for a_i, a in enumerate(ps):
            for b in ps[a_i + 1:]:
                total += ix.bw[a][b]
                pcie += ix.pcie[a][b]
                key = (ix.level[a][b], ix.bw[a][b])
                if weak is None or key < weak[0]:
                    weak = (key, a, b)
    ar = ring_bottleneck_mgbps(ix, ring(ix, ps)) / 1000.0 if allreduce else None
    return Score(
        weakest=None if weak is None else ix.label(weak[1], weak[2]),
        weakest_rank=None if weak is None else ix.levels[weak[0][0]],
        total_bandwidth_gbps=total / 1000.0,
        pcie_score=pcie,
        numa_nodes=numa_nodes,
        nic_near=sum(ix.nic_near[p] for p in ps) if with_nic else 0,
        free_quality=quality,
        allreduce_bandwidth_gbps=ar,
        optimal=True if result is None else result.optimal,
        bound_gbps=None if result is None or result.bound_mgbps is None else result.bound_mgbps / 1000.0,
    )


def _first_pair_at(L, ps: list[int], lvl: int) -> tuple:
    """((lvl,), a, b): the first pair of ``ps`` at level ``lvl`` (one level is one link rank, so any will do)."""
    for i, a in enumerate(ps):
        row = L[a]
        for b in ps[i + 1:]:
            if row[b] == lvl:
                return ((lvl,), a, b)
    raise AssertionError("no pair at the weakest level")  # pragma: no cover


def free_quality(ix: TopoIndex, rest: int, k: int) -> tuple:
    """Criterion 4b alone: greedy packing of ``rest`` into sets of size max(k, 2); (sum of weakest levels, sum of milli-GB/s)."""
    tb = table_of(ix)
    if tb is not None:
        return pack_quality(tb, rest, k)
    s = max(k, 2)
    lv = bw = 0
    while bin(rest).count("1") >= s:
        r = best_sets(ix, rest, s, tie_cap=1)
        if r is None:
            break
        lv += r.key[0]
        bw += r.key[1]
        rest &= ~r.sets[0]
    return (lv, bw)


def _decide_devices(state: NodeState, request: Request) -> Decision | Rejection:
    ix = index_of(state.topology)
    k = request.gpus
    for name in ("required", "near"):
        bad = [d for d in getattr(request, name) if d not in ix.pos]
        if bad:
            raise RequestError(f"no device {bad[0]} on this node", name, f"device indices {_ranges(ix.indices)}")
    if request.vendor or request.model or request.gpu_memory is not None or state.busy_partitions:
        mask, excluded = eligible(ix, state, request)
    else:  # the common case, from the state key: not taken, not failed, not in MIG mode
        mask = _plain_mask(ix) & ~state.key[1]
        excluded = None
    n_free = mask.bit_count()
    req = ix.mask_of(request.required) if request.required else 0
    if req & ~mask:
        unfit = _unfit(ix, state, request)
        lost = [d for d in request.required if not mask >> ix.pos[d] & 1]
        return Rejection(tuple(f"required device {d} is {unfit.get(d, 'not eligible').replace('memory: ', '')}"
                               for d in lost), request, state.node_id)
    if n_free < k:
        if excluded is None:
            excluded = eligible(ix, state, request)[1]
        head = f"only {n_free} device{'s' if n_free != 1 else ''} free{' that match' if request.vendor or request.model or request.gpu_memory else ''}, {k} asked"
        if ix.n < k:
            head = f"the node has {ix.n} device{'s' if ix.n != 1 else ''}, {k} asked"
        return Rejection((head, *excluded), request, state.node_id)
    nvlink = request.interconnect == "nvlink"
    near = [ix.pos[d] for d in request.near]
    exact = ix.n <= EXACT_UP_TO
    if exact:
        cap = SCAN_CAP
        classes = None
    else:
        cap = NEAR_TIE_CAP if near else (max(TIE_CAP, ix.n) if k == 1 else TIE_CAP)
        classes = near_classes(ix, request.nic, near) if near else None
    res = best_sets(ix, mask, k, nvlink=nvlink, nic=request.nic, same_numa=request.same_numa, tie_cap=cap,
                    required=req, classes=classes)
    if res is None:
        return Rejection(tuple(_why_none(ix, mask, request)), request, state.node_id)
    cands = res.sets
    why: list[str] = []
    quality = None
    losers: list[tuple[int, tuple | None]] = []
    decided = None
    n_tied = len(cands)
    sigs = None  # representative -> signature, when the tied sets are many (one per symmetry class)
    tb = table_of(ix) if exact else None
    if tb is not None and n_tied >= SCAN_CAP and not near:
        top = tb.key[cands[0]] >> _NUMA_SHIFT
        reps = tie_classes(ix, tb, mask, k, req, nvlink, request.nic, request.same_numa, top)
        if reps is not None:
            sigs = dict(reps)
            cands = list(sigs)
        else:  # little symmetry: every tied set
            res = best_sets(ix, mask, k, nvlink=nvlink, nic=request.nic, same_numa=request.same_numa, tie_cap=None,
                            required=req)
            cands = res.sets
            n_tied = len(cands)
    if near:
        cands, line, dropped = _near_choice(ix, mask, k, request, req, res, near)
        if line is not None:
            decided = "near"
            why.append(line)
            losers += [(m, None) for m in dropped]
            n_tied = len(cands)
    qual: dict = {}
    left = cands
    if len(cands) > 1 and tb is not None:
        pool = free_mask(ix, state) if state.busy_partitions else ((1 << ix.n) - 1) & ~state.key[1]
        left, qual, part = fragmentation(ix, tb, _plain_mask(ix), pool, cands, k)
        if part is not None:
            ties = f"{len(cands)}" if sigs is None else f"{n_tied}+ (in {len(cands)} symmetry classes)"
            # the sentence is written only if the allocation is materialized (it scans the tied sets)
            head = "decided by: " if decided is None else "then: "  # then: near dropped some, 4 chose among the rest
            why.append(partial(_why_fragmentation, ix, tb, part, left[0], cands, qual, k,
                               head, f" ({ties} sets tie on criteria 1-3)"))
            if decided is None:
                decided = "criterion 4"
    if sigs is not None:  # each class's member with the best PCIe paths (then lowest positions)
        start = res.hit
        flags = (request.interconnect == "nvlink", request.nic, request.same_numa)
        best_of = {m: best_member(tb, mask, k, req, *flags, start, sigs[m]) for m in left}
        qual = {best_of.get(m, m): q for m, q in qual.items()}
        left = [best_of[m] for m in left]
        cands = [best_of.get(m, m) for m in cands]
    if len(left) > 1:
        pc = {m: _pcie_of(ix, m) for m in left}
        top = max(pc.values())
        best_pc = [m for m in left if pc[m] == top]
        if len(best_pc) < len(left):
            upto = 4 if tb is not None else 3
            if decided is None:
                decided = "criterion 5"
                other = max((m for m in left if pc[m] != top), key=lambda m: (pc[m], lex_key(ix, m)))
                why.append(f"decided by: {_CRITERIA[4]}: score {top} vs {pc[other]} for {list(ix.devices_of(other))} "
                           f"({len(left)} sets tie on criteria 1-{upto})")
            else:  # an earlier criterion dropped some sets; the PCIe paths chose among those left
                why.append(f"then: {_CRITERIA[4]}: score {top} for {len(best_pc)} of the {len(left)} sets left "
                           f"(tied on criteria 1-{upto})")
        left = best_pc
    chosen = max(left, key=lambda m: lex_key(ix, m))
    if decided is not None and len(left) > 1:
        why.append(f"then: tie: lowest indices ({len(left)} sets left equal on every criterion)")
    quality = qual.get(chosen)
    losers = [(m, qual.get(m)) for m in cands[:8] if m != chosen] + losers
    if decided is None:
        if n_tied > 1:
            decided = "tie: lowest indices"
            extra = "" if exact else f"; criterion 4 is computed up to {EXACT_UP_TO} devices"
            cap_note = "+" if n_tied >= cap else ""
            if sigs is not None:
                extra += f"; {len(sigs)} symmetry classes"
            why.append(f"decided by: tie: lowest indices ({n_tied}{cap_note} sets equal on every criterion{extra})")
        elif res.runners:
            decided = _criterion_of(res.key, res.runners[0][0])
            why.append(partial(_why_criteria, ix, chosen, res.key, res.runners[0], request.nic))
        else:
            decided = "only set"
            why.append("decided by: the only set that meets the request")
    weakest_rank, key = _key_of(ix, chosen, request.nic)
    return Decision(state, request, chosen, res, quality, tuple(losers), tuple(why), weakest_rank, key, decided)


#: Sets tied on criteria 1-2 that ``near`` compares (table nodes; in key order).
NEAR_SCAN = 1024


def _near_choice(ix: TopoIndex, mask: int, k: int, request: Request, req: int, res: SearchResult, near: list[int]):
    """``near`` among the sets tied on criteria 1-2: (candidates left, "decided by" line or None, sets it dropped).

    Candidates: every set tied with the best on weakest link and total bandwidth (up
    to :data:`NEAR_SCAN`, table nodes), or above the table size the tied sets found
    plus, for each free near device, the best sets that hold it when they tie on
    criteria 1-2. The lowest locality cost wins; criteria 2b-3 then rank what is left.
    """
    tb = table_of(ix)
    nvlink = request.interconnect == "nvlink"
    flags = dict(nvlink=nvlink, nic=request.nic, same_numa=request.same_numa)
    if tb is not None:
        from ._table import best as table_best

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
    keys = {m: _key_of(ix, m, request.nic)[1][:4] for m in cheap}  # criteria 1-3; the PCIe paths come after 4
    top = max(keys.values())
    left = [m for m in cheap if keys[m] == top]
    if len(cheap) == len(group):  # near told no set apart
        return left, None, []
    other = min((m for m in group if costs[m] != low), key=lambda m: (costs[m], ix.devices_of(m)))
    line = (f"decided by: near (data locality): modeled {low / 1e6:.3g} ms to bring 1 GiB from each of device "
            f"{_list(list(request.near))} to the set, vs {costs[other] / 1e6:.3g} ms for {list(ix.devices_of(other))} "
            f"({len(group)} sets tie on weakest link and bandwidth)")
    return left, line, [m for m in group if m not in left][:5]


_CRITERIA = ("criterion 1 (weakest link)", "criterion 2 (total pair bandwidth)", "criterion 3 (NUMA nodes)",
             "criterion 3 (devices near an RDMA NIC)",
             "criterion 5 (PCIe path under the links: same switch > same root complex > same socket)")


def _pcie_of(ix: TopoIndex, mask: int) -> int:
    tb = table_of(ix)
    if tb is not None:
        return tb.decode(mask, False)[4]
    ps = [p for p in range(ix.n) if mask >> p & 1]
    return sum(ix.pcie[a][b] for i, a in enumerate(ps) for b in ps[i + 1:])


def _criterion_of(key: tuple, rkey: tuple) -> str:
    """The first criterion on which ``key`` differs from ``rkey`` (packed search keys)."""
    for i, (a, b) in enumerate(zip(key, rkey)):
        if a != b:
            return ("criterion 1", "criterion 2", "criterion 3", "criterion 3")[i] if i < 4 else "criterion 5"
    return "tie: lowest indices"


def _why_criteria(ix: TopoIndex, chosen: int, key: tuple, runner: tuple, nic: bool) -> str:
    """``"decided by: ..."``: the first criterion on which ``chosen`` beats the best runner-up, with the numbers."""
    return "decided by: " + _criteria_line(ix, chosen, key, runner)


def _criteria_line(ix: TopoIndex, chosen: int, key: tuple, runner: tuple) -> str:
    rkey, rmask = runner
    devs = list(ix.devices_of(rmask))
    for i, (a, b) in enumerate(zip(key, rkey)):
        if a == b:
            continue
        if i == 0:
            return f"{_CRITERIA[0]}: {_weakest_label(ix, chosen)} vs {_weakest_label(ix, rmask)} in runner-up {devs}"
        if i == 1:
            return f"{_CRITERIA[1]}: {a / 1000:g} vs {b / 1000:g} GB/s for runner-up {devs}"
        if i == 2:
            return f"{_CRITERIA[2]}: {-a} vs {-b} for runner-up {devs}"
        if i == 3:
            return f"{_CRITERIA[3]}: {a} vs {b} for runner-up {devs}"
        return f"{_CRITERIA[4]}: score {a} vs {b} for runner-up {devs}"
    return "tie: lowest indices"


def _weakest_label(ix: TopoIndex, mask: int) -> str:
    ps = [p for p in range(ix.n) if mask >> p & 1]
    if len(ps) < 2:
        return "one device"
    a, b = min(((x, y) for i, x in enumerate(ps) for y in ps[i + 1:]), key=lambda e: (ix.level[e[0]][e[1]], ix.bw[e[0]][e[1]]))
    return ix.label(a, b)


def _why_fragmentation(ix: TopoIndex, tb, part: str, chosen: int, cands: list[int], qual: dict, k: int,
                       head: str = "", tail: str = "") -> str:
    return head + _fragmentation_line(ix, part, chosen, cands, qual, k) + tail


def _fragmentation_line(ix: TopoIndex, part: str, chosen: int, cands: list[int], qual: dict, k: int) -> str:
    mine = qual[chosen]
    if part == "4a":
        other = max((m for m in cands if qual[m][0] != mine[0]), key=lambda m: (qual[m][0], lex_key(ix, m)))
        diff = mine[0] & ~qual[other][0]
        s = diff.bit_length() - 1
        return (f"criterion 4 (fragmentation): leaves a free {s}-device group as good as an idle node's best "
                f"{s}-set (weakest link and NUMA) whole; {list(ix.devices_of(other))} would break it")
    return (f"criterion 4 (fragmentation): every set keeps the same free groups; this one leaves the free devices "
            f"best packed into further size-{max(k, 2)} sets")


def _key_of(ix: TopoIndex, mask: int, with_nic: bool) -> tuple[tuple | None, tuple]:
    """(weakest-link rank or None, ``Score.key()``) of the set ``mask``, without building a Score."""
    tb = table_of(ix)
    if tb is not None:
        lvl, mgbps, neg_numa, near, pcie = tb.decode(mask, with_nic)
        weakest = ix.levels[lvl] if mask & (mask - 1) else None
        return weakest, (weakest if weakest is not None else (99, 0.0), round(mgbps / 1000.0, 3), neg_numa, near, pcie)
    sc = score_of(ix, mask, None, with_nic, allreduce=False)
    return sc.weakest_rank, sc.key()


def materialize(d: Decision) -> Allocation:
    """The full :class:`Allocation` of a decision: ring order, all-reduce model, scored runners-up. Kept on ``d``."""
    if d.alloc is not None:
        return d.alloc
    state, request, res, chosen = d.state, d.request, d.res, d.chosen
    ix = index_of(state.topology)
    score = score_of(ix, chosen, res, request.nic, d.quality)
    order = [ix.indices[p] for p in ring(ix, [i for i in range(ix.n) if chosen >> i & 1])]
    runners = [(tuple(ix.devices_of(m)), score_of(ix, m, res, request.nic, q, allreduce=False)) for m, q in d.losers[:3]]
    runners += [(tuple(ix.devices_of(m)), score_of(ix, m, None, request.nic, allreduce=False))
                for _, m in res.runners[:3 - len(runners)]]
    devs = {dv.index: dv for dv in state.topology.devices}
    d.why = why = tuple(w if isinstance(w, str) else w() for w in d.why)  # deferred sentences, written now
    d.alloc = Allocation(
        devices=tuple(order),
        request=request,
        score=score,
        memory_bytes={i: devs[i].memory_bytes for i in order},
        node=state.node_id,
        runners_up=tuple(runners),
        why=why,
        decided_by=d.decided_by,
    )
    return d.alloc


def _why_none(ix: TopoIndex, mask: int, request: Request) -> list[str]:
    k = request.gpus
    req = ix.mask_of(request.required) if request.required else 0
    plural = "s" if len(request.required) > 1 else ""
    with_req = f" that include required device{plural} {_list(list(request.required))}" if req else ""
    base = best_sets(ix, mask, k, tie_cap=1, required=req)
    reasons: list[str] = []
    if req and base is None:
        return [f"no {k} free devices{with_req}"]
    if request.interconnect == "nvlink":
        if base is not None and k >= 2:
            ps = [i for i in range(ix.n) if base.sets[0] >> i & 1]
            worst = min(((ix.level[a][b], ix.bw[a][b], a, b) for i, a in enumerate(ps) for b in ps[i + 1:]))
            a, b = ix.indices[worst[2]], ix.indices[worst[3]]
            label = ix.label(worst[2], worst[3])
            if ix.direct[worst[2]][worst[3]]:
                reasons.append(f"no {k} free devices{with_req} are all directly linked together with the other constraints")
            else:
                reasons.append(f"no {k} free devices{with_req} are all NVLink-connected: the best has {label} between {a} and {b}")
    if request.same_numa:
        per: dict = {}
        for i in range(ix.n):
            if mask >> i & 1:
                per[ix.numa[i]] = per.get(ix.numa[i], 0) + 1
        shown = ", ".join(f"{n}: {c}" for n, c in sorted(per.items(), key=lambda x: str(x[0])))
        if req:
            where = sorted({str(ix.numa[ix.pos[d]]) for d in request.required})
            reasons.append(f"no NUMA node has {k} free devices{with_req}{' that meet the other constraints' if request.interconnect != 'any' or request.nic else ''} "
                           f"(required devices on NUMA {', '.join(where)}; free per NUMA node: {shown})")
        else:
            reasons.append(f"no NUMA node has {k} free devices{' that meet the other constraints' if request.interconnect != 'any' or request.nic else ''} (free per NUMA node: {shown})")
    if request.nic:
        near = [ix.indices[i] for i in range(ix.n) if mask >> i & 1 and ix.nic_near[i]]
        if not near:
            reasons.append("no free device has a GPUDirect-capable (RDMA) NIC at PIX/PXB")
        else:
            reasons.append(f"no set meeting the other constraints{with_req} includes a device near an RDMA NIC (near: {_list(near)})")
    return reasons or [f"no set of free devices{with_req} meets the request"]
