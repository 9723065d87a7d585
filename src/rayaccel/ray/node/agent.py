"""The node agent: one small process per rayaccel node, beside its raylet, ending with it.

Started by whoever starts the node (``rayaccel start``, :func:`rayaccel.init`,
``SimulatedCluster``) with :func:`start`, as a node process (:mod:`.agentproc`: restarted
if it crashes; a Ray driver in an internal namespace, never one of the user's actors).
Drivers ask it through :func:`handle` (an :class:`AgentHandle`). About once a
second (:data:`PERIOD_S`) it:

* drops arbiter records of holders whose process is gone;
* publishes the node's snapshot in the GCS KV (``state/<key>``): free devices,
  holders (who holds what since when), drains, MIG instances held, and GPU slots
  Ray shows in use that no hooked worker holds (workers without rayaccel);
* (see :mod:`.health`) watches device health and drains unhealthy devices;
* (see :mod:`.leaks`) finds leaked device processes, fences their devices and reclaims them;
* (see :mod:`.dynmig`) makes the MIG instances Ray's waiting work asks for on ``--dynamic-mig`` GPUs.

Drivers read the snapshots to choose nodes; ``rayaccel status`` asks the agents.
"""

from __future__ import annotations

import logging
import os
import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rayaccel.arbiter import decide as D
from rayaccel.arbiter.state import GPU, Snapshot, held_devices, snapshot_of
from rayaccel.arbiter.statefile import Arbiter, LockTimeout
from rayaccel.arbiter.table import decode_table
from rayaccel.errors import ClusterError
from rayaccel.ray import _ray_private as rp, kv
from rayaccel.ray.node.doctor import node_facts
from rayaccel.ray.worker.hook import pg_alive
from rayaccel.contract import (AGENT_PREFIX, AGENT_SCHEMA, LEAK_DRAIN_BY, NODE_DIR_ENV, RECORD_FILE, TABLE_FILE,
                               drain_name)
from rayaccel.ray.node.processes import PROCESSES, _local, stop_local
from rayaccel.ray.record import NodeRecord

log = logging.getLogger(__name__)
NAMESPACE = "rayaccel"
PERIOD_S = 1.0
#: Ray's used GPUs must exceed hooked holders' for this long before slots count as held unhooked, seconds.
UNHOOKED_AFTER_S = 3.0
#: The agent never waits longer than this for the node lock (a stuck holder is reported instead), seconds.
LOCK_TIMEOUT_S = 1.0


