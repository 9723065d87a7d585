"""Operating a cluster: health-driven drains, operator drains, doctor, metrics, top (issue "Operate").

Faults are injected into each simulated node's fake NVML through its agent; the
real NVML health probe and the real drain path run.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import pytest
from raytest_helpers import node_named, wait_for

import rayaccel

pytestmark = pytest.mark.ray


def _agent(key):
    from rayaccel.ray.node import agent
    return agent.handle(key)


def _status():
    from rayaccel.ray.driver.status import cluster_status

    return cluster_status()


def _dev_row(name, dev):
    n = next(n for n in _status()["nodes"] if n["name"] == name)
    return n["devices"][dev]


def test_an_injected_xid_79_drains_the_device_within_2_s_and_work_lands_elsewhere(cluster):
    import ray

    dgx = node_named(cluster, "dgx1-v100")
    dev = 3
    h = _agent(dgx.node_key)
    t0 = time.monotonic()
    h.ask("inject", "xid", dev, xid=79)
    wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] == "drained", 5, "device 3 drained")
    assert time.monotonic() - t0 < 2.5
    row = _dev_row("dgx1-v100", dev)
    assert "Xid 79" in row["drain"]["reason"] and row["drain"]["by"] == "health"
    try:
        # the placeholder holds one GPU in Ray's ledger: Ray's count stays true
        wait_for(lambda: ray.available_resources().get("GPU", 0) <= 15, 60, "Ray's GPU count to drop by one")

        @ray.remote(num_gpus=1, label_selector={"rayaccel.io/topology": "dgx1-v100"})
        def plain():
            time.sleep(0.5)
            return int(ray.get_gpu_ids()[0])

        @rayaccel.remote(gpus=1, model="V100")
        def ours():
            time.sleep(0.5)
            return rayaccel.get_devices().indices[0]

        got = ray.get([plain.remote() for _ in range(7)] + [ours.remote() for _ in range(3)])
        assert dev not in got
        st = _status()
        dgx_row = next(n for n in st["nodes"] if n["name"] == "dgx1-v100")
        assert any(e["kind"] == "xid" and e["code"] == 79 for e in dgx_row["health_events"])
    finally:
        h.ask("undrain", dev)
    wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] == "free", 10, "device 3 back")


def test_on_failed_gpu_end_workers_restarts_an_actor_on_a_healthy_device(cluster):
    """``--on-failed-gpu=end-workers``: an Xid on an actor's device ends the actor; Ray restarts it elsewhere."""
    import ray

    from rayaccel.ray.node import failpolicy

    dgx = node_named(cluster, "dgx1-v100")
    h = _agent(dgx.node_key)

    @ray.remote(num_gpus=1, max_restarts=1, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Worker:
        def where(self):
            return os.getpid(), rayaccel.get_devices().indices[0], int(ray.get_gpu_ids()[0])

    failpolicy.write(dgx.directory, "end-workers")  # what `rayaccel start --on-failed-gpu=end-workers` writes
    a = Worker.remote()
    pid, dev, _ = ray.get(a.where.remote(), timeout=60)
    try:
        h.ask("inject", "xid", dev, xid=79)
        wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] in ("drained", "draining"), 10, "the device drained")

        def restarted():
            try:
                got = ray.get(a.where.remote(), timeout=10)
            except ray.exceptions.RayActorError:
                return None  # restarting
            return got if got[0] != pid else None

        new_pid, new_dev, ray_id = wait_for(restarted, 60, "the actor restarted")
        assert new_dev != dev and ray_id == new_dev
        ev = next(e for e in reversed(h.ask("snapshot").health["events"]) if e["device"] == dev)
        assert ev["ended"] == [pid]
    finally:
        failpolicy.write(dgx.directory, None)
        ray.kill(a)
        h.ask("undrain", dev)
    wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] == "free", 10, f"device {dev} back")


