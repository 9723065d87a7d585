"""The node agent's leak watcher: leaked device processes found, their devices fenced, reclaimed on request.

A child a worker started that outlives it keeps its CUDA context and device memory after Ray freed
the slot; the next worker given that device lands on memory a stranger holds. :class:`LeakWatch`
runs in the agent every period (:data:`~.agent.PERIOD_S`):

* **find**: one scan of ``/proc`` (this user's processes; NVML's of any user), then
  :func:`.leakscan.find` over the arbiter's live holders and NVML's per-process list (the usage
  watch's read of this period, :mod:`.usage`): a process using a device that is neither a live holder of
  it nor started by one. A leak seen for :data:`GRACE_S` counts (a holder's child in its first second is
  not yet in the snapshot the finder compares with);
* **fence**: the device is drained with ``by="leak"`` (:meth:`.agent.NodeAgent.drain`): no new grant maps
  to it and a placeholder holds it in Ray's ledger, so new work waits rather than lands on occupied
  memory. Work already on the device runs on untouched (never killed; the placeholder takes a free slot
  at once and moves onto the device when its work ends, as for an operator's drain of a busy device). The
  fence is lifted by the watcher once the device's leaked processes are gone; it never lifts another
  drain, and an operator's or the health watcher's drain replaces a fence. An operator who lifts a
  fence (``rayaccel undrain``) acknowledges its processes: they are shown, never fenced again;
* **reclaim** (:meth:`LeakWatch.reclaim`, ``rayaccel reclaim NODE:DEV``; automatically after the node's
  ``--reclaim-leaks AFTER``, :mod:`.leakpolicy`): the leaked processes that provably belong to the node's
  Ray workers (this user's, carrying the node's markers or descending from one of its workers) get
  SIGTERM, then SIGKILL after :data:`STOP_GRACE_S`; the others are reported, never signalled;
* **show**: :meth:`LeakWatch.summary` (the rows and the fence / unfence / reclaim events) goes into the
  node's snapshot for ``status``, ``top``, ``doctor`` and the metrics; each event is logged too.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import OrderedDict, deque
from typing import Any, Callable

from rayaccel.arbiter.state import held_devices
from rayaccel.contract import LEAK_DRAIN_BY
from rayaccel.ray.node import leakpolicy
from rayaccel.ray.node.leakscan import (Holder, Leak, cgroup_of, cmdline_of, find, is_root_cgroup, keys_for, scan,
                                        visible_ids)

log = logging.getLogger(__name__)
#: A leak must be seen this long before it counts (is shown, fenced), seconds.
GRACE_S = 3.0
#: SIGTERM, then this long before SIGKILL, seconds.
STOP_GRACE_S = 5.0
#: Events kept (fenced, unfenced, reclaimed, ...).
KEEP_EVENTS = 100
#: Leak rows a snapshot carries at most (the rest are counted by the metrics' sums of what is shown).
MAX_ROWS = 200
#: Holders remembered after they end (to name the holder a leak came from).
HISTORY = 1024


def _alive(root: str, pid: int, start: int | None) -> bool:
    """Does the process ``pid`` that started at ``start`` still run (a zombie has ended)?"""
    try:
        with open(f"{root}/{pid}/stat", "rb") as f:
            data = f.read()
    except OSError:
        return False
    rest = data[data.rfind(b")") + 2:].split()
    try:
        return rest[0] not in (b"Z", b"X") and (start is None or int(rest[19]) == start)
    except (IndexError, ValueError):
        return False


class LeakWatch:
    """The leak watcher of one node's agent (see the module docstring).

    Args:
        agent: the :class:`~.agent.NodeAgent` (its ``dir``, ``table``, ``arbiter``, ``drain`` / ``undrain``).
        root: the ``/proc`` to read (tests: a fake tree). nvml: returns NVML's processes (``.pid``, ``.device``,
            ``.used_bytes``); None: the agent's usage watch's last read (``agent.nvml_procs``).
        uid: the user whose processes may be reclaimed (default: this process's).
    """

    def __init__(self, agent: Any, *, root: str = "/proc", nvml: Callable[[], Any] | None = None,
                 uid: int | None = None, grace_s: float = GRACE_S, stop_grace_s: float = STOP_GRACE_S):
        self.agent = agent
        self.root = root
        self.nvml = nvml
        self.uid = os.getuid() if uid is None else uid
        self.grace_s = grace_s
        self.stop_grace_s = stop_grace_s
        table = agent.table
        gpus = any(r == "GPU" or r.startswith("mig_") for r in table.resources)
        self.visible_var = table.visible_env if gpus else None
        self.ids = visible_ids(table)
        self.first: dict[tuple, float] = {}
        self.current: list[Leak] = []
        self.rows: list[dict] = []
        self.events: deque = deque(maxlen=KEEP_EVENTS)
        self.acknowledged: set[tuple] = set()
        self.by_key: OrderedDict[str, tuple] = OrderedDict()  # grant key -> (pid, name, kind, job)
        self.by_pid: dict[int, str] = {}
        self.worker_cgroups: OrderedDict[str, tuple] = OrderedDict()
        self._cg_seen: dict[int, str | None] = {}
        self._fixed_cgroups: tuple[int, str | None, str | None] | None = None  # (raylet pid, its cgroup, the agent's)
        self.after_s = leakpolicy.read(agent.dir)
        self._raylet: int | None = None
        self._lock = threading.RLock()
        self._reclaiming: set[int] = set()
        self.error: str | None = None

    def __call__(self, agent: Any) -> None:
        self.check()

    # ------------------------------------------------------------ finding
    def remember(self) -> None:
        """Note every holder in the arbiter's state, the dead not yet reaped included (the agent calls this before
        its reaper runs): a short-lived holder's leaked child is then named by Ray's names."""
        st = self.agent.arbiter.peek()
        for pid, h in (st.holders.items() if st is not None else ()):
            if h.drain is None:
                self._note(pid, h)

    def _note(self, pid: int, h: Any) -> None:
        self.by_key[h.key] = (pid, h.name, h.kind, h.job)
        self.by_key.move_to_end(h.key)
        self.by_pid[pid] = h.key

    def _holders(self) -> tuple[dict[int, Holder], dict]:
        st = self.agent.arbiter.peek()
        if st is None:
            return {}, {}
        out = {}
        for pid, h in st.holders.items():
            if h.drain is not None or h.waiting or not self.agent.arbiter.alive(pid):
                continue
            devs = frozenset(held_devices(h, st.pools, self.agent.table.device_of))
            out[pid] = Holder(pid, h.key, devs)
            self._note(pid, h)
        while len(self.by_key) > HISTORY:
            k, v = self.by_key.popitem(last=False)
            if self.by_pid.get(v[0]) == k:
                del self.by_pid[v[0]]
        return out, dict(st.drained)

    def _raylet_pid(self, procs: dict) -> int | None:
        pid = getattr(self.agent, "raylet_pid", None) or self._raylet
        if pid:
            return pid
        for p, pr in procs.items():  # not told (a test's body): the node's process whose command is the raylet
            if pr.env and pr.env.get("RAYACCEL_NODE_DIR") == self.agent.dir and "/raylet" in cmdline_of(self.root, p):
                self._raylet = p
                return p
        return None

    def _cgroups(self, holders: dict[int, Holder], raylet: int | None) -> None:
        """Remember the cgroup of each holder that has one of its own: not its raylet's, not the agent's, not the root
        (where every process of a host without cgroups sits), not another holder's. Nothing is learned while the raylet
        is not found: without its cgroup, a worker's cannot be told apart from the one everything shares."""
        for pid in list(self._cg_seen):
            if pid not in holders:
                del self._cg_seen[pid]
        for pid in holders:
            if pid not in self._cg_seen:
                self._cg_seen[pid] = cgroup_of(self.root, pid)
        if not raylet:
            return
        if self._fixed_cgroups is None or self._fixed_cgroups[0] != raylet:  # read once: neither moves
            self._fixed_cgroups = (raylet, cgroup_of(self.root, raylet), cgroup_of(self.root, os.getpid()))
        _, base, mine = self._fixed_cgroups
        counts: dict[str, int] = {}
        for cg in self._cg_seen.values():
            if cg:
                counts[cg] = counts.get(cg, 0) + 1
        for pid, h in holders.items():
            cg = self._cg_seen.get(pid)
            if cg and base and cg != base and cg != mine and not is_root_cgroup(cg) and counts[cg] == 1:
                self.worker_cgroups[cg] = (pid, h.key, h.devices)
                self.worker_cgroups.move_to_end(cg)
        while len(self.worker_cgroups) > 256:
            self.worker_cgroups.popitem(last=False)

    def _nvml(self) -> list:
        if self.nvml is not None:
            return list(self.nvml() or ())
        return list(getattr(self.agent, "nvml_procs", None) or ())

    def find(self) -> tuple[list[Leak], dict]:
        """Every leak now (no grace) and the node's drains."""
        holders, drained = self._holders()
        nv = self._nvml()
        procs = scan(self.root, uid=self.uid, keys=keys_for(self.visible_var), also={int(p.pid) for p in nv},
                     cgroups=bool(self.worker_cgroups))
        raylet = self._raylet_pid(procs)
        self._cgroups(holders, raylet)
        leaks = find(procs, holders, node_dir=self.agent.dir, uid=self.uid, raylet_pid=raylet,
                     visible_var=self.visible_var, ids=self.ids, nvml=nv, worker_cgroups=self.worker_cgroups,
                     exclude={os.getpid(), os.getppid()}, cmdline=lambda p: cmdline_of(self.root, p))
        return leaks, drained

    # ------------------------------------------------------------ each period
    def check(self, now: float | None = None) -> list[dict]:
        """One period: find, fence new leaks, lift fences whose leaks are gone, reclaim when the policy says."""
        with self._lock:
            now = time.time() if now is None else now
            leaks, drained = self.find()
            self.first = {k: self.first.get(k, now) for k in ((lk.pid, lk.start, lk.device) for lk in leaks)}
            self.current = leaks
            live = {(lk.pid, lk.start, lk.device) for lk in leaks}
            self.acknowledged &= live
            counted = [lk for lk in leaks if now - self.first[(lk.pid, lk.start, lk.device)] >= self.grace_s]
            drained = self._fence(counted, leaks, drained, now)
            self.rows = [self._row(lk, drained) for lk in counted]
            self.error = None
        self._auto_reclaim(counted, now)
        return self.rows

    def _fence(self, counted: list[Leak], leaks: list[Leak], drained: dict, now: float) -> dict:
        by_dev: dict[int, list[Leak]] = {}
        for lk in counted:
            if (lk.pid, lk.start, lk.device) not in self.acknowledged:
                by_dev.setdefault(lk.device, []).append(lk)
        for d, lks in sorted(by_dev.items()):
            if d in drained:
                continue  # fenced already, or drained by an operator / the health watcher (their drain stands)
            reason = "leaked: " + "; ".join(f"pid {lk.pid} ({lk.command[:60] or '?'}) from {self.who(lk)}"
                                            for lk in lks[:3]) + (f"; +{len(lks) - 3} more" if len(lks) > 3 else "")
            self.agent.drain(d, reason, by=LEAK_DRAIN_BY, tick=False)
            drained[d] = None
            self._event("fenced", d, [lk.pid for lk in lks], reason, now)
        still = {lk.device for lk in leaks if (lk.pid, lk.start, lk.device) not in self.acknowledged}
        for d, dr in list(drained.items()):
            if dr is not None and dr.by == LEAK_DRAIN_BY and d not in still:
                if self.agent.undrain(d, only_by=LEAK_DRAIN_BY, tick=False):
                    del drained[d]
                    self._event("unfenced", d, [], "its leaked processes are gone", now)
        st = self.agent.arbiter.peek()
        return dict(st.drained) if st is not None else drained

    def acknowledge(self, device: int) -> None:
        """An operator lifted ``device``'s fence: its current leaked processes are not fenced again."""
        with self._lock:
            keys = {(lk.pid, lk.start, lk.device) for lk in self.current if lk.device == device}
            self.acknowledged |= keys
            if keys:
                self._event("acknowledged", device, sorted({k[0] for k in keys}), "an operator lifted the fence",
                            time.time())

    def _auto_reclaim(self, counted: list[Leak], now: float) -> None:
        self.after_s = leakpolicy.read(self.agent.dir)
        if self.after_s is None:
            return
        due = {lk.device for lk in counted if lk.ours and now - self.first[(lk.pid, lk.start, lk.device)] >= self.after_s}
        for d in sorted(due - self._reclaiming):
            self._reclaiming.add(d)
            threading.Thread(target=self._reclaim_bg, args=(d,), daemon=True, name=f"rayaccel-reclaim-{d}").start()

    def _reclaim_bg(self, device: int) -> None:
        try:
            self.reclaim(device, by="auto")
        except Exception as e:  # noqa: BLE001 - this thread's failure is reported, the watcher goes on
            log.error("rayaccel: reclaiming device %s failed: %s", device, e)
            self.error = f"reclaiming device {device}: {e}"
        finally:
            self._reclaiming.discard(device)

    # ------------------------------------------------------------ reclaiming
    def reclaim(self, device: int, by: str = "operator") -> dict:
        """End ``device``'s leaked processes that are ours (SIGTERM, then SIGKILL); report the others.

        Returns:
            ``{"device", "ended": [rows], "left": [rows with "why"], "fence": "lifted" | "kept" | "none"}``.
        """
        with self._lock:
            leaks, _ = self.find()
        mine = [lk for lk in leaks if lk.device == device]
        ours = [lk for lk in mine if lk.ours]
        ended = self._end(ours)
        left = [dict(self._row(lk, {}), why=lk.why) for lk in mine if not lk.ours]
        left += [dict(self._row(lk, {}), why="did not end after SIGKILL") for lk in ours if lk.pid not in ended]
        rows = [dict(self._row(lk, {}), signal=ended[lk.pid]) for lk in ours if lk.pid in ended]
        detail = (f"{by}: ended " + (", ".join(f"pid {r['pid']} ({r['command'][:60]})" for r in rows) or "nothing")
                  + "".join(f"; left pid {r['pid']} ({r['why']})" for r in left))
        if rows or left:
            self._event("reclaimed", device, [r["pid"] for r in rows], detail, time.time())
        was = self._drain_by(device)
        self.check()
        now_by = self._drain_by(device)
        fence = "none" if was != LEAK_DRAIN_BY else ("lifted" if now_by != LEAK_DRAIN_BY else "kept")
        return {"device": device, "ended": rows, "left": left, "fence": fence}

    def _drain_by(self, device: int) -> str | None:
        st = self.agent.arbiter.peek()
        dr = st.drained.get(device) if st is not None else None
        return dr.by if dr is not None else None

    def _end(self, leaks: list[Leak]) -> dict[int, str]:
        """Signal each (still the same process, still this user's): SIGTERM, wait, SIGKILL. pid -> the last signal."""
        targets = {}
        for lk in leaks:
            if lk.uid == self.uid and _alive(self.root, lk.pid, lk.start):
                targets[lk.pid] = lk.start
        sent: dict[int, str] = {}
        for pid in targets:
            try:
                os.kill(pid, signal.SIGTERM)
                sent[pid] = "SIGTERM"
            except (ProcessLookupError, PermissionError):
                pass
        deadline = time.monotonic() + self.stop_grace_s
        while time.monotonic() < deadline and any(_alive(self.root, p, targets[p]) for p in sent):
            time.sleep(0.05)
        for pid in sent:
            if _alive(self.root, pid, targets[pid]):
                try:
                    os.kill(pid, signal.SIGKILL)
                    sent[pid] = "SIGKILL"
                except (ProcessLookupError, PermissionError):
                    pass
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline and any(_alive(self.root, p, targets[p]) for p in sent):
            time.sleep(0.05)
        return {p: s for p, s in sent.items() if not _alive(self.root, p, targets[p])}

    # ------------------------------------------------------------ showing
    def who(self, lk: Leak) -> str:
        """The holder ``lk`` came from, by Ray's names where remembered."""
        if lk.holder_pid is None:
            return "an unknown holder"
        rec = self.by_key.get(lk.holder_key) if lk.holder_key else self.by_key.get(self.by_pid.get(lk.holder_pid, ""))
        if rec is not None and rec[0] == lk.holder_pid:
            _, name, kind, _ = rec
            return f"{kind or 'holder'} {name or '?'} (pid {lk.holder_pid})"
        if lk.holder_name:  # what the worker's marker said at the grant
            return f"{lk.holder_key.partition(':')[0] or 'holder'} {lk.holder_name} (pid {lk.holder_pid})"
        return f"pid {lk.holder_pid}" + (f" ({lk.holder_key})" if lk.holder_key else "")

    def _row(self, lk: Leak, drained: dict) -> dict:
        dr = drained.get(lk.device)
        key = (lk.pid, lk.start, lk.device)
        return {"device": lk.device, "pid": lk.pid, "command": lk.command, "uid": lk.uid, "evidence": lk.evidence,
                "ours": lk.ours, "why": lk.why, "holder": self.who(lk), "holder_pid": lk.holder_pid,
                "holder_key": lk.holder_key, "since": self.first.get(key), "used_bytes": lk.used_bytes,
                "fenced": dr is not None and dr.by == LEAK_DRAIN_BY, "drained_by": dr.by if dr is not None else None,
                "acknowledged": key in self.acknowledged}

    def _event(self, action: str, device: int, pids: list[int], detail: str, at: float) -> None:
        self.events.append({"at": at, "action": action, "device": device, "pids": list(pids), "detail": detail[:500]})
        log.warning("rayaccel leaks: device %s %s: %s", device, action, detail)

    def summary(self) -> dict:
        """What the snapshot carries: the counted leaks, recent events, the reclaim policy."""
        return {"rows": list(self.rows[:MAX_ROWS]), "events": list(self.events)[-20:], "reclaim_after_s": self.after_s,
                "error": self.error}


def attach(agent: Any) -> LeakWatch:
    """Watch ``agent``'s node for leaked device processes every period (after the usage watch: its NVML read)."""
    w = LeakWatch(agent)
    agent.leak_watch = w
    agent.extensions.append(w)
    return w


__all__ = ["GRACE_S", "LeakWatch", "STOP_GRACE_S", "attach"]
