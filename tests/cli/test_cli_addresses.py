"""A newcomer's first hour (issue 22): the CLI says which cluster it reads, refuses to guess among
several, fails fast when joining nothing, and says what it simulates. No Ray cluster is started here."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time

import pytest
from typer.testing import CliRunner

from rayaccel.cli import app
from rayaccel.errors import ClusterError

runner = CliRunner()
ADDRESSED = (["status"], ["doctor"], ["top", "--once"], ["drain", "abcdef123456:0"], ["undrain", "abcdef123456:0"])


@pytest.fixture
def clusters_here(monkeypatch):
    """Pretend these GCS addresses run on this machine (Ray's own local search, patched)."""
    from rayaccel.ray import _ray_private as rp

    monkeypatch.delenv("RAY_ADDRESS", raising=False)

    def set_(*addresses):
        monkeypatch.setattr(rp, "local_gcs_addresses", lambda: sorted(addresses))
    return set_


def test_auto_with_one_cluster_reads_it(clusters_here):
    from rayaccel.ray.driver.ops import resolve_address

    clusters_here("10.0.0.1:6379")
    assert resolve_address("auto") == "10.0.0.1:6379"
    assert resolve_address("10.0.0.9:1234") == "10.0.0.9:1234"  # given: taken as it is


def test_auto_prefers_ray_address(clusters_here, monkeypatch):
    from rayaccel.ray.driver.ops import resolve_address

    clusters_here("10.0.0.1:6379", "10.0.0.2:6379")
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.2:6379")
    assert resolve_address("auto") == "10.0.0.2:6379"


@pytest.mark.parametrize("cmd", ADDRESSED, ids=[c[0] for c in ADDRESSED])
def test_auto_refuses_several_clusters_and_lists_them(cmd, clusters_here):
    clusters_here("127.0.0.1:6379", "127.0.0.1:6380")
    r = runner.invoke(app, cmd)
    assert r.exit_code == 2 and r.stdout == "", r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: 2 Ray clusters run on this machine")
    assert "127.0.0.1:6379, 127.0.0.1:6380" in lines[0] and "--address 127.0.0.1:6379" in lines[0]


def test_auto_with_no_cluster_says_how_to_start_one(clusters_here):
    clusters_here()
    r = runner.invoke(app, ["status"])
    assert r.exit_code == 2 and "no Ray cluster runs on this machine" in r.stderr and "rayaccel start --head" in r.stderr


def test_the_address_read_is_the_first_line(clusters_here, monkeypatch):
    """Printed before connecting: a connection that fails still shows which address was tried."""
    from rayaccel.ray.driver import ops

    clusters_here("127.0.0.1:1")

    def refuse(address, **kw):
        raise ClusterError(f"cannot reach Ray at {address}")
    monkeypatch.setattr(ops, "connect", refuse)
    r = runner.invoke(app, ["status"])
    assert r.stdout.splitlines()[0] == "cluster: 127.0.0.1:1 (found by --address auto)"
    assert r.exit_code == 2 and "cannot reach Ray at 127.0.0.1:1" in r.stderr
    r = runner.invoke(app, ["status", "--json"])
    assert r.stdout == ""  # --json carries the address as a field instead (tests/ray/test_lifecycle.py)


def test_start_joining_nothing_fails_within_15_s_naming_the_address():
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "start", "--address=127.0.0.1:1"], capture_output=True,
                       text=True, env=env, timeout=60)
    dt = time.monotonic() - t0
    assert r.returncode == 2 and dt < 15, (dt, r.stderr[-2000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "no Ray head answers at 127.0.0.1:1" in lines[0] and "nothing was started" in lines[0]


def test_check_head_accepts_a_listening_port():
    import socket

    from rayaccel.ray.node.lifecycle import check_head

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    try:
        check_head(f"127.0.0.1:{srv.getsockname()[1]}")
    finally:
        srv.close()


def test_init_says_which_machine_it_simulates(monkeypatch, caplog):
    from rayaccel import catalog
    from rayaccel.errors import BackendUnavailable
    from rayaccel.ray.node import start

    def nothing():
        raise BackendUnavailable("no accelerator library", "install a driver")
    monkeypatch.setattr(start, "discover", nothing)
    with caplog.at_level(logging.WARNING, logger=start.log.name):
        topo, simulated = start.node_topology(None)
    assert simulated and topo.name == catalog.load(catalog.DEFAULT).name
    (rec,) = [r for r in caplog.records if r.levelno == logging.WARNING]
    msg = rec.getMessage()
    assert "simulates" in msg and catalog.DEFAULT in msg and "DGX-1" in msg and "topology=" in msg


def test_top_frame_is_plain_without_the_live_view():
    from rich.console import Console

    from rayaccel.cli.views import top_frame

    def text(**kw):
        c = Console(record=True, width=120)
        c.print(top_frame({"nodes": [], "bad": []}, topologies={}, **kw))
        return c.export_text()
    assert "q quits" not in text(address="10.0.0.1:6379") and "10.0.0.1:6379" in text(address="10.0.0.1:6379")
    assert "(q quits)" in text(live=True)


def test_no_hint_names_a_machine_the_catalog_lacks():
    import re
    from pathlib import Path

    from rayaccel import catalog
    from rayaccel.discovery import tpu

    named = re.findall(r"e\.g\. ([a-z0-9][\w.-]*)", tpu._HINT)
    assert named and all(n in catalog.names() for n in named), named
    src = Path(__file__).parent.parents[1] / "src" / "rayaccel"
    assert not [f for f in src.rglob("*.py") if "tpu-v4-host" in f.read_text()]


# ---------------------------------------------------------------- the demo, its sides replaced by canned results
def _canned(torch: bool):
    train = "TorchTrainer" if torch else "DataParallelTrainer"

    def side(plain, storage, log):
        return {"serve: Embedder (2 replicas x num_gpus=1)": {"gpus": [0, 1], "per_worker": 1,
                                                               "after_scale_down": [0] if plain else [1]},
                f"train: {train} (4 workers, use_gpu=True)": {"gpus": [1, 4, 5, 6] if plain else [4, 5, 6, 7],
                                                              "per_worker": 1, "torch": torch},
                "task: @ray.remote(num_gpus=2) generate()": {"gpus": [2, 3], "per_worker": 2}}
    return side


def test_demo_writes_nothing_without_out(monkeypatch, tmp_path):
    import rayaccel.demo as demo

    monkeypatch.setattr(demo, "_side", _canned(False))
    monkeypatch.chdir(tmp_path)
    r = runner.invoke(app, ["demo"])
    assert r.exit_code == 0, r.output
    assert list(tmp_path.iterdir()) == []
    assert "no files written: --out DIR" in r.stdout and "DataParallelTrainer" in r.stdout
    assert r.stdout.count("TorchTrainer") == 1 and "for TorchTrainer)" in r.stdout  # only in the install hint
    # the two sides' Serve kept different GPUs: the output says why Train's free GPUs differ
    assert "Serve picks which replica to stop" in r.stdout


def test_demo_out_writes_both_files(monkeypatch, tmp_path):
    import json

    import rayaccel.demo as demo

    monkeypatch.setattr(demo, "_side", _canned(True))
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "a" / "b")])
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in (tmp_path / "a" / "b").iterdir()) == ["demo.json", "placement.png"]
    data = json.loads((tmp_path / "a" / "b" / "demo.json").read_text())
    assert data["serve_kept"] == {"rayaccel": [1], "ray": [0]}