def test_ray_train_workers_avoid_a_drained_device(cluster, tmp_path):
    import dataclasses

    import ray
    from ray.train import ScalingConfig

    from rayaccel.ray import _ray_private as rp

    if "label_selector" not in {f.name for f in dataclasses.fields(ScalingConfig)}:  # the workers stay on the DGX-1
        pytest.skip(f"Ray {rp.release()} does not carry ScalingConfig(label_selector) in Ray Train")
    dgx = node_named(cluster, "dgx1-v100")
    dev = 3
    h = _agent(dgx.node_key)
    h.ask("inject", "xid", dev, xid=79)
    try:
        wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] == "drained", 5, "device 3 drained")
        wait_for(lambda: ray.available_resources().get("GPU", 0) <= 15, 60, "Ray's GPU count to drop by one")
        _train_avoids(dev, tmp_path)
    finally:
        h.ask("undrain", dev)
    wait_for(lambda: _dev_row("dgx1-v100", dev)["state"] == "free", 10, "device 3 back")


def _train_avoids(dev, tmp_path):
    import ray
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    @ray.remote(num_cpus=0)
    class Box:
        def __init__(self):
            self.got = []

        def put(self, x):
            self.got.append(x)

        def get(self):
            return self.got

    box = Box.options(name="ops-box").remote()

    def loop(config):
        import ray

        ray.get(ray.get_actor("ops-box").put.remote(int(ray.get_gpu_ids()[0])))

    TorchTrainer(loop, torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ScalingConfig(num_workers=4, use_gpu=True,
                                              label_selector={"rayaccel.io/topology": "dgx1-v100"}),
                 run_config=RunConfig(storage_path=str(tmp_path))).fit()
    got = ray.get(box.get.remote())
    ray.kill(box)
    assert len(got) == 4 and dev not in got


def test_operator_drain_with_kill_and_undrain_through_the_cli(cluster):
    import ray

    dgx = node_named(cluster, "dgx1-v100")

    @ray.remote(num_gpus=8, max_restarts=0, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Everything:
        def ok(self):
            return True

    a = Everything.remote()
    ray.get(a.ok.remote())
    env = {**os.environ}
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "drain", f"{dgx.node_key}:5", "--reason",
                        "fan replaced", "--kill", "--address", cluster.address], capture_output=True, text=True,
                       env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "drained" in r.stdout and "stopped pid" in r.stdout
    with pytest.raises(ray.exceptions.RayActorError):  # the work on it was stopped
        ray.get(a.ok.remote(), timeout=30)
    js = subprocess.run([sys.executable, "-m", "rayaccel.cli", "status", "--json", "--address", cluster.address],
                        capture_output=True, text=True, env=env, timeout=60)
    row = next(n for n in json.loads(js.stdout)["nodes"] if n["name"] == "dgx1-v100")["devices"][5]
    assert row["state"] == "drained" and row["drain"]["reason"] == "fan replaced"
    # the drain survives a restart of the node's agent (and so of its health watcher)
    old = _agent(dgx.node_key).ask("pid")
    os.kill(old, signal.SIGKILL)  # its supervisor starts it again
    wait_for(lambda: _agent(dgx.node_key) is not None and _agent(dgx.node_key).pid != old and
             _agent(dgx.node_key).ping() == dgx.node_key, 30, "the agent back")
    assert _dev_row("dgx1-v100", 5)["state"] == "drained"
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "undrain", f"{dgx.node_key}:5", "--address",
                        cluster.address], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0 and "undrained" in r.stdout
    wait_for(lambda: _dev_row("dgx1-v100", 5)["state"] == "free", 10, "device 5 back")


def test_drain_bad_targets_are_one_error_line(cluster):
    for target in ("nonsense", "abcdef:99", "zzzzzz:1", f"{node_named(cluster, 'dgx1-v100').node_key}:42"):
        r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "drain", target, "--address", cluster.address],
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 2, (target, r.stdout, r.stderr)
        lines = r.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.stderr


def test_doctor_passes_on_a_clean_cluster_and_fails_with_a_plain_ray_node(cluster):
    from rayaccel.ray.driver import doctor
    from rayaccel.ray.driver.view import view

    rows = doctor.run()
    assert not [r for r in rows if r.status == "fail"], [r for r in rows if r.status == "fail"]
    names = {r.name for r in rows}
    assert {"ray version", "rayaccel version", "worker hook", "driver", "pending GPU requests"} <= names
    hw = [r for r in rows if r.name in ("driver", "cuda", "nccl", "p2p", "persistence")]
    assert hw and all(r.status == "n/a" and "simulated" in r.detail for r in hw)
    nid = cluster.add_node("l40s-4x-pcie", plain=True)
    try:
        view().invalidate()
        rows = doctor.run()
        bad = [r for r in rows if r.status == "fail"]
        assert any(r.name == "rayaccel node" and r.node == nid[:12] for r in bad)
        r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "doctor", "--json", "--address", cluster.address],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 1 and json.loads(r.stdout)["fail"] >= 1
    finally:
        cluster.remove_node(nid)
        view().invalidate()


