"""Whether a node ends leaked processes by itself (``rayaccel start --reclaim-leaks AFTER``).

By default the leak watcher (:mod:`.leaks`) only fences a leaked device and reports the processes;
``rayaccel reclaim NODE:DEV`` ends them. With ``--reclaim-leaks 5m`` (``SimulatedCluster(reclaim_leaks="5m")``,
``rayaccel.init(reclaim_leaks=...)``) the agent ends, once a leak has lasted that long, the leaked processes
that provably belong to the node's Ray workers (as ``rayaccel reclaim`` does; others are never ended).

Written once at node start into the node directory (:data:`~rayaccel.contract.RECLAIM_LEAKS_FILE`, format
:data:`~rayaccel.contract.RECLAIM_LEAKS_SCHEMA`), read by the agent (a restarted agent keeps it).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

from rayaccel.contract import RECLAIM_LEAKS_FILE, RECLAIM_LEAKS_SCHEMA
from rayaccel.errors import ClusterError
from rayaccel.ray.node import nodedir

log = logging.getLogger(__name__)
#: The longest ``AFTER`` accepted, seconds (a week).
MAX_AFTER_S = 7 * 24 * 3600.0
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*$")


def reclaim_after(value: str | float | None) -> float | None:
    """Seconds a leak may last before the agent ends it, from ``30s`` / ``5m`` / ``1h`` / a number of seconds;
    None (or ``off``, ``never``): never.

    Raises:
        ClusterError: anything else, or a duration outside 1 s .. 7 days (the message names what is accepted).
    """
    if value is None or (isinstance(value, str) and value.strip().lower() in ("off", "never", "")):
        return None
    if isinstance(value, bool):
        seconds = None
    elif isinstance(value, (int, float)):
        seconds = float(value)
    else:
        m = _DURATION.match(str(value)[:40])
        seconds = float(m.group(1)) * _UNITS[m.group(2)] if m else None
    if seconds is None or not 1.0 <= seconds <= MAX_AFTER_S:
        raise ClusterError(f"reclaim-leaks={str(value)[:40]!r}: expected a duration from 1s to 7 days such as 30s, "
                           f"5m or 1h (or off): how long a leaked process may hold a device before the node's agent "
                           f"ends it")
    return seconds


def write(directory: str | Path, value: str | float | None) -> float | None:
    """Record the node's policy in its directory (atomically); returns the seconds written (None: never).

    Raises:
        ClusterError: a bad value (nothing is written).
    """
    after = reclaim_after(value)
    nodedir.write_policy(directory, RECLAIM_LEAKS_FILE, RECLAIM_LEAKS_SCHEMA, {"after_s": after})
    return after


def read(directory: str | Path) -> float | None:
    """The node's policy: seconds, or None (never; also, with one warning, when the file is unreadable)."""
    never = "leaks are not reclaimed by the agent"
    data = nodedir.read_policy(directory, RECLAIM_LEAKS_FILE, RECLAIM_LEAKS_SCHEMA, "rayaccel reclaim-leaks policy",
                               never)
    if data is None:
        return None
    try:
        return reclaim_after(data.get("after_s"))
    except ClusterError as e:
        log.warning("rayaccel: %s/%s: %s; %s", directory, RECLAIM_LEAKS_FILE, e, never)
        return None


__all__ = ["MAX_AFTER_S", "read", "reclaim_after", "write"]
