"""The suite's skip policy (tests/conftest.py): a skip nobody declared fails the run; declared ones are counted."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

CONFTEST = Path(__file__).with_name("conftest.py")


def _run(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    shutil.copy(CONFTEST, tmp_path / "conftest.py")
    (tmp_path / "test_x.py").write_text("import pytest\n\n\ndef test_a():\n" + body)
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)


def test_an_undeclared_skip_fails_the_run_and_is_named(tmp_path):
    r = _run(tmp_path, "    pytest.skip('the module did not import')\n")
    assert r.returncode == 1, r.stdout
    assert "1 skip(s) nobody declared" in r.stdout and "the module did not import" in r.stdout


def test_a_declared_skip_passes_and_is_counted(tmp_path):
    r = _run(tmp_path, "    pytest.skip('root may write anywhere')\n")
    assert r.returncode == 0, r.stdout
    assert "skipped: 1 test(s), by declared reason: 1 x 'root may write anywhere'" in r.stdout
