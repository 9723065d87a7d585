"""Gangs: N workers of k devices each, placed all at once (every worker or none).

:func:`place_gang` with ``strategy``:

* ``pack``: fill nodes: a worker goes to a node already used by the gang when it
  fits there, else to the node that can hold the most remaining workers;
* ``spread``: one worker per node where possible (the best node not used yet, ties
  to the node with the most free devices), then round again;
* ``strict-pack``: all N*k devices on one node (with ``interconnect="nvlink"`` in
  one NVLink domain of that node), the node whose best N*k set scores best; the set
  is then split into workers, each the best k-set left in it. Else a Rejection.

**Across nodes** (``places=``, one :class:`~.domains.NodePlace` per node): a gang that
no single node holds goes, in this order of preference, to

1. *one NVLink domain* that has room: among those, the one whose modeled all-reduce
   is best (:func:`~.domains.ring_allreduce`), then the tightest fit (fewest workers'
   room left in it: a domain's free trays are not broken when a smaller one fits, so
   whole domains stay free for later big gangs), then the first in node order;
2. else the *lowest common network level* with room (levels finest first,
   :func:`~.domains.level_order`): the tightest-fitting group of that level; inside
   it the gang takes the smallest domains whole first (their fragments) and puts the
   remainder into the tightest-fitting domain;
3. else the whole cluster, the same way.

Inside the chosen nodes the workers are placed as ``pack`` / ``spread`` say. A gang
that one node holds stays on one node; among such nodes, ties go to the node in the
fullest domain (so a one-tray job does not open a whole free domain). Rank order runs
node by node (domain by domain), so the ring crosses the fewest slow steps.

The result is a :class:`GangPlacement`: the workers in rank order, what decided
(``scope``: node, domain, level or cluster), the domain or level, the modeled
all-reduce and its bottleneck; ``explain()`` says it in words. Without any domain or
level (``places`` absent or empty) the placement is exactly the per-node one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from ..errors import RequestError
from .domains import NOWHERE, NodePlace, as_places, level_order, ring_allreduce
from .node import allocate
from .request import Request
from .result import Allocation, GangAllocation, Rejection
from .state import NodeState

STRATEGIES = ("pack", "spread", "strict-pack")
SCOPES = ("node", "nodes", "domain", "level", "cluster")


@dataclass(frozen=True, slots=True)
class GangPlacement(GangAllocation):
    """A :class:`~.result.GangAllocation` that says why it lies where it does.

    Attributes:
        scope: what held the gang: ``"node"`` (one node), ``"nodes"`` (several nodes, no
            domain or level known), ``"domain"`` (one NVLink domain), ``"level"`` (one group
            of a network level) or ``"cluster"`` (no common level had room).
        domain: the NVLink domain (scope ``domain``, or ``node`` on a node in one), else None.
        level: ``(level name, value)`` for scope ``level``, else None.
        allreduce_bandwidth_gbps: modeled ring all-reduce over every worker's devices, GB/s.
        bottleneck: what bounds it (:class:`~.domains.RingModel`).
        why: sentences: ``"decided by: ..."`` first, then what it was chosen over.
    """

    scope: str = "node"
    domain: str | None = None
    level: tuple[str, str] | None = None
    allreduce_bandwidth_gbps: float = 0.0
    bottleneck: str = ""
    why: tuple[str, ...] = ()

    def explain(self) -> str:
        """The workers (as :meth:`GangAllocation.explain`), what decided, and the modeled all-reduce."""
        lines = [GangAllocation.explain(self)]
        lines.extend(f"  {w}" for w in self.why)
        lines.append(f"  modeled all-reduce {self.allreduce_bandwidth_gbps:g} GB/s (bounded by {self.bottleneck})")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"ok": True, "strategy": self.strategy, "scope": self.scope, "domain": self.domain,
                "level": list(self.level) if self.level else None,
                "allreduce_bandwidth_gbps": self.allreduce_bandwidth_gbps, "bottleneck": self.bottleneck,
                "workers": [{"node": w.node, "devices": list(w.devices)} for w in self.workers],
                "why": list(self.why), "explain": self.explain()}


def place_gang(nodes: Sequence[NodeState], workers: int, gpus_per_worker: int, strategy: str = "pack",
               interconnect: str = "any", *, places: Sequence[NodePlace | None] | None = None,
               **fields) -> GangPlacement | Rejection:
    """Place ``workers`` workers of ``gpus_per_worker`` devices each (see module docstring).

    Args:
        nodes: node states. workers: N >= 1. gpus_per_worker: k >= 1.
        strategy: ``pack``, ``spread`` or ``strict-pack``. interconnect: per worker.
        places: one :class:`~.domains.NodePlace` (or None) per node, in the order of ``nodes``.
        **fields: other :class:`Request` fields applied to each worker (``same_numa``, ``nic``, ...).

    Raises:
        RequestError: bad strategy, counts, places or request fields.
    """
    if strategy not in STRATEGIES:
        raise RequestError(f"unknown strategy {strategy!r}", "strategy", ", ".join(STRATEGIES))
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise RequestError(f"expected an int >= 1, got {workers!r}", "workers")
    req = Request(gpus=gpus_per_worker, interconnect=interconnect, **fields)
    if req.kind != "devices":
        raise RequestError("gangs take whole devices", "gpus_per_worker", "an int >= 1")
    states = dict(enumerate(_check_nodes(nodes)))
    pl = as_places(places, len(states))
    if not states:
        return Rejection(("there are no nodes",), req)
    order = _domain_order(states, pl)
    if strategy == "strict-pack":
        return _strict(states, pl, order, workers, req)
    if not any(p.domain is not None or p.levels for p in pl):
        got = _greedy(states, list(states), req, workers, strategy)
        if isinstance(got, Rejection):
            return got
        nodes_used = {i for i, _ in got}
        scope = "node" if len(nodes_used) == 1 else "nodes"
        why = ("decided by: one node holds the gang",) if scope == "node" else (
            "decided by: per node (no NVLink domain or network level known for these nodes)",)
        return _result(states, pl, got, strategy, scope, why)
    return _across(states, pl, order, workers, req, strategy)


# ------------------------------------------------------------------ per node
def _greedy(states: dict, allowed: list[int], req: Request, workers: int, strategy: str) -> list | Rejection:
    """Place ``workers`` on the nodes ``allowed`` (ties to the earlier in that list): [(node, Allocation)]."""
    cur = {i: states[i] for i in allowed}
    out: list[tuple[int, Allocation]] = []
    used: list[int] = []
    for w in range(workers):
        pick = None
        if strategy == "pack":
            for i in reversed(used):
                a = allocate(cur[i], req)
                if a:
                    pick = (i, a)
                    break
            if pick is None:
                pick = _best_new(cur, req, set(used), workers - w, spread=False)
        else:
            pick = _best_new(cur, req, set(used), 1, spread=True)
            if pick is None:
                pick = _best_new(cur, req, set(), 1, spread=True)
        if pick is None:
            first = allocate(states[allowed[0]] if allowed else states[0], req)
            why = first.reasons[0] if not first and first.reasons else "no node has room"
            node = (states[allowed[0]] if allowed else states[0]).node_id
            return Rejection((f"worker {w} of {workers} ({req.describe()}) fits on no node after placing {w}",
                              f"e.g. node {node}: {why}"), req)
        i, a = pick
        out.append((i, a))
        used.append(i)
        cur[i] = cur[i].with_busy(a.devices)
    return out


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


def _fits(st: NodeState, req: Request, most: int) -> int:
    """How many workers of ``req`` the node holds now (at most ``most``)."""
    free = len(st.topology.devices) - len(st.taken())
    n = 0
    while n < most and free >= req.gpus:
        a = allocate(st, req)
        if not a:
            break
        st = st.with_busy(a.devices)
        free -= req.gpus
        n += 1
    return n


def _free_gpus(st: NodeState) -> int:
    return len(st.topology.devices) - len(st.taken())


def _domain_of(i: int, places: list[NodePlace]) -> tuple:
    """A node's domain key: its NVLink domain, or the node itself (an island)."""
    d = places[i].domain
    return ("domain", d) if d is not None else ("node", i)


