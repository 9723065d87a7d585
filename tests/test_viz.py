"""Pictures: every catalog machine draws, formats by suffix, assignments and errors."""

from __future__ import annotations

import pytest

from rayaccel import catalog, viz
from rayaccel.errors import RayaccelError

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize("name", catalog.names())
def test_every_catalog_machine_draws_png(tmp_path, name):
    out = viz.draw_topology(catalog.load(name), tmp_path / f"{name}.png")
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 20_000


def test_svg_with_assignments_and_mig(tmp_path):
    out = viz.draw_topology(catalog.load("a100-mig"), tmp_path / "sub" / "mig.svg", assignments={0: "serve-llm"},
                            title="MIG demo")
    text = out.read_text()
    assert text.lstrip().startswith("<?xml") and "<svg" in text
    assert "serve-llm" in text and "MIG demo" in text and "MIG instance" in text


def test_links_and_nics_in_legend(tmp_path):
    text = viz.draw_topology(catalog.load("dgx1-v100"), tmp_path / "d.svg", assignments={0: "job-a", 3: "job-a"}).read_text()
    for word in ("NVLink", "NIC", "job-a", "NV2", "mlx0", "NUMA 1"):
        assert word in text, word
    pcie = viz.draw_topology(catalog.load("pcie-8gpu-2socket"), tmp_path / "p.svg").read_text()
    assert "PCIe PIX" in pcie and "PCIe PXB" in pcie


def test_fabric_is_one_band_not_all_pairs(tmp_path):
    text = viz.draw_topology(catalog.load("hgx-h100"), tmp_path / "h.svg").read_text()
    assert "NVSwitch fabric: every pair of 8 devices 18 links" in text


@pytest.mark.parametrize("suffix", [".jpg", ".pdf", ""])
def test_bad_suffix(tmp_path, suffix):
    with pytest.raises(viz.VizError, match=r"\.png or \.svg"):
        viz.draw_topology(catalog.load("dgx1-v100"), tmp_path / f"x{suffix}")
    assert issubclass(viz.VizError, RayaccelError)


def test_assignment_to_unknown_device(tmp_path):
    with pytest.raises(viz.VizError, match=r"devices \[9\]"):
        viz.draw_topology(catalog.load("l40s-4x-pcie"), tmp_path / "x.png", assignments={9: "x"})


def test_draw_cluster(tmp_path):
    nodes = [("node-a", catalog.load("dgx1-v100"), {0: "train", 3: "train"}),
             ("node-b", catalog.load("hgx-h100"), {4: "serve"}),
             ("node-c", catalog.load("trn1-32xlarge"), {})]
    text = viz.draw_cluster(nodes, tmp_path / "c.svg", title="final placement").read_text()
    for word in ("node-a", "node-b", "node-c", "train", "serve", "final placement"):
        assert word in text
    assert viz.draw_cluster(nodes[:1], tmp_path / "c.png").read_bytes().startswith(PNG_MAGIC)


def test_draw_cluster_needs_nodes(tmp_path):
    with pytest.raises(viz.VizError, match="at least one"):
        viz.draw_cluster([], tmp_path / "c.png")


@pytest.mark.parametrize("name", catalog.names())
def test_layout_keeps_devices_inside_their_numa_box(name):
    topo = catalog.load(name)
    pos, boxes = viz._layout(topo)
    box = dict(boxes)
    for d in topo.devices:
        x, y = pos[d.index]
        x0, y0, x1, y1 = box[d.numa_node]
        assert x0 < x < x1 and y0 < y < y1
    assert len(set(pos.values())) == len(topo.devices)  # no two devices on one spot


def test_layout_avoids_crossing_devices_on_dgx1():
    topo = catalog.load("dgx1-v100")
    pos, _ = viz._layout(topo)
    blocked = [l for l in topo.links if l.direct and viz._blocked(pos, l.a, l.b)]
    assert len(blocked) <= 2  # only the two long cross-socket links need a curve


def test_empty_topology_draws(tmp_path):
    from rayaccel.topology import NodeTopology

    assert viz.draw_topology(NodeTopology(name="empty"), tmp_path / "e.png").exists()
