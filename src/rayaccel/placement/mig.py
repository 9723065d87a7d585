"""MIG: place a request on an existing instance, and plan new layouts.

* :func:`place_instance` takes a free existing instance of the asked profile.
  Among several, it packs: the GPU with the fewest free slices left is used
  first (its free space is already fragmented), so that whole free GPUs stay
  available for large profiles; then the lowest GPU and slot.
* :func:`plan_mig_layout` proposes new instances for pending requests on GPUs
  with MIG profile tables. Existing instances (busy or free) are never touched,
  unless ``reclaim_free=True`` lets it destroy *free* instances no request uses.
  Placements are valid by construction: a new instance starts at one of its
  profile's placements and its slices ``[start, start+size)`` overlap no other
  instance; compute slices (the ``Ng`` of the name) add up to at most 7.
  It maximizes the number of requests placed (exact branch and bound with
  memoisation), then prefers placements that block the fewest other
  placements. :meth:`MigLayout.commands` prints the ``nvidia-smi mig`` lines
  that would create it (dry run: nothing is applied).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..errors import RequestError
from ..topology import Device, MigProfile, NodeTopology, Partition
from .request import Request
from .result import Allocation, Rejection, Score
from .state import NodeState

_SLICES = 8
_COMPUTE = 7


def _g(profile: str) -> int:
    m = re.match(r"(\d+)g\.", profile)
    return int(m.group(1)) if m else 0


def _span(dev: Device, p: Partition) -> tuple[int, int] | None:
    if p.start is not None:
        size = p.size
        if size is None:
            prof = dev.profile(p.profile)
            size = prof.slots if prof else 1
        return (p.start, p.start + size)
    return None


def place_instance(state: NodeState, request: Request) -> Allocation | Rejection:
    """A free existing MIG instance of ``request.mig`` on ``state`` (see module docstring)."""
    name = request.mig
    cands = []
    free_other: dict[str, int] = {}
    for d in sorted(state.topology.devices, key=lambda d: d.index):
        if d.health == "failed" or d.index in state.busy or not d.partitions:
            continue
        if request.vendor and d.vendor.lower() != request.vendor.lower():
            continue
        if request.model and request.model.lower() not in (d.model or "").lower():
            continue
        used = sum((s[1] - s[0]) for p in d.partitions if (s := _span(d, p)))
        for p in d.partitions:
            if p.key in state.busy_partitions:
                continue
            if p.profile == name:
                cands.append((_SLICES - used, d.index, p.start if p.start is not None else 99, p))
            else:
                free_other[p.profile] = free_other.get(p.profile, 0) + 1
    if not cands:
        free_txt = ", ".join(f"{k} x{v}" for k, v in sorted(free_other.items())) or "none"
        reasons = [f"no free MIG instance of profile {name} (free: {free_txt})"]
        can = [d.index for d in state.topology.devices if d.profile(name) is not None and d.index not in state.busy]
        known = sorted({m.name for d in state.topology.devices for m in d.mig_profiles}
                       | {p.profile for d in state.topology.devices for p in d.partitions})
        if not any(name == k for k in known):
            reasons.append(f"no device on this node knows MIG profile {name!r} "
                           f"(profiles here: {', '.join(known) if known else 'none: no MIG-capable device'})")
        elif can:
            reasons.append(f"devices {', '.join(map(str, can))} support {name}: plan_mig_layout() can propose one")
        return Rejection(tuple(reasons), request, state.node_id)
    cands.sort(key=lambda c: (c[0], c[1], c[2]))
    _, dev, start, part = cands[0]
    why = (f"{len(cands)} free {name} instance(s); took the one on the device with the least unpartitioned space"
           " (packing keeps whole GPUs free for large profiles)",)
    score = Score(weakest=None, weakest_rank=None, total_bandwidth_gbps=0.0, numa_nodes=1)
    return Allocation(devices=(dev,), request=request, score=score, partitions=(part,),
                      memory_bytes={dev: part.memory_bytes}, node=state.node_id, why=why)


@dataclass(frozen=True, slots=True)
class NewInstance:
    """One instance the layout would create: ``gpu``, ``profile`` (a :class:`MigProfile`), ``start`` slice, ``request`` index."""

    gpu: int
    profile: MigProfile
    start: int
    request: int

    @property
    def end(self) -> int:
        return self.start + self.profile.slots


@dataclass(frozen=True, slots=True)
class MigLayout:
    """A proposed MIG layout.

    Attributes:
        assigned: request index -> existing :class:`Partition` reused, or the :class:`NewInstance`.
        create: new instances, by GPU then start.
        destroy: free existing instances to destroy first (only with ``reclaim_free``).
        unplaced: indices of requests that do not fit, with a reason each.
    """

    requests: tuple[str, ...]
    assigned: dict = field(default_factory=dict)
    create: tuple[NewInstance, ...] = ()
    destroy: tuple[Partition, ...] = ()
    unplaced: tuple[tuple[int, str], ...] = ()

    @property
    def placed(self) -> int:
        """How many requests the layout serves."""
        return len(self.assigned)

    def commands(self) -> list[str]:
        """``nvidia-smi mig`` command lines that would apply this layout (dry run; ``-cgi <id>:<start>`` pins placements)."""
        out: list[str] = []
        for p in self.destroy:
            gi = p.gi_id if p.gi_id is not None else "<gi>"
            out.append(f"nvidia-smi mig -i {p.parent} -gi {gi} -dci")
            out.append(f"nvidia-smi mig -i {p.parent} -gi {gi} -dgi")
        by_gpu: dict[int, list[NewInstance]] = {}
        for ni in self.create:
            by_gpu.setdefault(ni.gpu, []).append(ni)
        for gpu in sorted(by_gpu):
            specs = ",".join(f"{ni.profile.id}:{ni.start}" for ni in sorted(by_gpu[gpu], key=lambda x: x.start))
            out.append(f"nvidia-smi mig -i {gpu} -cgi {specs} -C")
        return out

    def explain(self) -> str:
        """Human summary: what is reused, created, destroyed, and what does not fit."""
        lines = [f"MIG layout: {self.placed} of {len(self.requests)} requests placed"]
        for i in sorted(self.assigned):
            a = self.assigned[i]
            if isinstance(a, Partition):
                lines.append(f"  request {i} ({self.requests[i]}): existing instance {a.key} (slot {a.start})")
            else:
                lines.append(f"  request {i} ({self.requests[i]}): new on GPU {a.gpu} at slices [{a.start}, {a.end})")
        for i, why in self.unplaced:
            lines.append(f"  request {i} ({self.requests[i]}): not placed - {why}")
        return "\n".join(lines)


def plan_mig_layout(gpus: NodeTopology | NodeState | Sequence[Device], requests: Iterable[str | Request], *,
                    busy_partitions: Iterable[str] = (), reclaim_free: bool = False) -> MigLayout:
    """Propose the MIG layout that fits the most ``requests`` (see module docstring).

    Args:
        gpus: a topology, a node state (its ``busy_partitions`` are used) or devices.
        requests: profile names (``"3g.40gb"``) or :class:`Request` with ``mig`` set.
        busy_partitions: keys of instances in use (never touched).
        reclaim_free: allow destroying free existing instances that no request reuses.

    Raises:
        RequestError: a request that is not a MIG profile name.
    """
    busy = set(busy_partitions)
    if isinstance(gpus, NodeState):
        busy |= set(gpus.busy_partitions)
        held = gpus.busy
        devices = [d for d in gpus.topology.devices if d.index not in held]
    elif isinstance(gpus, NodeTopology):
        devices = list(gpus.devices)
    else:
        devices = list(gpus)
    names: list[str] = []
    for i, r in enumerate(requests):
        if isinstance(r, Request):
            if r.mig is None:
                raise RequestError(f"request {i} is not a MIG request", "requests", "profile names or Request(mig=...)")
            names.append(r.mig)
        elif isinstance(r, str) and r.strip():
            names.append(r.strip())
        else:
            raise RequestError(f"request {i}: expected a profile name, got {r!r}", "requests", "e.g. '3g.40gb'")
    devices = sorted((d for d in devices if d.health != "failed" and (d.mig_profiles or d.partitions)), key=lambda d: d.index)
    # 1. reuse free existing instances of the asked profile
    assigned: dict = {}
    used_parts: set[str] = set()
    for i, name in enumerate(names):
        for d in devices:
            for p in d.partitions:
                if p.profile == name and p.key not in busy and p.key not in used_parts:
                    assigned[i] = p
                    used_parts.add(p.key)
                    break
            if i in assigned:
                break
    # 2. occupancy per GPU (bitmask of slices) and compute used
    occ: list[int] = []
    comp: list[int] = []
    destroy: list[Partition] = []
    for d in devices:
        m = 0
        c = 0
        for p in d.partitions:
            removable = reclaim_free and p.key not in busy and p.key not in used_parts
            if removable:
                destroy.append(p)
                continue
            span = _span(d, p)
            if span is None:
                m = (1 << _SLICES) - 1  # unknown placement: treat the GPU as full
            else:
                for s in range(*span):
                    m |= 1 << s
            c += _g(p.profile)
        occ.append(m)
        comp.append(c)
    pending = sorted((i for i in range(len(names)) if i not in assigned),
                     key=lambda i: (-_size(devices, names[i]), i))
    placements = _search(devices, names, pending, occ, comp)
    create = []
    unplaced = []
    for i in pending:
        hit = placements.get(i)
        if hit is None:
            if not any(d.profile(names[i]) for d in devices):
                unplaced.append((i, f"no GPU has MIG profile {names[i]}"))
            else:
                unplaced.append((i, "no free valid placement left"))
        else:
            g, prof, start = hit
            ni = NewInstance(devices[g].index, prof, start, i)
            assigned[i] = ni
            create.append(ni)
    kept_destroy = tuple(p for p in destroy if any(ni.gpu == p.parent for ni in create))
    return MigLayout(tuple(names), assigned, tuple(sorted(create, key=lambda x: (x.gpu, x.start))), kept_destroy,
                     tuple(sorted(unplaced)))


def _size(devices: list[Device], name: str) -> int:
    for d in devices:
        p = d.profile(name)
        if p is not None:
            return p.slots
    return 0


def _search(devices, names, pending, occ, comp) -> dict:
    """Max requests placed; ties -> fewest blocked placements. Exact with memo over (i, occupancy)."""
    memo: dict = {}

    def options(i, occ_t, comp_t):
        out = []
        name = names[pending[i]]
        for g, d in enumerate(devices):
            prof = d.profile(name)
            if prof is None or comp_t[g] + _g(name) > _COMPUTE:
                continue
            for st in prof.placements:
                span = ((1 << prof.slots) - 1) << st
                if st + prof.slots <= _SLICES and not occ_t[g] & span:
                    out.append((_blocked(d, occ_t[g], span), g, st, prof, span))
        out.sort(key=lambda o: (o[0], -bin(occ_t[o[1]]).count("1"), o[1], -o[2]))
        return out

    def go(i, occ_t, comp_t):
        if i == len(pending):
            return (0, 0), ()
        key = (i, occ_t, comp_t)
        if key in memo:
            return memo[key]
        best = go(i + 1, occ_t, comp_t)
        best = (best[0], best[1])
        for blocked, g, st, prof, span in options(i, occ_t, comp_t):
            o2 = occ_t[:g] + (occ_t[g] | span,) + occ_t[g + 1:]
            c2 = comp_t[:g] + (comp_t[g] + _g(prof.name),) + comp_t[g + 1:]
            (cnt, pen), rest = go(i + 1, o2, c2)
            cand = ((cnt + 1, pen - blocked), ((pending[i], (g, prof, st)),) + rest)
            if cand[0] > best[0]:
                best = cand
            if best[0][0] == len(pending) - i and best[0][1] == 0:
                break
        memo[key] = best
        return best

    _, chosen = go(0, tuple(occ), tuple(comp))
    return dict(chosen)


def _blocked(d: Device, occ: int, span: int) -> int:
    """How many currently-free placements of the device's profiles this span would block."""
    n = 0
    for p in d.mig_profiles:
        for st in p.placements:
            s = ((1 << p.slots) - 1) << st
            if not occ & s and s & span:
                n += 1
    return n
