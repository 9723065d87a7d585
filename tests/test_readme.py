"""The README's examples run as written.

Every ```python block runs in a fresh interpreter (with a private Ray temp dir and
rayaccel state dir; blocks that start Ray start their own embedded cluster). Every
offline ``rayaccel topo`` / ``rayaccel plan`` command line of the ```bash blocks runs
too, with the exit code it is expected to have (0 unless :data:`EXIT` says otherwise).
Everything runs in a temporary directory, never in the repository: the files a command
reads from the repository (``tests/data/captures/...``) are copied there first, and the
pictures it draws (``--png``, ``--svg``) must appear there. A block preceded by
``<!-- not run: why -->`` is skipped (none is today).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
_BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*)?```(\w+)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[int, str]]:
    text = README.read_text()
    out = []
    for m in _BLOCK.finditer(text):
        if m.group(2) == lang and not m.group(1):
            out.append((text[:m.start()].count("\n") + 1, m.group(3)))
    return out


def _env(tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAYACCEL_TOPOLOGY", "PYTHONPATH")}
    (tmp / "ray").mkdir(parents=True, exist_ok=True)
    state = Path(tempfile.mkdtemp(prefix="rdme-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
    env.update(RAY_TMPDIR=str(tmp), RAYACCEL_STATE_DIR=str(state), RAY_AUTH_MODE="disabled",
               RAY_USAGE_STATS_ENABLED="0")
    return env


PY = blocks("python")
OFFLINE = ("rayaccel topo ", "rayaccel plan ")
COMMANDS = [(line_no, line.split("#")[0].strip()) for line_no, b in blocks("bash") for line in b.splitlines()
            if line.strip().startswith(OFFLINE)]


#: Commands of the README that exit with something other than 0, and why.
EXIT = {
    # hgx-h100 has a MIG table but no instance: a Rejection, and the layout that would fit (a dry run)
    "rayaccel plan -t hgx-h100 --mig 3g.40gb --json": 1,
}
#: Depends on this machine: 0 with accelerators, else 2 with a hint (CI and this test run without GPUs).
THIS_MACHINE = "rayaccel topo show"
OUTPUTS = ("--png", "--svg", "--out")


def test_the_readme_has_examples():
    assert len(PY) >= 6 and len(COMMANDS) >= 6
    commands = {c for _, c in COMMANDS}
    assert set(EXIT) <= commands, f"EXIT names commands the README no longer has: {sorted(set(EXIT) - commands)}"
    assert THIS_MACHINE in commands


@pytest.mark.ray
@pytest.mark.parametrize("line,code", PY, ids=[f"line-{n}" for n, _ in PY])
def test_python_example_runs(line, code):
    tmp = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))  # short: Ray's socket paths
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(tmp),
                       cwd=tmp)
    assert r.returncode == 0, f"README line {line}:\n{code}\n--- stderr ---\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("line,cmd", COMMANDS, ids=[c for _, c in COMMANDS])
def test_shell_example_runs(line, cmd, tmp_path):
    argv = shlex.split(cmd)
    work = tmp_path / "work"
    work.mkdir()
    outputs = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a in OUTPUTS]
    for a in argv[1:]:  # files of the repository the command reads, at the same relative path
        src = REPO / a
        if not a.startswith("-") and a not in outputs and "/" in a and src.is_file():
            (work / a).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, work / a)
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", *argv[1:]], capture_output=True, text=True,
                       timeout=120, env=_env(tmp_path), cwd=work)
    assert "Traceback" not in r.stderr
    if cmd == THIS_MACHINE and r.returncode == 2:  # no accelerator here
        assert "No accelerators found" in r.stderr and "--topology dgx1-v100" in r.stderr
        return
    expected = EXIT.get(cmd, 0)
    assert r.returncode == expected, f"README line {line}: {cmd}: exit {r.returncode}, expected {expected}\n{r.stderr[-2000:]}"
    if cmd == "rayaccel plan -t hgx-h100 --mig 3g.40gb --json":
        assert "nvidia-smi mig -i " in r.stdout  # the README's promise: the commands of a layout that fits
    for out in outputs:
        assert (work / out).is_file() and (work / out).stat().st_size > 0, f"{cmd} drew no {out}"
