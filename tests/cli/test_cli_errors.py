"""Bad input to every ``rayaccel`` command: exit code != 0, ONE ``error: ...`` line that names what
was wrong and what would be right, never a traceback.

Through the real command object (``CliRunner`` on ``rayaccel.cli.app``, which converts errors
itself), through ``rayaccel.cli.main(argv)``, and through the installed ``rayaccel`` script.
Nothing here starts or stops a Ray cluster: start/stop/status/demo only see argument errors.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.cli import app, main

runner = CliRunner()


@pytest.fixture(scope="module")
def bad(tmp_path_factory) -> Path:
    """A folder of bad inputs: empty, binary, prose, broken JSON, a JSON with a bad field, a dir."""
    d = tmp_path_factory.mktemp("bad")
    (d / "empty.txt").write_text("")
    (d / "empty.json").write_text("")
    (d / "bin.dat").write_bytes(bytes(range(256)) * 4)
    (d / "prose.txt").write_text("hello world\nthis is not a capture\n")
    (d / "broken.json").write_text("{bad json")
    (d / "field.json").write_text('{"schema": "rayaccel.topology/1", "devices": [{"index": "x"}]}')
    (d / "list.json").write_text("[1, 2]")
    (d / "schema.json").write_text('{"schema": "other/9"}')
    (d / "adir").mkdir()
    (d / "adir.svg").mkdir()
    catalog.load("dgx1-v100").save(d / "good.json")
    return d


def _capture(data_dir: Path) -> str:
    return str(data_dir / "captures" / "13_dgx1-v100-8gpu-4mlx5-microway.txt")


# (args with {bad} / {capture} placeholders, what the one error line must contain)
CASES = [
    # ---- topo show
    (["topo", "show", "-t", "nosuch"], "is not a catalog machine"),
    (["topo", "show", "-t", "dgx1"], "did you mean"),
    (["topo", "show", "-t", "{bad}/missing.json"], "not a file"),
    (["topo", "show", "-t", "{bad}/adir"], "is a directory; expected a topology JSON file or a text capture"),
    (["topo", "show", "-t", "{bad}/empty.txt"], "empty capture; expected the text output of one of"),
    (["topo", "show", "-t", "{bad}/empty.json"], "empty file; expected a topology JSON object"),
    (["topo", "show", "-t", "{bad}/bin.dat"], "not a text file (expected a topology JSON file or a text capture)"),
    (["topo", "show", "-t", "{bad}/prose.txt"], "line 1: not a recognised capture"),
    (["topo", "show", "-t", "{bad}/broken.json"], "not valid JSON"),
    (["topo", "show", "-t", "{bad}/field.json"], "devices[0].index: expected int"),
    (["topo", "show", "-t", "{bad}/list.json"], "expected a JSON object, got list"),
    (["topo", "show", "-t", "{bad}/schema.json"], "schema: expected 'rayaccel.topology/1'"),
    (["topo", "show", "-t", ""], "empty topology source"),
    (["topo", "show", "--backend", "nosuch"], "unknown backend 'nosuch' (registered:"),
    (["topo", "show", "--backend", "nvidia"], "No accelerators found here"),
    (["topo", "show", "-t", "dgx1-v100", "--backend", "nvidia"], "exclude each other"),
    (["topo", "show", "-t", "dgx1-v100", "--svg", "{bad}/x.png"], "the file name must end in .svg"),
    (["topo", "show", "-t", "dgx1-v100", "--png", "{bad}/x.svg"], "the file name must end in .png"),
    (["topo", "show", "-t", "dgx1-v100", "--png", "{bad}/x"], "the file name must end in .png"),
    (["topo", "show", "-t", "dgx1-v100", "--svg", "{bad}/adir.svg"], "is a directory; expected a file name"),
    (["topo", "show", "-t", "dgx1-v100", "--png", "/proc/rayaccel-test.png"], "cannot write the picture"),
    (["topo", "show", "-t", "dgx1-v100", "--svg", "/proc/rayaccel-test.svg"], "cannot write the picture"),
    (["topo", "show", "--bogus"], "No such option: --bogus"),
    # ---- topo import
    (["topo", "import"], "Missing argument 'FILE...'"),
    (["topo", "import", "{bad}/missing.txt"], "no such file; expected a capture file"),
    (["topo", "import", "{bad}/adir"], "is a directory; expected a capture file"),
    (["topo", "import", "{bad}/empty.txt"], "empty capture"),
    (["topo", "import", "{bad}/bin.dat"], "not a text file"),
    (["topo", "import", "{bad}/prose.txt"], "not a recognised capture"),
    (["topo", "import", "{bad}/good.json", "{bad}/good.json"], "a topology JSON file must be given alone"),
    (["topo", "import", "{capture}", "{bad}/good.json"], "a topology JSON file must be given alone"),
    (["topo", "import", "{capture}", "{bad}/missing.txt"], "missing.txt: no such file"),
    (["topo", "import", "{capture}", "--name", ""], "--name: empty"),
    (["topo", "import", "{capture}", "--png", "/proc/rayaccel-test.png"], "cannot write the picture"),
    (["topo", "import", "{capture}", "--svg", "x.txt"], "the file name must end in .svg"),
    # ---- topo backends / list
    (["topo", "backends", "--bogus"], "No such option: --bogus"),
    (["topo", "list", "extra"], "Got unexpected extra argument"),
    # ---- topo path
    (["topo", "path"], "Missing argument 'A'"),
    (["topo", "path", "0", "-t", "dgx1-v100"], "Missing argument 'B'"),
    (["topo", "path", "0", "99", "-t", "dgx1-v100"], "has no device 99"),
    (["topo", "path", "x", "2", "-t", "dgx1-v100"], "A: cannot read 'x'; expected a device index"),
    (["topo", "path", "0", ":", "-t", "dgx1-v100"], "B: cannot read ':'"),
    (["topo", "path", "-t", "dgx1-v100", "--", "-1", "2"], "device must be an index >= 0"),
    (["topo", "path", "0", "1", "-t", "dgx1-v100", "--bytes", "-5"], "--bytes: cannot read '-5' as a size"),
    (["topo", "path", "0", "1", "-t", "dgx1-v100", "--bytes", "lots"], "allowed: bytes as an int"),
    (["topo", "path", "0", "1", "-t", "nosuch"], "is not a catalog machine"),
    (["topo", "path", "0", "nodeB:1", "-t", "dgx1-v100", "--remote-topology", "nosuch"], "is not a catalog machine"),
    (["topo", "path", "0", "1", "-t", "{bad}/adir"], "is a directory"),
    # ---- plan
    (["plan"], "give exactly one of --topology (one machine) or --cluster"),
    (["plan", "-t", "nosuch"], "is not a catalog machine"),
    (["plan", "-t", "{bad}/bin.dat"], "not a text file"),
    (["plan", "-t", "{bad}/broken.json"], "not valid JSON"),
    (["plan", "-t", "dgx1-v100", "--gpus", "-1"], "gpus: must be >= 0"),
    (["plan", "-t", "dgx1-v100", "--gpus", "abc"], "Invalid value for '--gpus'"),
    (["plan", "-t", "dgx1-v100", "--gpus", "0"], "gpus: 0 devices asked"),
    (["plan", "-t", "dgx1-v100", "--busy", "x"], "--busy: cannot read 'x'; expected device indices"),
    (["plan", "-t", "dgx1-v100", "--busy", "5-2"], "--busy: range '5-2' runs backwards"),
    (["plan", "-t", "dgx1-v100", "--busy", "1-"], "--busy: cannot read '1-'"),
    (["plan", "-t", "dgx1-v100", "--busy", "99"], "no device 99"),
    (["plan", "-t", "dgx1-v100", "--gpu-memory", "lots"], "gpu_memory: cannot read 'lots' as a size"),
    (["plan", "-t", "dgx1-v100", "--gpu-memory", "0"], "gpu_memory: must be > 0"),
    (["plan", "-t", "dgx1-v100", "--interconnect", "bogus"], "interconnect: unknown value 'bogus' (allowed:"),
    (["plan", "-t", "dgx1-v100", "--shared"], "needs gpu_memory"),
    (["plan", "-t", "dgx1-v100", "--shared", "--gpus", "2", "--gpu-memory", "1GiB"], "a shared request uses one device"),
    (["plan", "-t", "dgx-a100", "--mig", "1g.5gb", "--gpus", "2"], "a MIG request takes one instance"),
    (["plan", "-t", "dgx-a100", "--mig", "1g.5gb", "--gpu-memory", "1GiB"], "cannot be combined with mig"),
    # ---- bench
    (["bench", "placement", "--which", "bogus"], "--which: unknown benchmark 'bogus'; expected one of"),
    (["bench", "bogus"], "No such command 'bogus'"),
    # ---- start / stop / status / demo: argument errors only (nothing is started)
    (["status", "--bogus"], "No such option: --bogus"),
    (["stop", "--bogus"], "No such option: --bogus"),
    (["demo", "--bogus"], "No such option: --bogus"),
    (["demo", "--quick", "--out"], "Option '--out' requires an argument"),
    # ---- top level
    (["bogus"], "No such command 'bogus'"),
    (["--bogus"], "No such option: --bogus"),
]


def _args(args: list[str], bad: Path, data_dir: Path) -> list[str]:
    return [a.replace("{bad}", str(bad)).replace("{capture}", _capture(data_dir)) for a in args]


def _assert_one_error_line(stderr: str, expect: str) -> None:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert "Traceback" not in stderr, stderr
    assert len(lines) == 1, f"expected one line on stderr, got:\n{stderr}"
    assert lines[0].startswith("error: "), lines[0]
    assert expect in lines[0], f"{expect!r} not in {lines[0]!r}"


@pytest.mark.parametrize("args, expect", CASES, ids=[" ".join(a) for a, _ in CASES])
def test_bad_input_gets_one_clear_error_line(args, expect, bad, data_dir, monkeypatch):
    monkeypatch.delenv("RAYACCEL_TOPOLOGY", raising=False)
    r = runner.invoke(app, _args(args, bad, data_dir))
    assert r.exit_code == 2, (r.exit_code, r.stderr)
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    assert r.stdout == "", f"nothing on stdout when the input is bad:\n{r.stdout}"
    _assert_one_error_line(r.stderr, expect)


def test_no_args_shows_help_and_exits_2():
    r = runner.invoke(app, ["topo"])
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert "show" in r.stdout and "import" in r.stdout


def test_main_with_argv_converts_errors(capsys, bad, monkeypatch):
    monkeypatch.delenv("RAYACCEL_TOPOLOGY", raising=False)
    with pytest.raises(SystemExit) as e:
        main(["topo", "show", "-t", str(bad / "broken.json")])
    assert e.value.code == 2
    _assert_one_error_line(capsys.readouterr().err, "not valid JSON")


def test_markup_in_a_message_is_printed_literally(tmp_path):
    """A path with [brackets] must not be eaten as rich markup."""
    weird = tmp_path / "[bold]x"
    weird.mkdir()
    r = runner.invoke(app, ["topo", "show", "-t", str(weird)])
    assert r.exit_code == 2
    _assert_one_error_line(r.stderr, "[bold]x: is a directory")


def test_nothing_is_printed_before_a_picture_fails():
    """An unwritable --png fails before the (otherwise good) JSON is printed: a script sees no half result."""
    r = runner.invoke(app, ["topo", "show", "-t", "dgx1-v100", "--json", "--png", "/proc/rayaccel-test.png"])
    assert r.exit_code == 2 and r.stdout == ""


def test_unsatisfiable_plan_is_an_answer_not_an_error():
    """A request the machine cannot meet is a Rejection with reasons on stdout, exit code 1."""
    r = runner.invoke(app, ["plan", "-t", "dgx1-v100", "--gpus", "99"])
    assert r.exit_code == 1 and "cannot place 99 GPUs" in r.stdout and "the node has 8 devices" in r.stdout
    assert "Traceback" not in r.output


SCRIPT_CASES = [
    (["topo", "show", "-t", "{bad}/bin.dat"], "not a text file"),
    (["topo", "show", "-t", "dgx1-v100", "--png", "/proc/rayaccel-test.png"], "cannot write the picture"),
    (["plan", "-t", "dgx1-v100", "--gpus", "abc"], "Invalid value for '--gpus'"),
    (["topo", "import", "{bad}/good.json", "{bad}/good.json"], "must be given alone"),
]


@pytest.mark.skipif(shutil.which("rayaccel") is None, reason="the rayaccel script is not installed (pip install -e .)")
@pytest.mark.parametrize("args, expect", SCRIPT_CASES, ids=[" ".join(a) for a, _ in SCRIPT_CASES])
def test_installed_script_never_prints_a_traceback(args, expect, bad, data_dir):
    env = {k: v for k, v in os.environ.items() if k != "RAYACCEL_TOPOLOGY"}
    p = subprocess.run(["rayaccel", *_args(args, bad, data_dir)], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2, (p.returncode, p.stderr)
    _assert_one_error_line(p.stderr, expect)


def test_python_m_entry_point_matches_the_script(bad):
    """``python -c 'rayaccel.cli.main()'`` behaves like the script (same converter)."""
    p = subprocess.run([sys.executable, "-c", "from rayaccel.cli import main; main()", "topo", "show", "-t",
                        str(bad / "adir")], capture_output=True, text=True, timeout=120)
    assert p.returncode == 2
    _assert_one_error_line(p.stderr, "is a directory")
