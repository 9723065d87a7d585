"""Leaked device processes on a node: one scan of ``/proc``, then a pure decision (:func:`find`).

A *leak* is a process that uses a device of the node but is neither a live holder of that device
nor started by one, nor by a live worker of the node: the child a worker started that outlived it (a
DataLoader worker, an inference engine's subprocess, anything started in its own session) keeps its CUDA
context and device memory after Ray freed the slot. While its worker lives, a process it started is the
worker's own business, as the worker's own CUDA context is (Ray keeps idle workers, and their helpers
such as ``multiprocessing``'s resource tracker, which inherit the last grant's markers). The evidence that a process uses device ``d``, strongest first:

* **marker**: its exec-time environment (``/proc/<pid>/environ``) names this node
  (:data:`~rayaccel.contract.NODE_DIR_ENV` equal to the node's directory) and carries
  :data:`~rayaccel.contract.DEVICES_ENV`, which only the hook writes, at a grant, into a worker's
  ``os.environ``: a worker's own exec-time environment never has it (Ray starts workers from the
  raylet's environment), a process the worker starts after its grant inherits it, with
  :data:`~rayaccel.contract.HOLDER_ENV` naming the holder it came from;
* **visible devices**: the same, without the marker, but the GPUs' visible-devices variable names
  devices of the node (every entry an index or UUID the node table knows) with a value that is not
  the node's ambient one (the raylet's placeholders ``rayaccel-unhooked-<i>``, the node's preset);
* **nvml**: NVML lists the process on ``d`` (NVIDIA nodes, a simulated node's FakeNVML);
* **cgroup**: it sits in a cgroup that was a (now gone) worker's own.

Never a leak: the node's raylet and every process it started itself (its workers, idle or not:
a worker's exec-time environment is the raylet's, whatever it was granted since), a live holder of
``d``, a descendant of a live worker, or a process whose :data:`~rayaccel.contract.HOLDER_ENV` names a
live worker older than it (its parent chain may be broken: a daemonised child is reparented to init).
A process of another node on the same machine (another node directory) is not this node's.

A leak is **ours** (``rayaccel reclaim`` may end it) when it runs as this user and carries this
node's markers (it was started, after a grant, by a worker of this node that has ended since) or sits
in a gone worker's own cgroup; any other is reported with why, never ended.
"""

from __future__ import annotations

import os
from typing import Callable, Iterable, Mapping, NamedTuple

from rayaccel.contract import (DEVICES_ENV, HOLDER_ENV, NODE_DIR_ENV, NODE_VISIBLE_ENV, UNHOOKED_PREFIX,
                               parse_devices, parse_holder)

#: How far up its parents a process is followed, looking for a holder or a worker.
MAX_DEPTH = 32
#: The longest command line a leak row keeps, characters.
MAX_COMMAND = 200


class Proc(NamedTuple):
    """One process as the scan saw it.

    Attributes:
        pid / ppid: the process and its parent (None: unreadable). uid: its owner (None: unknown).
        start: its start time in clock ticks since boot (with the pid, its identity).
        env: the variables of interest from its exec-time environment (None: not readable, another user's).
        cgroup: its cgroup (``/proc/<pid>/cgroup``, joined), or None when not read.
    """

    pid: int
    ppid: int | None
    uid: int | None
    start: int | None
    env: Mapping[str, str] | None = None
    cgroup: str | None = None


class Holder(NamedTuple):
    """A live holder as the finder needs it: its pid, its grant's key and the devices it holds."""

    pid: int
    key: str
    devices: frozenset


class Leak(NamedTuple):
    """One leaked process on one device.

    Attributes:
        device: the device index. pid / start: the process (pid and start time).
        command: its command line (shortened). uid: its owner (None: unknown).
        evidence: ``marker`` / ``visible-devices`` / ``nvml`` / ``cgroup`` (module docstring).
        ours: this user's, and carries this node's markers or descends from a worker of this node: may be ended.
        why: for a process that is not ours, why not.
        holder_pid / holder_key / holder_name: the holder it came from (its worker's pid, grant key and name as its
            marker says; None / "" when unknown).
        used_bytes: device memory NVML says it uses (None: unknown).
    """

    device: int
    pid: int
    start: int | None
    command: str
    uid: int | None
    evidence: str
    ours: bool
    why: str
    holder_pid: int | None
    holder_key: str
    used_bytes: int | None
    holder_name: str = ""


# ------------------------------------------------------------------ reading /proc
def _read(path: str, limit: int = 1 << 17) -> bytes | None:
    try:
        with open(path, "rb") as f:
            return f.read(limit)
    except OSError:
        return None


def stat_of(root: str, pid: int) -> tuple[int | None, int | None]:
    """``(parent pid, start time)`` of ``pid`` under ``root`` (Nones when gone)."""
    data = _read(f"{root}/{pid}/stat", 4096)
    if not data:
        return None, None
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return int(rest[1]), int(rest[19])
    except (IndexError, ValueError):
        return None, None


