"""Cluster commands given bad input or an address that cannot be reached: one error line, fast.

Only loopback addresses are used: a port nothing listens on, and a port where a
server accepts connections but never answers (so Ray's connect would wait).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

COMMANDS = (["status"], ["doctor"], ["top", "--once"], ["drain", "abcdef123456:0"], ["undrain", "abcdef123456:0"])


def _cli(*args, timeout=60):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", *args], capture_output=True, text=True, timeout=timeout,
                       env=env)
    return r, time.monotonic() - t0


def _one_error(r):
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 2, (r.returncode, r.stdout[-500:], r.stderr[-1500:])
    assert len(lines) == 1 and lines[0].startswith("error: "), r.stderr[-1500:]
    assert "Traceback" not in r.stderr


def _free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c[0] for c in COMMANDS])
@pytest.mark.parametrize("address", ["not an address", "127.0.0.1:99999", "ray:/x", "h" * 400 + ":1"])
def test_malformed_address(cmd, address):
    r, dt = _cli(*cmd, "--address", address)
    _one_error(r)
    assert "address" in r.stderr and dt < 10


@pytest.mark.parametrize("cmd", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_nothing_listens_there(cmd):
    r, dt = _cli(*cmd, "--address", f"127.0.0.1:{_free_port()}")
    _one_error(r)
    assert "cannot reach Ray" in r.stderr and dt < 10


def test_a_server_that_never_answers_is_given_up_on_within_10_s():
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)
    port = srv.getsockname()[1]
    conns = []

    def accept():
        while True:
            try:
                c, _ = srv.accept()
            except OSError:
                return
            conns.append(c)  # held open, never answered

    threading.Thread(target=accept, daemon=True).start()
    try:
        r, dt = _cli("status", "--address", f"127.0.0.1:{port}")
        _one_error(r)
        assert dt < 15, dt  # the CLI's own bound is 10 s, plus interpreter start
    finally:
        srv.close()
        for c in conns:
            c.close()


@pytest.mark.parametrize("value", ["[1]", "null", "5", '{"x": -1}', '{"GPU": 2}', '{"rayaccel_node_x": 1}', "{bad",
                                   '{"x": true}', "[" * 5000 + "]" * 5000])
def test_start_rejects_bad_resources_before_starting_anything(value):
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", f"--resources={value}")
    _one_error(r)
    assert "--resources" in r.stderr


def test_start_rejects_a_num_gpus_it_does_not_have():
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", "--num-gpus=9")  # fewer than 8: the node takes those
    _one_error(r)
    assert "--num-gpus=9" in r.stderr and "8 GPU(s)" in r.stderr and "--num-gpus=8 or fewer" in r.stderr


@pytest.mark.parametrize("env", ["9", "GPU-nope", "1,GPU-nope", ""], ids=["index", "uuid", "mixed", "empty-ok"])
def test_start_checks_the_visible_devices_before_anything_starts(env, monkeypatch):
    if env == "":  # empty is valid (no GPU); with --num-gpus=1 it is the contradiction
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
        r, _ = _cli("start", "--head", "--topology", "dgx1-v100", "--num-gpus=1")
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", env)
        r, _ = _cli("start", "--head", "--topology", "dgx1-v100")
    _one_error(r)
    assert "CUDA_VISIBLE_DEVICES=" in r.stderr


def test_start_checks_zero_gpu_tasks():
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", "--zero-gpu-tasks=all")
    _one_error(r)
    assert "expected see-none or see-all" in r.stderr


@pytest.mark.parametrize("bad", ["end_workers", "kill", ""])
def test_start_checks_on_failed_gpu_before_anything_starts(bad):
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", f"--on-failed-gpu={bad}")
    _one_error(r)
    assert "expected leave or end-workers" in r.stderr


@pytest.mark.parametrize("bad", ["soon", "0s", "10d", "5 min"])
def test_start_checks_reclaim_leaks_before_anything_starts(bad):
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", f"--reclaim-leaks={bad}")
    _one_error(r)
    assert "reclaim-leaks=" in r.stderr and "expected a duration from 1s to 7 days such as 30s, 5m or 1h" in r.stderr


def test_stop_without_any_local_node_says_so():
    r, _ = _cli("stop", "--node", "abcdef123456")
    _one_error(r)
    assert "was started by `rayaccel start` on this machine" in r.stderr


def test_version():
    r, _ = _cli("--version")
    assert r.returncode == 0 and r.stdout.startswith("rayaccel ")


@pytest.mark.parametrize("content, says", [
    ("SwitchName=s1 Nodes=node[01-0\n", "topology.conf"),          # a hostlist that does not close
    ("SwitchName=s1 Nodes=elsewhere01\n", "not in this file"),       # a file that does not name this host
    ('{"Instances": [}', "topology.json"),                           # JSON that does not parse
], ids=["bad-hostlist", "host-not-named", "bad-json"])
def test_start_with_a_bad_network_topology_starts_nothing(tmp_path, content, says):
    """`rayaccel start --network-topology` reads the file before anything starts: one error line, no node."""
    from rayaccel.ray.node import processes
    name = "topology.json" if content.startswith("{") else "topology.conf"
    f = tmp_path / name
    f.write_text(content)
    before = {n.node_key for n in processes.local_nodes()}
    r, _ = _cli("start", "--head", "--topology", "dgx1-v100", "--network-topology", str(f), "--instance-id",
                "i-0123456789abcdef0")
    _one_error(r)
    assert says in r.stderr
    assert {n.node_key for n in processes.local_nodes()} == before


def test_network_levels_and_the_nvlink_domain_become_ray_start_labels():
    from pathlib import Path

    from rayaccel import catalog
    from rayaccel.discovery.network import node_levels
    from rayaccel.ray.node.lifecycle import ray_start_command

    conf = Path(__file__).parent.parent / "data" / "network" / "slurm-tree-topology.conf"
    levels = node_levels(conf, "nvl-r0-t03")
    assert levels["rayaccel.io/net-l1"] == "leaf-r0"
    tray = catalog.rack("gb200-nvl72-tray", trays=1, rack=0)[0]
    cmd = ray_start_command(tray, "0123456789ab", ["--head"], simulated=True, network=levels)
    labels = dict(kv.split("=", 1) for kv in cmd[-1][len("--labels="):].split(","))
    assert labels["rayaccel.io/net-l1"] == levels["rayaccel.io/net-l1"]
    assert labels["ray.io/gpu-domain"].endswith(".1") and labels["rayaccel.io/nvlink-clique"] == "1"


@pytest.mark.parametrize("topo,bad,why", [
    ("dgx1-v100", "0", "GPU 0 is not in MIG mode"), ("a100-mig", "5", "this node has no GPU 5"),
    ("a100-mig", "-1", "expected GPU indices"), ("a100-mig", "0,0", "named twice"),
    ("dgx1-v100", "all", "no GPU of this node is in MIG mode"),
], ids=["not-mig", "unknown", "negative", "twice", "all-none"])
def test_start_checks_dynamic_mig_before_anything_starts(topo, bad, why):
    r, _ = _cli("start", "--head", "--topology", topo, f"--dynamic-mig={bad}")
    _one_error(r)
    assert "dynamic-mig" in r.stderr and why in r.stderr
