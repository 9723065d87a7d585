"""A worker's usage file: what it says it uses of its devices, and what its GPU objects spilled.

Two things only the worker knows reach its node's agent through one small file per worker,
``<node dir>/usage/<pid>.json`` (:data:`~rayaccel.contract.USAGE_DIR`, format
:data:`~rayaccel.contract.USAGE_SCHEMA`):

* what :func:`rayaccel.report_usage` says: device memory used and utilisation per device.
  On a simulated node there is no NVML to ask, so this is the figure; on an NVIDIA node NVML's
  per-process figures win where NVML lists the process (:mod:`rayaccel.ray.node.usage`);
* the bytes its ``rayaccel``-transport objects spilled off the device
  (:class:`rayaccel.memory.held.HeldObjects`; the transport calls :func:`note_spilled` after each change).

The file also names the holder as the worker knows it (the grant it reported under, the actor's
class and name, the task's function), so the agent can drop figures an earlier task of a reused
worker left. Written atomically (a temporary file renamed over it) by the worker that owns the
pid; read, validated with the one guarded JSON loader, and removed once its process is gone
(pid and start time, so a recycled pid never inherits a file) by the agent.
"""

from __future__ import annotations

import json
import os
import threading
import time
from typing import Any, NamedTuple

from rayaccel import _proc
from rayaccel.contract import DEVICES_ENV, NODE_DIR_ENV, USAGE_DIR, USAGE_SCHEMA, load_json, parse_devices
from rayaccel.errors import StateError
from rayaccel.ray import _ray_private as rp

#: The largest usage file the agent reads, bytes.
MAX_BYTES = 64 << 10

_lock = threading.Lock()
_state: dict[str, Any] = {"devices": {}, "spilled_bytes": None, "spilled_device": None, "identity": {}}


class WorkerUsage(NamedTuple):
    """One worker's usage file, as the agent reads it.

    Attributes:
        pid: the worker. at: when it last wrote (epoch seconds). id: the grant it reported under
            (an actor or task id, hex; "" when unknown).
        devices: device index -> ``(used_bytes or None, utilization percent or None)``.
        spilled_bytes / spilled_device: what its GPU objects spilled off that device (None: nothing held).
        actor_class / actor_name / task_function: who it was when it wrote ("" when not an actor / task).
    """

    pid: int
    at: float
    id: str
    devices: dict
    spilled_bytes: int | None
    spilled_device: int | None
    actor_class: str
    actor_name: str
    task_function: str


def path(node_dir: str, pid: int | None = None) -> str:
    """The usage file of ``pid`` (default: this process) in ``node_dir``."""
    return os.path.join(node_dir, USAGE_DIR, f"{os.getpid() if pid is None else int(pid)}.json")


def report(node_dir: str, device: int, used_bytes: int | None, utilization: float | None,
           identity: dict[str, str]) -> str:
    """Record what this worker uses of ``device`` (None: unknown) and write its file; returns the path."""
    with _lock:
        _state["devices"][str(int(device))] = {"used_bytes": used_bytes, "utilization": utilization}
        _state["identity"] = dict(identity)
        return _write(node_dir)


def spilled(node_dir: str, nbytes: int, device: int | None, identity: dict[str, str]) -> str | None:
    """Record the bytes this worker's GPU objects have spilled off ``device``; writes only on a change."""
    with _lock:
        if _state["spilled_bytes"] == int(nbytes) and _state["spilled_device"] == device:
            return None
        _state["spilled_bytes"], _state["spilled_device"] = int(nbytes), device
        if identity:
            _state["identity"] = dict(identity)
        return _write(node_dir)


def note_spilled(nbytes: int, device: int | None = None) -> None:
    """Record the bytes this worker's ``rayaccel``-transport objects have spilled off its device (a no-op off a
    rayaccel node; written only on a change). ``device``: default the worker's first device."""
    node_dir = os.environ.get(NODE_DIR_ENV)
    if not node_dir:
        return
    if device is None:
        held = parse_devices(os.environ.get(DEVICES_ENV))
        device = held[0] if held else None
    try:
        spilled(node_dir, nbytes, device, identity())
    except OSError:
        pass  # the node directory is gone (the node is stopping): nothing to tell


def identity() -> dict[str, str]:
    """The current holder as per-holder usage names it (empty outside a Ray worker)."""
    try:
        return rp.holder_identity(rp.global_worker())
    except Exception:  # noqa: BLE001 - not connected (a driver, a test): no identity, the agent uses its own
        return {}


