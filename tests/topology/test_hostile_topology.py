"""Hostile topologies (issue 10): every numeric field is bounded and named, deep nesting and
huge names are errors, never a crash of whatever reads the topology later."""

from __future__ import annotations

import json

import pytest

from rayaccel import catalog
from rayaccel.discovery.load import load_topology
from rayaccel.errors import CatalogError, RayaccelError, TopologyError
from rayaccel.topology import NodeTopology

BIG = 10**400


def _base() -> dict:
    return catalog.load("a100-mig").to_dict()


def _set(path: str, value):
    """A mutator of the a100-mig dict setting ``path`` (dots and [k] indexes) to ``value``."""
    def mutate(d: dict) -> None:
        keys = path.replace("]", "").replace("[", ".").split(".")
        obj = d
        for k in keys[:-1]:
            obj = obj[int(k)] if k.isdigit() else obj[k]
        last = keys[-1]
        obj[int(last) if last.isdigit() else last] = value
    return mutate


def _nic(d: dict) -> None:
    d["nics"] = [{"name": "mlx5_0", "numa_node": BIG, "paths": {"0": "PIX"}}]


def _nic_key(d: dict) -> None:
    d["nics"] = [{"name": "mlx5_0", "paths": {str(10**30): "PIX"}}]


def _link(**kw):
    def mutate(d: dict) -> None:
        two = catalog.load("a100-pcie-2x-nvbridge").to_dict()
        d.clear()
        d.update(two)
        d["links"] = [{"a": 0, "b": 1, "kind": "nvlink", "count": 12, "pcie": "SYS", **kw}]
    return mutate


FIELDS = [
    (_set("devices[0].memory_bytes", BIG), "devices[0].memory_bytes"),
    (_set("devices[0].memory_bytes", 1 << 63), "devices[0].memory_bytes"),
    (_set("devices[0].index", BIG), "devices[0].index"),
    (_set("devices[0].numa_node", BIG), "devices[0].numa_node"),
    (_set("devices[0].numa_node", -1), "devices[0].numa_node"),
    (_set("devices[0].cpus", [0, BIG]), "devices[0].cpus[1]"),
    (_set("devices[0].partitions[0].memory_bytes", BIG), "devices[0].partitions[0].memory_bytes"),
    (_set("devices[0].partitions[0].start", 10**9), "devices[0].partitions[0].start"),
    (_set("devices[0].partitions[0].size", 0), "devices[0].partitions[0].size"),
    (_set("devices[0].partitions[0].gi_id", BIG), "devices[0].partitions[0].gi_id"),
    (_set("devices[0].partitions[0].sms", -3), "devices[0].partitions[0].sms"),
    (_set("devices[0].mig_profiles[0].memory_mib", BIG), "devices[0].mig_profiles[0].memory_mib"),
    (_set("devices[0].mig_profiles[0].slots", BIG), "devices[0].mig_profiles[0].slots"),
    (_set("devices[0].mig_profiles[0].max_instances", BIG), "devices[0].mig_profiles[0].max_instances"),
    (_set("devices[0].mig_profiles[0].placements", [0, BIG]), "devices[0].mig_profiles[0].placements[1]"),
    (_set("devices[0].mig_profiles[0].id", -1), "devices[0].mig_profiles[0].id"),
    (_set("devices[0].model", "m" * 100_000), "devices[0].model"),
    (_set("sources", [1, 2]), "sources[0]"),
    (_link(count=BIG), "links[0].count"),
    (_link(lane_gbps=1e300), "links[0].lane_gbps"),
    (_nic, "nics[0].numa_node"),
    (_nic_key, "nics[0].paths[0]"),
]


@pytest.mark.parametrize("mutate, field", FIELDS, ids=[f for _, f in FIELDS])
def test_every_numeric_field_is_bounded_and_named(mutate, field, tmp_path):
    d = _base()
    mutate(d)
    with pytest.raises(TopologyError) as e:
        NodeTopology.from_dict(d)
    assert field in str(e.value)
    assert len(str(e.value)) < 300  # the bad value is shortened, not echoed whole
    path = tmp_path / "t.json"
    path.write_text(json.dumps(d))
    with pytest.raises(TopologyError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load_topology(path)


def test_too_many_devices():
    d = _base()
    dev = d["devices"][0]
    d["devices"] = [{**dev, "index": i, "partitions": []} for i in range(1025)]
    with pytest.raises(TopologyError, match="devices: 1025 entries, at most 1024"):
        NodeTopology.from_dict(d)


@pytest.mark.parametrize("text", ["[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000],
                         ids=["arrays", "objects"])
def test_deeply_nested_json_is_a_topology_error(text, tmp_path):
    with pytest.raises(TopologyError, match="nested too deeply"):
        NodeTopology.from_json(text)
    path = tmp_path / "deep.json"
    path.write_text(text)
    with pytest.raises(TopologyError, match="deep.json: not a topology: JSON nested too deeply"):
        load_topology(path)


@pytest.mark.parametrize("text", ['{"schema": NaN}', '{"schema": Infinity}', '{"x": ' + "1" * 5000 + "}"],
                         ids=["nan", "infinity", "5000-digit-int"])
def test_non_finite_and_giant_numbers_are_rejected(text):
    with pytest.raises(TopologyError, match="not valid JSON"):
        NodeTopology.from_json(text)


@pytest.mark.parametrize("source", ["x" * 5000, "x/" * 2500, "[" * 100_000], ids=["5000", "5000-slashes", "brackets"])
def test_huge_source_names_are_one_short_error(source):
    with pytest.raises(CatalogError) as e:
        load_topology(source)
    msg = str(e.value)
    assert "is not a catalog machine" in msg and "not a file" in msg and len(msg) < 600


def test_huge_environment_topology(monkeypatch):
    from rayaccel.discovery import discover
    monkeypatch.setenv("RAYACCEL_TOPOLOGY", "x" * 5000)
    with pytest.raises(RayaccelError, match="too long for a file name"):
        discover()
    from rayaccel.discovery.registry import backend_infos

    sim = {i.name: i for i in backend_infos()}["simulated"]
    assert isinstance(sim.available, bool)  # answered, did not raise


def test_device_node_is_not_a_file():
    with pytest.raises(TopologyError, match="not a regular file"):
        load_topology("/dev/null")