def environ_of(root: str, pid: int, keys: Iterable[str]) -> dict[str, str] | None:
    """The variables ``keys`` of ``pid``'s exec-time environment (None: unreadable)."""
    data = _read(f"{root}/{pid}/environ")
    if data is None:
        return None
    want = tuple(k.encode() + b"=" for k in keys)
    out = {}
    for item in data.split(b"\0"):
        if item.startswith(want):
            k, _, v = item.partition(b"=")
            out[k.decode("utf-8", "replace")] = v.decode("utf-8", "replace")
    return out


def _kernel_or_init(pr: Proc) -> bool:
    """init, kthreadd and the kernel's threads (children of kthreadd): never a leak, whatever cgroup they sit in."""
    return pr.pid in (1, 2) or pr.ppid in (0, 2)


def is_root_cgroup(cgroup: str | None) -> bool:
    """Whether every hierarchy of ``cgroup`` (``0::/``; several lines joined by ``;`` on cgroup v1) is the root."""
    return not cgroup or all(line.rpartition(":")[2] in ("", "/") for line in cgroup.split(";"))


def cgroup_of(root: str, pid: int) -> str | None:
    """``pid``'s cgroup lines joined (``0::/user.slice/...``), or None."""
    data = _read(f"{root}/{pid}/cgroup", 8192)
    return None if data is None else data.decode("utf-8", "replace").strip().replace("\n", ";")


def cmdline_of(root: str, pid: int) -> str:
    """``pid``'s command line (arguments joined by spaces, shortened), or ""."""
    data = _read(f"{root}/{pid}/cmdline", 4096)
    if not data:
        return ""
    text = data.replace(b"\0", b" ").decode("utf-8", "replace").strip()
    return text if len(text) <= MAX_COMMAND else text[:MAX_COMMAND - 1] + "…"


def scan(root: str = "/proc", *, uid: int, keys: Iterable[str], also: Iterable[int] = (),
         cgroups: bool = False) -> dict[int, Proc]:
    """One pass over ``root``: every process of user ``uid`` (its parent, start time and the environment
    variables ``keys``; its cgroup when ``cgroups``), and the processes ``also`` names (NVML's) of any user
    (parent and start time only: another user's environment is not readable). Cheap: a few small reads each.
    """
    keys = tuple(keys)
    also = set(also)
    out: dict[int, Proc] = {}
    try:
        names = os.listdir(root)
    except OSError:
        return out
    for name in names:
        if not name.isdigit():
            continue
        pid = int(name)
        try:
            owner = os.stat(f"{root}/{name}").st_uid
        except OSError:
            continue  # gone meanwhile
        mine = owner == uid
        if not mine and pid not in also:
            continue
        ppid, start = stat_of(root, pid)
        if start is None:
            continue
        out[pid] = Proc(pid, ppid, owner, start, environ_of(root, pid, keys) if mine else None,
                        cgroup_of(root, pid) if mine and cgroups else None)
    return out


# ------------------------------------------------------------------ the decision
def visible_ids(table: object) -> dict[str, int]:
    """The names a visible-devices variable may give each GPU and MIG instance of a node table -> its device."""
    out: dict[str, int] = {}
    for r, t in getattr(table, "resources", {}).items():
        if r != "GPU" and not r.startswith("mig_"):
            continue
        for u in t.units:
            d = t.device_of.get(u)
            if d is not None:
                out[str(t.uuid_of.get(u) or u)] = int(d)
    return out


def _visible_devices(value: str | None, ids: Mapping[str, int]) -> set[int]:
    """The devices a visible-devices value names, only when every entry is one the node knows."""
    if not value or value.startswith(UNHOOKED_PREFIX):
        return set()
    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or not all(p in ids for p in parts):
        return set()
    return {ids[p] for p in parts}


