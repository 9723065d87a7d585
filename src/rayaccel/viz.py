"""Pictures of topologies: devices grouped by NUMA node, links by kind and strength.

* :func:`draw_topology` -- one node, optionally with work assignments highlighted.
* :func:`draw_cluster` -- several nodes side by side (``rayaccel demo`` uses it for
  the final placement picture).

matplotlib is imported lazily (Agg backend), so importing this module is cheap.
The output format follows the file suffix: ``.png`` or ``.svg``.

What is drawn:

* a box per NUMA node (socket), devices inside it (index, model, memory);
* direct links (NVLink / xGMI / NeuronLink) as thick coloured lines whose width
  grows with the lane count; a direct domain where *every* pair is linked the
  same way (an NVSwitch fabric, xGMI all-to-all) as one shaded band with a
  label instead of n*(n-1)/2 lines;
* PCIe paths as thin grey lines: PIX solid, PXB dashed, PHB/NODE dotted and
  faint; SYS is not drawn (it is what crossing a NUMA box means);
* NICs as small boxes in their NUMA box, joined to their closest devices by lines
  that run through the gaps between devices, never underneath another device;
* MIG partitions as segments of an 8-slice strip inside a device, coloured by the
  work that holds them (grey when free);
* assignments (device index or MIG instance key -> label) as coloured fills, one
  colour per label across every node of the picture, with a legend.

Every line is routed by :mod:`rayaccel._viz_layout` (pure geometry, tested) so that it
never crosses a device box it does not end in. Text from the topology or the caller is
drawn literally (a ``$`` is not TeX math).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping, Sequence

from ._viz_layout import (DEV_H, DEV_W, NIC_H, SMALL_ABOVE, STEP_X, STEP_Y, _all_to_all, _blocked,  # noqa: F401
                          _extent, _layout, domain_groups, drawn_links, link_label_point, link_route, nic_places,
                          pack_blocks, pack_groups)
from ._outputs import SUFFIXES, VizError, atomic_path, check_output_dir, check_output_file
from .errors import OutputPathError
from .topology import DIRECT_KINDS, Device, NodeTopology, Partition

__all__ = ["SUFFIXES", "OutputPathError", "check_output_dir", "check_output_file", "draw_cluster", "draw_topology",
           "holder_colours"]


KIND_COLOURS = {"nvlink": "#76b900", "xgmi": "#d6202a", "neuronlink": "#ff9900", "ici": "#4285f4", "hccs": "#c7000b",
                "roce": "#0071c5", "direct": "#7b3fa0"}
KIND_NAMES = {"nvlink": "NVLink", "xgmi": "xGMI (Infinity Fabric)", "neuronlink": "NeuronLink", "ici": "TPU ICI",
              "hccs": "HCCS", "roce": "RoCE (Gaudi scale-up)",
              "direct": "vendor direct link"}
PCIE_STYLE = {  # class -> (linestyle, width, alpha)
    "PIX": ("-", 1.6, 0.9),
    "PXB": ("--", 1.3, 0.8),
    "PHB": (":", 1.1, 0.55),
    "NODE": (":", 0.9, 0.35),
}
ASSIGN_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#e377c2", "#17becf", "#8c564b", "#bcbd22", "#d62728",
                  "#2ca02c", "#7f7f7f")
#: Fill of a MIG instance no one holds, and of a memory slice with no instance.
MIG_FREE = "#bcccdc"
MIG_EMPTY = "#eef1f4"
#: Inches per layout unit: one node alone, a node of a cluster picture.
SCALE_NODE, SCALE_SMALL, SCALE_CLUSTER = 0.85, 0.55, 0.55
_TITLE_PT = 10.0
_GAP = 0.7  # between node blocks of a cluster picture, layout units

Assignments = Mapping["int | str", str]


def _check_path(path: str | Path) -> Path:
    return check_output_file(path)


def _plt():
    try:
        import matplotlib
    except ImportError as e:
        raise VizError(f"drawing needs matplotlib, which is not importable ({e}); pip install matplotlib") from None

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt




def _t(text: Any) -> str:
    """Text from data, drawn literally: matplotlib would read ``$...$`` as TeX math."""
    return str(text).replace("$", r"\$")


def _short_model(model: str | None) -> str:
    if not model:
        return ""
    for prefix in ("NVIDIA ", "AMD Instinct ", "Tesla ", "AMD "):
        if model.startswith(prefix):
            model = model[len(prefix):]
    return model if len(model) <= 18 else model[:17] + "…"


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / (1 << 30):.0f} GiB"


def holder_colours(labels: Sequence[str]) -> dict[str, str]:
    """One distinct colour per distinct label, in first-seen order.

    The first ten come from :data:`ASSIGN_COLOURS`; more are drawn around the hue circle,
    so no two holders ever share a colour (and none is the colour of a free MIG instance).
    """
    out: dict[str, str] = {}
    used = {MIG_FREE, MIG_EMPTY}
    k = 0
    for label in labels:
        if label in out:
            continue
        if len(out) < len(ASSIGN_COLOURS):
            colour = ASSIGN_COLOURS[len(out)]
        else:
            while True:
                k += 1
                hue = (k * 0.618033988749895) % 1.0
                sat, val = (0.75, 0.72) if k % 2 else (0.55, 0.55)
                colour = _hex_hsv(hue, sat, val)
                if colour not in used:
                    break
        used.add(colour)
        out[label] = colour
    return out


def _hex_hsv(h: float, s: float, v: float) -> str:
    import colorsys

    r, g, b = colorsys.hsv_to_rgb(h, s, v)
    return "#{:02x}{:02x}{:02x}".format(round(r * 255), round(g * 255), round(b * 255))


def _check_assignments(topo: NodeTopology, assignments: Assignments) -> dict:
    """``{device index or MIG key: label}``, checked against the topology.

    Raises:
        VizError: a device index or MIG instance key the topology does not have.
    """
    keys = {p.key for p in topo.partitions()}
    bad_devs = sorted(k for k in assignments if isinstance(k, int) and k not in set(topo.indices))
    if bad_devs:
        raise VizError(f"assignments name devices {bad_devs} that {topo.name or 'the topology'} does not have "
                       f"(devices: {list(topo.indices)})")
    bad = sorted(str(k) for k in assignments if not isinstance(k, int) and k not in keys)
    if bad:
        raise VizError(f"assignments name MIG instances {bad} that {topo.name or 'the topology'} does not have "
                       f"(instances: {sorted(keys) or 'none'}); keys are device indices or Partition.key")
    return {k: str(v) for k, v in assignments.items()}


def mig_fills(device: Device, assignments: Assignments, colours: Mapping[str, str]) -> list[tuple[Partition, str | None, str]]:
    """``(partition, holder or None, fill colour)`` for each MIG instance of ``device``:
    a held instance in its holder's colour (the colour of that label everywhere in the
    picture), a free one in :data:`MIG_FREE`."""
    out = []
    for p in device.partitions:
        holder = assignments.get(p.key)
        out.append((p, holder, colours[holder] if holder is not None else MIG_FREE))
    return out


# ------------------------------------------------------------------ drawing
def _title_height(scale: float) -> float:
    return 2.7 * _TITLE_PT / 72 / scale


def _node_bounds(topo: NodeTopology, scale: float) -> tuple[float, float, float, float]:
    """``(x0, y0, x1, y1)`` of one node's drawing in layout units, its two title lines included."""
    pos, boxes = _layout(topo)
    if not boxes:
        return 0.0, -_title_height(scale), 4.0, 2.0
    X0 = min(b[0] for _, b in boxes)
    X1 = max(b[2] for _, b in boxes)
    Y0 = min(b[1] for _, b in boxes)
    Y1 = max(b[3] for _, b in boxes)
    fabrics = len(_all_to_all(topo))
    top = Y0 - 0.18 - 0.3 - 0.45 * (fabrics - 1) - 0.22 if fabrics else Y0  # above the fabric labels
    return X0 - 0.3, top - 0.12 - _title_height(scale), X1 + 0.3, Y1 + 0.3


