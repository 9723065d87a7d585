"""Byte-level views of tensors and arrays, buffer pools, and the two tier backends.

The store moves raw bytes; this module turns a numpy array or torch tensor into
a flat byte buffer and back (zero-copy views), and provides the backend that
allocates and copies between the device and host tiers:

* :class:`SimBackend` (no GPU): the device tier is CPU memory standing in for
  device memory, with its own budget; device <-> host transfers are memcpy.
* :class:`CudaBackend`: the device tier is real CUDA memory (torch's caching
  allocator) and the host tier is page-locked (pinned) memory, so transfers
  run at DMA speed.

torch is imported lazily: numpy alone is enough for the simulated path.
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import StoreError


class UnsupportedObject(StoreError, TypeError):
    """``put`` was given something other than a numpy array or a torch tensor."""


@dataclass(frozen=True, slots=True)
class Layout:
    """How to rebuild an object from its bytes.

    Attributes:
        kind: ``"numpy"`` or ``"torch"``. dtype: numpy dtype string (``"<f4"``)
            or torch dtype name (``"bfloat16"``). shape: dimensions.
        nbytes: size in bytes. device: where a torch tensor lived (``"cpu"``,
            ``"cuda:0"``); ``"cpu"`` for numpy.
    """

    kind: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    device: str = "cpu"


def _torch():
    import torch  # lazy: vendor library

    return torch


def is_torch(obj: Any) -> bool:
    """True when ``obj`` is a torch tensor (without importing torch if it is not loaded)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def describe(obj: Any) -> Layout:
    """The :class:`Layout` of a numpy array or torch tensor.

    Raises:
        UnsupportedObject: any other type, or a numpy object/void array.
    """
    if isinstance(obj, np.ndarray):
        if obj.dtype.hasobject or obj.dtype.kind == "V":
            raise UnsupportedObject(f"numpy arrays of dtype {obj.dtype} hold Python objects; store numeric arrays only")
        return Layout("numpy", obj.dtype.str, tuple(obj.shape), int(obj.nbytes))
    if is_torch(obj):
        if obj.is_sparse or obj.layout != _torch().strided:
            raise UnsupportedObject(f"only dense (strided) tensors can be stored, got layout {obj.layout}")
        return Layout("torch", str(obj.dtype).removeprefix("torch."), tuple(obj.shape),
                      obj.numel() * obj.element_size(), str(obj.device))
    raise UnsupportedObject(f"cannot store a {type(obj).__module__}.{type(obj).__qualname__}; "
                            "put a numpy array or a torch tensor")


def cpu_bytes(obj: Any) -> np.ndarray:
    """A flat uint8 view of a CPU numpy array or tensor (a contiguous copy only when it is not contiguous)."""
    if isinstance(obj, np.ndarray):
        arr = np.ascontiguousarray(obj)
        return arr.reshape(-1).view(np.uint8)
    t = obj.detach()
    if not t.is_contiguous():
        t = t.contiguous()
    return t.reshape(-1).view(_torch().uint8).numpy()


def from_cpu_bytes(buf: np.ndarray, layout: Layout) -> Any:
    """The object described by ``layout`` as a zero-copy view of ``buf`` (flat uint8, CPU)."""
    if layout.kind == "numpy":
        return buf.view(np.dtype(layout.dtype)).reshape(layout.shape)
    torch = _torch()
    return torch.from_numpy(buf).view(getattr(torch, layout.dtype)).reshape(layout.shape)


class BufferPool:
    """A cache of freed CPU byte buffers by exact size (like torch's caching allocators).

    Fresh allocations fault their pages in on first write, which costs about a
    third of a memcpy's time; reusing a freed buffer of the same size avoids it.
    A buffer goes back to the pool only when nothing outside the store still
    references it (checked with its reference count), so an array returned by
    ``get`` is never overwritten. Cached bytes are bounded by :meth:`trim`.
    """

    def __init__(self, alloc=None):
        self._free: OrderedDict[int, list[np.ndarray]] = OrderedDict()
        self.cached_bytes = 0
        self._alloc = alloc or (lambda n: np.empty(n, dtype=np.uint8))
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> np.ndarray:
        """A buffer of exactly ``nbytes`` (reused when one is cached)."""
        with self._lock:
            bufs = self._free.get(nbytes)
            if bufs:
                buf = bufs.pop()
                if not bufs:
                    del self._free[nbytes]
                self.cached_bytes -= nbytes
                return buf
        return self._alloc(nbytes)

    def give(self, buf: np.ndarray, limit: int, held: int = 1) -> bool:
        """Cache ``buf`` if unreferenced elsewhere and the cache stays within ``limit`` bytes.

        Args:
            held: references the calling chain itself holds (its variables).
        """
        # besides the caller's: this parameter and getrefcount's own argument
        if sys.getrefcount(buf) > held + 2 or buf.nbytes == 0:
            return False
        with self._lock:
            self._trim_locked(max(0, limit - buf.nbytes))
            if self.cached_bytes + buf.nbytes > limit:
                return False
            self._free.setdefault(buf.nbytes, []).append(buf)
            self._free.move_to_end(buf.nbytes)
            self.cached_bytes += buf.nbytes
            return True

    def trim(self, limit: int) -> None:
        """Drop cached buffers (oldest sizes first) until at most ``limit`` bytes are cached."""
        with self._lock:
            self._trim_locked(limit)

    def _trim_locked(self, limit: int) -> None:
        while self.cached_bytes > limit and self._free:
            size, bufs = next(iter(self._free.items()))
            bufs.pop()
            self.cached_bytes -= size
            if not bufs:
                del self._free[size]


