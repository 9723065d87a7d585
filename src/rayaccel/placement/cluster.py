"""The cluster placer: best node + devices, and gangs of workers.

:func:`place` asks every node for its best allocation (cached per node state
*key*: topology content + what is taken + request, so the many nodes sharing
a machine type and free state cost one dictionary lookup each) and ranks them
by :func:`node_rank`: for multi-device requests "as good as this machine type
gets", then packing (partly used nodes first, then best fit), then criteria
1-3; for single devices partly used nodes first, then first fit in the given
order; ties go to the first node in the given order.

:func:`place_gang` places N workers of k devices:

* ``pack``: fill nodes: a worker goes to a node already used by the gang when
  it fits there, else to the node that can hold the most remaining workers;
* ``spread``: one worker per node where possible (the best node not used yet,
  ties to the node with the most free devices), then round again;
* ``strict-pack``: all N*k devices on one node (with ``interconnect="nvlink"``
  in one NVLink domain), the node whose best N*k set scores best; the set is
  then split into workers, each the best k-set left in it. Else a Rejection.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Sequence

from ..errors import RequestError
from .node import Decision, allocate, decide, materialize
from .request import Request, make_request
from .result import Allocation, GangAllocation, Rejection
from .state import NodeState

STRATEGIES = ("pack", "spread", "strict-pack")
_RESULTS: dict = {}  # request -> {node state key: (rank or () when rejected, allocation or rejection)}
_IDLE: dict = {}  # (topology key, request) -> weakest-link rank of the best set on an idle node


def place(nodes: Sequence[NodeState], request: Request | None = None, **fields) -> Allocation | Rejection:
    """The best node and devices for ``request`` across ``nodes`` (``Allocation.node`` is set).

    Each node's answer is cached per (request, node state key), so a decision
    costs three list passes at C speed plus one fresh search per node whose
    state was not seen before. Nodes are ranked by :func:`node_rank`.

    Raises:
        RequestError: an invalid request, or ``nodes`` not a sequence of :class:`NodeState`.
    """
    req = make_request(request, **fields)
    cache = _RESULTS.get(req)
    if cache is None:
        if len(_RESULTS) > 1000:
            _RESULTS.clear()
        cache = _RESULTS[req] = {}
    try:
        keys = [st._key or st.key for st in nodes]
    except AttributeError:
        _check_nodes(nodes)
        raise
    got = list(map(cache.get, keys))
    if None in got:
        if len(cache) > 100_000:
            cache.clear()
        for i, r in enumerate(got):
            if r is None:
                r = cache.get(keys[i])
                if r is None:
                    r = cache[keys[i]] = _evaluate(nodes[i], req)
                got[i] = r
    ranks = [r[0] for r in got]
    top = max(ranks) if ranks else None
    if not top:
        if not nodes:
            return Rejection(("there are no nodes",), req)
        reasons: Counter = Counter()
        examples: dict[str, str] = {}
        for st, (_, alloc) in zip(nodes, got):
            for reason in alloc.reasons[:1]:
                reasons[reason] += 1
                examples.setdefault(reason, st.node_id or "?")
        lines = [f"{n} node(s): {why} (e.g. {examples[why]})" for why, n in reasons.most_common(4)]
        return Rejection((f"no node of {len(nodes)} can place it", *lines), req)
    i = ranks.index(top)
    win = got[i][1]
    if isinstance(win, Decision):
        win = materialize(win)
    return win if win.node == nodes[i].node_id else replace(win, node=nodes[i].node_id)


def node_rank(state: NodeState, alloc: Allocation | Decision) -> tuple:
    """How the cluster placer ranks a node's allocation (higher is better; ties go to the earlier node).

    Multi-device requests:

    1. whether the set is as good as the best an *idle* node of that type offers
       (same weakest link), i.e. the job gets its machine type's best interconnect;
    2. packing: a node already partly used beats a fully free one (keep whole
       nodes for large jobs), then the node left with the fewest free devices
       (best fit);
    3. criteria 1-3 of the set (weakest link, total bandwidth, NUMA, NIC), so
       among equally packed nodes the better-wired type wins.

    Single-device requests (no interconnect to protect): a partly used node
    beats a fully free one, then criteria 1-3, then the earlier node (first fit
    in the given order). First fit rather than best fit: consolidating small
    jobs on a stable prefix of the nodes leaves the other nodes whole, and in
    the churn benchmark it strands fewer free devices than best fit does.

    ``alloc`` may be a :class:`~.node.Decision` (the same ranking, computed before
    the allocation is materialized).
    """
    n = len(state.topology.devices)
    taken = len(state.taken()) if state.busy_partitions else state.key[1].bit_count()
    if isinstance(alloc, Decision):
        k = alloc.request.gpus
        weakest, key = alloc.weakest_rank, alloc.key
    else:
        sc = alloc.score
        k = len(alloc.devices)
        if sc is None or alloc.request.kind != "devices":  # MIG / shared memory: best score, then best fit
            return (sc.key() if sc is not None else (), -(n - taken - k))
        weakest, key = sc.weakest_rank, sc.key()
    if k == 1:
        return (1 if taken else 0, key)
    best = _idle_best(state, alloc.request)
    reaches = 1 if best is None or weakest == best else 0
    return (reaches, 1 if taken else 0, -(n - taken - k), key)


def _evaluate(st: NodeState, req: Request) -> tuple:
    d = decide(st, req)
    if not d:
        return ((), d)
    return (node_rank(st, d), d)


def _idle_best(state: NodeState, request: Request):
    ck = (state.key[0], request)
    if ck not in _IDLE:
        a = decide(NodeState(state.topology), request)
        if isinstance(a, Decision):
            _IDLE[ck] = a.weakest_rank
        else:
            _IDLE[ck] = a.score.weakest_rank if a and a.score is not None else None
    return _IDLE[ck]


def _check_nodes(nodes) -> list[NodeState]:
    out = list(nodes)
    for i, n in enumerate(out):
        if not isinstance(n, NodeState):
            raise RequestError(f"nodes[{i}] is a {type(n).__name__}, expected a NodeState", "nodes")
    return out


def place_gang(nodes: Sequence[NodeState], workers: int, gpus_per_worker: int, strategy: str = "pack",
               interconnect: str = "any", **fields) -> GangAllocation | Rejection:
    """Place ``workers`` workers of ``gpus_per_worker`` devices each (see module docstring).

    Args:
        nodes: node states. workers: N >= 1. gpus_per_worker: k >= 1.
        strategy: ``pack``, ``spread`` or ``strict-pack``. interconnect: per worker.
        **fields: other :class:`Request` fields applied to each worker (``same_numa``, ``nic``, ...).

    Raises:
        RequestError: bad strategy, counts or request fields.
    """
    if strategy not in STRATEGIES:
        raise RequestError(f"unknown strategy {strategy!r}", "strategy", ", ".join(STRATEGIES))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RequestError(f"expected an int >= 1, got {workers!r}", "workers")
    req = Request(gpus=gpus_per_worker, interconnect=interconnect, **fields)
    if req.kind != "devices":
        raise RequestError("gangs take whole devices", "gpus_per_worker", "an int >= 1")
    states = {i: s for i, s in enumerate(_check_nodes(nodes))}
    if not states:
        return Rejection(("there are no nodes",), req)
    if strategy == "strict-pack":
        return _strict(states, workers, req)
    out: list[Allocation] = []
    used: list[int] = []
    for w in range(workers):
        pick = None
        if strategy == "pack":
            for i in reversed(used):
                a = allocate(states[i], req)
                if a:
                    pick = (i, a)
                    break
            if pick is None:
                pick = _best_new(states, req, set(used), workers - w, spread=False)
        else:
            pick = _best_new(states, req, set(used), 1, spread=True)
            if pick is None:
                pick = _best_new(states, req, set(), 1, spread=True)
        if pick is None:
            first = allocate(states[0], req)
            why = first.reasons[0] if not first and first.reasons else "no node has room"
            return Rejection((f"worker {w} of {workers} ({req.describe()}) fits on no node after placing {w}",
                              f"e.g. node {states[0].node_id}: {why}"), req)
        i, a = pick
        out.append(a)
        used.append(i)
        states[i] = states[i].with_busy(a.devices)
    return GangAllocation(tuple(out), strategy)


def _best_new(states: dict, req: Request, exclude: set, want: int, spread: bool):
    best = None
    best_key = None
    for i, st in states.items():
        if i in exclude:
            continue
        a = allocate(st, req)
        if not a:
            continue
        free = len(st.topology.devices) - len(st.taken())
        fits = min(free // req.gpus, want)
        key = (a.score.key(), free) if spread else (fits, a.score.key(), -free)
        if best_key is None or key > best_key:
            best, best_key = (i, a), key
    return best


def _strict(states: dict, workers: int, req: Request) -> GangAllocation | Rejection:
    total = Request(gpus=workers * req.gpus, interconnect=req.interconnect, vendor=req.vendor, model=req.model,
                    gpu_memory=req.gpu_memory)
    best = None
    for i, st in states.items():
        a = allocate(st, total)
        if not a:
            continue
        free = len(st.topology.devices) - len(st.taken())
        key = (a.score.key(), -free)
        if best is None or key > best[0]:
            best = (key, i, a)
    if best is None:
        r = allocate(states[0], total)
        why = r.reasons[0] if not r else ""
        where = "one NVLink domain of one node" if req.interconnect == "nvlink" else "one node"
        return Rejection((f"no {where} has {workers * req.gpus} free devices for {workers} x {req.gpus}",
                          f"e.g. node {states[0].node_id}: {why}"), req)
    _, i, union = best
    st = states[i]
    others = frozenset(d.index for d in st.topology.devices) - frozenset(union.devices)
    cur = NodeState(st.topology, st.busy | others, st.busy_partitions, st.memory_used, st.node_id)
    out = []
    for w in range(workers):
        a = allocate(cur, req)
        if not a:  # per-worker extras (same_numa, nic) cannot be met inside the union
            return Rejection((f"worker {w}: {a.reasons[0]}",), req)
        out.append(a)
        cur = cur.with_busy(a.devices)
    return GangAllocation(tuple(out), "strict-pack")