def test_doctor_fails_on_mixed_versions():
    from rayaccel.ray.driver import doctor
    rows = doctor.version_rows({"a": {"ray": "2.60.0", "rayaccel": "0.1.0"}, "b": {"ray": "2.59.1", "rayaccel": "0.1.0"}},
                               ray_driver="2.60.0", rayaccel_driver="0.1.0")
    by = {r.name: r for r in rows}
    assert by["ray version"].status == "fail" and "2.59.1" in by["ray version"].detail
    assert by["rayaccel version"].status == "ok"


def _values(lines):
    """state -> value of ``rayaccel_device_state`` lines."""
    return {l.split('state="')[1].split('"')[0]: float(l.rsplit(" ", 1)[1]) for l in lines}


def test_metrics_reach_rays_prometheus_endpoint(cluster):
    """Each node's agent is a driver of the raylet ``ray.init`` picks on its host: its own in a real cluster
    (one node a host), any node's on this one-host cluster (the head's on recent releases, an arbitrary one on
    2.48). Its metrics leave through that node's metrics agent, so scrape every node's endpoint, as Prometheus
    does (Ray's service discovery lists them all)."""
    import ray

    from rayaccel import metrics_names as M

    dgx = node_named(cluster, "dgx1-v100")
    prefix = M.exported(M.DEVICE_STATE) + "{"

    def scraped():
        urls = [f"http://{n['NodeManagerAddress']}:{n['MetricsExportPort']}/metrics"
                for n in ray.nodes() if n["Alive"] and n.get("MetricsExportPort")]
        for url in urls:
            try:
                text = urllib.request.urlopen(url, timeout=5).read().decode()
            except OSError:
                continue
            lines = [l for l in text.splitlines() if l.startswith(prefix) and f'node="{dgx.node_key}"' in l
                     and 'device="0"' in l]
            # the idle state once it is exported: a value set before the cluster went idle (an earlier test's
            # busy or drained device) stays on the endpoint until Ray's next report of it
            if lines and M.exported(M.DEVICE_DRAINED) in text and _values(lines).get("free") == 1.0:
                return lines
        return None

    lines = wait_for(scraped, 60, "rayaccel's metrics of the DGX-1's device 0, free, on a node's metrics endpoint")
    value = _values(lines)
    # the cluster is idle (the fixture checks): device 0 is free, and exactly one state holds
    assert value["free"] == 1.0 and sum(value.values()) == 1.0 and set(value) >= {"busy", "drained", "failed"}


def test_top_once_renders_every_node(cluster):
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "top", "--once", "--address", cluster.address],
                       capture_output=True, text=True, timeout=120, env={**os.environ, "COLUMNS": "160"})
    assert r.returncode == 0, r.stderr[-2000:]
    for n in cluster.nodes:
        assert n.node_key in r.stdout
    assert "NV2:" in r.stdout  # the DGX-1's links


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_top_live_in_tmux_quits_on_q(cluster):
    session = f"rtop{os.getpid()}"
    cmd = f"{sys.executable} -m rayaccel.cli top --address {cluster.address} --interval 0.5"
    tmux = ["tmux", "-L", session]  # a server of its own: it inherits this environment
    subprocess.run([*tmux, "new-session", "-d", "-s", session, "-x", "160", "-y", "60", cmd], check=True,
                   env={**os.environ})
    try:
        def screen():
            out = subprocess.run([*tmux, "capture-pane", "-p", "-t", session], capture_output=True, text=True)
            return out.stdout if "rayaccel top" in out.stdout and node_named(cluster, "dgx1-v100").node_key in out.stdout else None

        wait_for(screen, 60, "top's first frame")
        subprocess.run([*tmux, "send-keys", "-t", session, "q"], check=True)

        def gone():
            return subprocess.run([*tmux, "has-session", "-t", session], capture_output=True).returncode != 0

        wait_for(gone, 15, "top to quit on q")
    finally:
        subprocess.run([*tmux, "kill-server"], capture_output=True)
