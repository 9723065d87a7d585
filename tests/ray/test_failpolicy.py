"""A failed GPU under running work (``--on-failed-gpu``): the policy file, and the health watcher acting on it.

Unit tier: a node agent's body over a node directory, its health probe over FakeNVML, a
real child process holding a device through the arbiter; an injected Xid 79 drains the
device, and with ``end-workers`` the holder is killed (Ray would restart it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from rayaccel import catalog, contract, health
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.decide import GrantRequest
from rayaccel.arbiter.table import encode_table
from rayaccel.errors import ClusterError
from rayaccel.ray.node import failpolicy
from rayaccel.testing import FakeNVML

KEY = "0123456789ab"


@pytest.mark.parametrize("bad", ["end_workers", "kill", "", "LEAVE", 3], ids=repr)
def test_a_bad_mode_is_refused_naming_the_modes(bad, tmp_path):
    with pytest.raises(ClusterError, match="leave or end-workers"):
        failpolicy.failed_gpu_mode(bad)
    with pytest.raises(ClusterError):
        failpolicy.write(tmp_path, bad)
    assert not (tmp_path / contract.FAILED_GPU_FILE).exists()  # nothing half-applied


def test_the_policy_round_trips_and_defaults_to_leave(tmp_path):
    assert failpolicy.read(tmp_path) == "leave" and not failpolicy.ends_workers(tmp_path)
    assert failpolicy.write(tmp_path, "end-workers") == "end-workers"
    assert failpolicy.read(tmp_path) == "end-workers" and failpolicy.ends_workers(tmp_path)
    assert failpolicy.write(tmp_path, None) == "leave" and failpolicy.read(tmp_path) == "leave"
    assert not failpolicy.ends_workers(None)


@pytest.mark.parametrize("content", [b"{", b"[]", json.dumps({"schema": "rayaccel.on-failed-gpu/9"}).encode(),
                                     json.dumps({"schema": contract.FAILED_GPU_SCHEMA, "on_failed_gpu": "x"}).encode()],
                         ids=["not-json", "not-object", "other-format", "bad-mode"])
def test_an_unreadable_policy_is_leave_with_a_warning(tmp_path, content, caplog):
    (tmp_path / contract.FAILED_GPU_FILE).write_bytes(content)
    assert failpolicy.read(tmp_path) == "leave"
    assert "on-failed-gpu=leave" in caplog.text


def _node(tmp_path, policy):
    from rayaccel.ray.node import agent as agent_mod
    from rayaccel.ray.node.health import Watcher
    from rayaccel.ray.record import NodeRecord

    topo = catalog.load("dgx1-v100")
    (tmp_path / contract.RECORD_FILE).write_text(NodeRecord(KEY, topo, True).to_json())
    (tmp_path / contract.TABLE_FILE).write_bytes(encode_table(build_table(topo, KEY, True)))
    if policy is not None:
        failpolicy.write(tmp_path, policy)
    body = agent_mod.NodeAgent(KEY, str(tmp_path))
    body._placeholder = lambda device: False  # Ray's ledger is the Ray tier's to test
    tick = body.tick
    body.tick = lambda publish=True: tick(publish=False)
    fake = FakeNVML(topo)
    w = Watcher(body, health.probe_for(topo, nvml=fake), fake)
    body.watcher = w
    return body, w, fake


@pytest.mark.parametrize("policy, ended", [(None, False), ("leave", False), ("end-workers", True)])
def test_an_xid_drains_and_ends_the_workers_only_when_the_node_says_so(tmp_path, policy, ended):
    body, w, fake = _node(tmp_path, policy)
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        g = body.arbiter.grant(GrantRequest(pid=worker.pid, key="task:1", slots={"GPU": ((0, 1.0),)}))
        g2 = body.arbiter.grant(GrantRequest(pid=other.pid, key="task:2", slots={"GPU": ((1, 1.0),)}))
        dev = g.devices[0]
        assert g2.devices[0] != dev
        fake.inject_xid(dev, xid=79)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and not body.arbiter.read().drained:
            for ev in w.probe.poll(0.2):
                w.handle(ev)
        assert dev in body.arbiter.read().drained
        if ended:
            assert worker.wait(5) == -9
            assert w.events[-1]["ended"] == [worker.pid]
        else:
            time.sleep(0.3)
            assert worker.poll() is None and "ended" not in w.events[-1]
        assert other.poll() is None  # the healthy device's worker is never touched
    finally:
        for p in (worker, other):
            if p.poll() is None:
                p.kill()
            p.wait()
    # a worker Ray restarts gets a healthy device
    again = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        g3 = body.arbiter.grant(GrantRequest(pid=again.pid, key="task:3", slots={"GPU": ((0, 1.0),)}))
        assert g3.devices and dev not in g3.devices
    finally:
        again.kill()
        again.wait()
    assert os.path.exists(tmp_path / contract.STATE_FILE)
