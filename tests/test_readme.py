"""The README's and the documentation's examples run as written.

Every ```python block of README.md and of docs/*.md runs in a fresh interpreter (with a private
Ray temp dir and rayaccel state dir; blocks that start Ray start their own embedded cluster). Every
offline ``rayaccel topo`` / ``rayaccel plan`` command line of their ```bash blocks runs too, with
the exit code it is expected to have (0 unless :data:`EXIT` says otherwise). Test ids name the file
and line. Everything runs in a temporary directory, never in the repository: the files a command
reads from the repository (``tests/data/captures/...``) are copied there first, and the pictures it
draws (``--png``, ``--svg``) must appear there. A block preceded by ``<!-- not run: why -->`` is
skipped (none is today).

The README's own links (to its sections and to docs/ pages and their headings) must resolve too;
the pages' links are checked by ``mkdocs build --strict``.
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
#: Every page whose examples run: the README first, then the documentation site's pages.
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
_BLOCK = re.compile(r"(<!-- not run: [^>]*-->\s*)?```(\w+)\n(.*?)```", re.S)


def blocks(lang: str) -> list[tuple[str, int, str]]:
    """(page relative to the repository, line of the opening fence, code) of every ``lang`` block run."""
    out = []
    for page in PAGES:
        text = page.read_text()
        for m in _BLOCK.finditer(text):
            if m.group(2) == lang and not m.group(1):
                out.append((page.relative_to(REPO).as_posix(), text[:m.start(2)].count("\n") + 1, m.group(3)))
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
#: (page, line, command) of every offline command line of the bash blocks.
COMMANDS = [(page, line_no + i + 1, line.split("#")[0].strip()) for page, line_no, b in blocks("bash")
            for i, line in enumerate(b.splitlines()) if line.strip().startswith(OFFLINE)]
#: Python examples that start Ray take 10-20 s each (more on a loaded machine): the pages hold this many,
#: and no more -- the seven of the README before it was split into docs/, and docs/frameworks.md's two.
RAY_EXAMPLES = 9
_STARTS_RAY = ("rayaccel.init(", "ray.init(", "SimulatedCluster(")


#: Commands of the pages that exit with something other than 0, and why.
EXIT = {
    # hgx-h100 has a MIG table but no instance: a Rejection, and the layout that would fit (a dry run)
    "rayaccel plan -t hgx-h100 --mig 3g.40gb --json": 1,
}
#: Depends on this machine: 0 with accelerators, else 2 with a hint (CI and this test run without GPUs).
THIS_MACHINE = "rayaccel topo show"
OUTPUTS = ("--png", "--svg", "--out")


def test_the_pages_have_examples():
    assert len(PY) >= 6 and len(COMMANDS) >= 6
    commands = {c for _, _, c in COMMANDS}
    assert set(EXIT) <= commands, f"EXIT names commands the pages no longer have: {sorted(set(EXIT) - commands)}"
    assert THIS_MACHINE in commands
    slow = [f"{page}:{line}" for page, line, code in PY if any(s in code for s in _STARTS_RAY)]
    assert len(slow) <= RAY_EXAMPLES, f"{len(slow)} examples start Ray (each 10-20 s of every test run): {slow}"


def _slug(heading: str) -> str:
    """A heading's anchor, as GitHub and MkDocs' toc write it for the headings these pages use."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "").strip().lower())
    return re.sub(r"[\s-]+", "-", text).strip("-")


def _anchors(page: Path) -> set[str]:
    text = _BLOCK.sub("", page.read_text())  # a `# comment` in a code block is no heading
    return {_slug(m.group(1)) for m in re.finditer(r"^#{1,6} (.+)$", text, re.M)}


def test_the_readme_contents_list_every_section():
    text = _BLOCK.sub("", README.read_text())
    sections = re.findall(r"^## (.+)$", text, re.M)
    contents = text[text.index("## Contents"):].split("\n\n")[1]
    listed = re.findall(r"^- \[.+\]\(#([\w-]+)\)$", contents, re.M)
    assert listed == [_slug(h) for h in sections if h != "Contents"]


def test_the_readme_links_resolve():
    for target in re.findall(r"\]\(([^)\s]+)\)", README.read_text()):
        if re.match(r"[a-z]+://", target):
            continue
        path, _, anchor = target.partition("#")
        page = REPO / path if path else README
        assert page.is_file(), f"README links to {target}: no such file"
        if anchor:
            assert anchor in _anchors(page), f"README links to {target}: {page.name} has no heading {anchor!r}"


@pytest.mark.ray
@pytest.mark.parametrize("page,line,code", PY, ids=[f"{p}:{n}" for p, n, _ in PY])
def test_python_example_runs(page, line, code):
    tmp = Path(tempfile.mkdtemp(prefix="rd-", dir="/tmp"))  # short: Ray's socket paths
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=_env(tmp),
                       cwd=tmp)
    assert r.returncode == 0, f"{page} line {line}:\n{code}\n--- stderr ---\n{r.stderr[-4000:]}"


@pytest.mark.parametrize("page,line,cmd", COMMANDS, ids=[f"{p}:{n}: {c}" for p, n, c in COMMANDS])
def test_shell_example_runs(page, line, cmd, tmp_path):
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
    assert r.returncode == expected, f"{page} line {line}: {cmd}: exit {r.returncode}, expected {expected}\n{r.stderr[-2000:]}"
    if cmd == "rayaccel plan -t hgx-h100 --mig 3g.40gb --json":
        assert "nvidia-smi mig -i " in r.stdout  # the page's promise: the commands of a layout that fits
    for out in outputs:
        assert (work / out).is_file() and (work / out).stat().st_size > 0, f"{cmd} drew no {out}"