class NodeAgent:
    """The agent's body (:mod:`.agentproc` serves it; tests may drive it directly)."""

    def __init__(self, node_key: str, node_dir: str | None = None, period_s: float = PERIOD_S):
        self.node_key = node_key
        self.dir = node_dir or os.environ.get(NODE_DIR_ENV)
        if not self.dir:
            raise RuntimeError("rayaccel agent: RAYACCEL_NODE_DIR is not set (not a rayaccel node)")
        with open(os.path.join(self.dir, RECORD_FILE), "rb") as f:
            self.record = NodeRecord.from_json(f.read(), where=self.dir)
        with open(os.path.join(self.dir, TABLE_FILE), "rb") as f:
            self.table = decode_table(f.read())
        self.arbiter = Arbiter(self.dir, self.table, topology=self.record.topology)
        self.period_s = period_s
        self.last: Snapshot | None = None
        self.errors = 0
        self._over_since: float | None = None
        self.unhooked = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.extensions: list = []  # callables(agent) run every period (metrics)
        self.watcher: Any = None  # the health watcher (.health), when the node has a probe
        self.health_error: str | None = None
        self.node_id: str | None = None
        self._demand: dict = {}
        self._is_head = False
        self._log_at = 0
        self.recent: list = []
        self._total_gpus: float | None = None
        self.usage_rows: list = []  # per-holder usage (.usage.UsageWatch), refreshed every period
        self.nvml_procs: list = []  # NVML's per-process list of this period (.usage.UsageWatch), for the leak watcher
        self.leak_watch: Any = None  # the leak watcher (.leaks)
        self.dynmig: Any = None  # dynamic MIG (.dynmig), on a node with --dynamic-mig GPUs
        self.raylet_pid: int | None = None  # the node's raylet (its processes are workers, never leaks)

    # ---------------------------------------------------------------- loop
    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="rayaccel-agent", daemon=True)
            self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - one failed period must not end the agent
                self.errors += 1
                log.exception("rayaccel agent %s: period failed", self.node_key)
            self._stop.wait(self.period_s)

    def tick(self, publish: bool = True) -> Snapshot:
        """One period: reap, run extensions, snapshot, publish. Returns the snapshot.

        The node lock is never waited on for long: when a stuck process holds it, the
        period publishes the last snapshot with the holder named (``Snapshot.lock``).
        """
        lock = None
        if self.leak_watch is not None:
            self.leak_watch.remember()  # before the reaper forgets the holders that ended: a leak names its holder
        try:
            self.arbiter.reap(timeout_s=LOCK_TIMEOUT_S)
        except LockTimeout as e:
            lock = e.holder
        for ext in list(self.extensions):
            try:
                ext(self)
            except Exception:  # noqa: BLE001 - an extension (e.g. health) failing must not stop publication
                self.errors += 1
                log.exception("rayaccel agent %s: %s failed", self.node_key, getattr(ext, "__name__", ext))
        self._track_demand()
        st = None
        if lock is None:
            try:
                st = self.arbiter.read(timeout_s=LOCK_TIMEOUT_S)
            except LockTimeout as e:
                lock = e.holder
        if st is not None:
            # reservations of groups Ray has removed go, so they stop keeping devices free (asked outside the lock)
            gone = {g for g in D.memberless_groups(st) if not pg_alive(g)}
            if gone and self.arbiter.forget_groups(gone):
                st = st._replace(pgs={g: r for g, r in st.pgs.items() if g not in gone})
            snap = snapshot_of(st, self.table.device_of, at=time.time(), alive=self.arbiter.alive,
                               unit_resources=self.table.unit_resources())
        else:
            log.warning("rayaccel agent %s: the node lock is held by pid %s (%s) for %.1f s; publishing the last "
                        "snapshot", self.node_key, lock.pid if lock else "?", lock.what if lock else "?",
                        lock.held_s if lock else 0.0)
            snap = self.last or Snapshot(at=time.time(), node_key=self.node_key)
        new, self._log_at = self.arbiter.decisions(self._log_at)
        new_t = tuple((float(t), float(us), tuple(devs), int(n)) for t, us, devs, n in new)
        self.recent = (self.recent + list(new_t))[-64:]
        snap = snap._replace(at=time.time(), node_key=self.node_key, decisions=tuple(self.recent[-32:]),
                             new_decisions=new_t, agent_errors=self.errors,
                             health=self.watcher.summary() if self.watcher is not None else {"error": self.health_error},
                             lock=lock, leaks=self.leak_watch.summary() if self.leak_watch is not None else {},
                             dynmig=self.dynmig.summary() if self.dynmig is not None else {})
        snap = snap._replace(unhooked_slots=self._unhooked(snap))
        self.last = snap
        if publish:
            kv.publish_state(self.node_key, snap)
        return snap

    def _unhooked(self, snap: Snapshot) -> float:
        """GPU slots Ray shows in use beyond what hooked holders hold (sustained for a few seconds)."""
        ray = sys.modules.get("ray")
        if ray is None or not ray.is_initialized():
            return 0.0  # not in Ray (tests driving the body): unknown -- and never start a Ray instance here
        try:
            nid = self.node_id or ray.get_runtime_context().get_node_id()
            avail = rp.available_resources_per_node().get(nid, {})
            if self._total_gpus is None:  # a node's total does not change: read it once
                self._total_gpus = float(rp.total_resources_per_node().get(nid, {}).get("GPU", 0.0))
        except Exception:  # noqa: BLE001 - not in Ray (tests driving the body): unknown
            return 0.0
        used = self._total_gpus - float(avail.get("GPU", 0.0))
        over = used - snap.slots_held
        now = time.monotonic()
        if over > 0.5:
            if self._over_since is None:
                self._over_since = now
            if now - self._over_since >= UNHOOKED_AFTER_S:
                self.unhooked = round(over, 4)
        else:
            self._over_since = None
            self.unhooked = 0.0
        return self.unhooked

    # ------------------------------------------------------------ requests
    def snapshot(self, fresh: bool = True) -> Snapshot:
        return self.tick(publish=True) if fresh or self.last is None else self.last

    def drain(self, device: int, reason: str = "drained by an operator", by: str = "operator",
              kill: bool = False, tick: bool = True) -> dict:
        """Drain ``device``: no new grant maps to it, and Ray's ledger holds it (a placeholder actor).

        Work already on it finishes unless ``kill`` (its holders' processes are killed;
        Ray then fails or retries their tasks as it would after any worker death).
        Idempotent; an operator's or the health watcher's drain replaces a leak fence (``by="leak"``).
        ``tick``: publish a fresh snapshot (the leak watcher, inside a period, does not). Returns what was done.
        """
        if device not in self.record.topology.indices:
            raise ClusterError(f"node {self.node_key} has no device {device} "
                               f"(devices {list(self.record.topology.indices)})")
        new = self.arbiter.drain(device, reason[:500], by)
        placed = self._placeholder(device)
        killed = self._kill_holders(device) if kill else []
        if tick:
            self.tick()
        return {"device": device, "new": new, "placeholder": placed, "killed": killed}

    def undrain(self, device: int, only_by: str | None = None, tick: bool = True) -> bool:
        """Lift a drain (and release the placeholder's slot); False when ``device`` was not drained (``only_by``:
        drained by that one). An operator lifting a leak fence acknowledges its leaked processes (:mod:`.leaks`)."""
        st = self.arbiter.peek()
        dr = st.drained.get(device) if st is not None else None
        was = self.arbiter.undrain(device, only_by)
        if was or only_by is None:
            self._drop_placeholder(device)
        if was:
            if only_by is None and dr is not None and dr.by == LEAK_DRAIN_BY and self.leak_watch is not None:
                self.leak_watch.acknowledge(device)
        if tick:
            self.tick()
        return was

    def leaks(self) -> list[dict]:
        """The node's leaked device processes now (:mod:`.leaks`): device, pid, command, holder, since, ours, ..."""
        if self.leak_watch is None:
            raise ClusterError(f"node {self.node_key} has no leak watcher")
        return list(self.leak_watch.rows)

    def reclaim(self, device: int) -> dict:
        """End ``device``'s leaked processes that belong to this node's Ray workers; report the others (:mod:`.leaks`).

        Raises:
            ClusterError: no such device, or no leak watcher.
        """
        if device not in self.record.topology.indices:
            raise ClusterError(f"node {self.node_key} has no device {device} "
                               f"(devices {list(self.record.topology.indices)})")
        if self.leak_watch is None:
            raise ClusterError(f"node {self.node_key} has no leak watcher")
        out = self.leak_watch.reclaim(device)
        self.tick()
        return out

    def placeholder_resources(self, device: int) -> dict[str, float]:
        """What holds ``device`` in Ray's ledger: one ``GPU``, or all of its units of the node's family
        (a Trainium device's NeuronCores, one TPU chip, ...); empty when the device backs no unit resource.

        On a node given MIG UUIDs (its ``GPU`` slots are MIG instances) a drain or leak fence of a device holds
        every instance of it the node offers: one ``GPU`` per instance, which the arbiter moves onto exactly
        those instances (:func:`rayaccel.arbiter.decide.decide`), so no other grant lands on that device."""
        out = {}
        for r in self.table.unit_resources():
            n = sum(1 for u in self.table.resources[r].units if self.table.resources[r].device_of.get(u) == device)
            if n:
                out[r] = float(n)
        return out

    def _placeholder(self, device: int) -> bool:
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        need = self.placeholder_resources(device)
        if not need:
            return False
        nid = self.node_id or ray.get_runtime_context().get_node_id()
        opts = {"num_gpus": need.pop(GPU, 0.0), **({"resources": need} if need else {})}
        placeholder_cls().options(name=drain_name(self.node_key, device), namespace=NAMESPACE, lifetime="detached",
                                  get_if_exists=True, **opts,
                                  scheduling_strategy=NodeAffinitySchedulingStrategy(nid, soft=False)).remote()
        return True

    def _drop_placeholder(self, device: int) -> None:
        import ray

        try:
            ray.kill(ray.get_actor(drain_name(self.node_key, device), namespace=NAMESPACE))
        except ValueError:
            pass

    def _kill_holders(self, device: int) -> list[int]:
        st = self.arbiter.read()
        pids = []
        for pid, h in st.holders.items():
            if h.drain is not None or not self.arbiter.alive(pid):
                continue
            if device in held_devices(h, st.pools, self.table.device_of):
                try:
                    os.kill(pid, signal.SIGKILL)
                    pids.append(pid)
                except (ProcessLookupError, PermissionError):
                    pass
        return pids

    def inject(self, kind: str, device: int, **kw: Any) -> None:
        """Inject a simulated hardware fault (see :meth:`.health.Watcher.inject`)."""
        if self.watcher is None:
            raise ClusterError(f"node {self.node_key} has no health watcher ({self.health_error or 'no probe'})")
        self.watcher.inject(kind, device, **kw)

    def usage(self) -> list[dict]:
        """Per-holder usage: each holder's device memory, utilisation and spilled bytes per device (:mod:`.usage`)."""
        return [r._asdict() for r in self.usage_rows]

    def doctor(self) -> dict:
        """This node's facts and local checks (see :mod:`.doctor`)."""

        return node_facts(self)

    def gpu_demand(self) -> list[dict]:
        """GPU requests waiting in Ray's queue, with when each shape was first seen (head node only)."""
        return [{"bundle": dict(k[0]), "count": k[1], "since": t} for k, t in self._demand.items()]

    def _track_demand(self) -> None:
        if not self._is_head:
            return
        try:
            import ray
            from ray.autoscaler.v2.sdk import get_cluster_status  # the autoscaler SDK loads only on the head

            cs = get_cluster_status(ray.get_runtime_context().gcs_address, timeout=5)
        except Exception as e:  # noqa: BLE001 - demand is advisory (doctor says when it is unreadable)
            log.debug("rayaccel agent: cluster status unavailable: %s", e)
            return
        seen = {}
        rd = cs.resource_demands
        for group in (rd.ray_task_actor_demand, rd.placement_group_demand):
            for dem in group:
                for rc in dem.bundles_by_count:
                    if rc.bundle.get("GPU"):
                        key = (tuple(sorted(rc.bundle.items())), rc.count)
                        seen[key] = self._demand.get(key, time.time())
        self._demand = seen

    def stop_node(self, force: bool = False) -> bool:
        """Stop this node's processes recorded by ``rayaccel start`` (this agent, recorded too, ends with them)."""

        d = Path(self.dir)
        if not (d / PROCESSES).is_file():
            return False
        node = _local(d)
        # a moment later: the asker gets its answer before this process is stopped with the node
        t = threading.Timer(0.5, stop_local, args=(node,), kwargs={"force": force})
        t.daemon = True
        t.start()
        return True