def _draw_node(ax: Any, topo: NodeTopology, assignments: Assignments | None, title: str | None,
               colours: Mapping[str, str], origin: tuple[float, float] = (0.0, 0.0),
               scale: float = SCALE_NODE) -> set[str]:
    """Draw one node on ``ax`` with its layout shifted by ``origin``; return the legend keys used."""
    from matplotlib.patches import FancyBboxPatch, PathPatch, Rectangle
    from matplotlib.path import Path as MPath
    from matplotlib.transforms import Affine2D

    tr = Affine2D().translate(*origin) + ax.transData
    assignments = _check_assignments(topo, dict(assignments or {}))
    n = len(topo.devices)
    bx0, by0, _, _ = _node_bounds(topo, scale)
    head = title or topo.name or topo.hostname or "topology"
    summary = f"{n} device{'s' if n != 1 else ''}" + (
        f", {len(topo.nics)} NIC{'s' if len(topo.nics) != 1 else ''}" if topo.nics else "")
    ax.text(bx0, by0, f"{_t(head)}\n{summary}", fontsize=_TITLE_PT, ha="left", va="top", transform=tr,
            linespacing=1.3)
    if n == 0:
        ax.text(bx0 + 0.3, by0 + _title_height(scale) + 0.6, "no devices", fontsize=9, va="center", transform=tr)
        return set()
    pos, boxes = _layout(topo)
    small = n > SMALL_ABOVE
    used: set[str] = set()
    fabrics = _all_to_all(topo)

    for numa, (x0, y0, x1, y1) in boxes:
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02,rounding_size=0.2",
                                    fc="#f4f6f8", ec="#9aa5b1", lw=1.0, zorder=0, transform=tr))
        cpu = next((d.cpus for d in topo.devices if d.numa_node == numa and d.cpus), None)
        label = "NUMA ?" if numa is None else f"NUMA {numa}"
        if cpu and not small:
            label += f"  CPUs {_ranges(cpu)}"
        ax.text(x0 + 0.15, y0 + 0.22, label, fontsize=6 if small else 8, color="#52606d", va="center", zorder=3,
                transform=tr, bbox=dict(boxstyle="square,pad=0.1", fc="#f4f6f8", ec="none"))

    X0 = min(b[0] for _, b in boxes)
    X1 = max(b[2] for _, b in boxes)
    Y0 = min(b[1] for _, b in boxes)
    Y1 = max(b[3] for _, b in boxes)
    centre = ((X0 + X1) / 2, (Y0 + Y1) / 2)
    for k, (dom, kind, count) in enumerate(fabrics):
        colour = KIND_COLOURS.get(kind, "#444")
        if len(dom) == n:  # the whole node: shade around every NUMA box
            fx0, fy0, fx1, fy1 = X0 - 0.18, Y0 - 0.18, X1 + 0.18, Y1 + 0.18
        else:
            xs = [pos[i][0] for i in dom]
            ys = [pos[i][1] for i in dom]
            fx0, fy0 = min(xs) - DEV_W / 2 - 0.12, min(ys) - DEV_H / 2 - 0.12
            fx1, fy1 = max(xs) + DEV_W / 2 + 0.12, max(ys) + DEV_H / 2 + 0.12
        ax.add_patch(FancyBboxPatch((fx0, fy0), fx1 - fx0, fy1 - fy0, boxstyle="round,pad=0.02,rounding_size=0.25",
                                    fc=colour, ec=colour, alpha=0.14, lw=3, zorder=-1, transform=tr))
        lanes = f"{count} links" if count else "linked"
        bw = topo.link(*sorted(dom)[:2]).bandwidth_gbps
        used.add(f"kind:{kind}")
        via = "NVSwitch fabric" if kind == "nvlink" else "all-to-all"
        ax.text(fx0, Y0 - 0.18 - 0.3 - 0.45 * k, f"{KIND_NAMES.get(kind, kind)} {via}: every pair of {len(dom)} "
                f"devices {lanes} (~{bw:.0f} GB/s per direction, modeled)",
                fontsize=7 if small else 8.5, color=colour, fontweight="bold", va="center", zorder=6, transform=tr)

    max_lanes = max((l.count or 1 for l in topo.links if l.direct), default=1)
    for l in drawn_links(topo):
        kind, pts = link_route(pos, l.a, l.b, centre)
        if l.direct:
            colour = KIND_COLOURS.get(l.kind, "#444")
            style = dict(colour=colour, lw=1.2 + 4.0 * (l.count or 1) / max_lanes, ls="-", alpha=0.85, z=2)
            used.add(f"kind:{l.kind}")
        else:
            ls, lw, alpha = PCIE_STYLE[l.pcie]
            style = dict(colour="#6b7785", lw=lw, ls=ls, alpha=alpha, z=1.5)
            used.add(f"pcie:{l.pcie}")
        _route(ax, tr, kind, pts, MPath, PathPatch, **style)
        if l.direct and not small and l.count and max_lanes > 1:
            lx, ly = link_label_point(kind, pts, l.a)
            ax.text(lx, ly, l.label, fontsize=6.5, color=style["colour"], ha="center", va="center",
                    fontweight="bold", zorder=3, transform=tr,
                    bbox=dict(boxstyle="round,pad=0.12", fc="white", ec=style["colour"], lw=0.5, alpha=0.9))

    for d in topo.devices:
        x, y = pos[d.index]
        work = assignments.get(d.index)
        fc = colours[work] if work is not None else "white"
        ec = "#d62728" if d.health == "failed" else "#1f2933"
        ax.add_patch(FancyBboxPatch((x - DEV_W / 2, y - DEV_H / 2), DEV_W, DEV_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.08", fc=fc, ec=ec,
                                    lw=2.2 if work is not None else 1.1, zorder=4, transform=tr))
        text_colour = "white" if work is not None else "#1f2933"
        if small:
            ax.text(x, y, str(d.index), fontsize=7, ha="center", va="center", color=text_colour, zorder=5,
                    fontweight="bold", transform=tr)
        else:
            ax.text(x, y - DEV_H / 2 + 0.2, f"{_prefix(d.vendor)}{d.index}", fontsize=8.5, ha="center",
                    va="center", color=text_colour, fontweight="bold", zorder=5, transform=tr)
            ax.text(x, y - 0.02, _t(_short_model(d.model)), fontsize=6, ha="center", va="center",
                    color=text_colour, zorder=5, transform=tr)
            sub = _gib(d.memory_bytes) if work is None else _t(work)
            if d.health not in ("ok",):
                sub += f" [{_t(d.health)}]"
            ax.text(x, y + 0.2, sub, fontsize=6, ha="center", va="center", color=text_colour, zorder=5,
                    fontweight="bold" if work is not None else "normal", transform=tr)
        if d.mig_mode or d.partitions:
            _draw_mig(ax, tr, d, x, y, small, Rectangle, assignments, colours)
            used.add("mig")

    _draw_nics(ax, tr, topo, pos, boxes, small, used)
    return used


