"""load_topology: catalog names, topology JSON files, capture files and capture text."""

from __future__ import annotations

import json

import pytest

import rayaccel
from rayaccel import catalog
from rayaccel.discovery.load import CaptureWarning, load_topology, load_topology_with_warnings
from rayaccel.errors import CaptureError, CatalogError, RayaccelError, TopologyError
from rayaccel.topology import NodeTopology

DGX1_CAPTURE = "13_dgx1-v100-8gpu-4mlx5-microway.txt"
MIG_L = "44_mig-L-jasmin-a100sxm4-40gb-2gpu-1g10gb.txt"
MIG_LGIP = "57_mig-lgip-a100-40gb-2gpu-all-used.txt"


@pytest.fixture
def captures(data_dir):
    return data_dir / "captures"


def test_top_level_load_topology_is_this_function():
    assert rayaccel.load_topology is load_topology
    assert "load_topology" in rayaccel.__all__


@pytest.mark.parametrize("name", catalog.names())
def test_catalog_name(name):
    assert load_topology(name) is catalog.load(name)


def test_topology_json_file(tmp_path):
    path = tmp_path / "machine.json"
    catalog.load("hgx-h100").save(path)
    assert load_topology(path) == catalog.load("hgx-h100")
    assert load_topology(str(path)) == catalog.load("hgx-h100")


def test_json_without_json_suffix(tmp_path):
    path = tmp_path / "machine.topo"
    path.write_text(catalog.load("l40s-4x-pcie").to_json())
    assert load_topology(path) == catalog.load("l40s-4x-pcie")


@pytest.mark.parametrize(
    "mutate,field",
    [
        (lambda d: d["devices"][2].pop("index"), "devices[2].index"),
        (lambda d: d["devices"][0].__setitem__("numa_node", "zero"), "devices[0].numa_node"),
        (lambda d: d["links"][1].__setitem__("kind", "infiniband"), "links[1].kind"),
        (lambda d: d["links"][0].__setitem__("pcie", "PCIX"), "links[0].pcie"),
        (lambda d: d.__setitem__("schema", "other/1"), "schema"),
        (lambda d: d["devices"][0].__setitem__("cpus", [0, "1"]), "devices[0].cpus"),
    ],
    ids=["missing-index", "bad-numa", "bad-kind", "bad-pcie", "bad-schema", "bad-cpus"],
)
def test_malformed_json_file_names_file_and_field(tmp_path, mutate, field):
    data = catalog.load("dgx1-v100").to_dict()
    mutate(data)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(TopologyError) as e:
        load_topology(path)
    assert str(path) in str(e.value) and field in str(e.value)


def test_broken_json_syntax_names_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"schema": "rayaccel.topology/1",\n "devices": [,]}\n')
    with pytest.raises(TopologyError, match=r"broken.json: not valid JSON: .* line 2"):
        load_topology(path)


def test_capture_file(captures):
    topo = load_topology(captures / DGX1_CAPTURE)
    assert len(topo) == 8 and topo.link(0, 3).label == "NV2" and topo.link(0, 5).label == "SYS"
    assert topo.validate() is topo


def test_capture_file_with_name(captures):
    topo = load_topology(captures / DGX1_CAPTURE, name="box-7")
    assert topo.name == "box-7"


def test_several_captures_combine(captures):
    topo, warns = load_topology_with_warnings([captures / MIG_L, captures / MIG_LGIP])
    dev = topo.device(0)
    assert [p.profile for p in dev.partitions] == ["1g.10gb"]
    assert dev.partitions[0].uuid.startswith("MIG-")
    assert dev.profile("3g.20gb") is not None and dev.profile("3g.20gb").slots == 4
    assert all(isinstance(w, str) for w in warns)


def test_single_item_list_is_like_the_item():
    assert load_topology(["dgx2-v100"]) is catalog.load("dgx2-v100")


def test_capture_text(captures):
    text = (captures / DGX1_CAPTURE).read_text()
    assert load_topology(text).link(0, 3).label == "NV2"


def test_warnings_returned_and_emitted(captures, caplog):
    topo, warns = load_topology_with_warnings(captures / MIG_LGIP)
    assert warns and any("placements" in w for w in warns)
    with pytest.warns(CaptureWarning, match="placements"):
        again = load_topology(captures / MIG_LGIP)
    assert again == topo
    assert any("placements" in r.getMessage() for r in caplog.records)


