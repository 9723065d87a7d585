"""Counting what the ``rayaccel`` transport moved: bytes, seconds and objects per path.

Counted in the process that receives (it pulls the bytes), kept in-process
(:func:`stats`, for tests and benchmarks) and exported through ``ray.util.metrics``
(:data:`rayaccel.metrics_names.TRANSPORT_BYTES_TOTAL` and friends, tags ``node`` and
``path``). Metrics are created on the first transfer; a process where Ray's metrics
cannot be created still counts in-process.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from ... import metrics_names as M
from ...transfer import TensorPath

log = logging.getLogger("rayaccel.ray.rdt")

_lock = threading.Lock()
_stats: dict[str, dict[str, Any]] = {}
_metrics: Any = None
_warned: set[str] = set()


def _ray_metrics() -> Any:
    global _metrics
    if _metrics is None:
        try:
            from ray.util.metrics import Counter

            keys = ("node", "path")
            _metrics = (Counter(M.TRANSPORT_BYTES_TOTAL, "bytes of tensors delivered by the rayaccel transport",
                                tag_keys=keys),
                        Counter(M.TRANSPORT_SECONDS_TOTAL, "seconds spent receiving them (s)", tag_keys=keys),
                        Counter(M.TRANSPORT_OBJECTS_TOTAL, "objects delivered", tag_keys=keys))
        except Exception as e:  # noqa: BLE001 - metrics are optional: transfers work without them
            log.warning("rayaccel transport: metrics disabled in this process: %s", e)
            _metrics = False
    return _metrics


def record(node: str, path: TensorPath, seconds: float, nbytes: int) -> None:
    """Count one delivered object."""
    with _lock:
        s = _stats.setdefault(path.path, {"bytes": 0, "seconds": 0.0, "objects": 0, "last_reason": ""})
        s["bytes"] += nbytes
        s["seconds"] += seconds
        s["objects"] += 1
        s["last_reason"] = path.reason
        m = _ray_metrics()
    if m:
        tags = {"node": node, "path": path.path}
        if nbytes > 0:  # Ray's Counter refuses 0 (an object of empty tensors)
            m[0].inc(float(nbytes), tags=tags)
        if seconds > 0:
            m[1].inc(seconds, tags=tags)
        m[2].inc(1.0, tags=tags)


def warn_once(what: str, reason: str) -> None:
    """One warning line per distinct reason per process: ``rayaccel transport: <what> ... because <reason>``."""
    with _lock:
        if reason in _warned:
            return
        _warned.add(reason)
    log.warning("rayaccel transport: %s goes through Ray's object store: %s", what, reason)


def stats() -> dict[str, dict[str, Any]]:
    """Per path: ``bytes``, ``seconds``, ``objects`` received by this process, and the ``last_reason``."""
    with _lock:
        return {k: dict(v) for k, v in _stats.items()}


def reset() -> None:
    """Forget the in-process counts (Ray's counters keep theirs)."""
    with _lock:
        _stats.clear()
        _warned.clear()