def _route(ax: Any, tr: Any, kind: str, pts: list, MPath: Any, PathPatch: Any, *, colour: str, lw: float, ls: str,
           alpha: float, z: float) -> None:
    if kind == "curve":
        path = MPath(pts, [MPath.MOVETO, MPath.CURVE3, MPath.CURVE3])
        ax.add_patch(PathPatch(path, fc="none", ec=colour, lw=lw, ls=ls, alpha=alpha, zorder=z, capstyle="round",
                               transform=tr))
    else:
        xs, ys = zip(*pts)
        ax.plot(xs, ys, color=colour, lw=lw, ls=ls, alpha=alpha, zorder=z, solid_capstyle="round",
                solid_joinstyle="round", transform=tr)


def _prefix(vendor: str) -> str:
    prefixes = {"aws": "NEURON", "amd": "GPU", "nvidia": "GPU", "google": "TPU", "habana": "HPU", "huawei": "NPU"}
    return prefixes.get(vendor, "DEV")


def _ranges(cpus: Sequence[int]) -> str:
    out, run = [], []
    for c in sorted(cpus):
        if run and c == run[-1] + 1:
            run.append(c)
        else:
            if run:
                out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
            run = [c]
    if run:
        out.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(out)


def _draw_mig(ax: Any, tr: Any, d: Device, x: float, y: float, small: bool, Rectangle: Any,
              assignments: Assignments, colours: Mapping[str, str]) -> None:
    """An 8-slice strip at the bottom of the device; each MIG instance a segment in its holder's colour."""
    slots = 8
    sw = (DEV_W - 0.2) / slots
    sy = y + DEV_H / 2 - 0.24
    x0 = x - DEV_W / 2 + 0.1
    for s in range(slots):
        ax.add_patch(Rectangle((x0 + s * sw, sy), sw, 0.17, fc=MIG_EMPTY, ec="#9aa5b1", lw=0.4, zorder=5,
                               transform=tr))
    unplaced = 0
    for p, holder, colour in mig_fills(d, assignments, colours):
        if p.start is None:
            unplaced += 1
            continue
        size = min(p.size or 1, slots - min(p.start, slots - 1))
        ax.add_patch(Rectangle((x0 + p.start * sw, sy), size * sw, 0.17, fc=colour, ec="#1f2933", lw=0.5, zorder=6,
                               transform=tr))
        if not small:
            text = p.profile if size >= 4 else p.profile.split(".")[0]
            ax.text(x0 + (p.start + size / 2) * sw, sy + 0.085, _t(text), fontsize=4.5, ha="center", va="center",
                    color="white" if holder is not None else "#1f2933", fontweight="bold", zorder=7, transform=tr)
    if unplaced and not small:
        ax.text(x, sy + 0.085, f"{len(d.partitions)} MIG", fontsize=5, ha="center", va="center", zorder=7,
                transform=tr)


