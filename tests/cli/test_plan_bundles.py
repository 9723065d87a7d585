"""``rayaccel plan --bundles``: the placement map a node's arbiter would give a placement group (issue 21 item 1).

Checked against the machine's topology, not against a list: each bundle's devices and their link class,
the busy devices left out, the tensor-parallel groups of the rank order on all-NVLink quads; the JSON is
the text's data in the live map's shape; bad input is one ``error:`` line and exit code 2.
"""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.arbiter.groupmap import BundlePlacement
from rayaccel.cli import app

runner = CliRunner()
DGX1 = catalog.load("dgx1-v100")


def _plan(*args: str, code: int = 0) -> str:
    r = runner.invoke(app, ["plan", "-t", "dgx1-v100", *args])
    assert r.exit_code == code, r.output
    return r.output


def _json(*args: str) -> dict:
    return json.loads(_plan(*args, "--json"))


def _strongest_link_rank() -> tuple:
    return max(l.rank for l in DGX1.links)


def test_4x2_puts_each_bundle_on_an_nv2_pair():
    m = _json("--bundles", "4x2")["map"]
    devices = [[d["index"] for d in b["devices"]] for b in m["bundles"]]
    assert sorted(d for pair in devices for d in pair) == list(DGX1.indices)
    for b, (x, y) in zip(m["bundles"], devices):
        link = DGX1.link(x, y)
        # the machine's strongest link class (NV2 on a DGX-1), and the label the map gives it
        assert link is not None and link.rank == _strongest_link_rank() and link.label == "NV2" == b["link"]


def test_the_json_and_the_text_say_the_same():
    args = ("--bundles", "[{\"GPU\": 2, \"CPU\": 4}, {\"GPU\": 2}, {\"CPU\": 1}]", "--busy", "0")
    out = _json(*args)
    text = _plan(*args)
    assert out["ok"] and out["busy"] == [0] and out["rank_order"]["order"] == [0, 1, 2]
    assert f"order[r]): {out['rank_order']['order']}" in " ".join(text.split())
    live = set(BundlePlacement(0, "n", None, None).to_dict())
    for b in out["map"]["bundles"]:
        assert set(b) == live
        devs = ",".join(str(d["index"]) for d in b["devices"])
        if devs:
            row = (rf"│ {b['bundle']}\s+│ {re.escape(devs)}\s+│ {re.escape(b['link'])}\s+│ "
                   rf"{re.escape(b['nics'][0])}")
        else:  # the why, folded in an 80-column table
            row = rf"│ {b['bundle']}\s+│ {re.escape(b['why'].split()[0])} "
        assert re.search(row, text), (row, text)
        for d in b["devices"]:
            assert f"device {d['index']}: {d['model']} {d['uuid']}" in text
    assert out["map"]["bundles"][2]["why"] == "the bundle holds no GPU"


def test_busy_devices_are_left_out():
    for busy in ("0,3", "4-7", "1"):
        want = {int(x) for part in busy.split(",") for x in (range(int(part[0]), int(part[-1]) + 1))}
        n = (8 - len(want)) // 2
        m = _json("--bundles", f"{n}x2", "--busy", busy)["map"]
        got = [d["index"] for b in m["bundles"] for d in b["devices"]]
        assert len(got) == len(set(got)) == 2 * n and not set(got) & want


def test_group_size_4_keeps_each_tp_group_on_an_all_nvlink_quad():
    out = _json("--bundles", "8x1", "--group-size", "4")
    devs = {b["bundle"]: [d["index"] for d in b["devices"]] for b in out["map"]["bundles"]}
    ro = out["rank_order"]
    assert ro["group_size"] == 4 and sorted(ro["order"]) == list(range(8)) and len(ro["groups"]) == 2
    for g in ro["groups"]:
        quad = [d for b in g["bundles"] for d in devs[b]]
        assert len(quad) == 4 and g["scope"] == "nvlink island" and g["allreduce_bandwidth_gbps"] > 0
        assert all(DGX1.link(a, b) is not None and DGX1.link(a, b).kind == "nvlink"
                   for a in quad for b in quad if a < b)
    text = " ".join(_plan("--bundles", "8x1", "--group-size", "4").split())  # titles fold at 80 columns
    assert f"order[r]): {ro['order']}; groups of 4 rank(s)" in text and "nvlink island" in text


def test_the_text_form_and_the_json_form_are_the_same_bundles():
    a = _json("--bundles", "1x4,2x2")["map"]["bundles"]
    b = _json("--bundles", "4,2,2")["map"]["bundles"]
    c = _json("--bundles", '[{"GPU": 4}, {"GPU": 2}, {"GPU": 2}]')["map"]["bundles"]
    assert a == b == c and [len(x["devices"]) for x in a] == [4, 2, 2]


