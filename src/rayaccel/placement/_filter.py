"""Stage 1 of a node's decision, the filter: which devices may take part, and why the others may not.

A device is eligible for a whole-device request when it is in the GPU pool
(:mod:`.pools`: no MIG instance, not in MIG mode, not failed), not taken (held
whole, holding shared-memory reservations or a busy MIG instance) and matches the
request's vendor, model and memory. :func:`filter_devices` gives the eligible
devices (a position mask) or a :class:`~.result.Rejection` when they cannot hold
the request: fewer than asked, or a required device among the rejected -- each
rejected device named with its reason, the way a Kubernetes filter plugin answers
``Unschedulable`` with reasons.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import RequestError
from ..units import format_bytes
from ._index import TopoIndex, pool_mask
from .request import Request
from .result import Rejection
from .state import NodeState, _ranges


@dataclass(frozen=True, slots=True)
class Eligible:
    """What the filter let through.

    Attributes:
        mask: positions of the eligible devices.
        excluded: sentences on why the other devices are not eligible, or None when the
            filter took its fast path (nothing but the state's taken devices and the pool
            to look at; :func:`eligible` writes them when a rejection needs them).
    """

    mask: int
    excluded: tuple[str, ...] | None


def filter_devices(ix: TopoIndex, state: NodeState, request: Request) -> Eligible | Rejection:
    """The devices of ``state`` that may take part in ``request`` (whole devices), or why too few may.

    Raises:
        RequestError: a ``required`` or ``near`` index the node lacks.
    """
    k = request.gpus
    for name in ("required", "near"):
        bad = [d for d in getattr(request, name) if d not in ix.pos]
        if bad:
            raise RequestError(f"no device {bad[0]} on this node", name, f"device indices {_ranges(ix.indices)}")
    if request.vendor or request.model or request.gpu_memory is not None or state.busy_partitions:
        mask, why = eligible(ix, state, request)
        excluded: tuple[str, ...] | None = tuple(why)
    else:  # the common case, from the state key: in the pool and not taken
        mask = pool_mask(ix) & ~state.key[1]
        excluded = None
    if request.required:
        req = ix.mask_of(request.required)
        if req & ~mask:
            unfit = _unfit(ix, state, request)
            lost = [d for d in request.required if not mask >> ix.pos[d] & 1]
            return Rejection(tuple(f"required device {d} is {unfit.get(d, 'not eligible').replace('memory: ', '')}"
                                   for d in lost), request, state.node_id)
    n_free = mask.bit_count()
    if n_free < k:
        if excluded is None:
            excluded = tuple(eligible(ix, state, request)[1])
        head = f"only {n_free} device{'s' if n_free != 1 else ''} free{' that match' if request.vendor or request.model or request.gpu_memory else ''}, {k} asked"
        if ix.n < k:
            head = f"the node has {ix.n} device{'s' if ix.n != 1 else ''}, {k} asked"
        return Rejection((head, *excluded), request, state.node_id)
    return Eligible(mask, excluded)


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
        elif d.partitions:  # MIG instances with the mode unknown: used through them, never whole
            out[idx] = "holding MIG instances (use mig=...)"
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
    reasons = [f"{len(v)} {'is' if len(v) == 1 else 'are'} {k}: {list_devices(v)}" for k, v in why.items()]
    return mask, reasons + notes[:6]


def list_devices(xs: list[int]) -> str:
    """``"0, 1, 2"``: at most 12 device indices, then ``" ..."``."""
    return ", ".join(map(str, xs[:12])) + (" ..." if len(xs) > 12 else "")
