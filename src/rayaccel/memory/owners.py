"""Owner tags on spill directories and shared segments, and the sweeper of dead owners' leftovers.

Every spill directory is named ``rayaccel-<pid>-<start>-<random>`` and every
shared-memory segment ``rayaccel_<pid>-<start>_<random>``, where ``<start>`` is
the owner's process start time (clock ticks since boot, from
``/proc/<pid>/stat``), so a recycled PID is not mistaken for the owner. A
process that dies without closing its store (SIGKILL, OOM killer, a Ray worker
killed by the raylet) leaves them behind; :func:`sweep` removes those of dead
owners and is called whenever a store is created.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

SPILL_PREFIX = "rayaccel-"
SHM_PREFIX = "rayaccel_"
SHM_DIR = Path("/dev/shm")
_SPILL_RE = re.compile(r"^rayaccel-(\d+)-(\d+)-[0-9a-f]+$")
_SHM_RE = re.compile(r"^rayaccel_(\d+)-(\d+)_[0-9a-z_]+$")


def _start_time(pid: int) -> int | None:
    """Start time of ``pid`` in clock ticks since boot, or None (no /proc, or no such process)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # the command name (field 2) may contain spaces and parentheses: split after the last ')'
    fields = stat[stat.rindex(")") + 2:].split()
    return int(fields[19])


def owner_tag(pid: int | None = None) -> str:
    """``"<pid>-<start time>"`` of this (or the given) process."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid) or 0}"


def is_alive(pid: int, start: int) -> bool:
    """Whether the process that had ``pid`` and ``start`` still runs."""
    now = _start_time(pid)
    if now is not None:
        return start == 0 or now == start
    if Path("/proc/self/stat").exists():
        return False  # /proc works and has no such pid
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def sweep(spill_root: Path | None = None, shm_dir: Path | None = SHM_DIR) -> list[str]:
    """Remove spill directories (under ``spill_root``) and shared segments of dead owners.

    Idempotent and safe to run concurrently from several processes (a removal
    that races with another sweeper is ignored).

    Returns:
        What was removed (paths), for logging and tests.
    """
    removed: list[str] = []
    if spill_root is not None and Path(spill_root).is_dir():
        for p in Path(spill_root).iterdir():
            m = _SPILL_RE.match(p.name)
            if m and not is_alive(int(m.group(1)), int(m.group(2))):
                shutil.rmtree(p, ignore_errors=True)
                if not p.exists():
                    removed.append(str(p))
    if shm_dir is not None and Path(shm_dir).is_dir():
        for p in Path(shm_dir).iterdir():
            m = _SHM_RE.match(p.name)
            if m and not is_alive(int(m.group(1)), int(m.group(2))):
                try:
                    p.unlink()
                    removed.append(str(p))
                except FileNotFoundError:
                    pass
    return removed
