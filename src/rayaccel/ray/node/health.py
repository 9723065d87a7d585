"""Device health on a rayaccel node: a watcher in the node agent that drains unhealthy devices.

:func:`attach` gives a :class:`~.agent.NodeAgent` a :class:`Watcher`: a thread that
waits on the node's health probe (:func:`rayaccel.health.probe_for`: NVML
Xid events, ECC, row remapping, retired pages, a GPU fallen off the bus, thermal
and power throttling; amdsmi's equivalents). A critical event drains the device
(:meth:`.agent.NodeAgent.drain`, ``by="health"``) within one poll, and with the node's
``--on-failed-gpu=end-workers`` (:mod:`.failpolicy`) kills the workers on it so Ray restarts
them on a healthy device (the event lists their pids under ``ended``); a warning is
only recorded and shown. On a simulated node the probe runs over a
:class:`~rayaccel.testing.fakenvml.FakeNVML` (or fake amdsmi) of the node's
topology, so the same code path can be exercised by injecting faults
(:meth:`Watcher.inject`, reached through the agent).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from typing import Any

from rayaccel import health
from rayaccel.errors import ClusterError
from rayaccel.ray.node import failpolicy

log = logging.getLogger(__name__)
#: How long one probe wait lasts, seconds (a critical event drains within about this).
POLL_S = 0.5
#: Events kept for status and metrics.
KEEP = 200


class Watcher:
    """The health watcher of one node (see module docstring)."""

    def __init__(self, agent: Any, probe: Any, fake: Any = None, poll_s: float = POLL_S):
        self.agent = agent
        self.probe = probe
        self.fake = fake
        self.poll_s = poll_s
        self.events: deque = deque(maxlen=KEEP)
        self.counts: dict[tuple[int, str], int] = {}
        self.worst: dict[int, str] = {}  # device -> "warning" | "critical"
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rayaccel-health", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                events = self.probe.poll(self.poll_s)
            except Exception as e:  # noqa: BLE001 - the library broke: report, back off, keep watching
                self.errors += 1
                log.error("rayaccel health watcher: probe failed: %s", e)
                self._stop.wait(5.0)
                continue
            for ev in events:
                self.handle(ev)

    def handle(self, ev: Any) -> None:
        """Record one event; drain its device when it is critical."""
        self.events.append({"device": ev.device, "kind": ev.kind, "severity": ev.severity, "detail": ev.detail,
                            "code": ev.code, "at": ev.at or time.time()})
        key = (ev.device, ev.kind)
        self.counts[key] = self.counts.get(key, 0) + 1
        if ev.severity == "critical" or self.worst.get(ev.device) != "critical":
            self.worst[ev.device] = ev.severity
        if ev.severity == "critical":
            end = failpolicy.ends_workers(getattr(self.agent, "dir", None))
            log.error("rayaccel: device %s unhealthy (%s); draining it%s", ev.device, ev.detail,
                      " and ending its workers (on-failed-gpu=end-workers)" if end else "")
            done = self.agent.drain(ev.device, ev.detail, by="health", kill=end)
            if end:
                self.events[-1]["ended"] = list((done or {}).get("killed", []))
        else:
            log.warning("rayaccel: device %s: %s", ev.device, ev.detail)

    def inject(self, kind: str, device: int, **kw: Any) -> None:
        """Inject a fault into the simulated hardware (``kind``: a ``FakeNVML.inject_*`` / ``lose`` name)."""
        if self.fake is None:
            raise ClusterError("fault injection is only possible on simulated nodes")
        fn = getattr(self.fake, kind if kind == "lose" else f"inject_{kind}", None)
        if fn is None:
            raise ClusterError(f"the simulated hardware cannot inject {kind!r}")
        fn(device, **kw)

    def summary(self) -> dict:
        return {"events": list(self.events)[-50:], "worst": {str(k): v for k, v in self.worst.items()},
                "counts": [[d, k, c] for (d, k), c in sorted(self.counts.items())], "errors": self.errors}


def _probe(agent: Any) -> tuple[Any, Any]:
    """The node's probe and (on simulated nodes) the fake it runs over (the fakes load only there)."""

    topo = agent.record.topology
    vendors = {d.vendor for d in topo.devices}
    if agent.record.simulated:
        if vendors == {"amd"}:
            from rayaccel.testing.fakeamdsmi import FakeAmdSmi  # simulated nodes only

            fake = FakeAmdSmi(topo)
            return health.probe_for(topo, amdsmi=fake), fake
        if vendors <= {"nvidia"}:
            from rayaccel.testing.fakenvml import FakeNVML  # simulated nodes only

            fake = FakeNVML(topo)
            return health.probe_for(topo, nvml=fake), fake
        return None, None
    return health.probe_for(topo), None


def attach(agent: Any) -> Watcher | None:
    """Start a health watcher for ``agent``'s node (None when its devices have no probe)."""
    try:
        probe, fake = _probe(agent)
    except Exception as e:  # noqa: BLE001 - no probe (library missing, driver gone): the node still works
        log.warning("rayaccel: no health watcher on node %s: %s", agent.node_key, e)
        agent.health_error = str(e)
        return None
    if probe is None:
        return None
    w = Watcher(agent, probe, fake)
    agent.watcher = w
    w.start()
    return w
