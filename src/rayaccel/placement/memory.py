"""GPU memory as a resource: share one device by memory, best-fit.

A shared request (``gpu_memory=X, exclusive=False``) goes to the device whose
free memory after the reservation is smallest but still >= 0 (best fit keeps
large holes for large requests). A device is never oversubscribed. Whole-device
and shared work never meet: a device held whole (or in MIG mode, or holding a
busy MIG instance) takes no shared work, and a device with any reservation is
not free for exclusive use (see :meth:`NodeState.taken`).
"""

from __future__ import annotations

from ..units import format_bytes
from .pools import in_gpu_pool
from .request import Request
from .result import Allocation, Rejection, Score
from .state import NodeState


def place_shared(state: NodeState, request: Request) -> Allocation | Rejection:
    """Best-fit a shared memory request onto one device of ``state``."""
    want = int(request.gpu_memory)  # type: ignore[arg-type]
    busy_parts = {p.parent for p in state.topology.partitions() if p.key in state.busy_partitions}
    best = None
    reasons: list[str] = []
    for d in sorted(state.topology.devices, key=lambda d: d.index):
        i = d.index
        if d.health == "failed":
            reasons.append(f"device {i} has failed")
        elif i in state.busy:
            reasons.append(f"device {i} is held whole")
        elif not in_gpu_pool(d) or i in busy_parts:  # MIG mode or MIG instances: used through them (.pools)
            reasons.append(f"device {i} is in MIG mode")
        elif request.vendor and d.vendor.lower() != request.vendor.lower():
            reasons.append(f"device {i} is not vendor {request.vendor}")
        elif request.model and request.model.lower() not in (d.model or "").lower():
            reasons.append(f"device {i} is not model ~{request.model!r}")
        elif d.memory_bytes is None:
            reasons.append(f"device {i} has unknown memory size")
        else:
            free = d.memory_bytes - state.memory_used.get(i, 0)
            if free < want:
                reasons.append(f"device {i} has {format_bytes(max(free, 0))} free, {format_bytes(want)} asked")
                continue
            left = free - want
            if best is None or left < best[0]:
                best = (left, i, free)
    if best is None:
        if not state.topology.devices:
            reasons = ["the node has no devices"]
        return Rejection(tuple(reasons[:8]) + ((f"... and {len(reasons) - 8} more",) if len(reasons) > 8 else ()),
                         request, state.node_id)
    left, i, free = best
    dev = state.topology.device(i)
    score = Score(weakest=None, weakest_rank=None, total_bandwidth_gbps=0.0,
                  numa_nodes=1, free_quality=(-left,))
    why = (f"best fit: device {i} has {format_bytes(free)} free and keeps {format_bytes(left)} after this reservation"
           f" (of {format_bytes(dev.memory_bytes)})",)
    return Allocation(devices=(i,), request=request, score=score, memory_bytes={i: want}, node=state.node_id, why=why)
