"""Geometry of the pictures (issue 10): no line runs underneath a device box it does not end
in, MIG slices take their holder's colour (one colour per holder, everywhere), and the
cluster picture packs its nodes tightly."""

from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest

from rayaccel import catalog, viz
from rayaccel._viz_layout import (DEV_H, DEV_W, _layout, curve_points, device_boxes, drawn_links, link_route,
                                  nic_places, pack_blocks, polyline_hits, segment_hits_box)
from rayaccel.discovery.load import load_topology
from rayaccel.errors import RayaccelError
from rayaccel.topology import Device, NodeTopology, Partition

DATA = Path(__file__).parent / "data"


def _machines():
    out = [(name, catalog.load(name)) for name in catalog.names()]
    for path in sorted((DATA / "captures").glob("*.txt")):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                out.append((path.name, load_topology(path)))
        except RayaccelError:
            continue  # captures the importer rejects are tested there
    return out


MACHINES = _machines()
IDS = [name for name, _ in MACHINES]


def _centre(boxes):
    X0 = min(b[0] for _, b in boxes)
    X1 = max(b[2] for _, b in boxes)
    Y0 = min(b[1] for _, b in boxes)
    Y1 = max(b[3] for _, b in boxes)
    return (X0 + X1) / 2, (Y0 + Y1) / 2


def test_segment_box_intersection():
    box = (0.0, 0.0, 1.0, 1.0)
    assert segment_hits_box((-1, 0.5), (2, 0.5), box)          # straight through
    assert segment_hits_box((0.5, 0.5), (3, 3), box)           # starts inside
    assert not segment_hits_box((-1, 1.0), (2, 1.0), box)      # along an edge
    assert not segment_hits_box((-1, -1), (-0.1, 3), box)      # beside
    assert not segment_hits_box((1.0, 0.5), (3, 0.5), box)     # ends on the edge, outside
    assert segment_hits_box((-1, -1), (2, 2), box)             # diagonal


@pytest.mark.parametrize("name, topo", MACHINES, ids=IDS)
def test_no_link_runs_under_another_device(name, topo):
    pos, boxes = _layout(topo)
    if not boxes:
        return
    dev = device_boxes(pos)
    centre = _centre(boxes)
    for l in drawn_links(topo):
        kind, pts = link_route(pos, l.a, l.b, centre)
        line = curve_points(*pts) if kind == "curve" else pts
        assert not polyline_hits(line, dev, {l.a, l.b}), f"{name}: link {l.a}-{l.b} ({kind}) crosses a device"


@pytest.mark.parametrize("name, topo", MACHINES, ids=IDS)
def test_no_nic_line_runs_under_a_device(name, topo):
    pos, boxes = _layout(topo)
    if not boxes:
        return
    dev = device_boxes(pos)
    for place in nic_places(topo, pos, boxes):
        for d, route in place.routes:
            assert not polyline_hits(list(route), dev, {d}), f"{name}: {place.nic.name} -> {d} crosses a device"
            x, y = pos[d]
            ex, ey = route[-1]  # it ends on the edge of its own device's box
            on_x = abs(abs(ex - x) - DEV_W / 2) < 1e-6 and abs(ey - y) <= DEV_H / 2
            on_y = abs(abs(ey - y) - DEV_H / 2) < 1e-6 and abs(ex - x) <= DEV_W / 2
            assert on_x or on_y, (name, place.nic.name, d, route[-1])
            sx, sy = route[0]  # and starts on the NIC's top edge
            assert abs(sy - (place.y - 0.18)) < 1e-6 and abs(sx - place.x) <= place.width / 2


def test_dgx1_nic0_does_not_read_as_a_gpu0_gpu2_link():
    """The audit's case: mlx5_0's line to GPU0 ran straight through GPU2's box."""
    topo = catalog.load("dgx1-v100")
    pos, boxes = _layout(topo)
    dev = device_boxes(pos)
    place = next(p for p in nic_places(topo, pos, boxes) if p.nic.name == "mlx5_0")
    route = dict(place.routes)[0]
    assert polyline_hits(list(route), dev, {0}) == []


# ---------------------------------------------------------------- colours of holders
def _two_mig_gpus() -> NodeTopology:
    a = catalog.load("a100-mig")
    d0 = a.devices[0]
    d1 = Device(1, model=d0.model, memory_bytes=d0.memory_bytes, numa_node=0, mig_mode=True,
                mig_profiles=d0.mig_profiles,
                partitions=tuple(Partition(parent=1, profile=p.profile, gi_id=p.gi_id, start=p.start, size=p.size)
                                 for p in d0.partitions))
    return NodeTopology(devices=(d0, d1), name="two-mig").validate()


