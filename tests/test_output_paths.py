"""Output paths are checked before any work (issue 10): ``viz.check_output_dir`` /
``viz.check_output_file`` raise OutputPathError (a RayaccelError) naming what is in the way."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from rayaccel import catalog, viz
from rayaccel.errors import OutputPathError, RayaccelError

runner = CliRunner()


@pytest.mark.parametrize("path, expect", [
    ("/dev/null/x", "/dev/null/x: cannot write the results here: /dev/null is a device, not a folder"),
    ("/dev/null/x/y/z", "/dev/null is a device, not a folder"),
    ("/dev/null", "/dev/null: is a device, not a folder"),
    ("", "empty output folder name"),
    ("x" * 5000, "the name is too long"),
], ids=["under-dev-null", "deep-under-dev-null", "dev-null", "empty", "too-long"])
def test_check_output_dir_rejects(path, expect):
    with pytest.raises(OutputPathError) as e:
        viz.check_output_dir(path, what="results")
    assert expect in str(e.value) and len(str(e.value)) < 300
    assert isinstance(e.value, RayaccelError)


def test_check_output_dir_rejects_a_file_and_accepts_new_folders(tmp_path):
    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(OutputPathError, match="is a file, not a folder"):
        viz.check_output_dir(f)
    with pytest.raises(OutputPathError, match=f"{f} is a file, not a folder"):
        viz.check_output_dir(f / "sub")
    assert viz.check_output_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # nothing is created by the check


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_check_output_dir_without_permission(tmp_path):
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    with pytest.raises(OutputPathError, match="no permission to write in"):
        viz.check_output_dir(ro / "out")


def test_pictures_under_a_device_fail_before_drawing(tmp_path):
    with pytest.raises(OutputPathError, match="/dev/null is a device, not a folder"):
        viz.draw_topology(catalog.load("dgx1-v100"), "/dev/null/x/pic.png")
    with pytest.raises(OutputPathError, match="/dev/null is a device"):
        viz.draw_cluster([("a", catalog.load("dgx1-v100"), {})], "/dev/null/pic.png")


def test_cli_picture_under_a_device_is_one_error_line():
    from rayaccel.cli import app

    r = runner.invoke(app, ["topo", "show", "-t", "dgx1-v100", "--png", "/dev/null/x/pic.png"])
    assert r.exit_code == 2 and r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --png /dev/null/x/pic.png: cannot write the picture")


def test_demo_out_under_a_device_is_one_error_line_and_starts_nothing():
    from rayaccel.cli import app

    r = runner.invoke(app, ["demo", "--quick", "--out", "/dev/null/x"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "/dev/null is a device, not a folder" in lines[0]


# ---------------------------------------------------------------- special file systems, all or nothing
# Permission bits do not tell (root passes access() on /proc and /sys): the check creates and removes
# one probe file, so these fail before any work, with one line naming the folder.
SPECIAL = [p for p in ("/proc", "/sys") if os.path.isdir(p)]


@pytest.mark.parametrize("base", SPECIAL)
@pytest.mark.parametrize("tail", ["x", "x/y/z"], ids=["child", "missing-parents"])
def test_special_file_systems_are_refused_by_the_check(base, tail):
    target = f"{base}/{tail}"
    with pytest.raises(OutputPathError, match=f"{base} takes no new files|no permission to write in {base}"):
        viz.check_output_dir(target, what="demo results")
    with pytest.raises(OutputPathError, match=f"{base} takes no new files|no permission to write in {base}"):
        viz.check_output_file(target + ".png")
    assert not os.path.exists(target)


def test_the_probe_leaves_nothing(tmp_path):
    viz.check_output_dir(tmp_path / "new", what="x")
    viz.check_output_file(tmp_path / "pic.png")
    assert list(tmp_path.iterdir()) == []


def test_output_dir_removes_the_folders_it_made_when_the_work_fails(tmp_path):
    from rayaccel._outputs import output_dir, write_text

    with pytest.raises(RuntimeError):
        with output_dir(tmp_path / "a" / "b", "results") as d:
            write_text(d / "one.json", "{}")
            raise RuntimeError("the run failed")
    assert list(tmp_path.iterdir()) == []
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "old.txt").write_text("mine")
    with pytest.raises(RuntimeError):
        with output_dir(keep, "results") as d:
            raise RuntimeError("the run failed")
    assert [p.name for p in keep.iterdir()] == ["old.txt"]


def test_atomic_path_never_leaves_a_partial_file(tmp_path):
    from rayaccel._outputs import atomic_path

    target = tmp_path / "sub" / "r.json"
    with pytest.raises(RuntimeError):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            raise RuntimeError("died while writing")
    assert not (tmp_path / "sub").exists()
    with atomic_path(target) as tmp:
        tmp.write_text("whole")
    assert target.read_text() == "whole" and [p.name for p in target.parent.iterdir()] == ["r.json"]
    assert oct(target.stat().st_mode & 0o777) == oct(0o666 & ~_umask())


def _umask() -> int:
    m = os.umask(0o022)
    os.umask(m)
    return m


@pytest.mark.parametrize("argv", [
    ["topo", "show", "-t", "dgx1-v100", "--png", "/proc/x.png"],
    ["topo", "show", "-t", "dgx1-v100", "--svg", "/sys/x/y.svg"],
    ["topo", "show", "-t", "dgx1-v100", "--png", "{file}/x.png"],
    ["topo", "import", "{capture}", "--png", "/proc/x/y.png"],
    ["plan", "--cluster", "{cluster}", "--svg", "/proc/x.svg"],
    ["demo", "--out", "/proc/x"],
    ["demo", "--out", "/sys/x/y"],
    ["demo", "--out", "{file}"],
    ["demo", "--out", "{file}/sub"],
], ids=["show-proc", "show-sys-missing-parent", "show-under-a-file", "import-proc", "plan-proc", "demo-proc",
        "demo-sys", "demo-a-file", "demo-under-a-file"])
def test_every_output_option_on_a_bad_path_is_one_error_line(argv, tmp_path):
    from pathlib import Path

    from rayaccel.cli import app

    here = Path(__file__).parent / "data"
    f = tmp_path / "a-file"
    f.write_text("x")
    subs = {"file": str(f), "capture": str(here / "captures" / "13_dgx1-v100-8gpu-4mlx5-microway.txt"),
            "cluster": str(here / "clusters" / "two-racks.json")}
    args = [a.format(**subs) for a in argv]
    if any(a.startswith(("/proc", "/sys")) for a in args) and not SPECIAL:
        pytest.skip("no /proc or /sys here")
    r = runner.invoke(app, args)
    assert r.exit_code == 2 and r.stdout == "", r.output
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in r.output
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"] and f.read_text() == "x"
