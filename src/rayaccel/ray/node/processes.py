"""The Ray processes ``rayaccel start`` started on this machine, and stopping exactly those.

A node's ``processes.json`` (in its node directory) records the pid, start time and
name of every Ray process that appeared for it. :func:`stop_local` stops them (SIGTERM,
then SIGKILL after a grace period; a pid is only signalled while its start time still
matches, so a reused pid is never hit) and their descendants. Nothing here runs
``ray stop``, which would stop every Ray process of the machine, other people's
clusters included. The node agent uses this to stop its node (``rayaccel stop --all``).
"""

from __future__ import annotations

import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from rayaccel._proc import cmdline as _cmdline
from rayaccel._proc import parent as _parent
from rayaccel._proc import start_time as _start_time
from rayaccel.errors import ClusterError
from rayaccel.ray.node import nodedir
PROCESSES = "processes.json"
#: SIGTERM, then this long before SIGKILL, seconds.
STOP_GRACE_S = 5.0
_RAY_NAMES = ("raylet", "gcs_server", "monitor.py", "dashboard", "log_monitor", "runtime_env", "agent",
              "client.server", "default_worker", "ray::")


@dataclass(frozen=True, slots=True)
class LocalNode:
    """A node rayaccel started on this machine (from its ``processes.json``)."""

    node_key: str
    directory: Path
    address: str | None
    head: bool
    pids: tuple[tuple[int, int, str], ...]
    started: float

    @property
    def alive(self) -> bool:
        """True while any recorded process still runs."""
        return any(_start_time(p) == t for p, t, _ in self.pids)


def _my_ray_processes() -> dict[int, tuple[int, str]]:
    """pid -> (start time, cmdline) of this user's processes that look like Ray's."""
    out = {}
    uid = os.getuid()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid:
                continue
        except OSError:
            continue
        cmd = _cmdline(pid)
        if not cmd or not any(n in cmd for n in _RAY_NAMES):
            continue
        t = _start_time(pid)
        if t is not None:
            out[pid] = (t, cmd)
    return out


def _stop_new(before: dict) -> None:
    """Stop what appeared since ``before`` (a failed start)."""
    now = _my_ray_processes()
    _signal_all([(p, t) for p, (t, _) in now.items() if p not in before], signal.SIGTERM)


def _save_processes(directory: Path, node_key: str, address: str, head: bool, pids: list) -> None:
    data = {"node_key": node_key, "address": address, "head": head, "started": time.time(),
            "pids": [list(p) for p in pids]}
    tmp = directory / f".{PROCESSES}.tmp"
    tmp.write_text(json.dumps(data))
    os.replace(tmp, directory / PROCESSES)


def _local(directory: Path) -> LocalNode:
    data = json.loads((directory / PROCESSES).read_text())
    return LocalNode(node_key=data["node_key"], directory=directory, address=data.get("address"),
                     head=bool(data.get("head")), pids=tuple((int(p), int(t), str(n)) for p, t, n in data["pids"]),
                     started=float(data.get("started", 0.0)))


def local_nodes() -> list[LocalNode]:
    """Nodes rayaccel started on this machine (as this user) that still have a record."""
    out = []
    base = nodedir.base_dir()
    for d in sorted(base.iterdir()):
        if (d / PROCESSES).is_file():
            try:
                out.append(_local(d))
            except (ValueError, KeyError, TypeError, OSError):
                continue
    return out


def _descendants(roots: set[int]) -> set[int]:
    kids: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            pp = _parent(int(name))
            if pp is not None:
                kids.setdefault(pp, []).append(int(name))
    out, todo = set(), list(roots)
    while todo:
        p = todo.pop()
        for c in kids.get(p, ()):
            if c not in out:
                out.add(c)
                todo.append(c)
    return out


def _signal_all(pids: list[tuple[int, int]], sig: int) -> None:
    for pid, t in pids:
        if _start_time(pid) == t:
            try:
                os.kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop_local(node: LocalNode, *, force: bool = False, grace_s: float = STOP_GRACE_S) -> int:
    """Stop one node's recorded processes and their descendants; return how many were running."""
    alive = [(p, t) for p, t, _ in node.pids if _start_time(p) == t]
    kids = [(c, _start_time(c)) for c in _descendants({p for p, _ in alive})]
    kids = [(c, t) for c, t in kids if t is not None]
    targets = alive + kids
    _signal_all(targets, signal.SIGKILL if force else signal.SIGTERM)
    deadline = time.monotonic() + (0 if force else grace_s)
    while time.monotonic() < deadline and any(_start_time(p) == t for p, t in targets):
        time.sleep(0.1)
    _signal_all(targets, signal.SIGKILL)
    nodedir.remove(node.directory)
    return len(alive)


def pick(node_key: str | None = None, address: str | None = None) -> list[LocalNode]:
    """The local node(s) a ``rayaccel stop`` means.

    Raises:
        ClusterError: none match, or several do and none was named.
    """
    nodes = local_nodes()
    if node_key is not None:
        nodes = [n for n in nodes if n.node_key == node_key]
    if address is not None:
        nodes = [n for n in nodes if n.address == address]
    if not nodes:
        what = f" with node key {node_key}" if node_key else f" at {address}" if address else ""
        raise ClusterError(f"no node{what} was started by `rayaccel start` on this machine: `rayaccel stop` stops "
                           f"only those (never `ray stop`, which ends every Ray cluster here, other people's included)")
    if len(nodes) > 1 and node_key is None and address is None:
        listing = ", ".join(f"{n.node_key} ({'head' if n.head else 'worker'} at {n.address})" for n in nodes)
        raise ClusterError(f"{len(nodes)} rayaccel nodes run on this machine: {listing}; say which with "
                           f"--node KEY or --address HOST:PORT")
    return nodes
