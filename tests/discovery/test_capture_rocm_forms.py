"""rocm-smi's NUMA section in every form seen in public output, and ``rocm-smi --json``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures, parse_capture
from rayaccel.errors import CaptureError

CAPTURES = Path(__file__).parent.parent / "data" / "captures"


def _file(prefix: str) -> Path:
    return next(CAPTURES.glob(f"{prefix}_*.txt"))


@pytest.mark.parametrize("line,index,node", [
    ("GPU[3]\t\t: (Topology) Numa Node: 1", 3, 1),          # ROCm 5-6 (captures 59-63, 84)
    ("GPU[0]          : (Topology) Numa Node: 6", 0, 6),     # spaces instead of tabs (ROCm/llvm-project PR #721)
    ("GPU 2          : (Topology) Numa Node: 2", 2, 2),     # no brackets (capture 83, ARCHER2)
    ("HCU[1]\t\t: Numa Node:  0", 1, 0),                     # no tag, two spaces (Hygon DTK rocm-smi)
    ("DCU[0] : Numa Node: 3", 0, 3),                         # Hygon DCU prefix
    ("GPU[0]\t\t: (Topology) Numa Node: -1", 0, None),       # unknown
], ids=["tagged", "tagged-spaces", "gpu-space", "untagged-hcu", "untagged-dcu", "unknown"])
def test_numa_line_forms(line, index, node):
    res = parse_capture(f"==== Numa Nodes ====\n{line}\n", "numa.txt")
    dev = {d.index: d for d in res.topology.devices}[index]
    assert dev.numa_node == node
    assert any("devices and NUMA nodes only" in w for w in res.warnings)


def test_gpu_space_form_fills_numa_of_a_full_showtopo():
    topo = import_captures([_file("83")]).topology
    assert [d.numa_node for d in topo.devices] == [0, 1, 2, 3]
    assert {l.kind for l in topo.links} == {"xgmi"} and len(topo.links) == 6


def test_showtoponuma_alone_gives_devices_and_numa_nodes():
    res = import_captures([_file("84")])
    assert [d.numa_node for d in res.topology.devices] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert not res.topology.links and len(res.warnings) == 1


def test_hygon_dtk_output_with_hcu_labels_and_untagged_numa_lines():
    """The layout of Hygon's DTK rocm-smi: matrices 'between HCUs' labelled HCU[i], Numa lines without the tag."""
    rows = "\n".join(f"HCU[{i}]    " + "    ".join("0" if j == i else "40" for j in range(4)) for i in range(4))
    hops = "\n".join(f"HCU[{i}]    " + "    ".join("0" if j == i else "2" for j in range(4)) for i in range(4))
    kind = "\n".join(f"HCU[{i}]    " + "    ".join("None" if j == i else "PCIE" for j in range(4)) for i in range(4))
    head = "          " + "    ".join(f"HCU[{i}]" for i in range(4))
    numa = "\n".join(f"HCU[{i}]\t\t: Numa Node:  0\nHCU[{i}]\t\t: Numa Affinity:  0" for i in range(4))
    text = (f"============================ System Management Interface =============================\n"
            f"Weight between HCUs\n{head}\n{rows}\n=====\nHops between HCUs\n{head}\n{hops}\n=====\n"
            f"Link Type between HCUs\n{head}\n{kind}\n=====\n{numa}\n")
    topo = parse_capture(text, "hygon.txt").topology
    assert len(topo.devices) == 4 and {d.vendor for d in topo.devices} == {"hygon"}
    assert {d.numa_node for d in topo.devices} == {0}
    assert len(topo.links) == 6 and {l.kind for l in topo.links} == {"pcie"}


def test_json_output_gives_numa_bus_and_vram():
    dev = import_captures([_file("85")]).topology.devices[0]
    assert (dev.index, dev.vendor, dev.numa_node, dev.pci_bus_id, dev.memory_bytes) == \
        (0, "amd", 0, "0000:04:00.0", 17163091968)


def test_damaged_json_is_a_capture_error_with_the_line():
    with pytest.raises(CaptureError) as e:
        parse_capture('rocm-smi --json\n{"card0": {"(Topology) Numa Node": "0", "PCI Bus": \n', "bad.json.txt")
    assert e.value.line == 2 and "not valid JSON" in str(e.value)
