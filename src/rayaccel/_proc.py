"""Facts about local processes (Linux ``/proc``, and ``kill(pid, 0)``), shared by the arbiter, the store
and ``rayaccel start/stop``.

A process is identified by its pid *and* start time, so a recycled pid is never
mistaken for the process it replaced.
"""

from __future__ import annotations

import os


def exists(pid: int) -> bool:
    """True when process ``pid`` exists (a zombie or another user's process counts: the conservative side)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stat(pid: int) -> list[bytes] | None:
    """``/proc/<pid>/stat`` fields after the command name (which may hold spaces and parentheses)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return None
    return data[data.rfind(b")") + 2:].split()


def start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None (no /proc, or no such process)."""
    rest = _stat(pid)
    try:
        return int(rest[19]) if rest is not None else None
    except (IndexError, ValueError):
        return None


def state(pid: int) -> str | None:
    """The one-letter state of ``pid`` (``R``, ``S``, ``Z`` for a zombie, ...), or None (no such process)."""
    rest = _stat(pid)
    try:
        return rest[0].decode() if rest is not None else None
    except (IndexError, UnicodeDecodeError):
        return None


def parent(pid: int) -> int | None:
    """The parent pid of ``pid``, or None."""
    rest = _stat(pid)
    try:
        return int(rest[1]) if rest is not None else None
    except (IndexError, ValueError):
        return None


def cmdline(pid: int) -> str:
    """The command line of ``pid`` (arguments joined by spaces), or "" (no /proc, or no such process)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode("utf-8", "replace").strip()
    except OSError:
        return ""
