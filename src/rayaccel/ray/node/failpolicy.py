"""What a node does with the workers of a GPU that failed under them (``rayaccel start --on-failed-gpu``).

When the health watcher (:mod:`.health`) drains a device on a critical event (an Xid such as 79
"fallen off the bus", a lost GPU, a reset required), the work on it usually hangs in a CUDA call
and never ends by itself. The node's policy decides:

* ``leave`` (the default): the drain only keeps new work off the device; what runs there is left
  to its owner (Ray's own behaviour: it knows nothing of the fault).
* ``end-workers``: the agent kills the device's holders (``SIGKILL``: a process stuck in the driver
  does not answer ``SIGTERM``), so Ray restarts their actors (``max_restarts``) and retries their
  tasks (``max_retries``); the restarted worker's grant maps to a healthy device of the node (the
  drained one is out of every grant), next to its gang's other members where one is free.

The policy is written once at node start into the node directory (:data:`FAILED_GPU_FILE`,
format :data:`FAILED_GPU_SCHEMA`) and read by the agent when a drain happens (a restarted
agent keeps it). Operator drains keep their own ``--kill`` flag.
"""

from __future__ import annotations

import logging
from pathlib import Path

from rayaccel.contract import FAILED_GPU_FILE, FAILED_GPU_MODES, FAILED_GPU_SCHEMA
from rayaccel.errors import ClusterError
from rayaccel.ray.node import nodedir

log = logging.getLogger(__name__)
DEFAULT = "leave"


def failed_gpu_mode(value: str | None) -> str:
    """The policy named by ``value`` (None: the default, ``leave``).

    Raises:
        ClusterError: not one of :data:`~rayaccel.contract.FAILED_GPU_MODES` (the message names them).
    """
    if value is None:
        return DEFAULT
    if not isinstance(value, str) or value not in FAILED_GPU_MODES:
        raise ClusterError(f"on-failed-gpu={value!r}: expected {' or '.join(FAILED_GPU_MODES)} (end-workers: "
                           "the workers on a GPU the health watcher drains are ended, so Ray restarts them "
                           "on a healthy device)")
    return value


def write(directory: str | Path, mode: str | None) -> str:
    """Record the node's policy in its directory (atomically); returns the mode written.

    Raises:
        ClusterError: a bad mode (nothing is written).
    """
    mode = failed_gpu_mode(mode)
    nodedir.write_policy(directory, FAILED_GPU_FILE, FAILED_GPU_SCHEMA, {"on_failed_gpu": mode})
    return mode


def read(directory: str | Path) -> str:
    """The node's policy; ``leave`` when none was recorded, or (with one warning) when the file is unreadable."""
    fallback = f"on-failed-gpu={DEFAULT}"
    data = nodedir.read_policy(directory, FAILED_GPU_FILE, FAILED_GPU_SCHEMA, "rayaccel failed-GPU policy", fallback)
    if data is None:
        return DEFAULT
    try:
        return failed_gpu_mode(data.get("on_failed_gpu"))
    except ClusterError as e:
        log.warning("rayaccel: %s/%s: %s; %s", directory, FAILED_GPU_FILE, e, fallback)
        return DEFAULT


def ends_workers(directory: str | Path | None) -> bool:
    """Does the node at ``directory`` end the workers of a device its health watcher drains?"""
    return directory is not None and read(directory) == "end-workers"


__all__ = ["DEFAULT", "ends_workers", "failed_gpu_mode", "read", "write"]