_PLACEHOLDER_CLS: Any = None


def placeholder_cls() -> Any:
    """The actor that holds a drained device in Ray's ledger (its GPU or its units, no CPU, never uses them)."""
    global _PLACEHOLDER_CLS
    if _PLACEHOLDER_CLS is None:
        import ray

        @ray.remote(num_gpus=1, num_cpus=0, max_restarts=-1)
        class DrainPlaceholder:
            def ping(self) -> bool:
                return True

        _PLACEHOLDER_CLS = DrainPlaceholder
    return _PLACEHOLDER_CLS


class AgentUnavailable(ClusterError):
    """The node's agent is not running, or did not answer in time."""


class AgentHandle:
    """A driver's way to ask one node's agent (see :mod:`.agentproc`): ``ask(method, *args)``.

    Attributes:
        node_key: the node. pid: the agent's process id (on the node's machine).
    """

    def __init__(self, node_key: str, info: dict):
        self.node_key = node_key
        self.pid = int(info["pid"])
        self._address = (str(info["host"]), int(info["port"]))
        self._key = bytes.fromhex(info["key"])

    def ask(self, method: str, *args: Any, timeout_s: float = 60.0, **kwargs: Any) -> Any:
        """Call ``method`` of the node's agent (:class:`NodeAgent`) and return its answer.

        Raises:
            AgentUnavailable: the agent is not reachable, or did not answer within ``timeout_s``.
            ClusterError: the agent refused (its message).
        """
        import socket
        from multiprocessing.connection import Client

        old = socket.getdefaulttimeout()
        try:
            socket.setdefaulttimeout(min(timeout_s, 10.0))  # connecting and authenticating
            conn = Client(self._address, authkey=self._key)
        except (OSError, EOFError) as e:
            raise AgentUnavailable(f"node {self.node_key}: its agent does not answer at "
                                   f"{self._address[0]}:{self._address[1]} ({e})") from None
        finally:
            socket.setdefaulttimeout(old)
        try:
            conn.send((method, args, kwargs))
            if not conn.poll(timeout_s):
                raise AgentUnavailable(f"node {self.node_key}: its agent did not answer {method!r} within "
                                       f"{timeout_s:.0f} s")
            answer = conn.recv()
        except (OSError, EOFError) as e:
            raise AgentUnavailable(f"node {self.node_key}: its agent went away during {method!r} ({e})") from None
        finally:
            conn.close()
        if answer[0] == "ok":
            return answer[1]
        raise ClusterError(f"node {self.node_key}: {answer[2]}" if answer[1] == "ClusterError"
                           else f"node {self.node_key}: the agent's {method!r} failed: {answer[1]}: {answer[2]}")

    def ping(self, timeout_s: float = 10.0) -> str:
        """The node key the agent answers with."""
        return self.ask("ping", timeout_s=timeout_s)