def find(procs: Mapping[int, Proc], holders: Mapping[int, Holder], *, node_dir: str, uid: int,
         raylet_pid: int | None = None, visible_var: str | None = None, ids: Mapping[str, int] | None = None,
         nvml: Iterable[object] = (), worker_cgroups: Mapping[str, tuple[int, str, frozenset]] | None = None,
         exclude: Iterable[int] = (), cmdline: Callable[[int], str] = lambda pid: "") -> list[Leak]:
    """The leaks among ``procs`` (see the module docstring), sorted by device and pid. Pure but for ``cmdline``.

    Args:
        procs: the scan (:func:`scan`). holders: the node's live holders by pid (drain placeholders left out).
        node_dir: this node's directory (what its processes' :data:`NODE_DIR_ENV` says).
        raylet_pid: the node's raylet (None: the parent of any live holder stands for it).
        visible_var / ids: the GPUs' visible-devices variable and the names it gives each device (:func:`visible_ids`).
        nvml: NVML's processes (``.pid``, ``.device``, ``.used_bytes``).
        worker_cgroups: cgroup -> ``(holder pid, grant key, devices)`` of workers that had a cgroup of their own.
        exclude: pids never to count (the agent itself).
    """
    ids = ids or {}
    worker_cgroups = worker_cgroups or {}
    raylets = {raylet_pid} if raylet_pid else {procs[p].ppid for p in holders if p in procs and procs[p].ppid}
    raylets.discard(None)
    workers = {p for p, pr in procs.items() if pr.ppid in raylets}
    never = set(exclude) | raylets | workers | {1}
    ambient: dict[str, str] = {}
    for r in raylets:  # what the raylet itself carries is inherited by everything it starts: never a grant's
        env = procs[r].env if r in procs else None
        ambient.update(env or {})

    def ancestors(pid: int) -> Iterable[int]:
        p, seen = procs[pid].ppid if pid in procs else None, 0
        while p is not None and p > 1 and seen < MAX_DEPTH:
            yield p
            p, seen = (procs[p].ppid if p in procs else None), seen + 1

    found: dict[tuple[int, int], list] = {}  # (pid, device) -> [evidence, used_bytes]
    for pid, pr in procs.items():
        env = pr.env
        if pid in never or not env or env.get(NODE_DIR_ENV) != node_dir:
            continue
        devs = set(parse_devices(env.get(DEVICES_ENV)) or ())
        if devs and env.get(DEVICES_ENV) == ambient.get(DEVICES_ENV):
            devs = set()  # the raylet's own (inherited from whoever started it): no grant's marker
        how = "marker"
        if not devs and visible_var:
            value = env.get(visible_var)
            if value is not None and value not in (ambient.get(visible_var), env.get(NODE_VISIBLE_ENV)):
                devs, how = _visible_devices(value, ids), "visible-devices"
        for d in devs:
            found[(pid, d)] = [how, None]
    if worker_cgroups:
        for pid, pr in procs.items():
            hit = worker_cgroups.get(pr.cgroup) if pr.cgroup else None
            if hit is not None and pid not in never and not _kernel_or_init(pr):
                for d in hit[2]:
                    found.setdefault((pid, d), ["cgroup", None])
    for np in nvml:
        pid, d = int(getattr(np, "pid")), int(getattr(np, "device"))
        if pid in never or pid not in procs:
            continue  # a worker of the raylet (idle ones included), or a pid not visible here (another pid namespace)
        hit = found.setdefault((pid, d), ["nvml", None])
        used = getattr(np, "used_bytes", None)
        if used is not None:
            hit[1] = (hit[1] or 0) + int(used)
    out = []
    for (pid, d), (how, used) in found.items():
        if pid in holders and d in holders[pid].devices:
            continue
        pr = procs[pid]
        env = pr.env or {}
        marked = parse_holder(env.get(HOLDER_ENV)) if env.get(HOLDER_ENV) != ambient.get(HOLDER_ENV) else None
        if marked is not None and marked[0] in holders and d in holders[marked[0]].devices:
            continue  # its holder lives and holds the device (the child may have been reparented)
        if marked is not None and marked[0] in workers and (procs[marked[0]].start or 0) <= (pr.start or 0):
            continue  # the worker that started it lives (idle, or holding other devices now): its own business
        chain = list(ancestors(pid))
        if any(a in holders or a in workers for a in chain):
            continue  # a live holder's or a live worker's descendant
        hpid, hkey, hname = marked if marked is not None else (None, "", "")
        in_cgroup = pr.cgroup is not None and pr.cgroup in worker_cgroups
        if hpid is None and in_cgroup:
            hpid, hkey = worker_cgroups[pr.cgroup][0], worker_cgroups[pr.cgroup][1]
        mine = pr.uid == uid
        ours = mine and (env.get(NODE_DIR_ENV) == node_dir or in_cgroup)
        why = "" if ours else (f"another user's (uid {pr.uid})" if not mine and pr.uid is not None
                               else "another user's" if not mine
                               else "it carries no marker of this node's workers")
        out.append(Leak(d, pid, pr.start, cmdline(pid), pr.uid, how, ours, why, hpid, hkey, used, hname))
    return sorted(out, key=lambda lk: (lk.device, lk.pid))


def keys_for(visible_var: str | None) -> tuple[str, ...]:
    """The environment variables :func:`scan` reads for :func:`find`."""
    return (NODE_DIR_ENV, DEVICES_ENV, HOLDER_ENV, NODE_VISIBLE_ENV, *((visible_var,) if visible_var else ()))


__all__ = ["Holder", "Leak", "Proc", "cgroup_of", "cmdline_of", "environ_of", "find", "is_root_cgroup", "keys_for", "scan", "stat_of",
           "visible_ids"]
