"""The node agent: one small actor per rayaccel node, pinned to it, dying with it.

Started by whoever starts the node (``rayaccel start``, :func:`rayaccel.init`,
``SimulatedCluster``) as the detached actor ``rayaccel-agent-<node key>`` in
namespace ``rayaccel`` (``num_cpus=0``, restarted if it crashes). About once a
second (:data:`PERIOD_S`) it:

* drops arbiter records of holders whose process is gone;
* publishes the node's snapshot in the GCS KV (``state/<key>``): free devices,
  holders (who holds what since when), drains, MIG instances held, and GPU slots
  Ray shows in use that no hooked worker holds (workers without rayaccel);
* (see :mod:`.health`) watches device health and drains unhealthy devices.

Drivers read the snapshots to choose nodes; ``rayaccel status`` asks the agents.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

log = logging.getLogger(__name__)
NAMESPACE = "rayaccel"
PREFIX = "rayaccel-agent-"
PERIOD_S = 1.0
#: Ray's used GPUs must exceed hooked holders' for this long before slots count as held unhooked, seconds.
UNHOOKED_AFTER_S = 3.0


def agent_name(node_key: str) -> str:
    """The agent actor's name for ``node_key``."""
    return f"{PREFIX}{node_key}"


def snapshot_of(arbiter: Any, state: dict | None = None) -> dict:
    """The publishable snapshot of a node from its arbiter state (pure; see module docstring)."""
    st = state if state is not None else arbiter.snapshot()
    gpu = st["pools"]["GPU"]
    holders = []
    used: set[int] = set()
    mig_held: set[str] = set()
    slots_held = 0.0
    shared: dict[int, float] = {}
    for pid, h in sorted(st["holders"].items(), key=lambda kv: kv[1].get("since", 0)):
        devs = [gpu[s] for s, _ in h.get("gpu", ()) if 0 <= s < len(gpu)]
        waiting = h.get("waiting")
        target = h.get("drain")
        placeholder = target is not None
        on_target = placeholder and target in devs
        for s, f in h.get("gpu", ()):
            slots_held += f
            if not waiting and (not placeholder or on_target):
                used.add(gpu[s])
                if f < 1 - 1e-6:
                    shared[gpu[s]] = shared.get(gpu[s], 0.0) + f
        parts = [st["pools"].get(r, [None] * (s + 1))[s] for r, s in h.get("mig", ())
                 if 0 <= s < len(st["pools"].get(r, ()))]
        if not waiting:
            mig_held.update(p for p in parts if p)
        holders.append({"pid": int(pid), "name": h.get("name"), "kind": h.get("kind"), "job": h.get("job"),
                        "id": h.get("id"), "since": h.get("since"), "devices": [] if waiting else devs,
                        "partitions": parts, "shared": any(f < 1 - 1e-6 for _, f in h.get("gpu", ())),
                        "waiting": waiting, "drain": target, "pg": h.get("pg"), "bundle": h.get("bundle")})
    drained = {int(d): v for d, v in st["drained"].items()}
    free = sorted(d for d in gpu if d not in used and d not in drained)
    return {"at": time.time(), "free": free, "holders": holders, "drained": {str(k): v for k, v in drained.items()},
            "mig_held": sorted(mig_held), "shared": {str(k): round(v, 4) for k, v in shared.items()},
            "slots_held": round(slots_held, 4), "decisions": st.get("decisions", [])[-32:],
            "resets": st.get("resets", 0), "pgs": st.get("pgs", {})}