def _draw_nics(ax: Any, tr: Any, topo: NodeTopology, pos, boxes, small: bool, used: set[str]) -> None:
    """NIC boxes in a strip at the bottom of their NUMA box, joined by routed lines (see nic_places)."""
    from matplotlib.patches import FancyBboxPatch

    for place in nic_places(topo, pos, boxes):
        ax.add_patch(FancyBboxPatch((place.x - place.width / 2, place.y - NIC_H / 2), place.width, NIC_H,
                                    boxstyle="round,pad=0.01,rounding_size=0.05",
                                    fc="#fff4d6", ec="#b7791f", lw=0.8, zorder=4, transform=tr))
        if not small:
            ax.text(place.x, place.y, _t(place.nic.name.replace("mlx5_", "mlx")),
                    fontsize=5.5 if place.width < 0.7 else 6.5, ha="center", va="center", zorder=5, transform=tr)
        for _, route in place.routes:
            xs, ys = zip(*route)
            ax.plot(xs, ys, color="#b7791f", lw=0.7, alpha=0.7, zorder=1.6, solid_joinstyle="round", transform=tr)
        used.add("nic")


def _legend_handles(used: set[str], colours: Mapping[str, str]) -> list:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = []
    for kind in DIRECT_KINDS:
        if f"kind:{kind}" in used:
            handles.append(Line2D([], [], color=KIND_COLOURS[kind], lw=3.5, label=f"{KIND_NAMES[kind]} (width ~ lanes)"))
    for cls, (ls, lw, alpha) in PCIE_STYLE.items():
        if f"pcie:{cls}" in used:
            handles.append(Line2D([], [], color="#6b7785", lw=lw, ls=ls, alpha=alpha, label=f"PCIe {cls}"))
    if any(k.startswith("pcie:") or k.startswith("kind:") for k in used):
        handles.append(Line2D([], [], color="none", label="SYS (across NUMA boxes): not drawn"))
    if "nic" in used:
        handles.append(Patch(fc="#fff4d6", ec="#b7791f", label="NIC (joined to its closest devices)"))
    if "mig" in used:
        handles.append(Patch(fc=MIG_FREE, ec="#1f2933", label="MIG instance, free (strip: 8 memory slices)"))
    for label, colour in colours.items():
        handles.append(Patch(fc=colour, ec="#1f2933", label=_t(label)))
    return handles


