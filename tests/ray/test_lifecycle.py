"""``rayaccel start`` / ``stop`` on real ``ray start`` processes: two local clusters side by side.

A driver that only calls ``ray.init(address=...)`` gets rayaccel's devices on a
``rayaccel start`` cluster; ``rayaccel stop --node`` stops exactly its own node's
processes and leaves the other cluster running; ``stop`` never runs ``ray stop``.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import textwrap
import time

import pytest

pytestmark = pytest.mark.ray


def _port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def _cli(*args, env, timeout=180):
    return subprocess.run([sys.executable, "-m", "rayaccel.cli", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.fixture(scope="module")
def two_clusters(ray_env):
    import shutil
    import tempfile
    from pathlib import Path

    import ray

    if ray.is_initialized():
        ray.shutdown()
    heads = []
    dirs = []
    for i in range(2):
        tmp = Path(tempfile.mkdtemp(prefix=f"rl{i}-", dir="/tmp"))  # Unix socket paths must stay short
        dirs.append(tmp)
        (tmp / "ray").mkdir(parents=True)
        env = {**os.environ, "RAY_TMPDIR": str(tmp)}
        env.pop("RAY_ADDRESS", None)
        port = _port()
        r = _cli("start", "--head", f"--port={port}", "--topology", "dgx1-v100", "--num-cpus=4",
                 "--include-dashboard=false", env=env)
        assert r.returncode == 0, r.stderr[-3000:] + r.stdout[-2000:]
        key = re.search(r"key ([0-9a-f]{12})", r.stdout).group(1)
        heads.append({"env": env, "port": port, "key": key, "out": r.stdout, "address": f"{_addr(r.stdout)}"})
    try:
        yield heads
    finally:
        for h in heads:
            _cli("stop", "--node", h["key"], "--force", env=h["env"])
        for d in dirs:
            shutil.rmtree(d, ignore_errors=True)


def _addr(text: str) -> str:
    return re.search(r"ray\.init\(address=\"([^\"]+)\"\)", text).group(1)


def _alive(address: str) -> bool:
    host, port = address.rsplit(":", 1)
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return True
    except OSError:
        return False


def test_start_prints_its_own_summary_and_no_colour_in_a_pipe(two_clusters):
    out = two_clusters[0]["out"]
    assert "rayaccel: started a head node" in out and "Ray GPU=8" in out and "topology: published" in out
    assert "ray stop" not in out and "\x1b[" not in out


def test_a_plain_driver_on_a_rayaccel_start_cluster_gets_nv2_pairs(two_clusters):
    from rayaccel import catalog

    h = two_clusters[0]
    code = textwrap.dedent("""
        import json, sys, time, ray
        ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
        @ray.remote(num_cpus=0)
        class Barrier:  # all four hold their GPUs at once (a slow worker start must not serialize them)
            def __init__(self):
                self.n = 0
            def arrive(self):
                self.n += 1
            def count(self):
                return self.n
        barrier = Barrier.remote()
        @ray.remote(num_gpus=2)
        def step(barrier):
            ray.get(barrier.arrive.remote())
            deadline = time.time() + 120
            while ray.get(barrier.count.remote()) < 4 and time.time() < deadline:
                time.sleep(0.05)
            return [int(i) for i in ray.get_gpu_ids()]
        print(json.dumps(ray.get([step.remote(barrier) for _ in range(4)])))
    """)
    r = subprocess.run([sys.executable, "-c", code, h["address"]], capture_output=True, text=True, timeout=180,
                       env=h["env"])
    assert r.returncode == 0, r.stderr[-3000:]
    pairs = json.loads(r.stdout.strip().splitlines()[-1])
    topo = catalog.load("dgx1-v100")
    assert sorted(d for p in pairs for d in p) == list(range(8))
    assert all(topo.link(*sorted(p)).label == "NV2" for p in pairs)


def test_auto_refuses_two_clusters_and_the_address_read_comes_first(two_clusters):
    """Issue 22: with two clusters here, ``--address auto`` (the default) names both instead of picking one;
    given an address, the first line says which cluster is read (``--json``: an ``address`` field)."""
    a, b = two_clusters
    env = {k: v for k, v in a["env"].items() if k != "RAY_ADDRESS"}
    r = _cli("status", env=env, timeout=60)
    assert r.returncode == 2 and "Ray clusters run on this machine" in r.stderr, r.stderr[-2000:]
    for h in (a, b):
        assert f":{h['port']}" in r.stderr  # each cluster listed by its GCS address
    assert len(r.stderr.strip().splitlines()) == 1
    r = _cli("top", "--once", "--address", a["address"], env=env, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.splitlines()[0] == f"cluster: {a['address']}" and "q quits" not in r.stdout
    st = _cli("status", "--address", a["address"], "--json", env=env, timeout=60)
    assert st.returncode == 0 and json.loads(st.stdout)["address"] == a["address"], st.stderr[-2000:]


def test_stop_stops_only_its_own_cluster(two_clusters):
    a, b = two_clusters
    r = _cli("stop", env=a["env"])
    assert r.returncode == 2 and "2 rayaccel nodes run on this machine" in r.stderr
    r = _cli("stop", "--node", a["key"], env=a["env"])
    assert r.returncode == 0, r.stderr
    assert f"stopped node {a['key']}" in r.stdout
    deadline = time.monotonic() + 20
    while _alive(a["address"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(a["address"])
    assert _alive(b["address"])  # the other cluster is untouched
    st = _cli("status", "--address", b["address"], "--json", env=b["env"])
    assert st.returncode == 0, st.stderr[-2000:]
    assert json.loads(st.stdout)["nodes"][0]["node_key"] == b["key"]


def test_stop_all_from_the_head_stops_the_cluster(two_clusters):
    b = two_clusters[1]
    r = _cli("stop", "--all", "--address", b["address"], env=b["env"])
    assert r.returncode == 0, r.stderr[-2000:]
    assert f"node {b['key']}: stopped" in r.stdout
    deadline = time.monotonic() + 20
    while _alive(b["address"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _alive(b["address"])