def _domain_order(states: dict, places: list[NodePlace]) -> list[int]:
    """Node indices, nodes of the fullest domains first (smallest share of their devices free, then
    fewest free devices), then node order."""
    free: dict[tuple, int] = {}
    size: dict[tuple, int] = {}
    for i, st in states.items():
        k = _domain_of(i, places)
        free[k] = free.get(k, 0) + _free_gpus(st)
        size[k] = size.get(k, 0) + len(st.topology.devices)

    def key(i: int) -> tuple:
        k = _domain_of(i, places)
        return (free[k] / size[k] if size[k] else 1.0, free[k], i)

    return sorted(states, key=key)


def _name(states: dict, i: int) -> str:
    return states[i].node_id or f"#{i}"


# ------------------------------------------------------------------ strict-pack
def _strict(states: dict, places: list[NodePlace], order: list[int], workers: int,
            req: Request) -> GangPlacement | Rejection:
    total = Request(gpus=workers * req.gpus, interconnect=req.interconnect, vendor=req.vendor, model=req.model,
                    gpu_memory=req.gpu_memory)
    best = None
    for i in order:  # ties go to the node in the fullest domain
        st = states[i]
        a = allocate(st, total)
        if not a:
            continue
        key = (a.score.key(), -_free_gpus(st))
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
        out.append((i, a))
        cur = cur.with_busy(a.devices)
    return _result(states, places, out, "strict-pack", "node", ("decided by: strict-pack (one node)",))


