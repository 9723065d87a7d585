"""A node's directory: its record, the arbiter's state and lock, what ``rayaccel start`` started.

Location: ``$RAYACCEL_STATE_DIR`` if set, else ``/dev/shm/rayaccel-<uid>`` (memory-backed:
the arbiter rewrites its state at every grant), else ``<tempdir>/rayaccel-<uid>``; one
sub-directory per node key. Directories are created ``0700`` and checked on every open:
owned by this user, a real directory (never followed through a symlink), not writable
by others -- so another local user cannot redirect or replace a node's state.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from pathlib import Path

from rayaccel.errors import ClusterError, StoreError
from rayaccel.contract import RECORD_FILE as RECORD, load_json, valid_key

log = logging.getLogger(__name__)

STATE_DIR_ENV = "RAYACCEL_STATE_DIR"


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

    The same check as the store's spill roots (:func:`rayaccel.memory.owners.private_dir`).

    Raises:
        ClusterError: it is a symlink, not a directory, or owned by another user.
    """
    from rayaccel.memory.owners import private_dir  # the memory package loads numpy: only node start needs this

    try:
        return private_dir(path, what="rayaccel state directory",
                           fix=f"set {STATE_DIR_ENV} to a directory you own")
    except StoreError as e:
        raise ClusterError(str(e)) from None


def node_dir(node_key: str, base: Path | None = None) -> Path:
    """The directory of node ``node_key`` (created private)."""

    if not valid_key(node_key):
        raise ClusterError(f"bad node key {node_key!r} (12 hex chars)")
    return ensure_private((base or base_dir()) / node_key)


def write_record(directory: Path, record_json: str) -> None:
    """Write the node's record atomically (the agent, and ``get_devices()`` in workers, read it)."""
    write_file(directory, RECORD, record_json.encode())


def write_file(directory: Path, name: str, data: bytes) -> None:
    """Write ``name`` in the node directory atomically (write + rename), mode 0600."""
    tmp = directory / f".{name}.{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)
    os.replace(tmp, directory / name)


def write_policy(directory: str | Path, name: str, schema: str, fields: dict) -> None:
    """Record one of the node's policies (``{"schema": schema, **fields}``) as ``name``, atomically (write_file)."""
    write_file(Path(directory), name, json.dumps({"schema": schema, **fields}).encode())


def read_policy(directory: str | Path, name: str, schema: str, what: str, fallback: str) -> dict | None:
    """A policy :func:`write_policy` recorded: its fields, or None when none was recorded -- and, with one warning
    naming the file, why and what holds instead (``fallback``), when it is unreadable or not that schema."""
    path = Path(directory) / name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        log.warning("rayaccel: %s unreadable (%s); %s", path, e, fallback)
        return None
    try:
        return load_json(raw, what=what, max_bytes=4096, error=lambda m, w: ClusterError(f"{w}: {m}"),
                         where=str(path), schema=schema)
    except ClusterError as e:
        log.warning("rayaccel: %s; %s", e, fallback)
        return None


def remove(directory: Path) -> None:
    """Delete a node directory (idempotent)."""
    shutil.rmtree(directory, ignore_errors=True)