def test_every_colour_maps_to_exactly_one_holder():
    topo = _two_mig_gpus()
    assign = {"0:mig7": "notebook", "1:mig8": "notebook", "0:mig2": "serve", "1:mig2": "batch"}
    colours = viz.holder_colours(list(assign.values()))
    fills = {p.key: (holder, colour) for d in topo.devices for p, holder, colour in viz.mig_fills(d, assign, colours)}
    by_colour: dict[str, set] = {}
    for key, (holder, colour) in fills.items():
        by_colour.setdefault(colour, set()).add(holder)
    assert all(len(holders) == 1 for holders in by_colour.values()), by_colour
    assert fills["0:mig7"][1] == fills["1:mig8"][1] == colours["notebook"]  # same holder, same colour on both GPUs
    assert fills["0:mig8"] == (None, viz.MIG_FREE) and fills["1:mig7"] == (None, viz.MIG_FREE)
    assert viz.MIG_FREE not in colours.values()


def test_holder_colours_never_repeat():
    labels = [f"job-{k}" for k in range(60)]
    colours = viz.holder_colours(labels + labels[:5])
    assert len(colours) == 60 and len(set(colours.values())) == 60
    assert viz.MIG_FREE not in colours.values() and viz.MIG_EMPTY not in colours.values()


def test_cluster_svg_colours_slices_by_holder_and_legend_agrees(tmp_path):
    topo = _two_mig_gpus()
    nodes = [("n1", topo, {"0:mig7": "notebook", "0:mig2": "serve"}),
             ("n2", catalog.load("a100-mig"), {"0:mig8": "notebook"}),
             ("n3", catalog.load("dgx1-v100"), {0: "serve", 1: "train"})]
    text = viz.draw_cluster(nodes, tmp_path / "c.svg").read_text()
    colours = viz.holder_colours(["notebook", "serve", "notebook", "serve", "train"])
    fills = re.findall(r"fill:\s*(#[0-9a-f]{6})", text)
    for label, colour in colours.items():
        assert label in text and colour in fills, (label, colour)
    assert viz.MIG_FREE in fills  # the instances nobody holds


def test_assignment_to_an_unknown_mig_instance(tmp_path):
    with pytest.raises(viz.VizError, match=r"MIG instances \['0:mig99'\].*Partition.key"):
        viz.draw_topology(catalog.load("a100-mig"), tmp_path / "x.png", assignments={"0:mig99": "x"})


def test_data_text_is_not_tex(tmp_path):
    topo = catalog.load("l40s-4x-pcie")
    out = viz.draw_topology(topo, tmp_path / "x.png", assignments={0: "$\\frac{broken"}, title="cost $5 $x$")
    assert out.exists()


# ---------------------------------------------------------------- compact cluster picture
DEMO = ("dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "a100-mig")


def test_cluster_picture_is_packed_tightly():
    scale = viz.SCALE_CLUSTER
    sizes = []
    for name in DEMO:
        x0, y0, x1, y1 = viz._node_bounds(catalog.load(name), scale)
        sizes.append((x1 - x0, y1 - y0))
    origins, width, height = pack_blocks(sizes, viz._GAP)
    used = sum(w * h for w, h in sizes)
    assert used / (width * height) > 0.7, used / (width * height)
    assert 1 / 1.2 <= width / height <= 3.0
    for (ox, oy), (w, h) in zip(origins, sizes):  # inside the picture, no two blocks overlap
        assert ox >= 0 and oy >= 0 and ox + w <= width + 1e-6 and oy + h <= height + 1e-6
    for i, ((ax, ay), (aw, ah)) in enumerate(zip(origins, sizes)):
        for (bx, by), (bw, bh) in list(zip(origins, sizes))[i + 1:]:
            assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay


def test_cluster_png_has_little_empty_space(tmp_path):
    import matplotlib.image as mpimg

    nodes = [(n, catalog.load(n), {}) for n in DEMO]
    out = viz.draw_cluster(nodes, tmp_path / "c.png", title="demo")
    im = mpimg.imread(out)[..., :3]
    white = float((im > 0.985).all(axis=2).mean())
    h, w = im.shape[:2]
    assert white < 0.66 and w * h < 2.8e6, (white, w, h)


@pytest.mark.parametrize("name", catalog.names())
def test_estimated_legend_matches_what_is_drawn(name):
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    topo = catalog.load(name)
    fig, ax = plt.subplots()
    try:
        assert viz._draw_node(ax, topo, {}, None, {}) == viz._legend_keys(topo)
    finally:
        plt.close(fig)
