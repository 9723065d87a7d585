"""``rayaccel doctor`` and NVLink domains: the per-node domain row, the IMEX check, consistency across
nodes, and the split of the Ray doctor into a node half and a cluster half (no import circle)."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import pytest

from rayaccel import catalog
from rayaccel.testing.fakenvml import FakeNVML
from rayaccel.doctor import NVIDIA_CHECKS, local_checks
from rayaccel.doctor._fabric import domain_summary, imex_check
from rayaccel.ray.driver.doctor import _node_rows, domain_rows
from rayaccel.topology import Fabric


@pytest.fixture
def host(tmp_path):
    """An empty /proc and /dev to fill per test."""
    proc, dev = tmp_path / "proc", tmp_path / "dev"
    proc.mkdir()
    dev.mkdir()

    def daemon(pid: int = 4242, name: str = "nvidia-imex"):
        (proc / str(pid)).mkdir()
        (proc / str(pid) / "comm").write_text(name + "\n")

    def channel(n: int = 0):
        (dev / "nvidia-caps-imex-channels").mkdir(exist_ok=True)
        (dev / "nvidia-caps-imex-channels" / f"channel{n}").write_text("")

    return proc, dev, daemon, channel


TRAY = catalog.rack("gb200-nvl72-tray", trays=1, rack=0)[0]


# ---------------------------------------------------------------- imex
def test_imex_channels_and_daemon_are_ok(host):
    proc, dev, daemon, channel = host
    daemon(1, "bash")
    daemon()
    channel(0)
    check = imex_check(TRAY, proc, dev)
    assert check.status == "ok" and "channel0" in check.detail and "nvidia-imex running" in check.detail


def test_imex_channels_without_a_visible_daemon_are_ok_in_a_container(host):
    proc, dev, _, channel = host
    channel(0)
    check = imex_check(TRAY, proc, dev)
    assert check.status == "ok" and "not visible from here" in check.detail


@pytest.mark.parametrize("with_daemon", [False, True])
def test_no_imex_channel_warns_with_the_fix(host, with_daemon):
    proc, dev, daemon, _ = host
    if with_daemon:
        daemon()
    check = imex_check(TRAY, proc, dev)
    assert check.status == "warn" and "/dev/nvidia-caps-imex-channels has no channel" in check.detail
    assert ("daemon runs" in check.detail) == with_daemon
    assert "nvidia-imex" in check.fix and "channel0" in check.fix


@pytest.mark.parametrize("name", ["hgx-h100", "dgx1-v100", "nvl72"])
def test_imex_is_na_without_a_multi_node_domain(host, name):
    proc, dev, *_ = host
    check = imex_check(catalog.load(name), proc, dev)
    assert check.status == "n/a" and "no multi-node NVLink domain" in check.detail


def test_imex_in_the_local_checks_of_a_real_and_a_simulated_tray(host):
    proc, dev, *_ = host
    checks = {c.name: c for c in local_checks(TRAY, simulated=False, nvml=FakeNVML(TRAY, driver_version="570.86.15"),
                                              proc_dir=proc, dev_dir=dev, proc_modules="/nonexistent")}
    assert list(checks) == list(NVIDIA_CHECKS)
    assert checks["imex"].status == "warn" and checks["fabric"].status == "ok"
    sim = {c.name: c for c in local_checks(TRAY, simulated=True)}
    assert sim["imex"].status == "n/a" and sim["imex"].detail == "simulated node: no IMEX daemon or channels to check"


# ---------------------------------------------------------------- per node
def test_domain_summary_and_its_row():
    s = domain_summary(TRAY)
    assert s["domain"] and s["gpus"] == 4 and s["reason"] is None and set(s["states"].values()) == {"completed"}
    (row,) = [r for r in _node_rows("k1", {"domain": s}) if r.name == "nvlink domain"]
    assert row.status == "ok" and s["domain"] in row.detail


def test_a_fabric_problem_warns_and_a_plain_box_is_na():
    bad = replace(TRAY, devices=(replace(TRAY.devices[0], fabric=Fabric("in_progress")),) + TRAY.devices[1:])
    (row,) = [r for r in _node_rows("k", {"domain": domain_summary(bad)}) if r.name == "nvlink domain"]
    assert row.status == "warn" and "GPU 0: fabric registration in progress" in row.detail and row.fix
    (row,) = [r for r in _node_rows("k", {"domain": domain_summary(catalog.load("hgx-h100"))})
              if r.name == "nvlink domain"]
    assert row.status == "n/a" and "all zeros" in row.detail


# ---------------------------------------------------------------- across nodes
def facts_of(trays) -> dict:
    return {t.hostname: {"domain": domain_summary(t), "hostname": t.hostname} for t in trays}


def test_two_racks_are_two_domains():
    rows = domain_rows(facts_of(catalog.rack("gb200-nvl72-tray", trays=18, rack=0)
                                + catalog.rack("gb200-nvl72-tray", trays=18, rack=1)))
    (row,) = rows
    assert row.status == "ok" and row.detail.startswith("2 domain(s): ") and row.detail.count("18 node(s), 72 GPU(s)") == 2


def test_no_domain_anywhere_is_na():
    (row,) = domain_rows(facts_of([catalog.load("hgx-h100"), catalog.load("dgx-a100")]))
    assert row.status == "n/a"


def test_uneven_trays_and_an_oversized_domain_warn():
    trays = list(catalog.rack("gb200-nvl72-tray", trays=18, rack=0))
    trays[3] = trays[3].subset([0, 1, 2])
    (row,) = domain_rows(facts_of(trays))
    assert row.status == "warn" and "nodes with 3 and 4 GPUs" in row.detail and trays[3].hostname in row.detail
    extra = [replace(t, hostname=f"x{t.hostname}") for t in catalog.rack("gb200-nvl72-tray", trays=2, rack=0)]
    (row,) = domain_rows(facts_of(list(catalog.rack("gb200-nvl72-tray", rack=0)) + extra))
    assert row.status == "warn" and "more than one NVL72 rack's 72" in row.detail


def _reclique(t, clique: int):
    return replace(t, devices=tuple(replace(d, fabric=replace(d.fabric, clique_id=clique)) for d in t.devices))


def test_a_rack_split_into_cliques_warns():
    trays = list(catalog.rack("gb200-nvl72-tray", trays=4, rack=0))
    trays[2], trays[3] = _reclique(trays[2], 9), _reclique(trays[3], 9)
    rows = {r.name: r for r in domain_rows(facts_of(trays))}
    assert rows["nvlink domains"].detail.startswith("2 domain(s)")
    assert rows["nvlink cliques"].status == "warn" and "split into 2 NVLink partitions" in rows["nvlink cliques"].detail


def test_trays_of_one_block_naming_different_clusters_fail():
    a = catalog.rack("gb200-nvl72-tray", trays=2, rack=0)
    b = catalog.rack("gb200-nvl72-tray", trays=2, rack=1)
    labels = {t.hostname: {"rayaccel.io/net-block": "rack7"} for t in (a[0], a[1], b[0])}
    labels[b[1].hostname] = {"rayaccel.io/net-block": "rack8"}
    rows = {r.name: r for r in domain_rows(facts_of(a + b), labels)}
    bad = rows["rack fabric"]
    assert bad.status == "fail" and "block rack7 name 2 different NVLink cluster UUIDs" in bad.detail
    assert b[0].hostname in bad.detail and b[1].hostname not in bad.detail


def test_hostile_facts_do_not_crash_the_cluster_half():
    rows = domain_rows({"a": {}, "b": {"domain": None}, "c": {"domain": "x"}, "d": "junk"})
    assert [r.status for r in rows] == ["n/a"]


# ---------------------------------------------------------------- the split
def test_the_node_half_imports_no_cluster_code():
    code = ("import sys, rayaccel.ray.node.doctor, rayaccel.ray.node.agent; "
            "bad = [m for m in ('rayaccel.ray.driver.doctor', 'rayaccel.ray.driver.view') "
            "if m in sys.modules]; assert not bad, bad")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