def _save(fig: Any, path: Path) -> Path:
    """Write the picture all or nothing (:func:`rayaccel._outputs.atomic_path`)."""
    try:
        with atomic_path(path, "picture") as tmp:
            try:
                fig.savefig(tmp, dpi=150 if path.suffix.lower() == ".png" else None, bbox_inches="tight",
                            format=path.suffix.lower().lstrip("."))
            except OSError as e:
                raise OutputPathError(f"{path}: cannot write the picture ({e.strerror or e}); "
                                      "expected a file name in a folder you can write to", path) from None
    finally:
        _plt().close(fig)
    return path


def _legend_size(handles: list, scale: float) -> tuple[float, float]:
    """Estimated size of the legend (7 pt), layout units."""
    longest = max((len(h.get_label()) for h in handles), default=0)
    return (0.75 + longest * 7 * 0.58 / 72) / scale, (0.1 + len(handles) * 7 * 1.6 / 72) / scale


def _figure(blocks: list[tuple[NodeTopology, Any, str | None, float]], colours: Mapping[str, str], path: Path,
            title: str | None, groups: list[tuple[str, list[int]]] | None = None) -> Path:
    """Draw node blocks and the legend packed on one axes (:func:`pack_blocks`); with ``groups``
    (label, block indices), each group in a labelled frame (:func:`pack_groups`)."""
    plt = _plt()
    scale = blocks[0][3]
    fig = plt.figure()
    ax = fig.add_axes((0.0, 0.0, 1.0, 1.0))
    bounds = [_node_bounds(t, scale) for t, _, _, _ in blocks]
    sizes = [(x1 - x0, y1 - y0) for x0, y0, x1, y1 in bounds]
    expected: set[str] = set()
    for topo, assign, _, _ in blocks:  # the legend's size is packed with the nodes, so it is estimated first
        _check_assignments(topo, dict(assign or {}))
        expected |= _legend_keys(topo)
    legend = _legend_size(_legend_handles(expected, colours), scale) if _legend_handles(expected, colours) else None
    frames: list = []
    if groups:
        label_h = (_TITLE_PT * 1.6 / 72) / scale
        origins, frames, legend_at, width, height = pack_groups(sizes, [m for _, m in groups], _GAP, 0.35,
                                                                label_h, legend)
        if legend_at is not None:
            origins = list(origins) + [legend_at]
    else:
        origins, width, height = pack_blocks(sizes + ([legend] if legend else []), _GAP)
    head = (_TITLE_PT * 1.2 * 1.6 / 72) / scale if title else 0.0
    if frames:
        from matplotlib.patches import FancyBboxPatch

        for (label, _), (fx, fy, fw, fh) in zip(groups, frames):
            ax.add_patch(FancyBboxPatch((fx, fy), fw, fh, boxstyle="round,pad=0,rounding_size=0.2",
                                        fc="#f3f8ec", ec="#76b900", lw=1.4, zorder=0))
            ax.text(fx + 0.3, fy + 0.12, _t(label), fontsize=_TITLE_PT, ha="left", va="top", weight="bold",
                    color="#3b5d00")
    used: set[str] = set()
    for (topo, assign, name, _), (bx0, by0, _, _), (ox, oy) in zip(blocks, bounds, origins):
        used |= _draw_node(ax, topo, assign, name, colours, origin=(ox - bx0, oy - by0), scale=scale)
    handles = _legend_handles(used, colours)
    if handles:
        lx, ly = origins[-1]
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(lx, ly), bbox_transform=ax.transData,
                  fontsize=7, frameon=False, borderaxespad=0.0)
    if title:
        ax.text(0.0, -head, _t(title), fontsize=_TITLE_PT * 1.2, ha="left", va="top")
    margin = 0.15
    fig.set_size_inches((width + 2 * margin) * scale, (height + head + 2 * margin) * scale)
    ax.set_xlim(-margin, width + margin)
    ax.set_ylim(height + margin, -head - margin)
    ax.axis("off")
    return _save(fig, path)


