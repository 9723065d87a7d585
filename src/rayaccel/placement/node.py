"""The node allocator: the best set of whole devices on one node.

Criteria (docs/ARCHITECTURE.md "What the best set means"), in order:

1. the weakest link among chosen pairs is as strong as possible;
2. then the total pair bandwidth is as large as possible;
3. then the fewest NUMA nodes (and, with ``nic=True``, the most devices near an
   RDMA NIC);
4. then the least fragmentation: among the sets tied on 1-3 (up to
   :data:`TIE_CAP` of them), the one whose *remaining* free devices pack best
   into further sets of the same size (size 2 for single devices). The packing
   is greedy: repeatedly take the best set of that size from what is left, and
   sum the weakest-link levels, then the bandwidths, of those sets. A 1-GPU
   request thus takes a device whose partner is busy, or the worst-connected
   one, instead of breaking up an NVLink pair (k8s-device-plugin#1193).
   Criterion 4 is computed on nodes of up to 16 devices.

Criteria 1-3 come from the exact search of :mod:`.search`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..units import format_bytes
from ._index import TopoIndex, index_of
from ._table import pack_quality, table_of
from .model import ring, ring_bottleneck_mgbps
from .request import Request
from .result import Allocation, Rejection, Score
from .search import EXACT_UP_TO, SearchResult, best_sets
from .state import NodeState

TIE_CAP = 12
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
        why: tie-break sentences. weakest_rank: Link.rank of the weakest pair (None for
        one device). key: equal to ``Score.key()`` of the materialized allocation.
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


def eligible(ix: TopoIndex, state: NodeState, request: Request) -> tuple[int, list[str]]:
    """(mask of devices eligible for ``request``, sentences on why the others are not)."""
    taken = state.taken()
    busy_parts = {p.parent for p in state.topology.partitions() if p.key in state.busy_partitions}
    mask = 0
    why: dict[str, list[int]] = {}
    notes: list[str] = []
    devs = {d.index: d for d in state.topology.devices}
    for i, idx in enumerate(ix.indices):
        d = devs[idx]
        if i in ix.failed:
            why.setdefault("failed", []).append(idx)
        elif idx in state.busy:
            why.setdefault("busy", []).append(idx)
        elif idx in busy_parts:
            why.setdefault("with busy MIG instances", []).append(idx)
        elif idx in taken:
            why.setdefault("holding shared memory reservations", []).append(idx)
        elif d.mig_mode:
            why.setdefault("in MIG mode (use mig=...)", []).append(idx)
        elif request.vendor and d.vendor.lower() != request.vendor.lower():
            why.setdefault(f"not vendor {request.vendor}", []).append(idx)
        elif request.model and request.model.lower() not in (d.model or "").lower():
            why.setdefault(f"not model ~{request.model!r}", []).append(idx)
        elif request.gpu_memory is not None and d.memory_bytes is None:
            why.setdefault("of unknown memory size", []).append(idx)
        elif request.gpu_memory is not None and d.memory_bytes < request.gpu_memory:  # type: ignore[operator]
            notes.append(f"device {idx} has {format_bytes(d.memory_bytes)}, {format_bytes(request.gpu_memory)} asked")  # type: ignore[arg-type]
        else:
            mask |= 1 << i
    reasons = [f"{len(v)} {'is' if len(v) == 1 else 'are'} {k}: {_list(v)}" for k, v in why.items()]
    return mask, reasons + notes[:6]


def _list(xs: list[int]) -> str:
    return ", ".join(map(str, xs[:12])) + (" ..." if len(xs) > 12 else "")


def score_of(ix: TopoIndex, mask: int, result: SearchResult | None = None, with_nic: bool = False,
             quality: tuple | None = None, allreduce: bool = True) -> Score:
    """The :class:`Score` of the set ``mask`` (positions); ``allreduce=False`` skips the ring model (None)."""
    ps = [i for i in range(ix.n) if mask >> i & 1]
    weak = None
    total = 0
    for a_i, a in enumerate(ps):
        for b in ps[a_i + 1:]:
            total += ix.bw[a][b]
            key = (ix.level[a][b], ix.bw[a][b])
            if weak is None or key < weak[0]:
                weak = (key, a, b)
    ar = ring_bottleneck_mgbps(ix, ring(ix, ps)) / 1000.0 if allreduce else None
    return Score(
        weakest=None if weak is None else ix.label(weak[1], weak[2]),
        weakest_rank=None if weak is None else ix.levels[weak[0][0]],
        total_bandwidth_gbps=total / 1000.0,
        numa_nodes=len({ix.numa[p] for p in ps}),
        nic_near=sum(ix.nic_near[p] for p in ps) if with_nic else 0,
        free_quality=quality,
        allreduce_bandwidth_gbps=ar,
        optimal=True if result is None else result.optimal,
        bound_gbps=None if result is None or result.bound_mgbps is None else result.bound_mgbps / 1000.0,
    )


def free_quality(ix: TopoIndex, rest: int, k: int) -> tuple:
    """Criterion 4: greedy packing of ``rest`` into sets of size max(k, 2); (sum of weakest levels, sum of milli-GB/s)."""
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
    if request.vendor or request.model or request.gpu_memory is not None or state.busy_partitions:
        mask, excluded = eligible(ix, state, request)
    else:  # the common case, from the state key: not taken, not failed, not in MIG mode
        mask = _plain_mask(ix) & ~state.key[1]
        excluded = None
    n_free = mask.bit_count()
    if n_free < k:
        if excluded is None:
            excluded = eligible(ix, state, request)[1]
        head = f"only {n_free} device{'s' if n_free != 1 else ''} free{' that match' if request.vendor or request.model or request.gpu_memory else ''}, {k} asked"
        if ix.n < k:
            head = f"the node has {ix.n} device{'s' if ix.n != 1 else ''}, {k} asked"
        return Rejection((head, *excluded), request, state.node_id)
    nvlink = request.interconnect == "nvlink"
    cap = max(TIE_CAP, ix.n) if k == 1 else TIE_CAP  # every free device competes for a single-device request
    res = best_sets(ix, mask, k, nvlink=nvlink, nic=request.nic, same_numa=request.same_numa, tie_cap=cap)
    if res is None:
        return Rejection(tuple(_why_none(ix, mask, request)), request, state.node_id)
    why: list[str] = []
    chosen = res.sets[0]
    losers: list[tuple[int, tuple]] = []
    quality = None
    if len(res.sets) > 1 and ix.n <= EXACT_UP_TO:
        pool = free_mask(ix, state) if state.busy_partitions else (((1 << ix.n) - 1) & ~state.key[1]) & ~_failed_mask(ix)
        scored = [(free_quality(ix, pool & ~m, k), m) for m in res.sets]
        best_q = max(q for q, _ in scored)
        winners = [m for q, m in scored if q == best_q]
        chosen = min(winners, key=lambda m: ix.devices_of(m))
        losers = [(m, q) for q, m in scored if m != chosen]
        why.append(f"{len(res.sets)}{'+' if len(res.sets) >= cap else ''} sets tie on weakest link, bandwidth and NUMA; "
                   f"this one leaves the free devices best connected for further size-{max(k, 2)} requests (criterion 4)")
        quality = best_q
    elif len(res.sets) > 1:
        why.append(f"{len(res.sets)} sets tie on criteria 1-3; lowest indices taken (criterion 4 is computed up to {EXACT_UP_TO} devices)")
    weakest_rank, key = _key_of(ix, chosen, request.nic)
    return Decision(state, request, chosen, res, quality, tuple(losers), tuple(why), weakest_rank, key)


def _key_of(ix: TopoIndex, mask: int, with_nic: bool) -> tuple[tuple | None, tuple]:
    """(weakest-link rank or None, ``Score.key()``) of the set ``mask``, without building a Score."""
    tb = table_of(ix)
    if tb is not None:
        lvl, mgbps, neg_numa, near = tb.decode(mask, with_nic)
        weakest = ix.levels[lvl] if mask & (mask - 1) else None
        return weakest, (weakest if weakest is not None else (99, 0.0), round(mgbps / 1000.0, 3), neg_numa, near)
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
    runners += [(tuple(ix.devices_of(m)), score_of(ix, m, None, request.nic, allreduce=False)) for _, m in res.runners[:3]]
    devs = {dv.index: dv for dv in state.topology.devices}
    d.alloc = Allocation(
        devices=tuple(order),
        request=request,
        score=score,
        memory_bytes={i: devs[i].memory_bytes for i in order},
        node=state.node_id,
        runners_up=tuple(runners[:5]),
        why=d.why,
    )
    return d.alloc


def _why_none(ix: TopoIndex, mask: int, request: Request) -> list[str]:
    k = request.gpus
    base = best_sets(ix, mask, k, tie_cap=1)
    reasons: list[str] = []
    if request.interconnect == "nvlink":
        if base is not None and k >= 2:
            ps = [i for i in range(ix.n) if base.sets[0] >> i & 1]
            worst = min(((ix.level[a][b], ix.bw[a][b], a, b) for i, a in enumerate(ps) for b in ps[i + 1:]))
            a, b = ix.indices[worst[2]], ix.indices[worst[3]]
            label = ix.label(worst[2], worst[3])
            if ix.direct[worst[2]][worst[3]]:
                reasons.append(f"no {k} free devices are all directly linked together with the other constraints")
            else:
                reasons.append(f"no {k} free devices are all NVLink-connected: the best has {label} between {a} and {b}")
    if request.same_numa:
        per: dict = {}
        for i in range(ix.n):
            if mask >> i & 1:
                per[ix.numa[i]] = per.get(ix.numa[i], 0) + 1
        shown = ", ".join(f"{n}: {c}" for n, c in sorted(per.items(), key=lambda x: str(x[0])))
        reasons.append(f"no NUMA node has {k} free devices{' that meet the other constraints' if request.interconnect != 'any' or request.nic else ''} (free per NUMA node: {shown})")
    if request.nic:
        near = [ix.indices[i] for i in range(ix.n) if mask >> i & 1 and ix.nic_near[i]]
        if not near:
            reasons.append("no free device has a GPUDirect-capable (RDMA) NIC at PIX/PXB")
        else:
            reasons.append(f"no set meeting the other constraints includes a device near an RDMA NIC (near: {_list(near)})")
    return reasons or ["no set of free devices meets the request"]
