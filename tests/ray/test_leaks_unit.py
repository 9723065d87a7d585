"""The leak watcher (:mod:`rayaccel.ray.node.leaks`) over real processes and a real arbiter, without Ray.

A leaked process here is a real one: a daemonised ``sleep`` started with the environment a worker's child
inherits after a grant (this node's directory, ``RAYACCEL_DEVICES``, ``RAYACCEL_HOLDER``), reparented away
from its starter. The node's arbiter is a real one on a temporary node directory; the agent around it is a
small stand-in (no placeholder actors: no Ray). NVML's list is injected.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.state import Snapshot, decode_snapshot, device_state, encode_snapshot
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.contract import DEVICES_ENV, HOLDER_ENV, LEAK_DRAIN_BY, NODE_DIR_ENV
from rayaccel.errors import ClusterError
from rayaccel.ray.node import leakpolicy
from rayaccel.ray.node.leaks import LeakWatch

KEY = "0123456789ab"


class _Agent:
    """What the watcher uses of a NodeAgent: its directory, table, arbiter, drain and undrain."""

    def __init__(self, d):
        self.dir = str(d)
        self.table = build_table(catalog.load("dgx1-v100"), KEY, True, None)
        self.arbiter = Arbiter(d, self.table)
        self.raylet_pid = None
        self.nvml_procs = []

    def drain(self, device, reason, by="operator", kill=False, tick=True):
        return {"new": self.arbiter.drain(device, reason, by)}

    def undrain(self, device, only_by=None, tick=True):
        return self.arbiter.undrain(device, only_by)


def _clean() -> dict:
    return {k: v for k, v in os.environ.items() if not k.startswith("RAYACCEL_")}


def _orphan(env: dict) -> int:
    """A sleeper started in its own session by a process that exits at once (so it is reparented)."""
    code = ("import subprocess, sys; p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'], "
            "start_new_session=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
            "print(p.pid)")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=30)
    return int(out.stdout)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] in (b"Z", b"X")
    except OSError:
        return True


@pytest.fixture
def node(tmp_path):
    d = tmp_path / "node"
    d.mkdir(mode=0o700)
    started: list[int] = []

    def leak(device: int, holder: str = "999999:actor:zz") -> int:
        pid = _orphan({**_clean(), NODE_DIR_ENV: str(d), DEVICES_ENV: str(device), HOLDER_ENV: holder})
        started.append(pid)
        return pid

    def stranger() -> int:
        pid = _orphan(_clean())
        started.append(pid)
        return pid

    try:
        yield SimpleNamespace(agent=_Agent(d), dir=d, leak=leak, stranger=stranger)
    finally:
        for pid in started:
            try:
                os.kill(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def _drain(agent, device):
    return agent.arbiter.read().drained.get(device)


def test_a_leak_is_fenced_after_the_grace_reclaimed_and_the_fence_lifts(node):
    lk = node.leak(2)
    other = node.stranger()
    w = LeakWatch(node.agent, nvml=lambda: [SimpleNamespace(pid=other, device=2, used_bytes=1 << 30)], grace_s=0.5)
    t0 = time.time()
    assert w.check(now=t0) == [] and _drain(node.agent, 2) is None  # within the grace: not yet
    rows = w.check(now=t0 + 1)
    assert {(r["pid"], r["ours"]) for r in rows} == {(lk, True), (other, False)}
    mine = next(r for r in rows if r["pid"] == lk)
    assert mine["holder"] == "pid 999999 (actor:zz)" and mine["evidence"] == "marker" and mine["fenced"]
    assert mine["since"] == t0 and "time.sleep(300)" in mine["command"]
    dr = _drain(node.agent, 2)
    assert dr.by == LEAK_DRAIN_BY and f"pid {lk}" in dr.reason
    out = w.reclaim(2)
    assert [r["pid"] for r in out["ended"]] == [lk] and out["ended"][0]["signal"] in ("SIGTERM", "SIGKILL")
    assert [(r["pid"], r["why"]) for r in out["left"]] == [(other, next(r["why"] for r in rows if r["pid"] == other))]
    assert _gone(lk) and not _gone(other)
    assert out["fence"] == "kept"  # the stranger still uses the device
    os.kill(other, signal.SIGKILL)
    for _ in range(50):
        if _gone(other):
            break
        time.sleep(0.05)
    w.nvml = lambda: []
    assert w.check() == [] and _drain(node.agent, 2) is None  # the leaked processes are gone: the fence lifts
    assert [e["action"] for e in w.summary()["events"]] == ["fenced", "reclaimed", "unfenced"]


@pytest.mark.parametrize("worker_cg, raylet_known, learned", [
    ("0::/", True, False),  # a host without cgroups: the root, where everything sits
    ("0::/ray/worker-7", False, False),  # the raylet not found: its cgroup unknown, nothing told apart
    ("0::/ray/raylet", True, False),  # the raylet's own
    ("0::/ray/worker-7", True, True),  # a worker's own
])
def test_only_a_workers_own_cgroup_is_remembered(node, tmp_path, worker_cg, raylet_known, learned):
    from rayaccel.ray.node.leakscan import Holder

    root = tmp_path / "proc"
    for pid, cg in ((7, worker_cg), (100, "0::/ray/raylet")):
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(cg + "\n")
    w = LeakWatch(node.agent, grace_s=0.0)
    w.root = str(root)
    w._cgroups({7: Holder(7, "actor:aa", frozenset({3}))}, 100 if raylet_known else None)
    assert (worker_cg in w.worker_cgroups) is learned


def test_an_operators_drain_replaces_a_fence_and_is_never_lifted_by_the_watcher(node):
    lk = node.leak(3)
    w = LeakWatch(node.agent, grace_s=0.0)
    w.check()
    assert _drain(node.agent, 3).by == LEAK_DRAIN_BY
    node.agent.arbiter.drain(3, "maintenance", "operator")
    assert _drain(node.agent, 3).by == "operator"
    os.kill(lk, signal.SIGKILL)
    time.sleep(0.2)
    w.check()
    assert _drain(node.agent, 3).by == "operator"  # the leak ended; the operator's drain stands
    assert not node.agent.arbiter.drain(3, "again", LEAK_DRAIN_BY)  # and a fence never replaces it


def test_a_health_drain_is_never_turned_into_a_fence(node):
    node.agent.arbiter.drain(4, "Xid 79", "health")
    node.leak(4)
    w = LeakWatch(node.agent, grace_s=0.0)
    (row,) = w.check()
    assert _drain(node.agent, 4).by == "health" and row["drained_by"] == "health" and not row["fenced"]


def test_an_operator_lifting_a_fence_acknowledges_its_processes(node):
    lk = node.leak(5)
    w = LeakWatch(node.agent, grace_s=0.0)
    w.check()
    assert _drain(node.agent, 5).by == LEAK_DRAIN_BY
    node.agent.undrain(5)
    w.acknowledge(5)  # what NodeAgent.undrain does for an operator
    (row,) = w.check()
    assert _drain(node.agent, 5) is None and row["acknowledged"] and row["pid"] == lk
    lk2 = node.leak(5)  # a new leak on the device fences it again
    w.check()
    assert _drain(node.agent, 5).by == LEAK_DRAIN_BY and f"pid {lk2}" in _drain(node.agent, 5).reason


def test_reclaim_leaks_after_ends_ours_by_itself(node):
    leakpolicy.write(node.dir, "1s")
    lk = node.leak(6)
    w = LeakWatch(node.agent, grace_s=0.0)
    t0 = time.time()
    w.check(now=t0)
    assert not _gone(lk)  # not yet: the leak has lasted 0 s
    w.check(now=t0 + 1.5)
    for _ in range(200):
        if _gone(lk):
            break
        time.sleep(0.05)
    assert _gone(lk)
    for _ in range(100):
        if not w._reclaiming:
            break
        time.sleep(0.05)
    assert w.summary()["reclaim_after_s"] == 1.0
    assert any(e["action"] == "reclaimed" and e["detail"].startswith("auto") for e in w.summary()["events"])
    w.check()
    assert _drain(node.agent, 6) is None


@pytest.mark.parametrize("value, seconds", [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("90", 90.0), (2, 2.0),
                                            (None, None), ("off", None)])
def test_reclaim_after_reads_durations(value, seconds):
    assert leakpolicy.reclaim_after(value) == seconds


@pytest.mark.parametrize("bad", ["0s", "5 minutes", "-1", "8d", "1e9", "0.5", True, "s"])
def test_reclaim_after_refuses_anything_else_by_name(bad):
    with pytest.raises(ClusterError, match="reclaim-leaks=.*expected a duration from 1s to 7 days"):
        leakpolicy.reclaim_after(bad)


def test_the_policy_file_round_trips_and_a_damaged_one_means_never(tmp_path, caplog):
    assert leakpolicy.read(tmp_path) is None
    assert leakpolicy.write(tmp_path, "2m") == 120.0 and leakpolicy.read(tmp_path) == 120.0
    (tmp_path / "reclaim-leaks.json").write_text('{"schema": "rayaccel.reclaim-leaks/9"}')
    assert leakpolicy.read(tmp_path) is None and "not reclaimed" in caplog.text


def test_a_fenced_device_shows_as_leaked_and_the_snapshot_carries_the_leaks():
    from rayaccel.arbiter.state import Drain

    rows = [{"device": 1, "pid": 42, "command": "python x", "holder": "actor A (pid 7)", "since": 1.0, "ours": True}]
    snap = Snapshot(at=1.0, node_key=KEY, free=(0,), drained={1: Drain("leaked: pid 42", 1.0, LEAK_DRAIN_BY),
                                                             2: Drain("op", 1.0, "operator")},
                    leaks={"rows": rows, "events": [], "reclaim_after_s": None, "error": None}, pool=(0, 1, 2))
    back = decode_snapshot(encode_snapshot(snap), "kv")
    assert back.leaks["rows"] == rows
    states = [device_state(i, back, pool=frozenset({0, 1, 2}), partitioned=frozenset()) for i in (0, 1, 2)]
    assert states == ["free", "leaked", "drained"]


def test_doctors_row_says_the_watcher_is_on_and_warns_of_each_leak():
    from rayaccel.ray.driver.doctor import leak_row

    assert leak_row("k", {"on": False}).status == "warn"
    ok = leak_row("k", {"on": True, "rows": [], "reclaim_after_s": 300.0})
    assert ok.status == "ok" and "after 300 s" in ok.detail
    rows = [{"device": 2, "pid": 42, "command": "python x", "holder": "actor A (pid 7)", "ours": True},
            {"device": 3, "pid": 43, "command": "nb", "holder": "an unknown holder", "ours": False, "why": "uid 9"}]
    w = leak_row("k", {"on": True, "rows": rows, "reclaim_after_s": None})
    assert w.status == "warn" and "pid 42 (python x) from actor A (pid 7)" in w.detail and "not ours: uid 9" in w.detail
    assert w.fix.startswith("rayaccel reclaim k:2; rayaccel reclaim k:3")


def test_status_and_top_show_the_leaks_table():
    from rich.console import Console

    from rayaccel.cli.views import leaks_table

    rows = [{"device": 2, "pid": 42, "command": "python -c sleep", "holder": "actor Spawner (pid 7)",
             "since": time.time() - 30, "used_bytes": 1 << 30, "ours": True, "fenced": True},
            {"device": 2, "pid": 43, "command": "nb", "holder": "an unknown holder", "since": None, "used_bytes": None,
             "ours": False, "why": "another user's (uid 9)", "fenced": True}]
    con = Console(width=200, record=True)
    con.print(leaks_table(rows))
    text = con.export_text()
    assert "actor Spawner (pid 7)" in text and "1.0 GiB" in text and "fenced" in text
    assert "no: another user's (uid 9)" in text and "30s" in text


def test_reclaim_leaks_is_checked_before_anything_starts():
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster
    from rayaccel.ray.driver.init import init

    if ray.is_initialized():  # a Ray test module's connection (tests/ray run together): init refuses that first
        ray.shutdown()

    with pytest.raises(ClusterError, match="reclaim_leaks= only applies to an embedded cluster"):
        init(address="127.0.0.1:1", reclaim_leaks="5m")
    with pytest.raises(ClusterError, match="reclaim-leaks='soon'"):
        init(topology="dgx1-v100", reclaim_leaks="soon")
    with pytest.raises(ClusterError, match="reclaim-leaks='0s'"):
        SimulatedCluster(["dgx1-v100"], reclaim_leaks="0s")