def _legend_keys(topo: NodeTopology) -> set[str]:
    """The legend entries a node's drawing uses (as :func:`_draw_node` returns them)."""
    keys: set[str] = set()
    for l in drawn_links(topo):
        keys.add(f"kind:{l.kind}" if l.direct else f"pcie:{l.pcie}")
    for _, kind, _ in _all_to_all(topo):
        keys.add(f"kind:{kind}")
    if any(d.mig_mode or d.partitions for d in topo.devices):
        keys.add("mig")
    if topo.devices and nic_places(topo, *_layout(topo)):
        keys.add("nic")
    return keys


def draw_topology(topology: NodeTopology, path: str | Path, *, assignments: Assignments | None = None,
                  title: str | None = None) -> Path:
    """Draw one node's topology to ``path`` (``.png`` or ``.svg``).

    Args:
        topology: the node.
        path: output file; its suffix picks the format. Parent folders are created.
        assignments: who holds what: ``{device index: label}`` for whole devices and
            ``{Partition.key: label}`` (e.g. ``"0:mig7"``) for MIG instances; each label
            gets one colour, shown in the legend.
        title: picture title (default: the topology's name).

    Returns:
        The path written.

    Raises:
        VizError: unsupported suffix, or an assignment to a device or MIG instance the topology lacks.
        OutputPathError: a path that cannot be written (checked before drawing).
    """
    p = _check_path(path)
    colours = holder_colours(list((assignments or {}).values()))
    scale = SCALE_NODE if len(topology.devices) <= SMALL_ABOVE else SCALE_SMALL
    return _figure([(topology, assignments, title, scale)], colours, p, None)


