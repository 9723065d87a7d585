"""CUDA pieces of the ``rayaccel`` transport: IPC handles out, and in with at most one copy.

A handle (``torch.multiprocessing.reductions.reduce_tensor``) is opened on the consumer's
ordinal of the producer's device when the consumer can see it, else on the consumer's
own device (``cudaIpcOpenMemHandle`` enables peer access between the two GPUs). Then:

* the consumer's device is the producer's: the tensor *is* the producer's memory (zero
  copy; RDT objects are mutable references, as with Ray's ``cuda_ipc``);
* another device: one device-to-device copy (over NVLink or the PCIe switch) into the
  consumer's own memory, after which the mapping is dropped.

Only the CUDA IPC argument Ray's own transport rewrites is touched (the storage device,
``reduce_tensor``'s 7th argument, pinned by torch's ``rebuild_cuda_tensor``).
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from . import local

_DEVICE_ARG = 6  # rebuild_cuda_tensor(..., storage_device, storage_handle, ...)


def synchronize(tensors: Sequence[Any]) -> None:
    """Wait for the kernels writing ``tensors`` (their devices' streams), so consumers read finished data."""
    import torch

    for d in {t.device for t in tensors}:
        torch.cuda.synchronize(d)


def ipc_handles(tensors: Sequence[Any]) -> list:
    """One ``(rebuild, args)`` CUDA IPC handle per tensor (no copy; the producer keeps the memory)."""
    from torch.multiprocessing.reductions import reduce_tensor

    return [reduce_tensor(t) for t in tensors]


def from_ipc(handles: Sequence[tuple], devices: Sequence[Optional[int]], device: Any,
             target: Optional[list]) -> list:
    """The producer's tensors on ``device`` (a CUDA torch.device of this process).

    Args:
        handles: from :func:`ipc_handles`. devices: the physical device of each (None: unknown).
        device: where they must land. target: buffers to copy into instead (Ray's target buffers).

    Raises:
        RuntimeError: a handle cannot be opened here (torch's error; the caller stages through host).
    """
    out = []
    for i, ((rebuild, args), phys) in enumerate(zip(handles, devices)):
        seen = local.ordinal(phys) if phys is not None else None
        opened_on = seen if seen is not None else device.index
        args = list(args)
        if not isinstance(args[_DEVICE_ARG], int):
            raise RuntimeError(f"unexpected CUDA IPC handle layout (argument {_DEVICE_ARG} is "
                               f"{type(args[_DEVICE_ARG]).__name__}, not a device ordinal)")
        args[_DEVICE_ARG] = opened_on
        t = rebuild(*args)
        if target:
            target[i].copy_(t)
            out.append(target[i])
        elif seen is not None and seen == device.index:
            out.append(t)  # the producer's own memory, on this process's device: no copy
        elif seen is None:
            out.append(t.clone())  # peer memory mapped on our device: one copy into our own
        else:
            out.append(t.to(device, copy=True))
    return out


def to_device(t: Any, device: Any) -> Any:
    """``t`` on ``device`` (one host-to-device copy)."""
    return t.to(device, copy=True)