# (args, what the one error line must contain)
ERRORS = [
    (["--bundles", "abc"], "--bundles: cannot read 'abc'; expected NxK (N bundles of K GPUs, e.g. 4x2)"),
    (["--bundles", "4x"], "--bundles: cannot read '4x'"),
    (["--bundles", "2.5"], "--bundles: cannot read '2.5'"),
    (["--bundles", "0x2"], "--bundles: '0x2' names no bundle"),
    (["--bundles", "[{\"GPU\": 2"], "--bundles: not valid JSON"),
    (["--bundles", "[1, 2]"], "--bundles: a JSON value that is not a list of objects"),
    (["--bundles", "[{\"GPU\": 0.5}]"], "--bundles: bundle 0 asks 0.5 GPU: the arbiter reserves whole devices"),
    (["--bundles", "[{\"TPU\": 1}]"], "--bundles: bundle 0: resource 'TPU' places no device in a dry run"),
    (["--bundles", "[{\"GPU\": 1, \"memory\": 1%s}]" % ("0" * 400)], "--bundles: bundle 0: memory is '1000"),
    (["--bundles", "[" * 4000], "--bundles: not valid JSON"),
    (["--bundles", "2000x1"], "--bundles: more than 1024 bundles; give at most 1024"),
    (["--bundles", "16"], "--bundles: bundle 0 asks 16 GPU(s); dgx1-v100 has 8 (Ray places a bundle on one node)"),
    (["--bundles", "5x2"], "--bundles: the group asks 10 GPUs; dgx1-v100 has 8 free"),
    (["--bundles", "3x2", "--busy", "0-2"],
     "--bundles: the group asks 6 GPUs; dgx1-v100 has 5 free (8 in all, 3 busy)"),
    (["--bundles", "4x2", "--busy", "9"], "--busy: no device 9"),
    (["--bundles", "3x1", "--group-size", "2"],
     "--group-size: 2 does not divide the group's 3 bundles; give one of 1, 3"),
    (["--bundles", "2x1", "--group-size", "0"], "--group-size: 0 ranks per group; give a positive number"),
    (["--group-size", "4"], "--group-size orders the ranks of a placement group: give --bundles too"),
    (["--bundles", "4x2", "--gpus", "2"], "--gpus does not apply to --bundles"),
    (["--bundles", "4x2", "--interconnect", "direct"], "--interconnect does not apply to --bundles"),
]


@pytest.mark.parametrize("args,text", ERRORS, ids=[" ".join(a)[:40] for a, _ in ERRORS])
def test_bad_input_is_one_error_line(args, text):
    r = runner.invoke(app, ["plan", "-t", "dgx1-v100", *args])
    assert r.exit_code == 2, r.output
    lines = [line for line in r.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and text in lines[0], r.output
    assert "Traceback" not in r.output


@pytest.mark.parametrize("args,text", [
    (["--cluster", "{spec}", "--bundles", "4x2"], "--bundles maps a placement group on one machine: give --topology"),
    (["--cluster", "{spec}", "--group-size", "2"], "--group-size maps a placement group on one machine"),
    (["-t", "trn1-32xlarge", "--bundles", "2x1"], "trn1-32xlarge's accelerators are Ray's 'neuron_cores', not GPUs"),
    (["-t", "a100-mig", "--bundles", "1"], "a100-mig has no whole GPU to reserve"),
], ids=["with --cluster", "group size with --cluster", "neuron", "all MIG"])
def test_bundles_need_one_machine_with_gpus(tmp_path, args, text):
    spec = tmp_path / "c.json"
    spec.write_text(json.dumps({"schema": "rayaccel.cluster/1", "nodes": [{"id": "n0", "topology": "dgx1-v100"}]}))
    r = runner.invoke(app, ["plan", *[a.replace("{spec}", str(spec)) for a in args]])
    assert r.exit_code == 2 and r.output.startswith("error: ") and text in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_status_renders_a_live_map_with_the_same_renderer():
    from rich.console import Console

    from rayaccel.cli.placements import placement_group_tables
    from rayaccel.arbiter.groupmap import dry_run

    m, _ = dry_run(DGX1, [{"GPU": 2}, {"CPU": 1}], node_id="7f3a9c0d1e2b")
    row = {"pg_id": "ab" * 14, "name": "rl", "state": "CREATED", "strategy": "PACK", "map": m.to_dict()}
    con = Console(width=160, record=True)
    for item in placement_group_tables([row, {"pg_id": "cd" * 14, "state": "PENDING", "strategy": "PACK"}]):
        con.print(item)
    text = con.export_text()
    b0 = m.bundles[0]
    assert f"placement group {'ab' * 14} (rl): PACK, CREATED" in text and "not placed yet" in text
    assert re.search(rf"│ 0\s+│ \? 7f3a9c0d\s+│ {b0.visible}\s+│ NV2\s+│", text), text
    assert "the bundle holds no GPU" in text and f"? 7f3a9c0d: device {b0.indices[0]}: Tesla V100" in text
