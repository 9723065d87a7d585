"""Which path one consumer takes for one object, from both ends' facts (:func:`rayaccel.transfer.tensor_path`).

Same node: CPU tensors map the producer's segment (or, without one, Ray's object store);
GPU tensors use CUDA IPC where :func:`~rayaccel.transfer.tensor_path` finds a peer path, else
the producer stages them into host memory. Other node: NIXL, through the NICs nearest each end.
``RAYACCEL_RDT_PATH`` (:data:`FORCE_ENV`) overrides the choice, for diagnostics and device checks.
"""

from __future__ import annotations

import os
from typing import Any, Optional

from ...errors import TransportError, TransportUnavailable
from ...transfer import TENSOR_PATHS, Endpoint, TensorPath, tensor_path
from . import local

#: Diagnostic override of the path choice (``cuda-ipc``, ``shared-memory``, ``nixl``, ``object-store``).
FORCE_ENV = "RAYACCEL_RDT_PATH"


def decide(meta: Any, device: Any, what: str) -> tuple[TensorPath, str]:
    """The path for one consumer (this process) and what it does: ``map`` (the segment the producer made
    with the object), ``segment`` (ask the producer for it first), ``ipc``, ``host`` (GPU memory the
    producer stages in a segment), ``nixl`` or ``store`` (Ray's object store).

    Raises:
        TransportUnavailable: the object must travel by NIXL and this process cannot import it.
        TransportError: a :data:`FORCE_ENV` value that is unknown or cannot serve this object.
    """
    p = meta.producer
    here = local.node_id()
    same = p.node_id == here
    topo = local.topology()
    src_dev = meta.devices[0] if meta.tensor_device == "cuda" and meta.devices else None
    dst_dev = local.physical(device.index) if device is not None and device.type == "cuda" else None
    src = Endpoint(p.node_id[:12], src_dev, topo if same else None)  # short ids: they name nodes in reasons
    dst = Endpoint(here[:12] if not same else p.node_id[:12], dst_dev, topo)
    forced = os.environ.get(FORCE_ENV) or None
    if forced is not None:
        _check_forced(forced, same, meta.tensor_device, what)
    if same and forced != "nixl":
        path = tensor_path(src, dst, meta.nbytes, shared_memory=meta.tensor_device == "cuda" or not meta.shm_error)
        if meta.tensor_device == "cpu":
            kind = "map" if meta.packed is not None else ("store" if meta.shm_error else "segment")
            if kind == "store":
                path = TensorPath("object-store", meta.shm_error or "no shared-memory segment", None, 0.0,
                                  meta.nbytes, 2, "host-staged")
        else:
            kind = "ipc" if path.path == "cuda-ipc" else "host"
        if forced == "object-store":
            path, kind = _forced(path, "object-store"), "store"
        elif forced == "shared-memory" and kind == "ipc":
            path, kind = _forced(path, "shared-memory"), "host"
        elif forced == "cuda-ipc" and kind == "host":
            path, kind = _forced(path, "cuda-ipc"), "ipc"
        return path, kind
    ok, why = local.nixl()
    if not ok:
        how = f"{FORCE_ENV}=nixl" if same else "the nodes differ"
        raise TransportUnavailable(f"{what} from {p.label()} to this process on node {here[:8]}: {how}, so it "
                                   f"travels by NIXL, but {why}", what)
    mine = local.gpudirect()
    gd = False if False in (p.gpudirect, mine) else (True if p.gpudirect and mine else None)
    path = tensor_path(src, dst, meta.nbytes, src_nics=p.nics, dst_nics=local.prepare_ucx() or local.near_nics(),
                       gpudirect=gd)
    if forced == "nixl" and same:
        path = _forced(path, "nixl")
    if forced == "object-store":
        return _forced(path, "object-store"), "store"
    return path, "nixl"


def _check_forced(forced: str, same: bool, device: str, what: str) -> None:
    """A diagnostic override must name a path that can carry this object, else one clear error."""
    if forced not in TENSOR_PATHS:
        raise TransportError(f"{FORCE_ENV}={forced!r}: expected one of {', '.join(TENSOR_PATHS)} (or unset)", what)
    if forced in ("shared-memory", "cuda-ipc") and not same:
        raise TransportError(f"{FORCE_ENV}={forced}: {what} comes from another node, which {forced} cannot reach",
                             what)
    if forced == "cuda-ipc" and device != "cuda":
        raise TransportError(f"{FORCE_ENV}=cuda-ipc: {what} holds {device} tensors, not GPU ones", what)


def _forced(path: TensorPath, name: str) -> TensorPath:
    return TensorPath(name, f"forced by {FORCE_ENV}={name} (would be {path.path}: {path.reason})", None, 0.0,
                      path.nbytes, path.copies, path.route, path.nics)


def destination(meta: Any, target: Optional[list], what: str) -> Any:
    """The torch device the tensors land on: the target buffers', else this process's GPU for CUDA tensors."""
    import torch

    if target:
        return target[0].device
    if meta.tensor_device != "cuda":
        return torch.device("cpu")
    if not torch.cuda.is_available():
        from .. import _ray_private as rp

        raise TransportError(f"{what} holds GPU tensors and this process has no usable GPU: give it one, or call "
                             f"{rp.cpu_target_hint()}", what)
    return torch.device("cuda", torch.cuda.current_device())
