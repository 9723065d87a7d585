"""Leaked GPU processes on a simulated node (issue 20, "Leaks"), on the shared session cluster.

A ``num_gpus=1`` actor daemonises a child (started by a short-lived process in its own session, so Ray's
"kill the worker's children" at the worker's exit does not reach it: the way an inference engine's or a
DataLoader's process escapes) and is killed with ``ray.kill``. The node's agent must see the child as a
leak of the actor's device, fence the device (new work lands elsewhere), name the pid and the actor in
``status``, and ``rayaccel reclaim`` must end the child and lift the fence. The automatic path
(``--reclaim-leaks``, written into the node directory as ``rayaccel start`` writes it) and NVML's process
list (a stranger injected into the node's FakeNVML: reported, fenced, never ended) run on the same cluster.
Every process a test starts is killed in a ``finally``; the ``cluster`` fixture checks the cluster idle after.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest
from raytest_helpers import node_named, wait_for

import rayaccel

pytestmark = pytest.mark.ray

NODE = "pcie-8gpu-2socket"
_DAEMONISE = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'], "
              "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, "
              "stderr=subprocess.DEVNULL); print(p.pid)")


def _node_row(name):
    from rayaccel.ray.driver.status import cluster_status

    return next(n for n in cluster_status()["nodes"] if n["name"] == name)


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X")
    except OSError:
        return False


def _kill(pid):
    if pid:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def _cli(cluster, *args):
    return subprocess.run([sys.executable, "-m", "rayaccel.cli", *args, "--address", cluster.address],
                          capture_output=True, text=True, timeout=120)


def _json(out):
    """The JSON object a ``--json`` command printed (past a line Ray's driver may print first about a removed node)."""
    return json.loads(out if out.startswith("{") else out[out.index("\n{") + 1:])


def _leak_one():
    """An actor on the node daemonises a child, then is killed. Returns (child pid, the actor's device)."""
    import ray

    @ray.remote(num_gpus=1, max_restarts=0, label_selector={"rayaccel.io/topology": NODE})
    class Spawner:
        def spawn(self):
            out = subprocess.run([sys.executable, "-c", _DAEMONISE], capture_output=True, text=True, check=True)
            return int(out.stdout), rayaccel.get_devices().indices[0]

    a = Spawner.remote()
    pid, dev = ray.get(a.spawn.remote(), timeout=60)
    ray.kill(a)
    return pid, dev


def test_a_killed_actors_escaped_child_fences_its_device_and_reclaim_ends_it(cluster):
    import ray

    node = node_named(cluster, NODE)
    from rayaccel.ray.driver.status import cluster_status

    assert not any(n["leaks"] for n in cluster_status()["nodes"]), "idle workers must never count as leaks"
    pid = None
    actors: list = []
    try:
        pid, dev = _leak_one()
        assert _alive(pid), "the daemonised child outlives the actor"
        row = wait_for(lambda: next((r for r in _node_row(NODE)["leaks"] or () if r["pid"] == pid), None), 30,
                       "the leak in status")
        assert row["device"] == dev and row["ours"] and row["evidence"] == "marker"
        assert "Spawner" in row["holder"] and "time.sleep(600)" in row["command"] and row["age_s"] >= 0
        wait_for(lambda: _node_row(NODE)["devices"][dev]["state"] == "leaked", 10, "the device fenced")
        drain = _node_row(NODE)["devices"][dev]["drain"]
        assert drain["by"] == "leak" and f"pid {pid}" in drain["reason"]

        @ray.remote(num_gpus=1, num_cpus=0, label_selector={"rayaccel.io/topology": NODE})
        class Infer:
            def device(self):
                return rayaccel.get_devices().indices[0]

        actors = [Infer.remote() for _ in range(7)]
        got = ray.get([a.device.remote() for a in actors], timeout=120)
        assert sorted(got) == sorted(set(range(8)) - {dev}), f"seven actors get the seven other devices: {got}"
        actors.append(Infer.remote())
        eighth = actors[-1].device.remote()
        ready, _ = ray.wait([eighth], timeout=3)
        assert not ready, "an eighth waits while the device is fenced"

        bad = _cli(cluster, "reclaim", f"{node.node_key}:99")
        assert bad.returncode == 2 and bad.stderr.strip().startswith("error:") and "has no device 99" in bad.stderr
        bad = _cli(cluster, "reclaim", "nosuchnode:1")
        assert bad.returncode == 2 and "no rayaccel node 'nosuchnode'" in bad.stderr

        r = _cli(cluster, "reclaim", f"{node.node_key}:{dev}")
        assert r.returncode == 0, r.stderr[-2000:]
        lines = r.stdout.splitlines()
        assert lines[0].startswith("cluster: ")
        assert f"ended pid {pid}" in r.stdout and "Spawner" in r.stdout and "leak fence is lifted" in r.stdout
        assert not _alive(pid)
        assert ray.get(eighth, timeout=60) == dev, "the eighth gets the reclaimed device"
        for a in actors:
            ray.kill(a)
        actors = []
        wait_for(lambda: _node_row(NODE)["devices"][dev]["state"] == "free", 10, "the fence lifted")
        st = _json(_cli(cluster, "status", "--json").stdout)
        n = next(x for x in st["nodes"] if x["name"] == NODE)
        assert not n["leaks"]
        assert [e["action"] for e in n["leak_events"] if e["device"] == dev][-3:] == ["fenced", "reclaimed", "unfenced"]
        doc = _json(_cli(cluster, "doctor", "--json").stdout)
        leak_rows = [r for r in doc["rows"] if r["name"] == "leaked processes" and r["node"] == node.node_key]
        assert leak_rows and leak_rows[0]["status"] == "ok"
    finally:
        for a in actors:
            ray.kill(a)
        _kill(pid)


def test_reclaim_leaks_after_ends_the_leak_by_itself(cluster):
    from rayaccel.ray.node import leakpolicy

    node = node_named(cluster, NODE)
    pid = None
    leakpolicy.write(node.directory, "1s")  # what `rayaccel start --reclaim-leaks 1s` writes
    try:
        pid, dev = _leak_one()
        wait_for(lambda: not _alive(pid), 30, "the agent to end the leaked child by itself")
        wait_for(lambda: _node_row(NODE)["devices"][dev]["state"] == "free", 10, "the fence lifted")
        events = _node_row(NODE)["leak_events"]
        assert any(e["action"] == "reclaimed" and e["detail"].startswith("auto") and pid in e["pids"] for e in events)
    finally:
        leakpolicy.write(node.directory, None)
        _kill(pid)


def test_a_stranger_in_nvmls_process_list_is_fenced_and_reported_never_ended(cluster):
    """NVML (the node's FakeNVML) lists a process of no Ray worker's on a free device: fenced, never ended."""
    from rayaccel.ray.node import agent

    dgx = node_named(cluster, "dgx1-v100")
    h = agent.handle(dgx.node_key)
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                env={k: v for k, v in os.environ.items() if not k.startswith("RAYACCEL_")})
    dev = 6
    try:
        h.ask("inject", "process_usage", dev, pid=stranger.pid, used_bytes=2 << 30)
        row = wait_for(lambda: next((r for r in _node_row("dgx1-v100")["leaks"] or ()
                                     if r["pid"] == stranger.pid), None), 20, "the stranger in status")
        assert (row["device"], row["evidence"], row["used_bytes"], row["ours"]) == (dev, "nvml", 2 << 30, False)
        wait_for(lambda: _node_row("dgx1-v100")["devices"][dev]["state"] == "leaked", 10, "the device fenced")
        out = h.ask("reclaim", dev)
        assert out["ended"] == [] and [r["pid"] for r in out["left"]] == [stranger.pid]
        assert stranger.poll() is None and out["fence"] == "kept"
        r = _cli(cluster, "reclaim", f"{dgx.node_key}:{dev}")
        assert f"not ours: pid {stranger.pid}" in r.stdout and "left running" in r.stdout
    finally:
        h.ask("inject", "process_gone", dev, pid=stranger.pid)
        stranger.kill()
        stranger.wait()
    wait_for(lambda: _node_row("dgx1-v100")["devices"][dev]["state"] == "free", 10, "the fence lifted")