def draw_cluster(nodes: Sequence[tuple[str, NodeTopology, Assignments]], path: str | Path,
                 title: str | None = None, domains: Sequence[str | None] | None = None) -> Path:
    """Draw several nodes packed tightly (in order, row by row), each with its assignments.

    Args:
        nodes: ``(node name, topology, assignments)`` per node; assignments as for
            :func:`draw_topology`. A label has the same colour on every node.
        path: output file (``.png`` or ``.svg``).
        title: picture title.
        domains: the NVLink domain of each node (``ray.io/gpu-domain``; None: none): nodes of one
            domain are drawn together in a frame labelled with it, domains in order of first
            appearance, nodes without one last. None (or no node in a domain): no frames.

    Returns:
        The path written.

    Raises:
        VizError: no nodes, unsupported suffix, or an assignment to an unknown device or MIG instance.
        OutputPathError: a path that cannot be written (checked before drawing).
    """
    p = _check_path(path)
    if not nodes:
        raise VizError("draw_cluster needs at least one (name, topology, assignments) node")
    colours = holder_colours([str(label) for _, _, a in nodes for label in (a or {}).values()])
    blocks = [(topo, assign, name, SCALE_CLUSTER) for name, topo, assign in nodes]
    return _figure(blocks, colours, p, title, domain_groups(domains, len(nodes)))