def test_unknown_name_not_a_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CatalogError) as e:
        load_topology("hgx-h10")
    msg = str(e.value)
    assert "not a catalog machine" in msg and "did you mean 'hgx-h100'" in msg and "not a file" in msg
    assert str(tmp_path / "hgx-h10") in msg


def test_directory_is_rejected(tmp_path):
    with pytest.raises(TopologyError, match="is a directory"):
        load_topology(tmp_path)


def test_binary_file_is_rejected(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(b"\xff\xfe\x00\x81" * 10)
    with pytest.raises(TopologyError, match="not a text file"):
        load_topology(path)


def test_garbage_text_file_is_a_capture_error(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("hello\nthis is not a capture\n")
    with pytest.raises(CaptureError) as e:
        load_topology(path)
    assert "notes.txt" in str(e.value)


@pytest.mark.parametrize("bad", [[], 42, None], ids=["empty-list", "int", "none"])
def test_bad_source_types(bad):
    with pytest.raises(RayaccelError):
        load_topology(bad)


def test_list_with_missing_file(captures, tmp_path):
    with pytest.raises(CaptureError, match="not a file"):
        load_topology([captures / DGX1_CAPTURE, tmp_path / "missing.txt"])


def test_result_is_a_node_topology_for_every_kind(tmp_path, captures):
    path = tmp_path / "t.json"
    catalog.load("trn1-32xlarge").save(path)
    for src in ("trn1-32xlarge", path, captures / "68_neuron-ls-trn1.32xlarge-16dev-collapsed-whitespace.txt"):
        topo = load_topology(src)
        assert isinstance(topo, NodeTopology) and len(topo) == 16


# ---------------------------------------------------------------- per-lane speed override (Link.lane_gbps)
def _one_link_json(tmp_path, **link):
    t = catalog.load("a100-pcie-2x-nvbridge").to_dict()
    t["links"] = [{"a": 0, "b": 1, "kind": "nvlink", "count": 12, "pcie": "SYS", **link}]
    path = tmp_path / "t.json"
    path.write_text(json.dumps(t))
    return path


@pytest.mark.parametrize("lane, why", [
    (0, "must be a number > 0"), (-5, "must be a number > 0"), ("fast", "expected int or float"),
    (True, "expected int or float"),
], ids=["zero", "negative", "string", "bool"])
def test_bad_lane_gbps_names_the_field(tmp_path, lane, why):
    with pytest.raises(TopologyError, match=why) as e:
        load_topology(_one_link_json(tmp_path, lane_gbps=lane))
    assert "links[0].lane_gbps" in str(e.value)


def test_lane_gbps_only_on_direct_links(tmp_path):
    with pytest.raises(TopologyError, match="only direct links"):
        load_topology(_one_link_json(tmp_path, kind="pcie", count=None, lane_gbps=50))


def test_lane_gbps_round_trips_and_is_written_only_when_set(tmp_path):
    topo = load_topology(_one_link_json(tmp_path, lane_gbps=50))
    assert topo.link(0, 1).lane_gbps == 50.0 and topo.bandwidth_gbps(0, 1) == 600.0
    assert topo.to_dict()["links"][0]["lane_gbps"] == 50.0
    assert "lane_gbps" not in load_topology(_one_link_json(tmp_path)).to_dict()["links"][0]
    assert NodeTopology.from_json(topo.to_json()) == topo


# ---------------------------------------------------------------- bad sources name what is wrong
@pytest.mark.parametrize("source, why", [
    ("", "empty topology source"), ("   ", "empty topology source"),
    ([1, 2], "source 0: expected a capture file path or capture text, got int"),
], ids=["empty", "blank", "list-of-ints"])
def test_bad_source_messages(source, why):
    with pytest.raises(TopologyError, match=why):
        load_topology(source)


def test_name_must_be_a_string():
    with pytest.raises(TopologyError, match="name: expected a str"):
        load_topology("dgx1-v100", name=5)


def test_json_file_cannot_be_combined_with_captures(tmp_path, captures):
    path = tmp_path / "t.json"
    catalog.load("dgx1-v100").save(path)
    with pytest.raises(TopologyError, match="must be given alone"):
        load_topology([captures / DGX1_CAPTURE, path])


def test_empty_json_file(tmp_path):
    (tmp_path / "e.json").write_text("")
    with pytest.raises(TopologyError, match="empty file; expected a topology JSON object"):
        load_topology(tmp_path / "e.json")
