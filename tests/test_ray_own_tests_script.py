"""scripts/ray_own_tests.py without Ray: the junit reports it reads, the verdicts, the table, its refusals, and
the simulated machine each node of Ray's tests gets."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def rot():
    spec = importlib.util.spec_from_file_location("ray_own_tests", ROOT / "scripts" / "ray_own_tests.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["ray_own_tests"] = mod  # dataclasses resolve the module by name
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop("ray_own_tests", None)


REPORT = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" tests="6">
<testcase classname="test_advanced_2" name="test_gpu_ids" time="3.1">
  <failure message="AssertionError: assert 'rayaccel-x' == ''&#10;second line">trace</failure></testcase>
<testcase classname="test_advanced_2" name="test_zero_cpus" time="1.0"/>
<testcase classname="test_advanced_6" name="test_colour" time="1.0"><failure message="RayTaskError: #x1B[36mray::f()#x1B[39m (pid=3)"/></testcase>
<testcase classname="test_node_labels" name="test_x[v1]" time="0.1"><skipped message="needs docker"/></testcase>
<testcase classname="sub.test_pg" name="test_setup_broke" time="0"><error message="fixture 'foo' not found"/></testcase>
<testcase classname="test_actor_resources.TestActors" name="test_in_class" time="0.2"/>
<testcase classname="test_advanced_2" name="test_zero_cpus" time="0"><error message="teardown failed"/></testcase>
</testsuite></testsuites>"""


def test_junit_outcomes_and_node_ids(rot):
    got = rot.parse_junit(REPORT)
    assert got == {
        "test_advanced_2.py::test_gpu_ids": ("failed", "AssertionError: assert 'rayaccel-x' == ''"),
        "test_advanced_2.py::test_zero_cpus": ("failed", "teardown failed"),  # a teardown error after a pass
        "test_advanced_6.py::test_colour": ("failed", "RayTaskError: ray::f() (pid=3)"),
        "test_node_labels.py::test_x[v1]": ("skipped", "needs docker"),
        "sub/test_pg.py::test_setup_broke": ("failed", "fixture 'foo' not found"),
        "test_actor_resources.py::TestActors::test_in_class": ("passed", ""),
    }


def test_a_report_that_is_not_xml_is_refused(rot):
    with pytest.raises(ValueError, match="not a junit XML report"):
        rot.parse_junit("5 passed in 3.2s")


@pytest.mark.parametrize("plain,accel,want", [
    ("passed", "passed", "pass both"), ("failed", "failed", "fail both"), ("passed", "failed", "differ"),
    ("failed", "passed", "differ"), ("skipped", "passed", "skip"), ("passed", "missing", "skip"),
])
def test_verdicts(rot, plain, accel, want):
    assert rot.verdict(plain, accel) == want


def test_table_counts_every_verdict_and_explains_each_difference(rot):
    plain = {"a.py::t1": ("passed", ""), "a.py::t2": ("passed", ""), "b.py::t3": ("failed", "boom")}
    accel = {"a.py::t1": ("passed", ""), "a.py::t2": ("failed", "assert labels == {...}"),
             "b.py::t3": ("failed", "boom"), "b.py::t4": ("passed", "")}
    table = rot.rows(plain, accel)
    assert [r.test for r in table] == ["a.py::t1", "a.py::t2", "b.py::t3", "b.py::t4"]
    assert rot.counts(table) == {"pass both": 1, "fail both": 1, "differ": 1, "skip": 1}
    text = rot.render(table)
    assert "| `a.py::t2` | passed | failed | differ |" in text
    assert "1 pass both, 1 fail both, 1 differ, 1 skip" in text
    assert "* `a.py::t2` (differ): plain: passed; rayaccel: assert labels == {...}" in text
    assert "* `b.py::t3` (fail both)" in text and "t4` (" not in text


def test_refuses_a_directory_in_the_project_or_missing(rot, capsys, tmp_path):
    assert rot.main([str(ROOT / "tests")]) == 2
    assert rot.main([str(tmp_path / "nope")]) == 2
    assert rot.main([str(tmp_path)]) == 2  # no test files
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(line.startswith("error: ") for line in err)
    assert "inside this project" in err[0] and "not a directory" in err[1] and "no test_*.py" in err[2]


@pytest.mark.parametrize("num_gpus,visible,machine,count", [
    (None, None, "dgx2-v100", 0),       # plain Ray finds no GPU on this CPU machine
    (3, None, "dgx2-v100", 3),
    (3, "4,5,6", "dgx2-v100", 3),
    (None, "14,15", "dgx2-v100", None),  # the preset's count, as Ray counts it
    (20, None, "nvl72", 20),
])
def test_each_node_gets_the_gpus_it_asked_for(rot, num_gpus, visible, machine, count):
    topo, n = rot.sim_topology(num_gpus, visible)
    assert topo.name == machine and n == count


def test_uuids_in_a_preset_name_the_simulated_devices(rot):
    from rayaccel.ray.node.preset import given

    topo, n = rot.sim_topology(1, "uuid1,uuid2")
    assert [d.uuid for d in topo.devices[:2]] == ["uuid1", "uuid2"]
    _, preset = given(topo, {"CUDA_VISIBLE_DEVICES": "uuid1,uuid2"}, num_gpus=n)
    assert preset.ray_ids == ("uuid1",)
