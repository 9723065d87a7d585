"""The cluster placer: best node + devices, and gangs of workers.

:func:`place` asks every node for its best allocation (cached per node state
*key*: topology content + what is taken + request, so the many nodes sharing
a machine type and free state cost one dictionary lookup each) and ranks them
by :func:`node_rank`: for multi-device requests "as good as this machine type
gets", then packing (partly used nodes first, then best fit), then criteria
1-3; for single devices partly used nodes first, then first fit in the given
order; ties go to the first node in the given order.

:func:`place_gang` (gangs of workers, across NVLink domains and network levels) lives in
:mod:`.gang` and is re-exported here.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import replace
from typing import Sequence

from ..errors import RequestError
from ._index import index_of
from ._live import LiveRanks
from ._tiebreak import takes_straggler
from .domains import NodePlace, as_places
from .gang import STRATEGIES, place_gang  # re-exported: the gang entry point of the cluster placer
from .node import Decision, decide, materialize
from .request import Request, make_request
from .result import Allocation, Rejection
from .state import NodeState

__all__ = ["STRATEGIES", "node_rank", "place", "place_gang"]
_RESULTS: dict = {}  # request -> ({node state key id: rank int, -1 when rejected}, {key id: decision})
_LIVE: dict = {}  # request -> LiveRanks of the node list it was last placed on
_LIVE_LOCK = threading.Lock()
_IDLE: dict = {}  # (topology key, request) -> weakest-link rank of the best set on an idle node
_NO_RANK = -1


def place(nodes: Sequence[NodeState], request: Request | None = None, *,
          places: Sequence[NodePlace | None] | None = None, **fields) -> Allocation | Rejection:
    """The best node and devices for ``request`` across ``nodes`` (``Allocation.node`` is set).

    Each node's answer is cached per (request, node state key), and the ranks
    of the last node list placed for a request are kept (:mod:`._live`): a
    call compares ``nodes`` with that list by identity (node states are
    frozen) in one pass at C speed, re-ranks only the nodes that changed (one
    fresh search per state not seen before), and reads the best rank and its
    first node from per-rank heaps. Nodes are ranked by :func:`node_rank`; ties
    go to the first node in ``nodes``.

    ``required``: nodes that lack one of the indices are skipped (a Rejection
    when no node has them all is a RequestError: the request names devices no
    node has). ``near`` with ``near_node``: that node is evaluated with the
    locality preference and ranks first among the nodes that reach their type's
    best interconnect (see :func:`node_rank`); the others are placed as if
    ``near`` were not given. ``near`` without ``near_node`` applies to every node
    that has those indices.

    ``places`` (one :class:`~.domains.NodePlace` or None per node): among the nodes tied
    at the best rank, the one in the fullest NVLink domain wins (the smallest share of its
    domain's devices free, then the fewest free), so single-node work does not open a whole
    free domain that a later gang needs. This costs one pass over ``nodes``, and only then.

    Raises:
        RequestError: an invalid request, ``nodes`` not a sequence of :class:`NodeState`,
            or ``required`` devices that no node has.
    """
    req = make_request(request, **fields)
    base = req if req.near_node is None else replace(req, near=(), near_node=None)
    got = _RESULTS.get(base)
    if got is None:
        if len(_RESULTS) > 1000:
            _RESULTS.clear()
        got = _RESULTS[base] = ({}, {})
    ranks_of, decisions = got
    if len(ranks_of) > 100_000:
        ranks_of.clear()
        decisions.clear()
    with _LIVE_LOCK:
        live = _LIVE.get(base)
        changed = live.changed(nodes) if live is not None else None
        if changed is None:
            live = _rank_all(nodes, base, ranks_of, decisions)
            if len(_LIVE) >= 64:
                _LIVE.clear()
            _LIVE[base] = live
        else:
            for i in changed:
                st = nodes[i]
                kid = _kid(st, nodes)
                r = ranks_of.get(kid)
                if r is None:
                    d, r = _evaluate(st, base)
                    ranks_of[kid] = r
                    decisions[kid] = d
                live.update(i, st, r)
        top, i = live.best()
        holder = live.position_of(req.near_node) if req.near_node is not None else None
    if holder is not None:
        d, r = _evaluate(nodes[holder], req, local=True)
        if r > top or (r == top and holder < i):
            win = materialize(d) if isinstance(d, Decision) else d
            return win if win.node == nodes[holder].node_id else replace(win, node=nodes[holder].node_id)
    if places is not None and top != _NO_RANK:
        i = _fullest_domain(nodes, places, live, top, i)
    if top == _NO_RANK:
        kids = [_kid(st, nodes) for st in nodes]
        for kid, st in zip(kids, nodes):
            if kid not in decisions:
                decisions[kid] = _evaluate(st, base)[0]
        return _rejection(nodes, kids, decisions, base)
    st = nodes[i]
    win = decisions.get(_kid(st, nodes))
    if win is None:  # the decision cache was reset since this rank was stored
        win = _evaluate(st, base)[0]
    if isinstance(win, Decision):
        win = materialize(win)
    return win if win.node == st.node_id else replace(win, node=st.node_id)


def _fullest_domain(nodes: Sequence[NodeState], places: Sequence[NodePlace | None], live: LiveRanks, top: int,
                    first: int) -> int:
    """The position, among those ranked ``top``, of the node in the fullest NVLink domain (ties: the first)."""
    pl = as_places(places, len(nodes))
    if not any(p.domain is not None for p in pl):
        return first
    with _LIVE_LOCK:
        tied = sorted({j for j in live.heaps[top] if live.ranks[j] == top})
    if len(tied) < 2:
        return first
    free: dict = {}
    size: dict = {}
    for j, st in enumerate(nodes):
        k = ("domain", pl[j].domain) if pl[j].domain is not None else ("node", j)
        free[k] = free.get(k, 0) + len(st.topology.devices) - len(st.taken())
        size[k] = size.get(k, 0) + len(st.topology.devices)

    def key(j: int) -> tuple:
        k = ("domain", pl[j].domain) if pl[j].domain is not None else ("node", j)
        return (free[k] / size[k] if size[k] else 1.0, free[k], j)

    return min(tied, key=key)


def _kid(st, nodes) -> int:
    try:
        return st._kid or st.key_id()
    except AttributeError:
        _check_nodes(nodes)
        raise


def _rank_all(nodes: Sequence[NodeState], base: Request, ranks_of: dict, decisions: dict) -> LiveRanks:
    """Rank every node (cached ranks at C speed, fresh searches for unseen states)."""
    try:
        kids = [st._kid or st.key_id() for st in nodes]
    except AttributeError:
        _check_nodes(nodes)
        raise
    ranks = list(map(ranks_of.get, kids))
    if None in ranks:
        i = ranks.index(None)
        while True:
            kid = kids[i]
            r = ranks_of.get(kid)
            if r is None:
                d, r = _evaluate(nodes[i], base)
                ranks_of[kid] = r
                decisions[kid] = d
            ranks[i] = r
            try:
                i = ranks.index(None, i + 1)
            except ValueError:
                break
    return LiveRanks(nodes, ranks)


def _rejection(nodes: Sequence[NodeState], kids: list[int], decisions: dict, req: Request) -> Rejection:
    if not nodes:
        return Rejection(("there are no nodes",), req)
    reasons: Counter = Counter()
    examples: dict[str, str] = {}
    for st, kid in zip(nodes, kids):
        for reason in decisions[kid].reasons[:1]:
            reasons[reason] += 1
            examples.setdefault(reason, st.node_id or "?")
    if req.required and all(r.startswith("has no device ") for r in reasons):
        raise RequestError(f"no node has device {_list_missing(nodes, req)}", "required",
                           "device indices that some node has")
    lines = [f"{n} node(s): {why} (e.g. {examples[why]})" for why, n in reasons.most_common(4)]
    return Rejection((f"no node of {len(nodes)} can place it", *lines), req)


def _list_missing(nodes: Sequence[NodeState], req: Request) -> str:
    have = set().union(*(set(st.topology.indices) for st in nodes)) if nodes else set()
    return ", ".join(str(d) for d in req.required if d not in have) or ", ".join(map(str, req.required))


def node_rank(state: NodeState, alloc: Allocation | Decision, local: bool = False) -> tuple:
    """How the cluster placer ranks a node's allocation (higher is better; ties go to the earlier node).

    Multi-device requests:

    1. whether the set is as good as the best an *idle* node of that type offers
       (same weakest link), i.e. the job gets its machine type's best interconnect;
    2. ``local``: the node holds the request's data (``near_node``);
    3. packing: a node already partly used beats a fully free one (keep whole
       nodes for large jobs), then the node left with the fewest free devices
       (best fit);
    4. criteria 1-3 of the set (weakest link, total bandwidth, NUMA, NIC, then the
       PCIe paths), so among equally packed nodes the better-wired type wins.

    Single-device requests: the node holding the data first, then a partly
    used node beats a fully free one, then a node where the device taken is a
    *straggler* -- no free partner it would form a best pair with (its type's
    best weakest link on one NUMA node; :func:`~._tiebreak.takes_straggler`) --
    so that a 1-GPU job uses up a device no 2-GPU job could use well before it
    breaks a good pair anywhere in the cluster; then criteria 1-3, then the
    earlier node (first fit in the given order). First fit rather than best fit:
    consolidating small jobs on a stable prefix of the nodes leaves the other
    nodes whole, and in the churn benchmark it strands fewer free devices than
    best fit does. (Straggler first: lower fragmentation, of nodes and of free
    groups, on every churn seed; see benchmarks/placement_churn.py.)

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
        if isinstance(alloc, Decision):
            chosen = alloc.chosen
        else:
            chosen = index_of(state.topology).mask_of(alloc.devices)
        stray = takes_straggler(state, chosen) if taken else 0
        return (1 if local else 0, 1 if taken else 0, stray, key)
    best = _idle_best(state, alloc.request)
    reaches = 1 if best is None or weakest == best else 0
    return (reaches, 1 if local else 0, 1 if taken else 0, -(n - taken - k), key)


_KEY_BITS = 120  # _key_int uses 7 + 31 + 45 + 14 + 9 + 8 = 114 bits


def _key_int(key: tuple) -> int:
    """``Score.key()`` as one int with the same order (within one request)."""
    rank, total, neg_numa, nic, pcie = key
    return ((((((min(rank[0], 127) << 31) | round(rank[1] * 1000)) << 45 | round(total * 1000)) << 9
             | (256 + max(neg_numa, -256))) << 8 | min(nic, 255)) << 14) | pcie


def _rank_int(rank: tuple) -> int:
    """:func:`node_rank` as one int with the same order (within one request of one kind)."""
    out = 0
    for x in rank:
        if isinstance(x, tuple):
            out = (out << _KEY_BITS) | (_key_int(x) if x else 0)
        else:  # small ints: flags and -(devices left), |x| < 2**17
            out = (out << 18) | (x + (1 << 17))
    return out


def _evaluate(st: NodeState, req: Request, local: bool = False) -> tuple:
    """(decision or rejection, rank int; -1 when rejected)."""
    if req.required or req.near:
        have = st.topology.indices
        missing = [d for d in req.required if d not in have]
        if missing:
            return Rejection((f"has no device {missing[0]}",), req, st.node_id), _NO_RANK
        if any(d not in have for d in req.near):
            req = replace(req, near=tuple(d for d in req.near if d in have), near_node=None)
    d = decide(st, req)
    if not d:
        return d, _NO_RANK
    return d, _rank_int(node_rank(st, d, local))

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