def test_a_failed_demo_leaves_no_folder(monkeypatch, tmp_path):
    import rayaccel.demo as demo

    def broken(plain, storage, log):
        raise ClusterError("the run failed")
    monkeypatch.setattr(demo, "_side", broken)
    r = runner.invoke(app, ["demo", "--out", str(tmp_path / "new" / "out")])
    assert r.exit_code == 2 and "the run failed" in r.stderr
    assert list(tmp_path.iterdir()) == []


def test_a_ray_error_in_the_demo_is_one_line(monkeypatch, tmp_path):
    import rayaccel.demo as demo

    class FakeCluster:
        def __init__(self, *a, **k):
            pass

        def shutdown(self):
            pass

    def run(storage, log):
        raise TimeoutError("the demo expected 4 GPUs in use, Ray shows 3.0")
    monkeypatch.setattr(demo, "SimulatedCluster", FakeCluster)
    monkeypatch.setattr(demo.workload, "run", run)
    r = runner.invoke(app, ["demo"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert lines == ["error: the demo's rayaccel run failed: TimeoutError: the demo expected 4 GPUs in use, Ray shows "
                     "3.0"]


def test_demo_results_are_both_files_or_neither(monkeypatch, tmp_path):
    import rayaccel.demo as demo
    from rayaccel import _outputs
    from rayaccel.errors import OutputPathError

    def full_disk(path, text, what="output"):
        raise OutputPathError(f"{path}: cannot write the {what} (No space left on device)", path)
    monkeypatch.setattr(demo, "_side", _canned(True))
    monkeypatch.setattr(_outputs, "write_text", full_disk)
    (tmp_path / "mine.txt").write_text("kept")
    r = runner.invoke(app, ["demo", "--out", str(tmp_path)])
    assert r.exit_code == 2 and "No space left on device" in r.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["mine.txt"]


def test_a_cluster_that_does_not_start_is_one_line(monkeypatch):
    import rayaccel.demo as demo

    class Overloaded:
        def __init__(self, *a, **k):
            raise Exception("The current node timed out during startup.")
    monkeypatch.setattr(demo, "SimulatedCluster", Overloaded)
    r = runner.invoke(app, ["demo"])
    assert r.exit_code == 2 and r.stderr.strip().splitlines() == [
        "error: the demo's rayaccel cluster did not start: Exception: The current node timed out during startup."]