def handle(node_key: str) -> AgentHandle | None:
    """The agent of ``node_key`` as it published itself, or None when it has not (or its entry is unreadable)."""
    raw = rp.kv_get(AGENT_PREFIX + node_key, NAMESPACE)
    if not raw:
        return None
    try:
        info = json.loads(raw)
        if info.get("schema") != AGENT_SCHEMA:
            log.warning("rayaccel: node %s: agent entry of format %r (this rayaccel reads %s)", node_key,
                        info.get("schema"), AGENT_SCHEMA)
            return None
        return AgentHandle(node_key, info)
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def ask_all(handles: dict[str, AgentHandle], method: str, *args: Any, timeout_s: float = 15.0) -> dict[str, Any]:
    """Ask several agents at once; node key -> the answer, or the exception it raised."""
    from concurrent.futures import ThreadPoolExecutor

    if not handles:
        return {}
    with ThreadPoolExecutor(max_workers=min(32, len(handles))) as pool:
        futs = {k: pool.submit(h.ask, method, *args, timeout_s=timeout_s) for k, h in handles.items()}
        out: dict[str, Any] = {}
        for k, f in futs.items():
            try:
                out[k] = f.result()
            except Exception as e:  # noqa: BLE001 - returned to the caller, per node
                out[k] = e
        return out


