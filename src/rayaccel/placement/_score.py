"""Stage 2 of a node's decision, the score: the sets that are best on criteria 1-3.

Over the eligible devices (:mod:`._filter`), the exact search (:mod:`._table` up to
16 devices, :mod:`.search` above) ranks every k-set by (1) its weakest link, (2) its
total pair bandwidth and (3) its NUMA nodes (with ``nic``, devices near an RDMA NIC),
within the request's constraints (direct links, one NUMA node, a NIC, required
devices). What survives is the sets tied best -- when they are many, one per
symmetry class (:func:`._symmetry.tie_classes`) -- for the tie-breaks
(:mod:`._tiebreak`); when no set meets the constraints, a
:class:`~.result.Rejection` says which constraint failed and how close the best set came.

Also here: :func:`score_of` / :func:`key_of`, the :class:`~.result.Score` of any set.
"""

from __future__ import annotations

from dataclasses import dataclass

from ._filter import Eligible, list_devices
from ._index import TopoIndex
from ._search_result import SearchResult
from ._symmetry import near_classes, tie_classes
from ._table import _NUMA_SHIFT, Table, table_of
from .model import ring, ring_bottleneck_mgbps
from .request import Request
from .result import Rejection, Score
from .search import EXACT_UP_TO, best_sets
from .state import NodeState

#: Tied sets kept above :data:`~.search.EXACT_UP_TO` devices (criterion 4 is not computed there).
TIE_CAP = 12
#: Tied sets kept above the table size when ``near`` must choose among them.
NEAR_TIE_CAP = 64
#: Above this many tied sets (table nodes), the tie-breaks run on one set per symmetry class.
SCAN_CAP = 64


@dataclass(slots=True)
class Scored:
    """The score stage's survivors and what the later stages need to know about them.

    Attributes:
        ix / state / request: what is decided on. mask: the eligible positions.
        req: the required positions (mask). near: the ``near`` positions.
        tb: the node's tables (None above the table size). cap: the tie cap the search ran with.
        res: the search result (key of the best sets, runners-up, optimality).
        cands: the tied sets (masks), or one representative per symmetry class when ``sigs``.
        n_tied: how many sets tie (at least ``len(cands)``).
        sigs: representative -> its class signature (:func:`~._symmetry.tie_classes`), or None.
    """

    ix: TopoIndex
    state: NodeState
    request: Request
    mask: int
    req: int
    near: list[int]
    tb: Table | None
    cap: int
    res: SearchResult
    cands: list[int]
    n_tied: int
    sigs: dict | None


def score_sets(ix: TopoIndex, state: NodeState, request: Request, eligible: Eligible) -> Scored | Rejection:
    """The sets of ``eligible`` devices tied best on criteria 1-3, or a Rejection when none meets the request."""
    k = request.gpus
    mask = eligible.mask
    req = ix.mask_of(request.required) if request.required else 0
    direct = request.direct
    near = [ix.pos[d] for d in request.near]
    exact = ix.n <= EXACT_UP_TO
    if exact:
        cap = SCAN_CAP
        classes = None
    else:
        cap = NEAR_TIE_CAP if near else (max(TIE_CAP, ix.n) if k == 1 else TIE_CAP)
        classes = near_classes(ix, request.nic, near) if near else None
    res = best_sets(ix, mask, k, nvlink=direct, nic=request.nic, same_numa=request.same_numa, tie_cap=cap,
                    required=req, classes=classes)
    if res is None:
        return Rejection(tuple(why_none(ix, mask, request)), request, state.node_id)
    cands = res.sets
    n_tied = len(cands)
    sigs = None  # representative -> signature, when the tied sets are many (one per symmetry class)
    tb = table_of(ix) if exact else None
    if tb is not None and n_tied >= SCAN_CAP and not near:
        top = tb.key[cands[0]] >> _NUMA_SHIFT
        reps = tie_classes(ix, tb, mask, k, req, direct, request.nic, request.same_numa, top)
        if reps is not None:
            sigs = dict(reps)
            cands = list(sigs)
        else:  # little symmetry: every tied set
            res = best_sets(ix, mask, k, nvlink=direct, nic=request.nic, same_numa=request.same_numa, tie_cap=None,
                            required=req)
            cands = res.sets
            n_tied = len(cands)
    return Scored(ix, state, request, mask, req, near, tb, cap, res, cands, n_tied, sigs)


def why_none(ix: TopoIndex, mask: int, request: Request) -> list[str]:
    """Why no set of the free devices ``mask`` meets ``request``'s constraints (enough of them are free)."""
    k = request.gpus
    req = ix.mask_of(request.required) if request.required else 0
    plural = "s" if len(request.required) > 1 else ""
    with_req = f" that include required device{plural} {list_devices(list(request.required))}" if req else ""
    base = best_sets(ix, mask, k, tie_cap=1, required=req)
    reasons: list[str] = []
    if req and base is None:
        return [f"no {k} free devices{with_req}"]
    if request.direct:
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
        others = " that meet the other constraints" if request.interconnect != "any" or request.nic else ""
        if req:
            where = sorted({str(ix.numa[ix.pos[d]]) for d in request.required})
            reasons.append(f"no NUMA node has {k} free devices{with_req}{others} "
                           f"(required devices on NUMA {', '.join(where)}; free per NUMA node: {shown})")
        else:
            reasons.append(f"no NUMA node has {k} free devices{others} (free per NUMA node: {shown})")
    if request.nic:
        near = [ix.indices[i] for i in range(ix.n) if mask >> i & 1 and ix.nic_near[i]]
        if not near:
            reasons.append("no free device has a GPUDirect-capable (RDMA) NIC at PIX/PXB")
        else:
            reasons.append(f"no set meeting the other constraints{with_req} includes a device near an RDMA NIC "
                           f"(near: {list_devices(near)})")
    return reasons or [f"no set of free devices{with_req} meets the request"]


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


def key_of(ix: TopoIndex, mask: int, with_nic: bool) -> tuple[tuple | None, tuple]:
    """(weakest-link rank or None, ``Score.key()``) of the set ``mask``, without building a Score."""
    tb = table_of(ix)
    if tb is not None:
        lvl, mgbps, neg_numa, near, pcie = tb.decode(mask, with_nic)
        weakest = ix.levels[lvl] if mask & (mask - 1) else None
        return weakest, (weakest if weakest is not None else (99, 0.0), round(mgbps / 1000.0, 3), neg_numa, near, pcie)
    sc = score_of(ix, mask, None, with_nic, allreduce=False)
    return sc.weakest_rank, sc.key()


def pcie_of(ix: TopoIndex, mask: int) -> int:
    """Criterion 5 of the set ``mask``: the summed PCIe-path score under its pairs."""
    tb = table_of(ix)
    if tb is not None:
        return tb.decode(mask, False)[4]
    ps = [p for p in range(ix.n) if mask >> p & 1]
    return sum(ix.pcie[a][b] for i, a in enumerate(ps) for b in ps[i + 1:])
