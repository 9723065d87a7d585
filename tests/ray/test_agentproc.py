"""The node agent's supervisor never outlives its raylet (rayaccel.ray.node.agentproc; no Ray needed).

The agent itself may hang on a GCS that went with its node (Ray's driver ignores SIGTERM while it
connects), so the supervisor watches the raylet too and ends the child when the raylet is gone --
a zombie raylet (killed, not yet reaped by its parent) included.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from rayaccel.ray.node import agentproc


def _zombie() -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", "pass"])
    deadline = time.monotonic() + 10
    while agentproc.raylet_gone(p.pid) is False and time.monotonic() < deadline:
        with open(f"/proc/{p.pid}/stat") as f:
            if f.read().split(") ", 1)[1].startswith("Z"):
                break
        time.sleep(0.05)
    return p  # exited, not reaped: a zombie


def test_raylet_gone_knows_running_dead_zombie_and_unknown():
    assert agentproc.raylet_gone(None) is False  # unknown: the agent asks Ray's node table instead
    assert agentproc.raylet_gone(os.getpid()) is False
    z = _zombie()
    try:
        assert agentproc.raylet_gone(z.pid) is True
    finally:
        z.wait()
    assert agentproc.raylet_gone(z.pid) is True  # reaped: no such process


def test_the_supervisor_ends_a_hung_agent_once_its_raylet_is_gone(monkeypatch):
    monkeypatch.setattr(agentproc, "ALIVE_EVERY_S", 0.2)
    child = subprocess.Popen([sys.executable, "-c", "import signal, time; signal.signal(signal.SIGTERM, "
                              "signal.SIG_IGN); time.sleep(60)"])  # hung, deaf to SIGTERM, as in ray.init
    raylet = _zombie()
    try:
        t0 = time.monotonic()
        assert agentproc._wait_child(child, raylet.pid) == agentproc.NODE_GONE
        assert child.poll() is not None and time.monotonic() - t0 < 15
    finally:
        child.kill()
        raylet.wait()


def test_the_supervisor_waits_while_the_raylet_runs(monkeypatch):
    monkeypatch.setattr(agentproc, "ALIVE_EVERY_S", 0.2)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5); raise SystemExit(3)"])
    assert agentproc._wait_child(child, os.getpid()) == 3  # its own exit code: the supervisor restarts it