class NodeAgent:
    """The agent's body (the actor wraps it; tests may drive it directly)."""

    def __init__(self, node_key: str, node_dir: str | None = None, period_s: float = PERIOD_S):
        from ..topology import NodeTopology  # noqa: F401 - typing only
        from .arbiter import Arbiter
        from .names import NodeRecord

        self.node_key = node_key
        self.dir = node_dir or os.environ.get("RAYACCEL_NODE_DIR")
        if not self.dir:
            raise RuntimeError("rayaccel agent: RAYACCEL_NODE_DIR is not set (not a rayaccel node)")
        with open(os.path.join(self.dir, "record.json"), "rb") as f:
            self.record = NodeRecord.from_json(f.read(), where=self.dir)
        self.arbiter = Arbiter(self.dir, self.record.topology)
        self.period_s = period_s
        self.last: dict = {}
        self.errors = 0
        self._over_since: float | None = None
        self.unhooked = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.extensions: list = []  # callables(agent) run every period (health watcher, metrics)

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

    def tick(self, publish: bool = True) -> dict:
        """One period: reap, run extensions, snapshot, publish. Returns the snapshot."""
        self.arbiter.reap()
        if self.arbiter.read()["pgs"]:
            from .hook import _pg_alive

            self.arbiter.forget_removed_groups(_pg_alive)
        for ext in list(self.extensions):
            try:
                ext(self)
            except Exception:  # noqa: BLE001 - an extension (e.g. health) failing must not stop publication
                self.errors += 1
                log.exception("rayaccel agent %s: %s failed", self.node_key, getattr(ext, "__name__", ext))
        snap = snapshot_of(self.arbiter)
        snap["unhooked_slots"] = self._unhooked(snap)
        snap["node_key"] = self.node_key
        snap["agent_errors"] = self.errors
        self.last = snap
        if publish:
            from . import kv

            kv.publish_state(self.node_key, snap)
        return snap

    def _unhooked(self, snap: dict) -> float:
        """GPU slots Ray shows in use beyond what hooked holders hold (sustained for a few seconds)."""
        try:
            import ray

            nid = ray.get_runtime_context().get_node_id()
            from . import _ray_private as rp

            avail = rp.available_resources_per_node().get(nid, {})
            total = rp.total_resources_per_node().get(nid, {})
        except Exception:  # noqa: BLE001 - not in Ray (tests driving the body): unknown
            return 0.0
        used = float(total.get("GPU", 0.0)) - float(avail.get("GPU", 0.0))
        over = used - snap["slots_held"]
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
    def snapshot(self, fresh: bool = True) -> dict:
        return self.tick(publish=True) if fresh or not self.last else self.last

    def stop_node(self, force: bool = False) -> bool:
        """Stop this node's processes recorded by ``rayaccel start`` (this agent dies with them)."""
        from pathlib import Path

        from .lifecycle import PROCESSES, _local, stop_local

        d = Path(self.dir)
        if not (d / PROCESSES).is_file():
            return False
        node = _local(d)
        threading.Thread(target=stop_local, args=(node,), kwargs={"force": force}, daemon=True).start()
        return True


_ACTOR_CLS: Any = None


def actor_cls() -> Any:
    global _ACTOR_CLS
    if _ACTOR_CLS is None:
        import ray

        @ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=-1, max_concurrency=8)
        class Agent:
            def __init__(self, node_key: str):
                self.body = NodeAgent(node_key)
                from . import health

                health.attach(self.body)
                self.body.start()

            def snapshot(self, fresh: bool = True) -> dict:
                return self.body.snapshot(fresh)

            def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
                return getattr(self.body, method)(*args, **kwargs)

            def ping(self) -> str:
                return self.body.node_key

        _ACTOR_CLS = Agent
    return _ACTOR_CLS


def start(node_key: str, node_id: str, node_dir: Any = None, timeout_s: float = 60.0) -> Any:
    """Start (or find) the agent of ``node_key`` on Ray node ``node_id``; wait until it answers."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    h = actor_cls().options(name=agent_name(node_key), namespace=NAMESPACE, lifetime="detached",
                            get_if_exists=True,
                            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False)).remote(node_key)
    ray.get(h.ping.remote(), timeout=timeout_s)
    return h


def handle(node_key: str) -> Any:
    """The agent of ``node_key``, or None when it is not running."""
    import ray

    try:
        return ray.get_actor(agent_name(node_key), namespace=NAMESPACE)
    except ValueError:
        return None
