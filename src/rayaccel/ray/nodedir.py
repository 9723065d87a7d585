"""A node's directory: its record, the arbiter's state and lock, what ``rayaccel start`` started.

Location: ``$RAYACCEL_STATE_DIR`` if set, else ``/dev/shm/rayaccel-<uid>`` (memory-backed:
the arbiter rewrites its state at every grant), else ``<tempdir>/rayaccel-<uid>``; one
sub-directory per node key. Directories are created ``0700`` and checked on every open:
owned by this user, a real directory (never followed through a symlink), not writable
by others -- so another local user cannot redirect or replace a node's state.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from pathlib import Path

from ..errors import ClusterError

STATE_DIR_ENV = "RAYACCEL_STATE_DIR"
RECORD = "record.json"


def base_dir() -> Path:
    """The per-user root of node directories (created 0700 and checked)."""
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return ensure_private(Path(env))
    uid = os.getuid()
    for root in ("/dev/shm", tempfile.gettempdir()):
        if os.path.isdir(root) and os.access(root, os.W_OK | os.X_OK):
            return ensure_private(Path(root) / f"rayaccel-{uid}")
    raise ClusterError(f"no writable directory for rayaccel's node state (tried /dev/shm and "
                       f"{tempfile.gettempdir()}); set {STATE_DIR_ENV} to a directory you own")


def ensure_private(path: Path) -> Path:
    """Create ``path`` (mode 0700) if missing and check that it is ours and private.

    Raises:
        ClusterError: it is a symlink, not a directory, owned by another user, or writable by others.
    """
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise ClusterError(f"cannot create rayaccel state directory {path}: {e.strerror}") from None
    try:
        st = os.lstat(path)
    except OSError as e:
        raise ClusterError(f"cannot inspect rayaccel state directory {path}: {e.strerror}") from None
    if stat.S_ISLNK(st.st_mode):
        raise ClusterError(f"rayaccel state directory {path} is a symlink; remove it (rayaccel never follows one) "
                           f"or set {STATE_DIR_ENV} to a directory you own")
    if not stat.S_ISDIR(st.st_mode):
        raise ClusterError(f"rayaccel state directory {path} exists but is not a directory; remove it or set "
                           f"{STATE_DIR_ENV}")
    if st.st_uid != os.getuid():
        raise ClusterError(f"rayaccel state directory {path} belongs to uid {st.st_uid}, not you (uid {os.getuid()}); "
                           f"remove it or set {STATE_DIR_ENV} to a directory you own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise ClusterError(f"rayaccel state directory {path} is writable by others (mode {stat.S_IMODE(st.st_mode):o}); "
                           f"chmod 700 it or set {STATE_DIR_ENV}")
    return path


def node_dir(node_key: str, base: Path | None = None) -> Path:
    """The directory of node ``node_key`` (created private)."""
    from .names import valid_key

    if not valid_key(node_key):
        raise ClusterError(f"bad node key {node_key!r} (12 hex chars)")
    return ensure_private((base or base_dir()) / node_key)


def write_record(directory: Path, record_json: str) -> None:
    """Write the node's record atomically (the worker hook reads it at its first grant)."""
    tmp = directory / f".{RECORD}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, record_json.encode())
    finally:
        os.close(fd)
    os.replace(tmp, directory / RECORD)


def remove(directory: Path) -> None:
    """Delete a node directory (idempotent)."""
    shutil.rmtree(directory, ignore_errors=True)
