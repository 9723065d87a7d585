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