# ------------------------------------------------------------------ across nodes
def _across(states: dict, places: list[NodePlace], order: list[int], workers: int, req: Request,
            strategy: str) -> GangPlacement | Rejection:
    fits = {i: _fits(states[i], req, workers) for i in order}
    if sum(fits.values()) < workers:  # the per-node greedy words the rejection
        got = _greedy(states, order, req, workers, strategy)
        if isinstance(got, Rejection):
            return got
    if strategy == "pack" or workers == 1:
        singles = [i for i in order if fits[i] >= workers]
        if singles:
            got = _greedy(states, singles, req, workers, strategy)
            if not isinstance(got, Rejection):
                i = got[0][0]
                why = ["decided by: one node holds the gang"]
                if places[i].domain is not None:
                    why.append(f"then: of the nodes that hold it, ties went to the fullest NVLink domain "
                               f"({places[i].domain})")
                return _result(states, places, got, strategy, "node", tuple(why), domain=places[i].domain)
    domains: dict[tuple, list[int]] = {}
    for i in order:
        domains.setdefault(_domain_of(i, places), []).append(i)
    room = {k: sum(fits[i] for i in v) for k, v in domains.items()}
    multi = {k: v for k, v in domains.items() if k[0] == "domain"}
    tried = []  # (key, gang, domain key); keys compare: more nodes (spread), all-reduce, tighter fit
    for k, members in multi.items():
        if room[k] < workers:
            continue
        got = _greedy(states, members, req, workers, strategy)
        if isinstance(got, Rejection):
            continue
        g = _result(states, places, got, strategy, "domain", (), domain=k[1])
        spread_nodes = len({i for i, _ in got}) if strategy == "spread" else 0
        tried.append(((spread_nodes, round(g.allreduce_bandwidth_gbps, 3), -(room[k] - workers)), g, k))
    if tried:
        best = max(tried, key=lambda t: t[0])  # ties: the first, in the order of the fullest domain
        key, g, k = best
        why = [f"decided by: NVLink domain {k[1]} holds all {workers} workers "
               f"({room[k] - workers} worker(s) of room left in it)"]
        for rkey, rg, rk in [t for t in tried if t is not best][:3]:
            if rkey[0] != key[0]:
                how = f"spreads over {key[0]} nodes, not {rkey[0]}"
            elif rkey[1] != key[1]:
                how = f"modeled all-reduce {g.allreduce_bandwidth_gbps:g} GB/s, not {rg.allreduce_bandwidth_gbps:g}"
            elif rkey[2] != key[2]:
                how = (f"the tighter fit ({room[k] - workers} left, not {room[rk] - workers}: "
                       "keeps the emptier domain whole)")
            else:
                how = "a tie: the fuller domain, then node order"
            why.append(f"chosen over {rk[1]}: {how}")
        return _with_why(g, why)
    widest = max(multi, key=lambda kk: room[kk], default=None)
    lead = (f"no NVLink domain has room for {workers} workers"
            + (f" (most: {widest[1]} with {room[widest]})" if widest is not None else " (no domains known)"))
    for lvl in level_order(places):
        groups: dict[str, list[int]] = {}
        for i in order:
            v = places[i].level(lvl)
            if v is not None:
                groups.setdefault(v, []).append(i)
        ok = sorted((sum(fits[i] for i in m), v) for v, m in groups.items() if sum(fits[i] for i in m) >= workers)
        for cap, v in ok:  # tightest fit first
            got = _span(states, places, groups[v], fits, req, workers, strategy)
            if isinstance(got, Rejection):
                continue
            why = [lead, f"decided by: network level {lvl}={v}, the lowest common level with room "
                         f"({cap - workers} worker(s) of room left in it)"]
            if len(ok) > 1:
                why.append("chosen over " + ", ".join(f"{lvl}={vv} ({c - workers} left)" for c, vv in ok
                                                      if vv != v)[:300] + ": the tighter fit")
            return _result(states, places, got, strategy, "level", tuple(why), level=(lvl, v))
    got = _span(states, places, order, fits, req, workers, strategy)
    if isinstance(got, Rejection):
        return got
    levels = level_order(places)
    tail = ("no network level has a group with room" if levels else "no network levels known")
    return _result(states, places, got, strategy, "cluster", (lead, f"decided by: the whole cluster ({tail})"))


