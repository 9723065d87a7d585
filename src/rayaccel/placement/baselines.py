"""Baselines, for benchmarks only: what others do, written here from their descriptions.

* :func:`first_free` -- Ray's raylet: the lowest free device indices.
* :func:`besteffort` -- NVIDIA go-gpuallocator's best-effort policy (used by the
  Kubernetes device plugin): enumerate every partition of the available devices
  into sets of the requested size (padding the list so its length divides
  evenly; only sets with no padding or all of it), score a set by the sum of its
  pair scores (PCIe record SYS 10, NODE 20, PHB 30, PXB 40, PIX 50, plus 100 x N
  for N NVLinks), take the best-scoring partition and return its best set.
  Size 1 returns the first available device. Modeled faithfully where it
  matters: it is NVSwitch-blind (an all-to-all NVLink domain of >= 4 GPUs with
  equal lane counts is treated as NVSwitch-connected, so its NVLink records are
  dropped, as go-gpuallocator's ``TODO: Handle NVSwitch`` does); it sees no
  xGMI/NeuronLink (NVML only). Two deviations, documented: when the padded set
  would score highest (the panic of go-gpuallocator PR #80) the best unpadded
  set of that partition is returned; and the enumeration stops after
  :data:`PARTITION_CAP` partitions (only reached above 12 free devices).
* :func:`random_policy` -- k free devices at random.

All take ``(state, request)`` and return an :class:`Allocation` or a
:class:`Rejection`; they handle whole-device requests and delegate MIG/shared
requests to first-fit.
"""

from __future__ import annotations

import itertools
import random
from typing import Callable

from ..topology import NodeTopology
from ._filter import eligible
from ._index import TopoIndex, index_of
from ._score import score_of
from .node import allocate
from .request import Request
from .result import Allocation, Rejection
from .state import NodeState, as_state

PARTITION_CAP = 20_000
PCIE_SCORE = {"SYS": 10, "NODE": 20, "PHB": 30, "PXB": 40, "PIX": 50}
_RNG = random.Random(0)


def _prep(state, request) -> tuple[NodeState, TopoIndex, list[int]] | Rejection:
    st = as_state(state)
    ix = index_of(st.topology)
    mask, why = eligible(ix, st, request)
    free = [i for i in range(ix.n) if mask >> i & 1]
    if len(free) < request.gpus:
        return Rejection((f"only {len(free)} devices free, {request.gpus} asked", *why), request, st.node_id)
    return st, ix, free


def _make(st: NodeState, ix: TopoIndex, ps: list[int], request: Request) -> Allocation:
    m = 0
    for p in ps:
        m |= 1 << p
    devs = tuple(ix.indices[p] for p in sorted(ps))
    return Allocation(devices=devs, request=request, score=score_of(ix, m), node=st.node_id)


def _other(state, request):
    return allocate(as_state(state), request)


def first_free(state: NodeState | NodeTopology, request: Request) -> Allocation | Rejection:
    """Ray's choice: the ``request.gpus`` lowest free device indices (ignores interconnect/NUMA)."""
    if request.kind != "devices":
        return _other(state, request)
    got = _prep(state, request)
    if isinstance(got, Rejection):
        return got
    st, ix, free = got
    return _make(st, ix, free[: request.gpus], request)


def random_policy(state: NodeState | NodeTopology, request: Request, rng: random.Random | None = None) -> Allocation | Rejection:
    """``request.gpus`` free devices at random (``rng`` defaults to a module generator seeded 0)."""
    if request.kind != "devices":
        return _other(state, request)
    got = _prep(state, request)
    if isinstance(got, Rejection):
        return got
    st, ix, free = got
    return _make(st, ix, sorted((rng or _RNG).sample(free, request.gpus)), request)


def pair_scores(ix: TopoIndex) -> list[list[int]]:
    """go-gpuallocator pair scores over positions (PCIe record + 100 x NVLinks, NVSwitch-blind). Cached."""
    got = ix.cache.get("besteffort")
    if got is not None:
        return got
    topo = ix.topology
    blind = _nvswitch_domains(ix)
    n = ix.n
    S = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            link = topo.link(ix.indices[i], ix.indices[j])
            s = PCIE_SCORE.get(link.pcie if link is not None and link.pcie else "SYS", 10)
            if link is not None and link.kind == "nvlink" and not (i in blind and j in blind):
                s += 100 * (link.count or 1)
            S[i][j] = S[j][i] = s
    ix.cache["besteffort"] = S
    return S


def _nvswitch_domains(ix: TopoIndex) -> set[int]:
    topo = ix.topology
    blind: set[int] = set()
    for dom in topo.direct_domains():
        ps = sorted(ix.pos[d] for d in dom)
        if len(ps) < 4:
            continue
        counts = set()
        ok = True
        for a, b in itertools.combinations(ps, 2):
            l = topo.link(ix.indices[a], ix.indices[b])
            if l is None or l.kind != "nvlink":
                ok = False
                break
            counts.add(l.count)
        if ok and len(counts) == 1:
            blind.update(ps)
    return blind


def besteffort(state: NodeState | NodeTopology, request: Request) -> Allocation | Rejection:
    """go-gpuallocator's best-effort policy (see module docstring)."""
    if request.kind != "devices":
        return _other(state, request)
    got = _prep(state, request)
    if isinstance(got, Rejection):
        return got
    st, ix, free = got
    k = request.gpus
    if k == 1:
        return _make(st, ix, free[:1], request)
    S = pair_scores(ix)
    memo: dict = {}

    def set_score(s: tuple) -> int:
        v = memo.get(s)
        if v is None:
            v = sum(S[a][b] for a, b in itertools.combinations(s, 2))
            memo[s] = v
        return v

    pad = (-len(free)) % k
    best = None  # (partition score, sets)
    count = 0
    # the padded set holds k - pad real devices (all of the padding); enumerate it first
    padded_choices = itertools.combinations(free, k - pad) if pad else [()]
    for pset in padded_choices:
        rest = [d for d in free if d not in pset]
        for part in _partitions(rest, k):
            count += 1
            sets = list(part) + ([pset] if pad else [])
            sc = sum(set_score(s) for s in sets)
            if best is None or sc > best[0]:
                best = (sc, sets)
            if count >= PARTITION_CAP:
                break
        if count >= PARTITION_CAP:
            break
    assert best is not None
    full = [s for s in best[1] if len(s) == k]
    chosen = max(full, key=set_score)
    return _make(st, ix, list(chosen), request)


def _partitions(items: list[int], k: int):
    if not items:
        yield ()
        return
    first, rest = items[0], items[1:]
    for comp in itertools.combinations(rest, k - 1):
        s = (first,) + comp
        left = [x for x in rest if x not in comp]
        for tail in _partitions(left, k):
            yield (s,) + tail


#: Name -> policy, for benchmarks.
POLICIES: dict[str, Callable] = {"first_free": first_free, "besteffort": besteffort, "random": random_policy}