def start(node_key: str, node_id: str, node_dir: Any = None, *, address: str | None = None,
          raylet_pid: int | None = None, timeout_s: float = 60.0, wait: bool = True) -> subprocess.Popen:
    """Start the agent process of ``node_key`` (Ray node ``node_id``) beside its raylet; wait until it answers.

    ``address``: the GCS (default: the connected driver's). The process runs in its own session:
    stop it with :func:`stop` (or it exits when its raylet is gone). ``wait=False``: return at once
    (then :func:`wait_started`).

    Raises:
        AgentUnavailable: it did not answer within ``timeout_s`` (it is stopped again).
    """
    if address is None:
        import ray

        address = ray.get_runtime_context().gcs_address
    d = str(node_dir or os.environ.get(NODE_DIR_ENV) or "")
    if not d:
        raise ClusterError(f"node {node_key}: no node directory for its agent (RAYACCEL_NODE_DIR is not set)")
    old = rp.kv_get(AGENT_PREFIX + node_key, NAMESPACE) if rp.kv() is not None else None
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAYACCEL_NODE", "RAY_preload", "RAY_ADDRESS"))}
    cmd = [sys.executable, "-m", "rayaccel.ray.node.agentproc", "--address", address, "--node-key", node_key,
           "--node-id", node_id, "--dir", d, *(["--raylet-pid", str(raylet_pid)] if raylet_pid else [])]
    log_dir = rp.logs_dir() if rp.kv() is not None else None
    log_path = os.path.join(log_dir or d, f"rayaccel-agent-{node_key}.log")
    with open(log_path, "ab") as out:  # never the starter's pipes: `rayaccel start` waits for those to close
        proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdin=subprocess.DEVNULL, stdout=out,
                                stderr=subprocess.STDOUT)
    if not wait or rp.kv() is None:
        return proc  # the caller waits by its own means (wait_started)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        raw = rp.kv_get(AGENT_PREFIX + node_key, NAMESPACE)
        if raw and raw != old:
            h = handle(node_key)
            try:
                if h is not None and h.ping(timeout_s=5.0) == node_key:
                    return proc
            except ClusterError:
                pass
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    stop(proc)
    raise AgentUnavailable(f"node {node_key}: its agent did not start within {timeout_s:.0f} s"
                           + (f" (exit {proc.returncode})" if proc.returncode is not None else ""))


def wait_started(node_keys: list[str], procs: list[subprocess.Popen], timeout_s: float = 60.0) -> None:
    """Wait until each agent of ``node_keys`` answers (started by :func:`start` elsewhere: ``rayaccel start``)."""
    deadline = time.monotonic() + timeout_s
    for key, proc in zip(node_keys, procs):
        while True:
            h = handle(key)
            try:
                if h is not None and h.ping(timeout_s=5.0) == key:
                    break
            except ClusterError:
                pass
            if proc.poll() is not None:
                raise AgentUnavailable(f"node {key}: its agent exited ({proc.returncode}) before answering")
            if time.monotonic() > deadline:
                raise AgentUnavailable(f"node {key}: its agent did not start within {timeout_s:.0f} s")
            time.sleep(0.1)


def stop(proc: subprocess.Popen | None, timeout_s: float = 10.0) -> None:
    """Stop an agent process started by :func:`start` (its supervisor and the agent; idempotent)."""
    if proc is None or proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait(5.0)
