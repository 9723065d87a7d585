"""Who holds which devices: a small detached actor fed by the in-worker setup.

Only for display (``rayaccel status``) and for noticing queued work; the source
of truth for free/busy stays Ray's per-node available resources. Entries of a
worker that died without retiring are dropped by readers when Ray shows the
devices free again (:func:`holders` with ``prune=True``).
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

NAME = "rayaccel-registry"
NAMESPACE = "rayaccel"
log = logging.getLogger(__name__)

_HANDLE: Any = None
_ACTOR_CLS: Any = None


def _actor_cls():
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        import ray

        @ray.remote(num_cpus=0, max_concurrency=1)
        class _Registry:
            def __init__(self):
                self.entries: dict[str, dict] = {}

            def add(self, token: str, info: dict) -> None:
                self.entries[token] = info

            def remove(self, token: str) -> None:
                self.entries.pop(token, None)

            def drop(self, tokens: list) -> None:
                for t in tokens:
                    self.entries.pop(t, None)

            def list(self) -> dict:
                return dict(self.entries)

        _ACTOR_CLS = _Registry
    return _ACTOR_CLS


def ensure() -> Any:
    """Create (or find) the registry actor from a driver; return its handle."""
    global _HANDLE
    if _HANDLE is None:
        _HANDLE = _actor_cls().options(name=NAME, namespace=NAMESPACE, lifetime="detached",
                                       get_if_exists=True).remote()
    return _HANDLE


def reset() -> None:
    """Forget the cached handle (after ray.shutdown())."""
    global _HANDLE
    _HANDLE = None


def _handle() -> Any:
    global _HANDLE
    if _HANDLE is None:
        import ray

        try:
            _HANDLE = ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            log.warning("rayaccel registry actor not found; `rayaccel status` will not name holders")
            return None
    return _HANDLE


def announce(spec: Any, kind: str) -> str | None:
    """Record that this process now holds ``spec``'s devices (fire and forget); return a token."""
    import ray

    h = _handle()
    if h is None:
        return None
    ctx = ray.get_runtime_context()
    token = f"{os.getpid()}:{ctx.get_task_id() or ctx.get_actor_id()}"
    info = {"node_id": spec.node_id, "devices": list(spec.devices), "partitions": list(spec.partitions),
            "shared_memory": [list(x) for x in spec.shared_memory], "name": spec.name, "kind": kind,
            "pid": os.getpid(), "task_id": ctx.get_task_id(), "actor_id": ctx.get_actor_id(),
            "since": time.time()}
    h.add.remote(token, info)
    return token


def retire(token: str | None) -> None:
    """Remove the holder entry ``token`` (fire and forget)."""
    if token is None:
        return
    h = _handle()
    if h is not None:
        h.remove.remote(token)


def holders(timeout_s: float = 5.0) -> dict[str, dict]:
    """All current entries (token -> info); {} when no registry exists."""
    import ray

    try:
        h = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        return {}
    return ray.get(h.list.remote(), timeout=timeout_s)


def drop(tokens: list[str]) -> None:
    """Remove stale entries (fire and forget)."""
    import ray

    if not tokens:
        return
    try:
        h = ray.get_actor(NAME, namespace=NAMESPACE)
    except ValueError:
        return
    h.drop.remote(tokens)
