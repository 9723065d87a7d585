"""Importers of the accelerators beyond GPUs, field by field on real captures: neuron-ls, npu-smi, tpu-info, tpu-env."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures, parse_capture
from rayaccel.errors import CaptureError
from rayaccel.topology import Slice

CAPTURES = {p.name[:2]: p for p in (Path(__file__).parent.parent / "data" / "captures").glob("*.txt")}


def load(num: str):
    return import_captures([CAPTURES[num]])


# -------------------------------------------------------------------- neuron-ls
def test_neuron_229_core_ids_cpu_affinity_numa():
    t = load("88").topology
    d0, d4 = t.device(0), t.device(4)
    assert (d0.model, d0.cores, d0.memory_bytes, d0.numa_node) == ("Trainium2", 4, 96 << 30, 1)
    assert d0.cpus == tuple(range(48, 96)) + tuple(range(144, 192)) and d4.numa_node == 0
    assert d0.pci_bus_id == "0000:cc:00.0" and {l.kind for l in t.links} == {"neuronlink"}
    assert {b for l in t.links for b in (l.a, l.b) if 0 in (l.a, l.b)} - {0} == {12, 3, 4, 1}


def test_neuron_show_all_procs_continuation_rows_are_not_devices():
    t = load("89").topology
    assert t.indices == tuple(range(16)) and all(d.cores == 4 for d in t.devices)


def test_neuron_221_counts_the_logical_cores_ray_sees():
    t = load("91").topology
    assert {d.cores for d in t.devices} == {4}  # NEURON CORES 8 physical, LOGICAL NC 4


def test_neuron_topology_diagram_is_not_read_as_rows():
    assert len(load("90").topology.devices) == 16


def test_neuron_json_single_device_and_container_views():
    r = load("93")
    d = r.topology.device(0)
    assert (d.cores, d.memory_bytes, d.numa_node, d.cpus) == (2, 32 << 30, None, tuple(range(8)))  # numa "-1"
    assert r.topology.links == () and r.warnings == ()
    r = load("94")  # the table and the JSON of one container: they agree
    d = r.topology.device(0)
    assert (d.model, d.cores, d.numa_node) == ("Trainium2", 4, 1)
    assert len(r.warnings) == 2 and all("neighbours 12, 1, 9, 14, not in the capture" in w for w in r.warnings)


def test_neuron_core_ids_that_disagree_with_the_core_count():
    text = CAPTURES["88"].read_text().replace("| 4      | 0-3      |", "| 4      | 0-2      |", 1)
    with pytest.raises(CaptureError, match="NEURON CORE IDS lists 3 cores but NEURON CORES says 4"):
        parse_capture(text)


@pytest.mark.parametrize("old,new,needle", [
    ('"nc_count": 2,', '"nc_count": "two",', "nc_count must be a core count"),
    ('"connected_to": null,', '"connected_to": "all",', "connected_to must be a list"),
    ('"memory_size": 34359738368,', '"memory_size": -5,', "memory_size must be bytes"),
    ('"neuron_device": 0,', '"neuron_device": -1,', "neuron_device must be a device number"),
    ('"numa_node": "-1",', '"numa_node": "zero",', "numa_node 'zero' is not a node number"),
    ('"nc_count": 2,', '"nc_count": 2', "not valid JSON"),
])
def test_neuron_json_damage_is_named(old, new, needle):
    text = CAPTURES["93"].read_text()
    assert old in text
    with pytest.raises(CaptureError, match=needle) as e:
        parse_capture(text.replace(old, new, 1), "neuron.json")
    assert "neuron.json" in str(e.value)


def test_neuron_row_with_device_fields_but_no_device_number():
    lines = CAPTURES["92"].read_text().splitlines()
    i = next(k for k, ln in enumerate(lines) if "23531" in ln)
    lines[i] = lines[i].replace("|        |        |", "|        | 4      |", 1)
    with pytest.raises(CaptureError, match="without a NEURON DEVICE number"):
        parse_capture("\n".join(lines))


# ---------------------------------------------------------------------- npu-smi
def test_npu_smi_topo_and_info_of_one_machine():
    r = load("95")
    t = r.topology
    assert t.hostname == "valle" and r.warnings == ()
    assert len(t.links) == 28 and {l.kind for l in t.links} == {"hccs"}
    d = t.device(2)
    assert (d.vendor, d.model, d.pci_bus_id, d.memory_bytes) == ("huawei", "Ascend910B3", "0000:81:00.0", 64 << 30)
    assert d.cpus == tuple(range(96, 120))


def test_npu_smi_first_generation_groups_of_four():
    """A synthesized `npu-smi info -t topo` (not a capture): a 910 board, two HCCS groups, SYS across."""
    rows = []
    for a in range(8):
        cells = ["X" if a == b else ("HCCS" if a // 4 == b // 4 else "SYS") for b in range(8)]
        rows.append(f"NPU{a}       " + "       ".join(cells) + ("       0-23" if a < 4 else "       24-47"))
    text = "\t   " + "       ".join(f"NPU{i}" for i in range(8)) + "       CPU Affinity\n" + "\n".join(rows) + "\n"
    t = parse_capture(text).topology
    assert {(l.a, l.b) for l in t.links if l.kind == "hccs"} == {(a, b) for a in range(8) for b in range(a + 1, 8)
                                                                  if a // 4 == b // 4}
    assert t.link(0, 4).pcie == "SYS" and t.device(5).cpus == tuple(range(24, 48))


@pytest.mark.parametrize("old,new,needle", [
    ("NPU3       HCCS       HCCS       HCCS       X", "NPU3       HCCS       HCCS       HCCS       HCCS",
     "should have X"),
    ("NPU5       HCCS       HCCS       HCCS       HCCS       HCCS       X          HCCS       HCCS",
     "NPU5       HCCS       HCCS       HCCS       HCCS       HCCS       X          WARP       HCCS", "unknown connection"),
    ("NPU7       HCCS", "NPU6       HCCS", "listed twice"),
])
def test_npu_smi_topo_damage_is_named(old, new, needle):
    text = CAPTURES["96"].read_text()
    assert old in text
    with pytest.raises(CaptureError, match=needle):
        parse_capture(text.replace(old, new, 1))


def test_npu_smi_info_multi_chip_boards_are_refused():
    text = CAPTURES["95"].read_text().replace("| 0                         | 0000:C2:00.0", "| 1                         | 0000:C2:00.0", 1)
    with pytest.raises(CaptureError, match="several chips per NPU"):
        import_captures([text])


# ------------------------------------------------------------------------ TPU
def test_tpu_info_box_and_plain_tables():
    for num, gen in (("97", "v4"), ("98", "v6e")):
        r = load(num)
        t = r.topology
        assert [d.coords for d in t.devices] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]
        assert {d.model for d in t.devices} == {f"TPU {gen}"} and len(t.links) == 4
        assert {l.kind for l in t.links} == {"ici"} and t.link(0, 3) is None  # no diagonal
        assert len(r.warnings) == 1 and "no chip coordinates" in r.warnings[0]


def test_tpu_env_gives_the_slice_and_coordinates():
    t = load("99").topology
    assert t.slice == Slice(name="penghao-tpu-1", worker_id=0, topology="4x4x8", accelerator_type="v4-256")
    assert [d.coords for d in t.devices] == [(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)]


def test_tpu_env_of_another_worker_sits_elsewhere_in_the_slice():
    """The real tpu-env with WORKER_ID changed (derived, not a capture): worker 5 of HOST_BOUNDS 2,2,8."""
    text = CAPTURES["99"].read_text().replace("WORKER_ID: '0'", "WORKER_ID: '5'")
    t = parse_capture(text).topology
    assert t.slice.worker_id == 5
    assert [d.coords for d in t.devices][0] == (2, 0, 1)  # host (1, 0, 1) of 2,2,1 chips: x 2-3, y 0-1, z 1
    with pytest.raises(CaptureError, match="outside HOST_BOUNDS"):
        parse_capture(CAPTURES["99"].read_text().replace("WORKER_ID: '0'", "WORKER_ID: '32'"))
    with pytest.raises(CaptureError, match="CHIPS_PER_HOST_BOUNDS '2,2' is not 'x,y,z'"):
        parse_capture(CAPTURES["99"].read_text().replace("CHIPS_PER_HOST_BOUNDS: '2,2,1'", "CHIPS_PER_HOST_BOUNDS: '2,2'"))


def test_tpu_info_and_env_of_one_host_combine():
    r = import_captures([CAPTURES["99"], CAPTURES["97"]])
    assert r.topology.slice.accelerator_type == "v4-256" and len(r.topology.devices) == 4


def test_tpu_info_damage():
    text = CAPTURES["97"].read_text()
    with pytest.raises(CaptureError, match="chip 1 listed twice"):
        parse_capture(text.replace("/dev/accel2", "/dev/accel1", 1))
    with pytest.raises(CaptureError, match="a TPU host has chips 0..n-1"):
        parse_capture(text.replace("│ /dev/accel3 │ TPU v4 chip │ 1       │ 130007 │\n", "", 1))
