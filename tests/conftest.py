"""Shared test fixtures.

Autouse: vendor visibility variables are cleared so nothing the host sets leaks
into a test, and Ray runs without token auth in a private temp dir.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"
VISIBILITY_VARS = (
    "CUDA_VISIBLE_DEVICES",
    "HIP_VISIBLE_DEVICES",
    "ROCR_VISIBLE_DEVICES",
    "NEURON_RT_VISIBLE_CORES",
    "TPU_VISIBLE_CHIPS",
    "TPU_CHIPS_PER_HOST_BOUNDS",
    "TPU_HOST_BOUNDS",
    "HABANA_VISIBLE_MODULES",
    "ASCEND_RT_VISIBLE_DEVICES",
    "RAYACCEL_TOPOLOGY",
)

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")


@pytest.fixture(autouse=True)
def _clean_accelerator_env(monkeypatch):
    for var in VISIBILITY_VARS:
        monkeypatch.delenv(var, raising=False)
    yield


@pytest.fixture
def data_dir() -> Path:
    return DATA


# ------------------------------------------------------------------ skips are declared
#: Every skip this suite may take, as a pattern over its reason, with why it is expected. A skip whose
#: reason matches none fails the run (a broken import or a missing install step must not pass as a skip).
DECLARED_SKIPS: dict[str, str] = {
    r"not an NVIDIA machine": "FakeNVML round trips run over NVIDIA catalog machines only",
    r"not an NVIDIA capture": "FakeNVML round trips run over NVIDIA captures only",
    r"not an AMD (machine|capture)": "FakeAmdSmi round trips run over AMD machines and captures only",
    r"capture rejected by the importer \(tested there\)": "captures the importer refuses are tested by its own tests",
    r"not a topology NVML could report": "a capture beyond NVML's limits (NVML_NVLINK_MAX_LINKS)",
    r"root may write anywhere": "read-only paths do not stop root",
    r"torch is not installed": "the tensor transport's checks need torch (scripts/ray_matrix.py --quick installs none; "
                               "CI and the full matrix do)",
    r"tmux": "the live `top` test needs tmux (.ci/run installs it)",
    r"Ray \S+ does not carry": "a Ray feature the installed release lacks (docs/compatibility-ray.md; .ci/ray-oldest "
                               "runs the Ray tests on 2.48)",
}

_SKIPS: list[tuple[str, str]] = []


def pytest_runtest_logreport(report):
    if report.skipped and not hasattr(report, "wasxfail"):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        _SKIPS.append((report.nodeid, reason.removeprefix("Skipped: ")))


def _undeclared() -> list[tuple[str, str]]:
    import re

    return [(n, r) for n, r in _SKIPS if not any(re.search(p, r) for p in DECLARED_SKIPS)]


def pytest_sessionfinish(session, exitstatus):
    if _undeclared() and exitstatus == 0:
        session.exitstatus = 1


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if not _SKIPS:
        return
    import collections
    import re

    counts = collections.Counter(next((p for p in DECLARED_SKIPS if re.search(p, r)), "UNDECLARED") for _, r in _SKIPS)
    terminalreporter.write_line(f"skipped: {len(_SKIPS)} test(s), by declared reason: "
                                + "; ".join(f"{n} x {p!r}" for p, n in counts.most_common()))
    bad = _undeclared()
    if bad:
        terminalreporter.write_line(f"error: {len(bad)} skip(s) nobody declared (tests/conftest.py DECLARED_SKIPS); "
                                    "fix the cause or declare the skip with why:", red=True)
        for nodeid, reason in bad[:50]:
            terminalreporter.write_line(f"  {nodeid}: {reason[:200]}", red=True)
