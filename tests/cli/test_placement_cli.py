"""``rayaccel plan`` (wired into a private app, so the test does not depend on the lead's wiring)."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from rayaccel.cli import bench, plan

from machines import dgx1v


@pytest.fixture
def app_and_topo(tmp_path):
    app = typer.Typer()
    plan.register(app)
    bench.register(app)
    path = tmp_path / "dgx1.json"
    dgx1v().save(path)
    return app, str(path)


@pytest.mark.parametrize("args,code,text", [
    (["--gpus", "2", "--busy", "0,3"], 0, "weakest link NV2"),
    (["--gpus", "4", "--interconnect", "nvlink", "--busy", "1,5"], 1, "all NVLink-connected"),
    (["--gpus", "4", "--interconnect", "direct", "--busy", "1,5"], 1, "all NVLink-connected"),
    (["--gpus", "4", "--interconnect", "direct"], 0, "weakest link NV1"),
    (["--gpus", "2", "--busy", "x"], 2, "--busy: cannot read 'x'"),
], ids=["NV2 pair", "nvlink rejection", "direct rejection", "direct quad", "bad busy"])
def test_plan_command(app_and_topo, args, code, text):
    app, path = app_and_topo
    res = CliRunner().invoke(app, ["plan", "--topology", path, *args])
    assert res.exit_code == code
    assert text in res.output


def test_plan_json_and_unknown_device(app_and_topo):
    app, path = app_and_topo
    res = CliRunner().invoke(app, ["plan", "--topology", path, "--gpus", "4", "--json"])
    data = json.loads(res.output)
    assert data["ok"] and set(data["devices"]) in ({0, 1, 2, 3}, {4, 5, 6, 7})
    res = CliRunner().invoke(app, ["plan", "--topology", path, "--gpus", "1", "--busy", "9"])
    assert res.exit_code == 2 and "9" in res.output and "--busy" in res.output


def test_plan_mig_proposes_a_layout_when_no_instance_is_free():
    from rayaccel.cli import app as real_app

    res = CliRunner().invoke(real_app, ["plan", "--topology", "hgx-h100", "--mig", "3g.40gb", "--busy", "0", "--json"])
    assert res.exit_code == 1, res.output
    out = json.loads(res.output)
    assert out["mig_layout"]["create"] == [{"gpu": 1, "profile": "3g.40gb", "start": 4}]
    assert out["mig_layout"]["commands"] == ["nvidia-smi mig -i 1 -cgi 9:4 -C"]


def test_plan_unknown_mig_profile_lists_the_known_ones():
    from rayaccel.cli import app as real_app

    res = CliRunner().invoke(real_app, ["plan", "--topology", "hgx-h100", "--mig", "9g.1tb"])
    assert res.exit_code == 1
    assert "no device on this node knows MIG profile '9g.1tb'" in res.output and "3g.40gb" in res.output
