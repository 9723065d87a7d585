"""Owner tags on spill directories and shared segments, per-user spill roots, and the sweeper.

Every spill directory is named ``rayaccel-<pid>-<start>-<random>`` and every
shared-memory segment ``rayaccel_<pid>-<start>_u<uid>_<random>``, where ``<start>`` is
the owner's process start time (clock ticks since boot, from
``/proc/<pid>/stat``), so a recycled PID is not mistaken for the owner. A
process that dies without closing its store (SIGKILL, OOM killer, a Ray worker
killed by the raylet) leaves them behind; :func:`sweep` removes those of dead
owners and is called whenever a store is created.

Other users. ``/tmp`` and ``/dev/shm`` are shared by every user of the machine, so:

* the default spill root is per user, ``<temp dir>/rayaccel-spill-<uid>``
  (:func:`default_spill_root`), created ``0700`` and checked on every open by
  :func:`private_dir`: it must be a real directory (never followed through a
  symbolic link) owned by this user, else :class:`~rayaccel.errors.StoreError` names
  the path and what to do. Another user who pre-creates it cannot redirect, read,
  delete or replace this user's spill files;
* each store's own spill directory is created ``0700`` with an exclusive ``mkdir``;
* segment names carry the owner's uid, and :func:`sweep` only ever removes entries
  owned by this user: another user's (or an unremovable) leftover is skipped, never
  fatal.

An explicit spill directory (``Store(spill_dir=...)``, ``RAYACCEL_SPILL_DIR``) is the
caller's choice and gets no ownership check: a shared, sticky ``/scratch`` is a normal
place for it. Each store's own directory inside it is still ``0700`` and exclusive.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import stat
from pathlib import Path

from .._proc import exists as _exists
from .._proc import start_time as _start_time
from ..errors import StoreError

SPILL_PREFIX = "rayaccel-"
SHM_PREFIX = "rayaccel_"
SHM_DIR = Path("/dev/shm")
#: Name of the default spill root under a temp directory; ``-<uid>`` is appended.
SPILL_ROOT_NAME = "rayaccel-spill"
_SPILL_RE = re.compile(r"^rayaccel-(\d+)-(\d+)-[0-9a-f]+$")
_SHM_RE = re.compile(r"^rayaccel_(\d+)-(\d+)_(?:u(\d+)_)?[0-9a-z_]+$")




def owner_tag(pid: int | None = None) -> str:
    """``"<pid>-<start time>"`` of this (or the given) process."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}-{_start_time(pid) or 0}"


def segment_prefix() -> str:
    """``"rayaccel_<pid>-<start>_u<uid>_"``: the start of every segment name this process creates."""
    return f"{SHM_PREFIX}{owner_tag()}_u{os.geteuid()}_"


def default_spill_root(temp_dir: str | Path) -> Path:
    """This user's spill root under ``temp_dir``: ``<temp_dir>/rayaccel-spill-<uid>`` (not created here)."""
    return Path(temp_dir) / f"{SPILL_ROOT_NAME}-{os.geteuid()}"


def _user(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def private_dir(path: str | Path, what: str = "spill root", fix: str = "set RAYACCEL_SPILL_DIR (or Store's spill_dir) "
                "to a directory you own") -> Path:
    """Create ``path`` (mode ``0700``) or check it: a real directory owned by this user.

    Never follows a symbolic link at ``path``; a directory this user owns but others may
    write is tightened to ``0700``. Missing parents are created (with the default mode).

    Args:
        path: the directory. what: how messages name it. fix: what messages suggest doing.

    Returns:
        ``path`` as a Path.

    Raises:
        StoreError: ``path`` is a symbolic link, not a directory, owned by another user,
            or cannot be created (the message names the path, who owns it and ``fix``).
    """
    p = Path(path)
    try:
        if not os.path.isdir(p.parent):
            p.parent.mkdir(parents=True)
        os.mkdir(p, 0o700)
    except FileExistsError:
        if not os.path.lexists(p):  # it was a parent that exists and is not a directory
            raise StoreError(f"{what} {p} cannot be created: a parent is not a directory; {fix}") from None
    except OSError as e:
        raise StoreError(f"{what} {p} cannot be created: {e.strerror or e}; {fix}") from None
    try:
        st = os.lstat(p)
    except OSError as e:
        raise StoreError(f"{what} {p} cannot be checked: {e.strerror or e}; {fix}") from None
    if stat.S_ISLNK(st.st_mode):
        raise StoreError(f"{what} {p} is a symbolic link; rayaccel does not follow links in a shared directory "
                         f"(another user could point it anywhere): remove it, or {fix}")
    if not stat.S_ISDIR(st.st_mode):
        raise StoreError(f"{what} {p} exists and is not a directory: remove it, or {fix}")
    me = os.geteuid()
    if st.st_uid != me:
        raise StoreError(f"{what} {p} belongs to {_user(st.st_uid)}, not to you ({_user(me)}): whoever owns it could "
                         f"read, delete or replace your spilled data; have it removed, or {fix}")
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(p, 0o700)
        except OSError as e:
            raise StoreError(f"{what} {p} is open to other users (mode {stat.S_IMODE(st.st_mode):o}) and cannot be "
                             f"made private: {e.strerror or e}; {fix}") from None
    return p


def _mine(p: Path, want_dir: bool) -> bool:
    """Whether ``p`` (not followed if a link) is a directory/regular file owned by this user."""
    try:
        st = os.lstat(p)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(st.st_mode) if want_dir else stat.S_ISREG(st.st_mode)
    return kind_ok and st.st_uid == os.geteuid()


def is_alive(pid: int, start: int) -> bool:
    """Whether the process that had ``pid`` and ``start`` still runs."""
    now = _start_time(pid)
    if now is not None:
        return start == 0 or now == start
    if Path("/proc/self/stat").exists():
        return False  # /proc works and has no such pid
    return _exists(pid)


def sweep(spill_root: Path | None = None, shm_dir: Path | None = SHM_DIR) -> list[str]:
    """Remove spill directories (under ``spill_root``) and shared segments of dead owners.

    Only entries owned by this user are touched: another user's leftovers, links, and
    anything that cannot be removed (permissions, a read-only mount) are skipped, so a
    stray file in ``/dev/shm`` never makes a store fail. Idempotent and safe to run
    concurrently from several processes (a removal that races with another sweeper is
    ignored).

    Returns:
        What was removed (paths), for logging and tests.
    """
    removed: list[str] = []
    me = str(os.geteuid())
    for p in _entries(spill_root):
        m = _SPILL_RE.match(p.name)
        if m and _mine(p, want_dir=True) and not is_alive(int(m.group(1)), int(m.group(2))):
            shutil.rmtree(p, ignore_errors=True)
            if not os.path.lexists(p):
                removed.append(str(p))
    for p in _entries(shm_dir):
        m = _SHM_RE.match(p.name)
        if not m or (m.group(3) is not None and m.group(3) != me) or not _mine(p, want_dir=False):
            continue
        if not is_alive(int(m.group(1)), int(m.group(2))):
            try:
                p.unlink()
            except OSError:  # gone already (another sweeper), or not ours to remove after all: skip
                continue
            removed.append(str(p))
    return removed


def _entries(folder: Path | None) -> list[Path]:
    """The entries of ``folder``; none when it is None, absent or unreadable."""
    if folder is None:
        return []
    try:
        return list(Path(folder).iterdir())
    except OSError:
        return []