class SimBackend:
    """No GPU: the device tier is budgeted CPU memory; transfers are memcpy."""

    name = "simulated"
    device = "cpu"
    pinned_host = False

    def __init__(self) -> None:
        self.device_pool = BufferPool()
        self.host_pool = BufferPool()

    # device-tier data is a flat uint8 numpy array
    def to_device_data(self, obj: Any, layout: Layout) -> tuple[Any, bool]:
        """Device-tier bytes for a user object (zero-copy here). Returns (data, pooled)."""
        if is_torch(obj) and obj.device.type != "cpu":
            obj = obj.cpu()
        return cpu_bytes(obj), False

    def device_alloc(self, nbytes: int) -> Any:
        return self.device_pool.take(nbytes)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        return self.host_pool.take(nbytes)

    def copy_d2h(self, dst_host: np.ndarray, src_dev: Any) -> None:
        np.copyto(dst_host, src_dev)

    def copy_h2d(self, dst_dev: Any, src_host: np.ndarray) -> None:
        np.copyto(dst_dev, src_host)

    def device_view(self, data: Any) -> np.ndarray | None:
        """A CPU byte view of device-tier data when it is CPU memory (else None)."""
        return data

    def host_view(self, data: np.ndarray) -> np.ndarray:
        return data

    def materialize(self, data: Any, layout: Layout, device: str | None) -> Any:
        """The user-facing object from device-tier bytes, on ``device`` (None: where it lives)."""
        obj = from_cpu_bytes(data, layout)
        if device is None or device == "cpu":
            return obj
        return to_device(obj, device)


class CudaBackend:
    """A real GPU: device tier in CUDA memory, host tier in pinned memory."""

    name = "cuda"
    pinned_host = True

    def __init__(self, device: str = "cuda") -> None:
        torch = _torch()
        self.torch = torch
        dev = torch.device(device)
        self.device = f"cuda:{dev.index if dev.index is not None else torch.cuda.current_device()}"
        self.device_pool = None
        self.host_pool = BufferPool(alloc=self._pinned)

    def _pinned(self, nbytes: int) -> np.ndarray:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, pin_memory=True).numpy()

    def to_device_data(self, obj: Any, layout: Layout) -> tuple[Any, bool]:
        torch = self.torch
        if isinstance(obj, np.ndarray):
            obj = torch.from_numpy(cpu_bytes(obj))
        t = obj.detach()
        if not t.is_contiguous():
            t = t.contiguous()
        t = t.reshape(-1).view(torch.uint8)
        if str(t.device) != self.device:
            t = t.to(self.device)
        return t, False

    def device_alloc(self, nbytes: int) -> Any:
        return self.torch.empty(nbytes, dtype=self.torch.uint8, device=self.device)

    def host_alloc(self, nbytes: int) -> np.ndarray:
        return self.host_pool.take(nbytes)

    def copy_d2h(self, dst_host: np.ndarray, src_dev: Any) -> None:
        self.torch.from_numpy(dst_host).copy_(src_dev, non_blocking=True)
        self.torch.cuda.synchronize(self.device)

    def copy_h2d(self, dst_dev: Any, src_host: np.ndarray) -> None:
        dst_dev.copy_(self.torch.from_numpy(src_host), non_blocking=True)
        self.torch.cuda.synchronize(self.device)

    def device_view(self, data: Any) -> np.ndarray | None:
        return None

    def host_view(self, data: np.ndarray) -> np.ndarray:
        return data

    def materialize(self, data: Any, layout: Layout, device: str | None) -> Any:
        torch = self.torch
        if layout.kind == "numpy" and device in (None, "cpu"):
            return data.cpu().numpy().view(np.dtype(layout.dtype)).reshape(layout.shape)
        t = data.view(getattr(torch, layout.dtype if layout.kind == "torch" else _numpy_to_torch(layout.dtype)))
        t = t.reshape(layout.shape)
        return t if device is None else t.to(device)


def _numpy_to_torch(dtype: str) -> str:
    return str(_torch().from_numpy(np.empty(0, dtype=np.dtype(dtype))).dtype).removeprefix("torch.")


def to_device(obj: Any, device: str) -> Any:
    """Move a CPU object to ``device`` (``"cuda:0"`` gives a torch tensor).

    Raises:
        StoreError: the device does not exist here.
    """
    torch = _torch()
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise StoreError(f"unknown device {device!r}; use 'cpu' or 'cuda:<index>'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise StoreError(f"device {device!r} requested but no CUDA device is available here; use 'cpu'")
    if isinstance(obj, np.ndarray):
        obj = torch.from_numpy(obj)
    return obj.to(dev)


def make_backend(device: str | None) -> SimBackend | CudaBackend:
    """The backend for ``device``: None picks CUDA when torch sees a GPU, else simulation.

    ``device="cpu"`` forces the simulated device tier even on a GPU machine.

    Raises:
        StoreError: a CUDA device was asked for and none is available.
    """
    if device in (None, "auto"):
        torch = sys.modules.get("torch")
        if torch is None:
            try:
                import torch  # noqa: F811  lazy vendor import
            except ImportError:
                return SimBackend()
        return CudaBackend() if torch.cuda.is_available() else SimBackend()
    if device in ("cpu", "sim", "simulated"):
        return SimBackend()
    if str(device).startswith("cuda"):
        torch = _torch()
        if not torch.cuda.is_available():
            raise StoreError(f"device {device!r} requested but torch sees no CUDA device; use device=None or 'cpu'")
        return CudaBackend(device)
    raise StoreError(f"unknown device {device!r}; use None (auto), 'cpu' (simulated device tier) or 'cuda:<index>'")
