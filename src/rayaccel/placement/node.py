"""The node allocator: the best set of whole devices on one node, decided in stages.

The shape of the Kubernetes scheduler framework: each stage takes what the
previous one let through and returns the survivors with the reason for those it
set apart.

1. **filter** (:mod:`._filter`): the eligible devices -- in the GPU pool
   (:mod:`.pools`), not taken, matching vendor, model and memory -- or a Rejection
   naming each device left out and why;
2. **score** (:mod:`._score`): the exact search for the sets best on criteria 1-3
   (docs/ARCHITECTURE.md "What the best set means"): the weakest link among chosen
   pairs as strong as possible, then the total pair bandwidth as large as possible,
   then the fewest NUMA nodes (with ``nic=True``, the most devices near an RDMA NIC);
   or a Rejection saying which constraint no set meets;
3. **tie-breaks** (:mod:`._tiebreak`), among the sets tied so far: ``near`` (data
   locality, when asked), criterion 4 (the least fragmentation, nodes of up to 16
   devices), criterion 5 (the PCIe paths under the links), then the lowest indices;
4. **explanation** (:mod:`._explain`): the criterion that decided and the
   sentences :meth:`Allocation.explain` prints.

``required`` devices are a hard constraint: the filter rejects a request whose
required device is not eligible, and the score stage keeps only sets that hold
them. :func:`decide` stops after the explanation (a :class:`Decision`, what the
cluster placer ranks nodes on); :func:`materialize` adds what only the winner
needs (ring order, all-reduce model, scored runners-up).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ._explain import explain
from ._filter import filter_devices
from ._index import index_of
from ._score import key_of, score_of, score_sets
from ._search_result import SearchResult
from ._symmetry import lex_key
from ._tiebreak import by_fragmentation, by_near, by_pcie, resolve_classes
from .memory import place_shared
from .mig import place_instance
from .model import ring
from .request import Request
from .result import Allocation, Rejection
from .state import NodeState

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
            hit = place_instance(state, request)
        elif request.kind == "shared":
            hit = place_shared(state, request)
        else:
            hit = _decide_devices(state, request)
        if len(_DECISIONS) >= _CACHE_MAX:
            _DECISIONS.clear()
        _DECISIONS[ck] = hit
    return hit


def _decide_devices(state: NodeState, request: Request) -> Decision | Rejection:
    """The four stages in order (see the module docstring)."""
    ix = index_of(state.topology)
    got = filter_devices(ix, state, request)  # 1. filter
    if isinstance(got, Rejection):
        return got
    sc = score_sets(ix, state, request, got)  # 2. score: criteria 1-3
    if isinstance(sc, Rejection):
        return sc
    cands, n_tied = sc.cands, sc.n_tied  # 3. tie-breaks
    cuts = []
    losers: list[tuple[int, tuple | None]] = []
    if sc.near:
        cut = by_near(sc, cands)
        cands = cut.kept
        if cut.criterion is not None:
            cuts.append(cut)
            losers += [(m, None) for m in cut.dropped]
            n_tied = len(cands)
    qual: dict = {}
    left = cands
    if len(cands) > 1 and sc.tb is not None:
        cut = by_fragmentation(sc, cands, n_tied)
        left, qual = cut.kept, cut.quality
        if cut.criterion is not None:
            cuts.append(cut)
    if sc.sigs is not None:
        left, cands, qual = resolve_classes(sc, left, cands, qual)
    cut = by_pcie(sc, left)
    if cut.criterion is not None:
        cuts.append(cut)
    left = cut.kept
    chosen = max(left, key=lambda m: lex_key(ix, m))
    decided, why = explain(ix, cuts, chosen, len(left), n_tied, sc.cap, sc.sigs, sc.res)  # 4. explanation
    losers = [(m, qual.get(m)) for m in cands[:8] if m != chosen] + losers
    weakest_rank, key = key_of(ix, chosen, request.nic)
    return Decision(state, request, chosen, sc.res, qual.get(chosen), tuple(losers), tuple(why), weakest_rank, key,
                    decided)


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
