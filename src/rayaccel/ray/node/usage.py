"""Per-holder usage on a node: device memory, utilisation and spilled bytes of each Ray task and actor.

Ray 2.60's own view (its dashboard agent, ``ray/dashboard/modules/reporter/``) already reads NVML's
per-process figures and shows, per worker *process*, its GPU memory (MiB) and SM utilisation summed over
every GPU it uses, exported as ``ray_component_gpu_memory_mb`` / ``ray_component_gpu_percentage`` tagged
with the process title (``Component="ray::MyActor"``, ``"ray::train"``, ``"ray::IDLE"``: workers of one
title summed). What it lacks, and this module adds (docs/operations.md, "Per-holder usage"):

* **which device**: one row per holder *and device* (and MIG instance), where Ray sums over GPUs;
* **who, by Ray's names**: the actor's class and its name (two actors of one class stay apart), the
  task's function, its job and the grant's id -- joined from the node arbiter's holders, never guessed
  from a title; a holder's child processes (a DataLoader worker, an engine's subprocess) count as the holder's;
* **simulated nodes**: no NVML there, so a worker says what it uses (:func:`rayaccel.report_usage`);
* **spilled bytes**: what a producer's ``rayaccel``-transport objects moved off the device
  (:class:`rayaccel.memory.held.HeldObjects`), which only the worker knows.

:class:`UsageWatch` runs in the agent every period: NVML's figures (:class:`rayaccel.health.usage.NvmlUsageReader`;
on a simulated NVIDIA node, over the health watcher's FakeNVML, so tests drive the same path), the workers'
usage files (:mod:`rayaccel.ray.usagefile`), and the last snapshot's holders go into :func:`join`, pure,
whose rows ``status``, ``top`` and the metrics show. NVML's figure wins over a worker's report for the same
process and device.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Iterable, NamedTuple

from rayaccel import _proc
from rayaccel.health.usage import NvmlUsageReader, ProcessUsage
from rayaccel.ray import usagefile

log = logging.getLogger(__name__)
#: How far up its parents a process is followed to find the holder it belongs to.
MAX_DEPTH = 32


class HolderUsage(NamedTuple):
    """One holder's use of one device (a row of ``status`` / ``top``, a series of the metrics).

    Attributes:
        pid: the holder's process. device: the device index. partition: the MIG instance key, or None.
        kind: ``actor`` / ``task``. holder: the name ``status`` shows. id: the actor or task id (hex). job: its job.
        actor_class / actor_name: an actor's class and name ("" when unnamed, or not an actor).
        task_function: a task's function (Ray's task name), "" for an actor.
        used_bytes: device memory in use (None: unknown). utilization: percent (None: unknown).
        spilled_bytes: what its ``rayaccel``-transport objects spilled off this device (None: it holds none under a budget).
        source: ``nvml`` (NVML's per-process figures) or ``reported`` (what the worker said).
        pids: the processes counted (the holder and its descendants NVML listed).
    """

    pid: int
    device: int
    partition: str | None
    kind: str
    holder: str
    id: str
    job: str
    actor_class: str
    actor_name: str
    task_function: str
    used_bytes: int | None
    utilization: float | None
    spilled_bytes: int | None
    source: str
    pids: tuple[int, ...]


def title_class(cmdline: str) -> str:
    """The actor class in a Ray worker's process title (``ray::MyActor`` / ``ray::MyActor.step``), or ""."""
    head = cmdline.split(" ", 1)[0] if cmdline else ""
    if not head.startswith("ray::") or head.startswith("ray::IDLE"):
        return ""
    return head[5:].split(".", 1)[0]


def join(holders: Iterable[Any], procs: Iterable[ProcessUsage], files: dict[int, usagefile.WorkerUsage], *,
         parent: Callable[[int], int | None] = _proc.parent,
         cmdline: Callable[[int], str] = _proc.cmdline) -> list[HolderUsage]:
    """Per-holder usage rows (pure but for ``parent`` / ``cmdline``, which read ``/proc``).

    Args:
        holders: the snapshot's holders (:class:`~rayaccel.arbiter.state.SnapshotHolder`); waiting grants and
            drain placeholders hold nothing and get no row.
        procs: NVML's per-process figures. files: the workers' usage files by pid.
    """
    live = {h.pid: h for h in holders if not h.waiting and h.drain is None}
    owner_of: dict[int, int | None] = {}

    def owner(pid: int) -> int | None:
        if pid in owner_of:
            return owner_of[pid]
        p, seen = pid, 0
        while p is not None and p > 1 and seen < MAX_DEPTH and p not in live:
            p, seen = parent(p), seen + 1
        owner_of[pid] = p if p in live else None
        return owner_of[pid]

    acc: dict[tuple[int, int], dict] = {}
    for pr in procs:
        o = owner(pr.pid)
        if o is None:
            continue  # not a holder's: another user's, outside Ray, or a leak (reported elsewhere)
        a = acc.setdefault((o, pr.device), {"used": None, "util": None, "pids": [], "gi": None, "source": "nvml"})
        if pr.used_bytes is not None:
            a["used"] = (a["used"] or 0) + pr.used_bytes
        if pr.utilization is not None:
            a["util"] = min(100.0, (a["util"] or 0.0) + pr.utilization)
        a["pids"].append(pr.pid)
        if pr.gpu_instance is not None:
            a["gi"] = pr.gpu_instance
    spilled: dict[tuple[int, int], int] = {}
    for pid, f in files.items():
        h = live.get(pid)
        if h is None or (f.id and h.id and f.id != h.id):
            continue  # not holding now, or figures an earlier task of this (reused) worker left
        for dev, (used, util) in f.devices.items():
            if (pid, dev) not in acc and (not h.devices or dev in h.devices):
                acc[(pid, dev)] = {"used": used, "util": util, "pids": [pid], "gi": None, "source": "reported"}
        if f.spilled_bytes is not None:
            dev = f.spilled_device if f.spilled_device is not None else (h.devices[0] if h.devices else None)
            if dev is not None:
                spilled[(pid, dev)] = f.spilled_bytes
                acc.setdefault((pid, dev), {"used": None, "util": None, "pids": [pid], "gi": None, "source": "reported"})
    rows = []
    for (pid, dev), a in sorted(acc.items()):
        h = live[pid]
        f = files.get(pid) if pid in files and (not files[pid].id or files[pid].id == h.id) else None
        if h.kind == "actor":
            cls = (f.actor_class if f else "") or title_class(cmdline(pid)) or h.name
            name = f.actor_name if f else ("" if h.name == cls else h.name)
            fn = ""
        else:
            cls = name = ""
            fn = (f.task_function if f else "") or h.name
        part = f"{dev}:mig{a['gi']}" if a["gi"] is not None else next(
            (p for p in h.partitions if str(p).split(":")[0] == str(dev)), None)
        rows.append(HolderUsage(pid, dev, part, h.kind, h.name, h.id, h.job, cls, name, fn, a["used"],
                                None if a["util"] is None else round(a["util"], 2), spilled.get((pid, dev)),
                                a["source"], tuple(sorted(set(a["pids"])))))
    return rows


class UsageWatch:
    """The agent's per-holder usage, refreshed every period (an agent extension; see the module docstring)."""

    def __init__(self, reader: NvmlUsageReader | None):
        self.reader = reader
        self.problems: list[str] = []
        self.rows: list[HolderUsage] = []
        self._told: set[str] = set()

    def __call__(self, agent: Any) -> None:
        snap = agent.last
        procs: list[ProcessUsage] = []
        if self.reader is not None:
            procs = self.reader.read()
        files, self.problems = usagefile.read_all(agent.dir)
        for p in self.problems:
            if p not in self._told:  # once per problem, not every second
                self._told.add(p)
                log.warning("rayaccel usage: %s (its figures are left out)", p)
        self.rows = join(snap.holders if snap is not None else (), procs, files)
        agent.usage_rows = self.rows
        agent.nvml_procs = procs  # the leak watcher's NVML evidence (.leaks): one NVML read per period


def _reader(agent: Any) -> NvmlUsageReader | None:
    topo = agent.record.topology
    if not any(d.vendor == "nvidia" for d in topo.devices):
        return None
    if agent.record.simulated:
        fake = getattr(getattr(agent, "watcher", None), "fake", None)
        return NvmlUsageReader(topo, nvml=fake) if hasattr(fake, "set_process_usage") else None
    return NvmlUsageReader(topo)


def attach(agent: Any) -> UsageWatch:
    """Gather ``agent``'s per-holder usage every period (usage files only when NVML is unavailable)."""
    try:
        reader = _reader(agent)
    except Exception as e:  # noqa: BLE001 - no NVML (library missing, driver gone): the usage files still count
        log.warning("rayaccel: per-holder usage on node %s without NVML's figures: %s", agent.node_key, e)
        reader = None
    w = UsageWatch(reader)
    agent.extensions.append(w)
    return w