def forget() -> None:
    """Forget this process's figures (tests; a new worker starts empty)."""
    with _lock:
        _state.update(devices={}, spilled_bytes=None, spilled_device=None, identity={})


def _write(node_dir: str) -> str:
    d = os.path.join(node_dir, USAGE_DIR)
    os.makedirs(d, mode=0o700, exist_ok=True)
    pid = os.getpid()
    ident = _state["identity"]
    data = {"schema": USAGE_SCHEMA, "pid": pid, "start": _proc.start_time(pid), "at": time.time(),
            "id": ident.get("id", ""), "devices": _state["devices"], "spilled_bytes": _state["spilled_bytes"],
            "spilled_device": _state["spilled_device"], "actor_class": ident.get("actor_class", ""),
            "actor_name": ident.get("actor_name", ""), "task_function": ident.get("task_function", "")}
    final = path(node_dir, pid)
    tmp = f"{final}.{threading.get_ident()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, separators=(",", ":"))
    os.replace(tmp, final)
    return final


def decode(raw: bytes | str, where: str) -> tuple[WorkerUsage, int | None]:
    """A usage file's contents and the start time it names (validated field by field).

    Raises:
        StateError: too large, not JSON, another format, or a field of the wrong type (names it).
    """
    d = load_json(raw, what="usage file", max_bytes=MAX_BYTES, error=StateError, where=where, schema=USAGE_SCHEMA)

    def bad(field: str, what: str) -> StateError:
        return StateError(f"usage file: {field} must be {what}", where)

    if not _int(d.get("pid")) or d["pid"] <= 0:
        raise bad("pid", "a positive int")
    if d.get("start") is not None and not _int(d["start"]):
        raise bad("start", "an int or null")
    if not _num(d.get("at", 0)):
        raise bad("at", "a number")
    for key in ("id", "actor_class", "actor_name", "task_function"):
        if not isinstance(d.get(key, ""), str):
            raise bad(key, "a string")
    devs = d.get("devices", {})
    if not isinstance(devs, dict):
        raise bad("devices", "an object keyed by device index")
    out: dict[int, tuple] = {}
    for k, v in devs.items():
        if not (isinstance(k, str) and k.isdigit()) or not isinstance(v, dict):
            raise bad("devices", "an object keyed by device index")
        used, util = v.get("used_bytes"), v.get("utilization")
        if used is not None and (not _int(used) or used < 0):
            raise bad(f"devices.{k}.used_bytes", "a non-negative int or null")
        if util is not None and (not _num(util) or not 0 <= util <= 100):
            raise bad(f"devices.{k}.utilization", "a percentage (0..100) or null")
        out[int(k)] = (used, None if util is None else float(util))
    sp, sd = d.get("spilled_bytes"), d.get("spilled_device")
    if sp is not None and (not _int(sp) or sp < 0):
        raise bad("spilled_bytes", "a non-negative int or null")
    if sd is not None and (not _int(sd) or sd < 0):
        raise bad("spilled_device", "a device index or null")
    return (WorkerUsage(d["pid"], float(d.get("at", 0)), d.get("id", ""), out, sp, sd, d.get("actor_class", ""),
                        d.get("actor_name", ""), d.get("task_function", "")), d.get("start"))


def read_all(node_dir: str, *, clean: bool = True) -> tuple[dict[int, WorkerUsage], list[str]]:
    """Every live worker's usage file in ``node_dir``: ``({pid: WorkerUsage}, [problems])``.

    A file whose process is gone (or whose pid now names another process) is removed when
    ``clean``; a file that cannot be read is skipped and named in the problems.
    """
    d = os.path.join(node_dir, USAGE_DIR)
    try:
        names = os.listdir(d)
    except OSError:
        return {}, []
    out: dict[int, WorkerUsage] = {}
    problems: list[str] = []
    for name in names:
        stem, dot, ext = name.partition(".")
        if ext != "json" or not stem.isdigit():
            continue
        full = os.path.join(d, name)
        pid = int(stem)
        try:
            fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW)
            with os.fdopen(fd, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
            usage, start = decode(raw, full)
        except OSError:
            continue  # gone meanwhile
        except StateError as e:
            problems.append(str(e))
            continue
        gone = usage.pid != pid or not _proc.exists(pid) or (start is not None and _proc.start_time(pid) != start)
        if gone:
            if clean:
                try:
                    os.unlink(full)
                except OSError:
                    pass
            continue
        out[pid] = usage
    return out, problems


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v == v
