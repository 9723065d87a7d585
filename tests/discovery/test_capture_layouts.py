"""Each importer reads its tool's table by the header, in every column layout the tool's versions print.

A column may be absent where the machine or the version has nothing to list (no NICs, no
affinity columns on old drivers, ``GPU NUMA ID`` only on recent ones). The importers take
what the header names and complain about a missing column only when the topology cannot be
built without it. Every case below is a real capture (tests/data/captures, INDEX.tsv says
where each was published); the hl-smi variants are the same capture with one column deleted,
the layouts ``hl-smi topo -c`` and ``hl-smi topo -N`` print (the two flags are independent).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rayaccel.discovery.capture import import_captures
from rayaccel.errors import CaptureError

CAPTURES = Path(__file__).parent.parent / "data" / "captures"


def _capture(number: str) -> Path:
    (path,) = CAPTURES.glob(f"{number}_*.txt")
    return path


# nvidia-smi topo -m: (capture, layout, devices, NIC columns, CPU lists?, NUMA nodes?)
NVSMI_LAYOUTS = [
    ("21", "no affinity columns (old driver)", 8, 0, False, False),
    ("13", "CPU Affinity only (R384-era DGX-1)", 8, 4, True, False),
    ("01", "CPU Affinity + NUMA Affinity, no GPU NUMA ID", 8, 10, True, True),
    ("10", "CPU + NUMA Affinity + GPU NUMA ID, no NICs", 2, 0, True, True),
    ("26", "GPU NUMA ID with 12 NIC columns and a NIC Legend", 8, 12, True, True),
    ("74", "space-aligned, no NIC columns", 8, 0, True, True),
    ("38", "topo -mp (PCIe only), NICs", 8, 12, True, True),
]


@pytest.mark.parametrize("number, layout, devices, nics, cpus, numa", NVSMI_LAYOUTS,
                         ids=[f"{c[0]}-{c[1]}" for c in NVSMI_LAYOUTS])
def test_nvidia_smi_topo_layouts(number, layout, devices, nics, cpus, numa):
    res = import_captures([_capture(number)])
    t = res.topology
    assert len(t.devices) == devices and len(t.nics) == nics
    assert all((d.cpus is not None) == cpus for d in t.devices if d.index == 0)
    assert all((d.numa_node is not None) == numa for d in t.devices if d.index == 0)
    assert not any("column" in w.lower() for w in res.warnings), res.warnings  # an absent column is no fault


HLSMI = _capture("66").read_text()


def _drop_column(text: str, name: str) -> str:
    """The hl-smi table without column ``name``: the header cell, its dashes and each row's cell go."""
    lines = text.splitlines()
    head = next(k for k, l in enumerate(lines) if l.lstrip().startswith("modID"))
    out = lines[:head]
    for l in lines[head:]:
        words = l.split()
        if l.lstrip().startswith("modID"):
            out.append("modID   " + ("NUMA Affinity" if name == "CPU Affinity" else "CPU Affinity"))
        elif words and words[0].startswith("-"):
            out.append("-----   " + "-" * 13)
        elif words and words[0].isdigit():
            cpus, numa = " ".join(words[1:-1]), words[-1]
            out.append(f"{words[0]}       {numa if name == 'CPU Affinity' else cpus}")
        else:
            out.append(l)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("layout, text, cpus, numa", [
    ("topo -c -N", HLSMI, True, True),
    ("topo -c", _drop_column(HLSMI, "NUMA Affinity"), True, False),
    ("topo -N", _drop_column(HLSMI, "CPU Affinity"), False, True),
], ids=["c-N", "c-only", "N-only"])
def test_hl_smi_layouts(layout, text, cpus, numa, tmp_path):
    f = tmp_path / "hl.txt"
    f.write_text(text)
    t = import_captures([f]).topology
    assert len(t.devices) == 8
    d4 = t.device(4)
    assert (d4.cpus is not None) == cpus and (d4.numa_node is not None) == numa
    if cpus:
        assert d4.cpus[0] == 40 and len(d4.cpus) == 80  # "40-79, 120-159": a CPU list with a space
    if numa:
        assert d4.numa_node == 1


def test_hl_smi_row_that_does_not_fit_the_header_names_the_columns(tmp_path):
    f = tmp_path / "hl.txt"
    f.write_text(HLSMI.replace("7       40-79, 120-159          1", "7  40-79, 120-159  1  9"))
    with pytest.raises(CaptureError, match="<modID>  <CPU list>  <NUMA node>"):
        import_captures([f])


@pytest.mark.parametrize("number, layout, chips, generation", [
    ("97", "tpu-info 0.1: rich box tables, /dev/accel", 4, "TPU v4"),
    ("98", "tpu-info 0.14: plain | tables, /dev/vfio", 4, "TPU v6e"),
], ids=["0.1-box", "0.14-plain"])
def test_tpu_info_layouts(number, layout, chips, generation):
    t = import_captures([_capture(number)]).topology
    assert len(t.devices) == chips and {d.model for d in t.devices} == {generation}


def test_tpu_info_reads_the_chip_table_by_its_header(tmp_path):
    text = _capture("98").read_text()
    # the same rows with the columns in another order: read by the header, not by position
    swapped = []
    for l in text.splitlines():
        cells = l.split("|")
        if len(cells) == 6 and ("Chip" in cells[1] or "/dev/" in cells[1] or set(cells[1]) <= {"-"}):
            cells[1], cells[2] = cells[2], cells[1]
        swapped.append("|".join(cells))
    f = tmp_path / "tpu.txt"
    f.write_text("\n".join(swapped) + "\n")
    t = import_captures([f]).topology
    assert len(t.devices) == 4 and t.device(3).model == "TPU v6e"


@pytest.mark.parametrize("number, layout", [
    ("95", "header indented by a tab (npu-smi on valle)"),
    ("96", "header not indented (npu-smi 23.0.rc2)"),
], ids=["indented", "flush"])
def test_npu_smi_topo_layouts(number, layout):
    t = import_captures([_capture(number)]).topology
    assert len(t.devices) == 8 and all(d.cpus for d in t.devices)
    assert {l.kind for l in t.links} == {"hccs"}


def test_amd_smi_tables_topology_does_not_need_are_skipped(tmp_path):
    """Later amd-smi releases print more ``... TABLE:`` sections (``NUMA BW TABLE`` with ranges such as
    ``50000-100000``); only ACCESS, WEIGHT, HOPS and LINK TYPE are read. The extra table here is written
    for the test (a malformed one, so reading it would fail), prefixed to the real capture 64."""
    extra = ("NUMA BW TABLE:\n"
             "             0000:05:00.0\n"
             "0000:05:00.0 N/A 50000-100000 stray\n\n")
    f = tmp_path / "amd.txt"
    f.write_text(extra + _capture("64").read_text())
    t = import_captures([f]).topology
    assert len(t.devices) == 8 and len(t.links) == 28
