"""The simulated backend: RAYACCEL_TOPOLOGY / source -> load_topology."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.simulated import SimulatedBackend
from rayaccel.errors import BackendUnavailable, CatalogError
from rayaccel.topology import Device, NodeTopology

DATA = Path(__file__).parent.parent / "data"


def test_unset_is_unavailable_with_hint():
    b = SimulatedBackend()
    info = b.available()
    assert not info.available and "RAYACCEL_TOPOLOGY is not set" in info.reason and "catalog name" in info.hint
    with pytest.raises(BackendUnavailable, match="RAYACCEL_TOPOLOGY"):
        b.discover()


def test_topology_object_source():
    t = NodeTopology(devices=(Device(0), Device(1))).validate()
    b = SimulatedBackend(t)
    assert b.available().available and b.discover() is t


def test_catalog_name_from_env(monkeypatch):
    import rayaccel.catalog as catalog
    name = catalog.DEFAULT
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", name)
    b = SimulatedBackend()
    assert b.available().available
    assert b.discover() == catalog.load(name)


def test_json_file(tmp_path, monkeypatch):
    t = NodeTopology(devices=(Device(0, model="X"), Device(1, model="X"))).validate()
    p = tmp_path / "machine.json"
    t.save(p)
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", str(p))
    assert SimulatedBackend().discover().devices == t.devices


def test_capture_files(monkeypatch):
    caps = sorted((DATA / "captures").glob("01_*.txt"))
    if not caps:
        pytest.skip("capture 01 not in tests/data/captures")
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", str(caps[0]))
    t = SimulatedBackend().discover()
    assert len(t.devices) == 8


def test_missing_file_is_unavailable(tmp_path):
    info = SimulatedBackend(str(tmp_path / "nope.json")).available()
    assert not info.available and "no such file" in info.reason


def test_unknown_catalog_name_names_close_ones(monkeypatch):
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", "dgx1-v10")
    with pytest.raises(CatalogError, match="dgx1-v100"):
        SimulatedBackend().discover()