def _span(states: dict, places: list[NodePlace], members: list[int], fits: dict, req: Request, workers: int,
          strategy: str) -> list | Rejection:
    """Place a gang over several domains among ``members``: the smallest domains whole first (their
    fragments), the remainder in the tightest-fitting domain that holds it."""
    doms: dict[tuple, list[int]] = {}
    for i in members:
        if fits[i]:
            doms.setdefault(_domain_of(i, places), []).append(i)
    cap = {k: sum(fits[i] for i in v) for k, v in doms.items()}
    todo = sorted(doms, key=lambda k: (cap[k], members.index(doms[k][0])))
    plan: list[tuple[tuple, int]] = []
    left = workers
    while left > 0 and todo:
        fit_one = [k for k in todo if cap[k] >= left]
        if fit_one:
            plan.append((fit_one[0], left))  # todo is sorted by room: the first that holds it is the tightest
            left = 0
            break
        k = todo.pop(0)
        plan.append((k, cap[k]))
        left -= cap[k]
    if left > 0:
        return _greedy(states, members, req, workers, strategy)
    out: list = []
    for k, n in plan:
        got = _greedy(states, doms[k], req, n, strategy)
        if isinstance(got, Rejection):
            return got
        out.extend(got)
    return out


def _result(states: dict, places: list[NodePlace], got: list, strategy: str, scope: str, why: tuple,
            domain: str | None = None, level: tuple[str, str] | None = None) -> GangPlacement:
    blocks: dict[int, list[int]] = {}
    for i, a in got:
        blocks.setdefault(i, []).extend(a.devices)
    model = ring_allreduce([(states[i].topology, places[i], devs) for i, devs in blocks.items()])
    bottleneck = model.bottleneck
    if bottleneck.startswith("inside node "):
        bottleneck = f"inside node {_name(states, list(blocks)[int(bottleneck.rsplit(' ', 1)[1])])}"
    return GangPlacement(tuple(a for _, a in got), strategy, scope=scope, domain=domain, level=level,
                         allreduce_bandwidth_gbps=model.allreduce_bandwidth_gbps, bottleneck=bottleneck, why=why)


def _with_why(g: GangPlacement, why: list[str]) -> GangPlacement:
    return GangPlacement(g.workers, g.strategy, scope=g.scope, domain=g.domain, level=g.level,
                         allreduce_bandwidth_gbps=g.allreduce_bandwidth_gbps, bottleneck=g.bottleneck,
                         why=tuple(why))


def _check_nodes(nodes) -> list[NodeState]:
    try:
        out = list(nodes)
    except TypeError:
        raise RequestError(f"expected a sequence of NodeState, got {type(nodes).__name__}", "nodes") from None
    for i, n in enumerate(out):
        if not isinstance(n, NodeState):
            raise RequestError(f"nodes[{i}] is a {type(n).__name__}, expected a NodeState", "nodes")
    return out


__all__ = ["NOWHERE", "SCOPES", "STRATEGIES", "GangPlacement", "place_gang"]
