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
