"""The cluster placer: best node + devices, and gangs of workers.

:func:`place` asks every node for its best allocation (cached per node state
*key*: topology content + what is taken + request, so the many nodes sharing
a machine type and free state cost one dictionary lookup each) and takes the
best score (criteria 1-3); ties go to the node that is left with the fewest
free devices (packing, to keep whole nodes free for large jobs), then to the
first node in the given order.

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
from typing import Sequence

from ..errors import RequestError
from .node import allocate, allocate_raw
from .request import Request, make_request
from .result import Allocation, GangAllocation, Rejection
from .state import NodeState

STRATEGIES = ("pack", "spread", "strict-pack")
_RESULTS: dict = {}  # request -> {node state key: (ok, sort key, allocation)}


def place(nodes: Sequence[NodeState], request: Request | None = None, **fields) -> Allocation | Rejection:
    """The best node and devices for ``request`` across ``nodes`` (``Allocation.node`` is set).

    Raises:
        RequestError: an invalid request, or ``nodes`` not a sequence of :class:`NodeState`.
    """
    req = make_request(request, **fields)
    best = None
    best_key = None
    best_state = None
    reasons: Counter = Counter()
    examples: dict[str, str] = {}
    cache = _RESULTS.get(req)
    if cache is None:
        if len(_RESULTS) > 1000:
            _RESULTS.clear()
        cache = _RESULTS[req] = {}
    for st in nodes:
        k = st._key or st.key
        r = cache.get(k)
        if r is None:
            alloc = allocate_raw(st, req)
            if alloc:
                sk = alloc.score.key() if alloc.score is not None else ()
                free_after = len(st.topology.devices) - bin(k[1]).count("1") - len(alloc.devices)
                r = (True, sk + (-free_after,), alloc)
            else:
                r = (False, None, alloc)
            if len(cache) > 100_000:
                cache.clear()
            cache[k] = r
        ok, key, alloc = r
        if ok:
            if best_key is None or key > best_key:
                best_key, best, best_state = key, alloc, st
        else:
            for reason in alloc.reasons[:1]:
                reasons[reason] += 1
                examples.setdefault(reason, st.node_id or "?")
    if best is None:
        if not nodes:
            return Rejection(("there are no nodes",), req)
        top = [f"{n} node(s): {why} (e.g. {examples[why]})" for why, n in reasons.most_common(4)]
        return Rejection((f"no node of {len(nodes)} can place it", *top), req)
    from dataclasses import replace

    return replace(best, node=best_state.node_id)


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
