"""A plugin is a whole accelerator: examples/acme-accelerator, installed for real (pip, into a temporary
directory, offline), declares a fictional accelerator that rayaccel discovers, places and advertises to Ray
with no change to Ray or rayaccel."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from rayaccel.discovery import ray_node_resources, ray_specs, registry
from rayaccel.placement import Rejection, choose_units, node_units, visible_env

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "acme-accelerator"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """``pip install --no-deps --no-build-isolation --target <tmp> examples/acme-accelerator``: a real install
    (a wheel built, its entry points written) that touches nothing outside the temporary directory."""
    target = tmp_path_factory.mktemp("acme-site")
    build = tmp_path_factory.mktemp("acme-build")
    source = shutil.copytree(EXAMPLE, build / "acme-accelerator",
                             ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))  # builds leave files
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                        "--no-index", "--target", str(target), str(source)],
                       capture_output=True, text=True, timeout=300, cwd=build,
                       env={**os.environ, "PIP_NO_CACHE_DIR": "1"})
    assert r.returncode == 0, r.stdout + r.stderr
    assert list(target.glob("acme_accelerator-*.dist-info/entry_points.txt"))
    sys.path.insert(0, str(target))
    registry._reset()
    try:
        yield target
    finally:
        sys.path.remove(str(target))
        for mod in [m for m in sys.modules if m == "acme_accelerator" or m.startswith("acme_accelerator.")]:
            del sys.modules[mod]
        registry._reset()


@pytest.fixture
def simulate(monkeypatch):
    monkeypatch.setenv("ACME_SIMULATE", "1")


def test_the_installed_plugin_is_a_backend_with_a_ray_spec(installed, simulate):
    b = registry.get_backend("acme")
    assert b.available().available
    spec = ray_specs()["acme"]
    assert (spec.resource, spec.unit, spec.visible_env) == ("ACME", "device", ("ACME_VISIBLE_DEVICES",))
    topo = registry.discover("acme")
    assert len(topo.devices) == 8 and {d.vendor for d in topo.devices} == {"acme"}


def test_without_its_hardware_it_says_why_and_what_to_do(installed, monkeypatch):
    monkeypatch.delenv("ACME_SIMULATE", raising=False)
    info = registry.get_backend("acme").available()
    assert not info.available and "ACME_SIMULATE" in info.reason and info.hint


def test_its_node_advertises_what_ray_would_and_places_on_best_linked_units(installed, simulate):
    topo = registry.discover("acme")
    spec = ray_specs()["acme"]
    resources, labels = ray_node_resources(topo)
    assert resources == {"ACME": 8.0, "accelerator_type:Acme-Tile-T4": 1.0}
    assert labels == {"ray.io/accelerator-type": "Acme-Tile-T4"}
    assert [u.id for u in node_units(topo, spec)] == list(range(8))
    free = {0, 1, 4, 5, 6, 7}  # Ray's lowest free 4 would be 0, 1, 4, 5: two quads over PCIe SYS
    got = choose_units(topo, spec, free, 4)
    assert sorted(got.units) == [4, 5, 6, 7] and got.ring  # one quad: every pair on AcmeLink
    assert visible_env(topo, spec, got.units) == {"ACME_VISIBLE_DEVICES": ",".join(map(str, got.units))}
    assert isinstance(choose_units(topo, spec, {0, 5}, 3), Rejection)


def test_rayaccel_cli_shows_the_plugin(installed):
    env = {**os.environ, "ACME_SIMULATE": "1",
           "PYTHONPATH": os.pathsep.join(p for p in (str(installed), os.environ.get("PYTHONPATH")) if p)}
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "topo", "backends", "--json"], capture_output=True,
                       text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["acme"]["available"] is True
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "topo", "show", "--backend", "acme", "--json"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["name"] == "acme-t4-8x" and data["links"][0]["kind"] == "direct"
    r = subprocess.run([sys.executable, "-m", "rayaccel.cli", "topo", "show", "--backend", "acme"],
                       capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 0 and "DL2" in r.stdout, r.stdout + r.stderr
