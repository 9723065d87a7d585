"""``rayaccel.store()``: the tiered memory store of the current Ray worker process.

Inside a rayaccel task or actor::

    s = rayaccel.store()          # one per process, closed at process exit
    h = s.put(tensor)             # spills device -> pinned host -> disk under pressure
    return h                      # another task: rayaccel.store().get(h)

Sizing: the device tier is ``RAYACCEL_GPU_MEMORY_BYTES`` (set by the in-worker
setup from the task's ``gpu_memory``), else :data:`DEFAULT_DEVICE_BYTES`; a
later task in the same worker with another ``gpu_memory`` resizes it (spilling
to fit). The host tier is ``RAYACCEL_HOST_MEMORY_BYTES`` or
:data:`DEFAULT_HOST_BYTES`; ``RAYACCEL_SPILL_DIR`` and ``RAYACCEL_DISK_BYTES``
set the disk tier (default: ``<node temp dir>/rayaccel-spill-<uid>``, private to the
user, no limit; see :func:`rayaccel.memory.owners.private_dir`).

Hand-off: handles pickle to a shared export. On the same node a receiver copies
the bytes from a shared-memory segment (or opens a CUDA IPC handle on a GPU),
with no trip through Ray's object store. When the cluster has more than one
node (or ``RAYACCEL_SHARE_VIA_RAY=always``), the export also carries a
``ray.put`` of the bytes, which a receiver on another node (or after the
segment is gone) fetches with ``ray.get``. ``RAYACCEL_SHARE_VIA_RAY=never``
disables that.

Cleanup: spill directories and segments are named after the owner's PID and
start time; a store being created sweeps those of dead processes on its node,
so killed workers leave nothing behind once any store starts on the node.
"""

from __future__ import annotations

import atexit
import os
import tempfile
import threading
import time
import weakref
import zlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from rayaccel.contract import DEVICES_ENV, parse_devices
from rayaccel.errors import CorruptObject, RequestError, StoreError
from rayaccel.memory import Store, sweep
from rayaccel.memory.owners import default_spill_root, private_dir
from rayaccel.memory.share import SharedObject
from rayaccel.units import parse_bytes

DEFAULT_DEVICE_BYTES = 1 << 30
DEFAULT_HOST_BYTES = 4 << 30
_NODES_TTL_S = 30.0

_store: Store | None = None
_lock = threading.Lock()
_nodes_cache: tuple[float, int] = (0.0, 0)
_SWEEP_EVERY_S = 60.0
_last_sweep = time.monotonic()


def _env_bytes(name: str, default: int | None) -> int | None:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        return parse_bytes(value, name)
    except RequestError as e:
        raise StoreError(f"environment variable {name}={value!r} is not a size: {e}") from None


def _node_id() -> str | None:
    import ray

    if os.environ.get("RAYACCEL_NODE_ID"):
        return os.environ["RAYACCEL_NODE_ID"]
    if ray.is_initialized():
        return ray.get_runtime_context().get_node_id()
    return None


def _node_temp_dir() -> Path:
    from rayaccel.ray import _ray_private as rp

    node = rp.node_temp_dir()  # the raylet's temp dir, shared by the node
    return Path(node) if node else Path(tempfile.gettempdir())


def _alive_nodes() -> int:
    global _nodes_cache
    import ray

    now = time.monotonic()
    if now - _nodes_cache[0] > _NODES_TTL_S:
        _nodes_cache = (now, sum(1 for n in ray.nodes() if n.get("Alive")))
    return _nodes_cache[1]


def _export_hook(shared: SharedObject, data: np.ndarray) -> SharedObject:
    """Attach a Ray object-store copy when the handle may travel to another node."""
    import ray

    devices = parse_devices(os.environ.get(DEVICES_ENV))
    if devices and shared.device is None:
        shared = replace(shared, device=devices[0])
    mode = os.environ.get("RAYACCEL_SHARE_VIA_RAY", "auto")
    if mode not in ("auto", "always", "never"):
        raise StoreError(f"RAYACCEL_SHARE_VIA_RAY={mode!r}; use auto, always or never")
    if mode == "never" or not ray.is_initialized() or (mode == "auto" and _alive_nodes() <= 1):
        return shared
    crc = shared.crc32 if shared.crc32 is not None else zlib.crc32(memoryview(data))
    return replace(shared, crc32=crc, ref=ray.put(data))


def _remote_fetch(shared: SharedObject, name: str) -> np.ndarray:
    """Fetch an export's bytes through Ray's object store; verify its checksum."""
    import ray

    data = np.array(ray.get(shared.ref), dtype=np.uint8, copy=True).reshape(-1)
    if shared.crc32 is not None and zlib.crc32(memoryview(data)) != shared.crc32:
        raise CorruptObject(f"object {name}: the copy fetched through Ray's object store fails its checksum", key=name)
    return data


def store() -> Store:
    """The store of this worker process (created on first use, closed at exit).

    Raises:
        StoreError: a sizing environment variable that is not a size.
    """
    global _store
    device_bytes = _env_bytes("RAYACCEL_GPU_MEMORY_BYTES", DEFAULT_DEVICE_BYTES)
    with _lock:
        if _store is not None and not _store.closed:
            global _last_sweep
            if time.monotonic() - _last_sweep > _SWEEP_EVERY_S:  # long-lived workers sweep now and then
                _last_sweep = time.monotonic()
                sweep(_store.spill_dir.parent)
            if _store.budgets["device"] != device_bytes:
                _store.set_budget("device", device_bytes)
            return _store
        spill = os.environ.get("RAYACCEL_SPILL_DIR") or str(private_dir(default_spill_root(_node_temp_dir())))
        s = Store(
            device_bytes=device_bytes,
            host_bytes=_env_bytes("RAYACCEL_HOST_MEMORY_BYTES", DEFAULT_HOST_BYTES),
            spill_dir=spill,
            disk_bytes=_env_bytes("RAYACCEL_DISK_BYTES", None),
            node_id=_node_id(),
            share=True,
        )
        s.export_hook = _export_hook
        s.remote_fetch = _remote_fetch
        _store = s
        # weakly: a closed store must not be kept alive by atexit; bounded wait: a thread
        # stuck inside the store (e.g. in a Ray call) must not hang the worker's exit
        atexit.register(_close_at_exit, weakref.ref(s))
        return s


#: How long the exit hook waits for another thread's store operation, seconds.
EXIT_CLOSE_TIMEOUT_S = 5.0


def _close_at_exit(ref: "weakref.ref[Store]") -> None:
    s = ref()
    if s is not None:
        s.close(timeout_s=EXIT_CLOSE_TIMEOUT_S)


def close_store() -> None:
    """Close this process's store now (idempotent); the next :func:`store` makes a new one."""
    global _store
    with _lock:
        if _store is not None:
            _store.close()
            _store = None


def current() -> Any:
    """This process's store if one was created, else None (no side effect)."""
    return _store
