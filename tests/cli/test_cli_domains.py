"""Domains and network levels in the CLI and pictures (offline): ``plan --cluster``, ``status`` grouping,
the cluster picture's domain frames."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from rayaccel import catalog, viz
from rayaccel.cli import app
from rayaccel.cli.views import domain_groups, status_tables

runner = CliRunner()
SPEC = Path(__file__).parent.parent / "data" / "clusters" / "two-racks.json"


def _run(*args):
    r = runner.invoke(app, ["plan", *args])
    return r.exit_code, r.stdout, r.stderr


def test_plan_cluster_shows_domains_levels_and_what_decided():
    code, out, _ = _run("--cluster", str(SPEC), "--workers", "3", "--gpus", "4")
    assert code == 0
    assert "rack-a" in out and "rack-b" in out and "block: b0; spine: s0" in out and "32/72" in out
    assert "decided by: NVLink domain rack-a holds all 3 workers" in out
    assert "modeled all-reduce 900 GB/s (bounded by NVLink across nodes)" in out
    code, out, _ = _run("--cluster", str(SPEC), "-w", "20", "-g", "4", "--json")
    d = json.loads(out)
    assert code == 0 and d["scope"] == "level" and d["level"] == ["spine", "s0"] and len(d["workers"]) == 20
    assert [r["domain"] for r in d["domains"]] == ["rack-a", "rack-b"]
    code, out, _ = _run("--cluster", str(SPEC), "-w", "40", "-g", "4")
    assert code == 1 and "fits on no node" in out


def test_plan_cluster_picture(tmp_path):
    code, _, err = _run("--cluster", str(SPEC), "-w", "2", "-g", "4", "--svg", str(tmp_path / "p.svg"))
    assert code == 0 and "wrote" in err
    text = (tmp_path / "p.svg").read_text()
    assert "NVLink domain rack-a" in text and "this gang" in text


@pytest.mark.parametrize("args, says", [
    (["--gpus", "2"], "exactly one of --topology"),
    (["-t", "dgx1-v100", "--cluster", str(SPEC)], "exactly one of --topology"),
    (["-t", "dgx1-v100", "--workers", "2"], "give --cluster"),
    (["--cluster", str(SPEC), "--busy", "0"], "--busy is for one machine"),
    (["--cluster", str(SPEC), "--strategy", "scatter"], "unknown strategy"),
    (["--cluster", str(SPEC), "--workers", "0"], "workers: expected an int >= 1"),
    (["--cluster", str(SPEC), "--png", "x.svg"], "must end in .png"),
    (["--cluster", "/no/such/spec.json"], "cannot read the cluster spec"),
], ids=["neither", "both", "workers-one-machine", "busy", "strategy", "workers", "suffix", "missing"])
def test_plan_cluster_bad_options_are_one_error_line(args, says):
    code, out, err = _run(*args)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]


GOOD = json.loads(SPEC.read_text())


def _spec(tmp_path, mutate):
    d = json.loads(json.dumps(GOOD))
    mutate(d)
    p = tmp_path / "c.json"
    p.write_text(json.dumps(d))
    return p


@pytest.mark.parametrize("mutate, says", [
    (lambda d: d.update(nodes=[]), "nodes: expected a non-empty list"),
    (lambda d: d.update(schema="x/2"), "schema"),
    (lambda d: d.update(racks=1), "unknown key 'racks'"),
    (lambda d: d["nodes"][0].update(count=0), "nodes[0].count: expected an int from 1"),
    (lambda d: d["nodes"][0].update(count=10**6), "nodes[0].count"),
    (lambda d: d["nodes"][1].update(topology="no-such-machine"), "nodes[1].topology"),
    (lambda d: d["nodes"][1].update(domain=""), "domain: expected a non-empty string"),
    (lambda d: d["nodes"][1].update(levels=["b0"]), "nodes[1].levels"),
    (lambda d: d["nodes"][1].update(levels={"block": 3}), "levels[block]"),
    (lambda d: d["nodes"][1].update(busy="9"), "busy"),
    (lambda d: d["nodes"][1].update(busy=[0, 7]), "no device 7"),
    (lambda d: d["nodes"][1].update(network_gbps=-1), "network_gbps"),
    (lambda d: d["nodes"][2].update(name="a-free"), "used twice"),
    (lambda d: d["nodes"][0].update(clique=[1]), "clique"),
    (lambda d: d["nodes"][0].update(tray=1), "unknown key 'tray'"),
], ids=["empty", "schema", "key", "count0", "count-huge", "topology", "domain", "levels-list", "level-value",
        "busy-index", "busy-list", "rate", "dup-name", "clique", "entry-key"])
def test_bad_cluster_specs_name_the_file_and_field(tmp_path, mutate, says):
    p = _spec(tmp_path, mutate)
    code, out, err = _run("--cluster", str(p), "-w", "2", "-g", "4")
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert code == 2 and out == "" and len(lines) == 1, err
    assert lines[0].startswith("error: ") and str(p) in lines[0] and says in lines[0], lines[0]


# ------------------------------------------------------------------ status grouping
def _row(key, free, labels):
    return {"node_id": key * 4, "node_key": key, "name": "gb200-nvl4", "hostname": None, "simulated": True,
            "free": free, "devices": [{"index": i, "model": "NVIDIA GB200", "memory_bytes": 1 << 30,
                                       "state": "free" if i < free else "busy", "holders": [], "share": None,
                                       "mig_held": [], "drain": None, "health": "ok"} for i in range(4)],
            "holders": [], "unhooked_slots": 0.0, "waiting": [], "age_s": 0.1, "agent": "answered",
            "labels": labels}


def _render(items):
    c = Console(width=160, record=True, file=open("/dev/null", "w"))
    for it in items:
        c.print(it)
    return c.export_text()


def test_status_groups_nodes_by_domain():
    def dom(d):
        return {"ray.io/gpu-domain": d, "rayaccel.io/nvlink-clique": "7", "rayaccel.io/net-block": "b0"}
    nodes = [_row("aaaa00000001", 4, dom("rack-a")), _row("bbbb00000002", 0, dom("rack-b")),
             _row("cccc00000003", 2, {}), _row("aaaa00000004", 3, dom("rack-a"))]
    groups = domain_groups(nodes)
    assert [[n["node_key"] for n in m] for _, m in groups] == [["aaaa00000001", "aaaa00000004"], ["bbbb00000002"],
                                                              ["cccc00000003"]]
    text = _render(status_tables({"nodes": nodes, "bad": [], "unmanaged": []}))
    assert "NVLink domain rack-a (clique 7): 2 node(s), 7/8 GPUs free; block=b0" in text
    assert "no NVLink domain: 1 node(s), 2/4 GPUs free" in text
    assert text.index("rack-a") < text.index("aaaa00000004") < text.index("rack-b") < text.index("cccc00000003")


def test_status_without_domains_has_no_headers():
    nodes = [_row("aaaa00000001", 4, {}), _row("bbbb00000002", 1, {"rayaccel.io/node-key": "bbbb00000002"})]
    assert domain_groups(nodes) == [(None, nodes)]
    assert "NVLink domain" not in _render(status_tables({"nodes": nodes, "bad": [], "unmanaged": []}))


# ------------------------------------------------------------------ the cluster picture
def test_cluster_picture_frames_each_domain(tmp_path):
    t = catalog.load("gb200-nvl4")
    nodes = [(f"tray{i}", t, {0: "job"} if i == 1 else {}) for i in range(4)]
    text = viz.draw_cluster(nodes, tmp_path / "c.svg", domains=["rack-a", "rack-b", "rack-a", None]).read_text()
    assert "NVLink domain rack-a" in text and "NVLink domain rack-b" in text and "no NVLink domain" in text
    plain = viz.draw_cluster(nodes, tmp_path / "p.svg").read_text()
    assert "NVLink domain" not in plain
    with pytest.raises(viz.VizError, match="one NVLink domain name"):
        viz.draw_cluster(nodes, tmp_path / "x.svg", domains=["a"])
