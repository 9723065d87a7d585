"""The arbiter of one node: the state file and the node lock around the pure transitions of :mod:`.decide`.

The state (``arbiter.state`` in the node directory, on ``/dev/shm`` when available) is
replaced atomically (write + rename) under ``flock`` on ``arbiter.lock``. The lock file
is opened once per process and kept; after taking the lock a process writes its pid and
the time into it, so a process waiting longer than :data:`LOCK_WARN_S` can log one
warning naming the holder (a stopped or stuck process stalls every grant on the node),
and the agent, ``status`` and ``doctor`` can show it (:meth:`Arbiter.lock_info`).
Nothing remote happens under the lock: the transitions are pure, and whatever Ray must
be asked (is a placement group still there?) is asked by the caller before or after.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from .._proc import cmdline
from .._proc import exists as pid_alive  # the arbiter's default liveness test
from ..contract import DYNMIG_FILE, LOCK_FILE, STATE_FILE
from ..errors import ClusterError
from . import decide as D
from .choose import TableChooser
from .state import (ArbiterState, LockInfo, Reservation, Snapshot, StateError, decode_state, encode_state,
                    fresh_state, snapshot_of)
from .table import NodeTable, decode_live, dynamic_resources, encode_live, with_live

log = logging.getLogger(__name__)
#: One JSON line per decision (time, microseconds, devices, MIG instances), appended; read by the agent.
DECISION_LOG = "decisions.log"
#: A grant that has waited this long for the node lock logs who holds it, seconds.
LOCK_WARN_S = 3.0
_TAG_BYTES = 32


class LockTimeout(ClusterError):
    """The node lock was not free within the time asked (:attr:`holder` says who has it)."""

    def __init__(self, message: str, holder: LockInfo | None):
        self.holder = holder
        super().__init__(message)


class Arbiter:
    """The arbiter of one node (module docstring).

    Args:
        node_dir: the node's directory (holds the state and lock files).
        table: the node table (:mod:`.table`).
        chooser: picks units (default: :class:`~.choose.TableChooser` over ``table``, loading the
            topology from ``topology`` when its plans have no answer).
        topology: the node's topology, or a zero-argument callable returning it.
        alive: liveness test for holder pids (tests inject one).

    Raises:
        ClusterError: the node directory does not exist.
    """

    def __init__(self, node_dir: str | Path, table: NodeTable, *, chooser: Any = None, topology: Any = None,
                 alive: Callable[[int], bool] = pid_alive):
        self.dir = str(node_dir)
        if not os.path.isdir(self.dir):
            raise ClusterError(f"rayaccel node directory {self.dir} does not exist (was the node started by "
                               f"`rayaccel start`?)")
        self.table = table
        self._base_table = table
        self._dynamic = bool(dynamic_resources(table))
        self._live_mtime: int | None = None
        self.pools = table.pools()
        if chooser is None:
            chooser = TableChooser(table, topology if callable(topology) else (lambda: topology))
        self.chooser = chooser
        self.alive = alive
        self.state_path = os.path.join(self.dir, STATE_FILE)
        self._tmp_path = os.path.join(self.dir, f".{STATE_FILE}.{os.getpid()}")
        self._lock_path = os.path.join(self.dir, LOCK_FILE)
        self._lock_fd: int | None = None
        self._log_fd: int | None = None
        self._tlock = threading.Lock()
        self._pid = os.getpid()

    # ------------------------------------------------------------------ the lock
    def _fd(self) -> int:
        if self._lock_fd is None or self._pid != os.getpid():  # a forked child needs its own open file
            self._lock_fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o600)
            self._pid = os.getpid()
            self._tmp_path = os.path.join(self.dir, f".{STATE_FILE}.{self._pid}")
            self._log_fd = None
        return self._lock_fd

    def open(self) -> None:
        """Open the lock file and the decision log now (a worker does at start, off its first grant's path)."""
        self._fd()
        try:
            self._log()
        except OSError:
            pass  # the log only feeds metrics

    def rehearse(self, resource: str) -> None:
        """Run a one-unit grant's code once on an idle copy of the state: nothing saved.

        A worker does this at start. Python runs a function's first call cold, which costs a
        fresh worker's first real grant about 0.1 ms more (0.20 vs 0.07 ms here). Only where the
        node table's plans answer (the placer and the topology are not loaded at worker start).
        Takes no lock: the state is read as :meth:`peek` reads it (the file is replaced atomically),
        so a node starting many workers never queues its real grants behind their rehearsals.
        """
        t = self.table.resources.get(resource)
        if t is None or t.plans is None or not t.units:
            return
        self.peek()  # not _load: a damaged file is reported by the real grant, once
        counts = getattr(self.chooser, "answered", None), getattr(self.chooser, "placed", None)
        req = D.GrantRequest(pid=os.getpid(), key="rehearsal", slots={resource: ((0, 1.0),)})
        new, _ = D.decide(fresh_state(self.pools), req, self.table, chooser=self.chooser, alive=lambda p: False,
                          now=time.time())
        encode_state(new)
        if counts[0] is not None:  # a rehearsal is no decision
            self.chooser.answered, self.chooser.placed = counts

    @contextmanager
    def _locked(self, timeout_s: float | None = None) -> Iterator[None]:
        fd = self._acquire(timeout_s)
        try:
            yield
        finally:
            self._release(fd)

    def _acquire(self, timeout_s: float | None = None) -> int:
        """Take the node lock (and this process's thread lock), tagged with this pid; :meth:`_release` gives it back.
        A grant calls these two directly, not :meth:`_locked`: a context manager costs every grant ~1 us."""
        self._tlock.acquire()
        try:
            fd = self._fd()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                self._wait(fd, timeout_s)
        except BaseException:
            self._tlock.release()
            raise
        try:
            os.pwrite(fd, f"{self._pid} {time.time():.3f}".ljust(_TAG_BYTES).encode(), 0)
        except BaseException:
            self._release(fd)
            raise
        return fd

    def _release(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            self._tlock.release()

    def _wait(self, fd: int, timeout_s: float | None) -> None:
        t0 = time.monotonic()
        delay, warned = 5e-5, False
        while True:
            time.sleep(delay)
            delay = min(delay * 2, 0.005)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                pass
            waited = time.monotonic() - t0
            if timeout_s is not None and waited >= timeout_s:
                h = self._holder(fd)
                raise LockTimeout(f"the node lock {self._lock_path} was not free within {timeout_s:g} s"
                                  + (f" (held by pid {h.pid}: {h.what})" if h else ""), h)
            if not warned and waited >= LOCK_WARN_S:
                warned = True
                h = self._holder(fd)
                log.warning("rayaccel arbiter: the node lock %s has been held for %.1f s by pid %s (%s); every "
                            "grant on this node waits", self._lock_path, h.held_s if h else waited,
                            h.pid if h else "?", h.what if h else "unknown")

    def _holder(self, fd: int) -> LockInfo | None:
        try:
            parts = os.pread(fd, _TAG_BYTES, 0).decode().split()
            pid, t = int(parts[0]), float(parts[1])
        except (OSError, UnicodeError, ValueError, IndexError):
            return None
        return LockInfo(pid, cmdline(pid)[:200] or "(process gone)", round(max(0.0, time.time() - t), 3))

    def lock_info(self, held_over_s: float = LOCK_WARN_S) -> LockInfo | None:
        """Who holds the node lock, when someone has held it for more than ``held_over_s`` (else None)."""
        with self._tlock:
            fd = self._fd()
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                h = self._holder(fd)
                return h if h is not None and h.held_s >= held_over_s else None
            fcntl.flock(fd, fcntl.LOCK_UN)
            return None

    # ------------------------------------------------------------------ the file
    def _load(self) -> ArbiterState:
        try:
            fd = os.open(self.state_path, os.O_RDONLY)
        except FileNotFoundError:
            return fresh_state(self.pools)
        try:
            raw = os.read(fd, os.fstat(fd).st_size + 1)
        finally:
            os.close(fd)
        try:
            return decode_state(raw, self.pools)
        except StateError as e:
            # A damaged state file cannot be trusted; rebuild it from what is verifiable.
            why = f"{self.state_path}: {e}"
            log.error("rayaccel arbiter: state file unreadable (%s); starting a fresh one", why)
            return fresh_state(self.pools, resets=1, reset_reason=why[:500])

    def _save(self, st: ArbiterState) -> int:
        """Replace the state file with ``st``; return its modification time (ns; a rename keeps it)."""
        fd = os.open(self._tmp_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            os.write(fd, encode_state(st))
            mtime_ns = os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
        os.replace(self._tmp_path, self.state_path)
        return mtime_ns

    def _apply(self, step: Callable[[ArbiterState], tuple[ArbiterState, Any]], timeout_s: float | None = None) -> Any:
        """Run one pure transition under the lock; save when the state changed; return its result."""
        with self._locked(timeout_s):
            st = self._load()
            new, out = step(st)
            if new is not st:
                self._save(new)
        return out

    def state_mtime_ns(self) -> int | None:
        """The state file's modification time (None when absent): unchanged means no grant, drain or release since."""
        try:
            return os.stat(self.state_path).st_mtime_ns
        except OSError:
            return None

    def peek(self) -> ArbiterState | None:
        """The state without the lock (the file is replaced atomically; None when absent or unreadable)."""
        try:
            with open(self.state_path, "rb") as f:
                return decode_state(f.read(), self.pools)
        except (OSError, StateError):
            return None

    # ------------------------------------------------------------------ transitions
    def grant(self, req: D.GrantRequest) -> D.Grant:
        """Decide which units stand behind ``req``'s slots (see :func:`.decide.decide`).

        Returns:
            The :class:`~.decide.Grant` (``asked`` is ``req``, ``state_mtime_ns`` the file as it wrote it);
            ``waiting`` set when it cannot be served now (retry, after asking Ray about ``blocked_by`` when set).
        """
        t0 = time.perf_counter()
        fd = self._acquire()
        try:
            if self._dynamic:
                self.refresh_live()
            st = self._load()
            new, g = D.decide(st, req, self.table, chooser=self.chooser, alive=self.alive, now=time.time())
            mtime_ns = self._save(new)
        finally:
            self._release(fd)
        dt = time.perf_counter() - t0
        if g.waiting is None and g.units:
            self._log_decision(dt, g)
        return g._replace(seconds=dt, state_mtime_ns=mtime_ns)

    # ------------------------------------------------------------------ dynamic MIG
    def refresh_live(self) -> None:
        """Take the dynamic-MIG instances that exist now (:data:`~rayaccel.contract.DYNMIG_FILE`, written by the
        node's agent) into :attr:`table` when the file changed: their units get their UUIDs, the others none (never
        handed out). Before the agent first writes it, the node table's instances stand. An unreadable file keeps
        what was read last (one error line)."""
        path = os.path.join(self.dir, DYNMIG_FILE)
        try:
            mtime: int | None = os.stat(path).st_mtime_ns
        except FileNotFoundError:
            mtime = None
        if mtime == self._live_mtime:
            return
        self._live_mtime = mtime
        if mtime is None:
            self.table = self._base_table
            return
        try:
            with open(path, "rb") as f:
                live = decode_live(f.read())
        except (OSError, StateError) as e:
            log.error("rayaccel arbiter: %s unreadable (%s); keeping the MIG instances read before", path, e)
            return
        self.table = with_live(self._base_table, live)

    def write_live(self, instances: Mapping[str, str]) -> None:
        """Replace the dynamic-MIG instances file (the agent, under :meth:`exclusive` so no grant sees half of it)."""
        path = os.path.join(self.dir, DYNMIG_FILE)
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(encode_live(instances, time.time()))
        os.replace(tmp, path)
        self.refresh_live()

    def exclusive(self, fn: Callable[[ArbiterState], Any], timeout_s: float | None = None) -> Any:
        """Run ``fn(state)`` under the node lock (no grant runs meanwhile); the state is not changed. Returns its result."""
        with self._locked(timeout_s):
            if self._dynamic:
                self.refresh_live()
            return fn(self._load())

    def release(self, pid: int, key: str | None = None) -> None:
        """Forget ``pid``'s grant (only grant ``key`` when given). Idempotent."""
        def step(st: ArbiterState) -> tuple[ArbiterState, None]:
            new = D.release(st, pid, key)
            return (st if new is None else new), None
        self._apply(step)

    def reap(self, timeout_s: float | None = None) -> int:
        """Drop holders whose process is gone; return how many.

        Raises:
            LockTimeout: with ``timeout_s``, the lock was not free in time.
        """
        return self._apply(lambda st: D.reap(st, self.alive), timeout_s)

    def reserve_group(self, pg: str, resource: str, pg_bundles: Mapping[int, float]) -> Reservation | None:
        """Reserve placement group ``pg``'s units here now, as its first member would (:func:`.decide.reserve_group`).

        Idempotent: a group already reserved keeps its units. Returns the reservation, or None.
        """
        return self._apply(lambda st: D.reserve_group(st, pg, resource, pg_bundles, self.table, chooser=self.chooser,
                                                      alive=self.alive, now=time.time()))

    def forget_groups(self, gone: set[str] | frozenset[str]) -> list[str]:
        """Drop reservations of placement groups in ``gone`` (learned from Ray by the caller) with no member here."""
        if not gone:
            return []
        return self._apply(lambda st: D.forget_groups(st, gone))

    def drain(self, device: int, reason: str, by: str = "operator") -> bool:
        """Mark ``device`` drained (no new grant maps to it); False when it already was.

        Raises:
            ClusterError: no such device on this node.
        """
        if device not in self.table.cpus and not any(device in t.device_of.values()
                                                     for t in self.table.resources.values()):
            raise ClusterError(f"no device {device} on this node (devices {sorted(self.table.cpus)})")
        return self._apply(lambda st: D.drain(st, device, reason, by, time.time()))

    def undrain(self, device: int, only_by: str | None = None) -> bool:
        """Lift a drain; False when ``device`` was not drained (with ``only_by``: not drained by that one)."""
        return self._apply(lambda st: D.undrain(st, device, only_by))

    def read(self, timeout_s: float | None = None) -> ArbiterState:
        """The state, under the lock.

        Raises:
            LockTimeout: with ``timeout_s``, the lock was not free in time.
        """
        with self._locked(timeout_s):
            return self._load()

    def snapshot(self, timeout_s: float | None = None) -> Snapshot:
        """The node's snapshot (live holders only) for status and metrics."""
        return snapshot_of(self.read(timeout_s), self.table.device_of, at=time.time(), alive=self.alive,
                           unit_resources=self.table.unit_resources())

    # ------------------------------------------------------------------ the decision log
    def _log_decision(self, seconds: float, g: D.Grant) -> None:
        line = f"[{time.time():.4f},{round(seconds * 1e6)},{list(g.devices)},{len(g.partitions)}]\n"
        try:
            os.write(self._log(), line.encode())
        except OSError:
            self._log_fd = None  # the log only feeds metrics

    def log_step(self, step: Mapping[str, Any]) -> None:
        """Append one step of the node's agent (a dynamic-MIG create or destroy) to the decision log, as a JSON
        object (:meth:`decisions` returns grants only; :meth:`steps` these)."""
        os.write(self._log(), (json.dumps(dict(step), separators=(",", ":"), default=str) + "\n").encode())

    def _log(self) -> int:
        """The decision log's file, opened on first use (append-only)."""
        if self._log_fd is None:
            self._log_fd = os.open(os.path.join(self.dir, DECISION_LOG), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        return self._log_fd

    def decisions(self, since: int = 0, max_bytes: int = 1 << 20) -> tuple[list, int]:
        """Decisions logged after byte offset ``since``: ``([[time, us, devices, n_mig], ...], new offset)``.

        The log is truncated once it passes ``max_bytes`` (the caller's offset then restarts at 0).
        """
        path = os.path.join(self.dir, DECISION_LOG)
        try:
            size = os.path.getsize(path)
        except OSError:
            return [], 0
        if size < since:
            since = 0
        with open(path, "rb") as f:
            f.seek(since)
            data = f.read()
        out = []
        end = data.rfind(b"\n") + 1
        for line in data[:end].splitlines():
            try:
                x = json.loads(line)
            except ValueError:
                continue
            if isinstance(x, list):  # a grant (an agent's step is an object: log_step)
                out.append(x)
        offset = since + end
        if offset > max_bytes:
            try:
                os.truncate(path, 0)
                offset = 0
            except OSError:
                pass
        return out, offset
