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
* NICs as small boxes in their NUMA box, joined to their closest devices;
* MIG partitions as coloured segments of an 8-slice strip inside a device;
* assignments (device -> label) as coloured fills with a legend.
"""

from __future__ import annotations

import errno
import math
import os
import stat
from collections import defaultdict
from pathlib import Path
from typing import Any, Mapping, Sequence

from ._viz_layout import DEV_H, DEV_W, STEP_X, STEP_Y, _all_to_all, _blocked, _extent, _layout  # noqa: F401
from .errors import OutputPathError, RayaccelError
from .topology import DIRECT_KINDS, NodeTopology

__all__ = ["SUFFIXES", "OutputPathError", "check_output_dir", "check_output_file", "draw_cluster", "draw_topology"]

#: Supported output suffixes.
SUFFIXES = (".png", ".svg")

KIND_COLOURS = {"nvlink": "#76b900", "xgmi": "#d6202a", "neuronlink": "#ff9900"}
KIND_NAMES = {"nvlink": "NVLink", "xgmi": "xGMI (Infinity Fabric)", "neuronlink": "NeuronLink"}
PCIE_STYLE = {  # class -> (linestyle, width, alpha)
    "PIX": ("-", 1.6, 0.9),
    "PXB": ("--", 1.3, 0.8),
    "PHB": (":", 1.1, 0.55),
    "NODE": (":", 0.9, 0.35),
}
ASSIGN_COLOURS = ("#1f77b4", "#ff7f0e", "#9467bd", "#e377c2", "#17becf", "#8c564b", "#bcbd22", "#d62728",
                  "#2ca02c", "#7f7f7f")
MIG_COLOURS = ("#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#edc948", "#76b7b2", "#ff9da7")


class VizError(RayaccelError, ValueError):
    """A picture cannot be drawn as asked (bad path suffix, bad assignment)."""


def _kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if stat.S_ISREG(st.st_mode):
        return "a file"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "a device"
    return "not a file or folder"


def _writable_folder(folder: Path, target: Path, what: str) -> None:
    """``folder`` (the nearest existing ancestor of ``target``) is a folder this process may write in."""
    try:
        st = folder.stat()
    except OSError as e:
        raise OutputPathError(f"{target}: cannot write the {what} here: {folder}: {e.strerror or e}", target) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{target}: cannot write the {what} here: {folder} is {_kind(st)}, not a folder; "
                              "expected a path in a folder you can write to", target)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{target}: cannot write the {what} here: no permission to write in {folder}; "
                              "expected a path in a folder you can write to", target)


def _existing_ancestor(p: Path) -> Path:
    """The nearest ancestor of ``p`` (``p`` itself included) that exists, or that stat cannot pass."""
    probe = p
    while True:
        try:
            probe.stat()
            return probe
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                return probe
            probe = probe.parent
        except OSError:  # too long, no permission: let the caller report it
            return probe


def check_output_dir(path: str | Path, what: str = "output") -> Path:
    """Check, before any work, that ``path`` is a folder (or can be created as one) this process can write in.

    Creates nothing. A path that exists must be a folder; otherwise its nearest existing
    ancestor must be a writable folder (so ``/dev/null/x`` fails here, naming ``/dev/null``).

    Args:
        path: the output folder. what: what will be written there, for messages.

    Returns:
        ``path`` as a Path.

    Raises:
        OutputPathError: naming the path, what is in the way and what would work.
    """
    p = Path(path)
    if not str(path).strip():
        raise OutputPathError(f"empty output folder name; expected a folder to write the {what} to", path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        _writable_folder(_existing_ancestor(p), p, what)
        return p
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise OutputPathError(f"{str(p)[:80]}…: cannot write the {what} here: the name is too long", path) from None
        raise OutputPathError(f"{p}: cannot write the {what} here: {e.strerror or e}", path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{p}: is {_kind(st)}, not a folder; expected a folder for the {what}", path)
    _writable_folder(p, p, what)
    return p


def check_output_file(path: str | Path, what: str = "picture", suffixes: Sequence[str] | None = SUFFIXES) -> Path:
    """Check, before any work, that a file can be written at ``path`` (a picture by default).

    Args:
        path: the output file. what: what it is, for messages.
        suffixes: allowed suffixes (lower case, with the dot), or None for any.

    Returns:
        ``path`` as a Path.

    Raises:
        VizError: a suffix not in ``suffixes``.
        OutputPathError: the path is a folder, or its folder cannot be created or written.
    """
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise VizError(f"{p}: unsupported picture format {p.suffix or '(none)'!r}; use a file name ending in "
                       + " or ".join(suffixes))
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        _writable_folder(_existing_ancestor(p.parent), p, what)
        return p
    except OSError as e:
        raise OutputPathError(f"{str(p)[:200]}: cannot write the {what}: {e.strerror or e}", path) from None
    if stat.S_ISDIR(st.st_mode):
        ends = " or ".join(suffixes) if suffixes else ""
        raise OutputPathError(f"{p}: is a directory; expected a file name" + (f" ending in {ends}" if ends else ""),
                              path)
    _writable_folder(p.parent, p, what)
    return p


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




def _short_model(model: str | None) -> str:
    if not model:
        return ""
    for prefix in ("NVIDIA ", "AMD Instinct ", "Tesla ", "AMD "):
        if model.startswith(prefix):
            model = model[len(prefix):]
    return model if len(model) <= 18 else model[:17] + "…"


def _gib(n: int | None) -> str:
    return "" if n is None else f"{n / (1 << 30):.0f} GiB"


# ------------------------------------------------------------------ drawing
def _draw_node(ax: Any, topo: NodeTopology, assignments: Mapping[int, str] | None, title: str | None,
               colours: dict[str, str]) -> set[str]:
    """Draw one node on ``ax``; return the legend keys used."""
    from matplotlib.patches import FancyBboxPatch, Rectangle

    assignments = dict(assignments or {})
    unknown = sorted(set(assignments) - set(topo.indices))
    if unknown:
        raise VizError(f"assignments name devices {unknown} that {topo.name or 'the topology'} does not have "
                       f"(devices: {list(topo.indices)})")
    n = len(topo.devices)
    if n == 0:
        ax.text(0.5, 0.5, "no devices", ha="center", va="center", transform=ax.transAxes)
        ax.set_title(title or topo.name or "topology", fontsize=10, loc="left")
        ax.axis("off")
        return set()
    pos, boxes = _layout(topo)
    small = n > 24
    used: set[str] = set()
    fabrics = _all_to_all(topo)
    in_fabric = {i for dom, _, _ in fabrics for i in dom}

    for numa, (x0, y0, x1, y1) in boxes:
        ax.add_patch(FancyBboxPatch((x0, y0), x1 - x0, y1 - y0, boxstyle="round,pad=0.02,rounding_size=0.2",
                                    fc="#f4f6f8", ec="#9aa5b1", lw=1.0, zorder=0))
        cpu = next((d.cpus for d in topo.devices if d.numa_node == numa and d.cpus), None)
        label = "NUMA ?" if numa is None else f"NUMA {numa}"
        if cpu and not small:
            label += f"  CPUs {_ranges(cpu)}"
        ax.text(x0 + 0.15, y0 + 0.22, label, fontsize=6 if small else 8, color="#52606d", va="center", zorder=1)

    X0 = min(bx[0] for _, bx in boxes)
    X1 = max(bx[2] for _, bx in boxes)
    Y0 = min(bx[1] for _, bx in boxes)
    Y1 = max(bx[3] for _, bx in boxes)
    centre = ((X0 + X1) / 2, (Y0 + Y1) / 2)
    top = Y0
    # fabrics: one shaded band per all-to-all domain instead of n*(n-1)/2 lines
    for k, (dom, kind, count) in enumerate(fabrics):
        colour = KIND_COLOURS.get(kind, "#444")
        if len(dom) == n:  # the whole node: shade around every NUMA box
            bx0, by0, bx1, by1 = X0 - 0.18, Y0 - 0.18, X1 + 0.18, Y1 + 0.18
        else:
            xs = [pos[i][0] for i in dom]
            ys = [pos[i][1] for i in dom]
            bx0, by0 = min(xs) - DEV_W / 2 - 0.12, min(ys) - DEV_H / 2 - 0.12
            bx1, by1 = max(xs) + DEV_W / 2 + 0.12, max(ys) + DEV_H / 2 + 0.12
        ax.add_patch(FancyBboxPatch((bx0, by0), bx1 - bx0, by1 - by0, boxstyle="round,pad=0.02,rounding_size=0.25",
                                    fc=colour, ec=colour, alpha=0.14, lw=3, zorder=-1))
        lanes = f"{count} links" if count else "linked"
        bw = topo.link(*sorted(dom)[:2]).bandwidth_gbps
        used.add(f"kind:{kind}")
        via = "NVSwitch fabric" if kind == "nvlink" else "all-to-all"
        label_y = by0 - 0.3 - 0.45 * k
        top = min(top, label_y - 0.3)
        ax.text(bx0, label_y, f"{KIND_NAMES.get(kind, kind)} {via}: every pair of {len(dom)} devices {lanes} "
                f"(~{bw:.0f} GB/s per direction, modeled)",
                fontsize=7 if small else 8.5, color=colour, fontweight="bold", va="center", zorder=6)

    max_lanes = max((l.count or 1 for l in topo.links if l.direct), default=1)
    for l in topo.links:
        if l.direct:
            if l.a in in_fabric and l.b in in_fabric:
                continue
            colour = KIND_COLOURS.get(l.kind, "#444")
            width = 1.2 + 4.0 * (l.count or 1) / max_lanes
            lx, ly = _line(ax, pos, l.a, l.b, centre, colour=colour, lw=width, ls="-", alpha=0.85, z=2)
            used.add(f"kind:{l.kind}")
            if not small and l.count and max_lanes > 1:
                ax.text(lx, ly, l.label, fontsize=6.5, color=colour, ha="center", va="center", fontweight="bold",
                        zorder=3, bbox=dict(boxstyle="round,pad=0.12", fc="white", ec=colour, lw=0.5, alpha=0.9))
        elif l.pcie in PCIE_STYLE and not (small and l.pcie in ("PHB", "NODE")):
            ls, lw, alpha = PCIE_STYLE[l.pcie]
            _line(ax, pos, l.a, l.b, centre, colour="#6b7785", lw=lw, ls=ls, alpha=alpha, z=1.5)
            used.add(f"pcie:{l.pcie}")

    # devices
    for d in topo.devices:
        x, y = pos[d.index]
        work = assignments.get(d.index)
        fc = colours[work] if work is not None else "white"
        ec = "#1f2933"
        if d.health == "failed":
            ec = "#d62728"
        ax.add_patch(FancyBboxPatch((x - DEV_W / 2, y - DEV_H / 2), DEV_W, DEV_H,
                                    boxstyle="round,pad=0.02,rounding_size=0.08", fc=fc, ec=ec,
                                    lw=2.2 if work is not None else 1.1, zorder=4))
        text_colour = "white" if work is not None else "#1f2933"
        if small:
            ax.text(x, y, str(d.index), fontsize=7, ha="center", va="center", color=text_colour, zorder=5,
                    fontweight="bold")
        else:
            head = f"{_prefix(d.vendor)}{d.index}"
            ax.text(x, y - DEV_H / 2 + 0.2, head, fontsize=8.5, ha="center", va="center", color=text_colour,
                    fontweight="bold", zorder=5)
            ax.text(x, y - 0.02, _short_model(d.model), fontsize=6, ha="center", va="center", color=text_colour,
                    zorder=5)
            sub = _gib(d.memory_bytes) if work is None else work
            if d.health not in ("ok",):
                sub += f" [{d.health}]"
            ax.text(x, y + 0.2, sub, fontsize=6, ha="center", va="center", color=text_colour, zorder=5,
                    fontweight="bold" if work is not None else "normal")
        if d.mig_mode or d.partitions:
            _draw_mig(ax, d, x, y, small, Rectangle)
            used.add("mig")

    _draw_nics(ax, topo, pos, boxes, small, used)

    ax.set_xlim(X0 - 0.3, X1 + 0.3)
    ax.set_ylim(Y1 + 0.3, top - 0.3)
    ax.set_aspect("equal")
    ax.axis("off")
    head = title or topo.name or topo.hostname or "topology"
    summary = f"{n} device{'s' if n != 1 else ''}" + (f", {len(topo.nics)} NIC{'s' if len(topo.nics) != 1 else ''}" if topo.nics else "")
    ax.set_title(f"{head}\n{summary}", fontsize=10, loc="left")
    return used


def _prefix(vendor: str) -> str:
    return {"aws": "NEURON", "amd": "GPU", "nvidia": "GPU"}.get(vendor, "DEV")


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


def _line(ax: Any, pos, a: int, b: int, centre: tuple[float, float], *, colour: str, lw: float, ls: str,
          alpha: float, z: float) -> tuple[float, float]:
    """A straight line, or a curve through the gap between rows/columns when the
    straight one would run through another device; returns the label point."""
    from matplotlib.patches import PathPatch
    from matplotlib.path import Path as MPath

    (xa, ya), (xb, yb) = pos[a], pos[b]
    mx, my = (xa + xb) / 2, (ya + yb) / 2
    if not _blocked(pos, a, b):
        ax.plot([xa, xb], [ya, yb], color=colour, lw=lw, ls=ls, alpha=alpha, zorder=z, solid_capstyle="round")
        t = 0.5 if xa == xb or ya == yb else (0.44 if a % 2 == 0 else 0.56)  # crossing diagonals: split labels
        return xa + t * (xb - xa), ya + t * (yb - ya)
    dx, dy = xb - xa, yb - ya
    length = math.hypot(dx, dy) or 1.0
    nx, ny = -dy / length, dx / length
    # bend outward (away from the layout centre); the peak of a quadratic curve is half the offset
    if (mx - centre[0]) * nx + (my - centre[1]) * ny < 0:
        nx, ny = -nx, -ny
    horizontal = abs(dx) >= abs(dy)
    peak = (DEV_H / 2 + (STEP_Y - DEV_H) / 2) if horizontal else (DEV_W / 2 + (STEP_X - DEV_W) / 2)
    off = 2 * peak / max(abs(ny) if horizontal else abs(nx), 0.3)
    cx, cy = mx + nx * off, my + ny * off
    path = MPath([(xa, ya), (cx, cy), (xb, yb)], [MPath.MOVETO, MPath.CURVE3, MPath.CURVE3])
    ax.add_patch(PathPatch(path, fc="none", ec=colour, lw=lw, ls=ls, alpha=alpha, zorder=z, capstyle="round"))
    return 0.25 * xa + 0.5 * cx + 0.25 * xb, 0.25 * ya + 0.5 * cy + 0.25 * yb


def _draw_mig(ax: Any, d, x: float, y: float, small: bool, Rectangle) -> None:
    """An 8-slice strip at the bottom of the device; each MIG instance a coloured segment."""
    slots = 8
    sw = (DEV_W - 0.2) / slots
    sy = y + DEV_H / 2 - 0.24
    x0 = x - DEV_W / 2 + 0.1
    for s in range(slots):
        ax.add_patch(Rectangle((x0 + s * sw, sy), sw, 0.17, fc="#e4e7eb", ec="#9aa5b1", lw=0.4, zorder=5))
    unplaced = 0
    for k, p in enumerate(d.partitions):
        if p.start is None:
            unplaced += 1
            continue
        size = p.size or 1
        colour = MIG_COLOURS[k % len(MIG_COLOURS)]
        ax.add_patch(Rectangle((x0 + p.start * sw, sy), size * sw, 0.17, fc=colour, ec="#1f2933", lw=0.5, zorder=6))
        if not small:
            text = p.profile if size >= 4 else p.profile.split(".")[0]
            ax.text(x0 + (p.start + size / 2) * sw, sy + 0.085, text, fontsize=4.5, ha="center", va="center",
                    color="white", fontweight="bold", zorder=7)
    if unplaced and not small:
        ax.text(x, sy + 0.085, f"{len(d.partitions)} MIG", fontsize=5, ha="center", va="center", zorder=7)


def _draw_nics(ax: Any, topo: NodeTopology, pos, boxes, small: bool, used: set[str]) -> None:
    """NICs in a strip at the bottom of their NUMA box, ordered under their closest devices."""
    from matplotlib.patches import FancyBboxPatch

    if not topo.nics:
        return
    order = ("PIX", "PXB", "PHB", "NODE", "SYS")
    box_of = {numa: b for numa, b in boxes}
    dev_numa = {d.index: d.numa_node for d in topo.devices}
    per_box: dict[Any, list] = defaultdict(list)
    for nic in topo.nics:
        ranks = [order.index(c) for _, c in nic.paths if c in order]
        best = min(ranks, default=len(order) - 1)
        near = [d for d, c in nic.paths if c in order and order.index(c) == best and c != "SYS" and d in pos]
        numa = nic.numa_node if nic.numa_node in box_of else (dev_numa.get(near[0]) if near else None)
        if numa not in box_of:
            numa = boxes[-1][0]
        near = [d for d in near if dev_numa.get(d) == numa] or near
        key = sum(pos[d][0] for d in near) / len(near) if near else math.inf
        per_box[numa].append((key, nic.name, nic, near))
    for numa, items in per_box.items():
        x0, y0, x1, y1 = box_of[numa]
        items.sort(key=lambda t: (t[0], t[1]))
        count = len(items)
        width = min(1.0, (x1 - x0 - 0.3) / count - 0.08)
        for k, (_, _, nic, near) in enumerate(items):
            nx = x0 + 0.15 + k * (width + 0.08) + width / 2
            ny = y1 - 0.42
            ax.add_patch(FancyBboxPatch((nx - width / 2, ny - 0.18), width, 0.36,
                                        boxstyle="round,pad=0.01,rounding_size=0.05",
                                        fc="#fff4d6", ec="#b7791f", lw=0.8, zorder=4))
            if not small:
                ax.text(nx, ny, nic.name.replace("mlx5_", "mlx"), fontsize=5.5 if width < 0.7 else 6.5,
                        ha="center", va="center", zorder=5)
            for d in near[:4]:
                dx, dy = pos[d]
                ax.plot([nx, dx], [ny - 0.18, dy + DEV_H / 2], color="#b7791f", lw=0.7, alpha=0.6, zorder=1.6)
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
        handles.append(Patch(fc=MIG_COLOURS[0], ec="#1f2933", label="MIG instance (8 memory slices)"))
    for label, colour in colours.items():
        handles.append(Patch(fc=colour, ec="#1f2933", label=label))
    return handles


def _colours(labels: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for label in labels:
        if label not in out:
            out[label] = ASSIGN_COLOURS[len(out) % len(ASSIGN_COLOURS)]
    return out


def _save(fig: Any, path: Path) -> Path:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=150 if path.suffix.lower() == ".png" else None, bbox_inches="tight")
    except OSError as e:
        raise OutputPathError(f"{path}: cannot write the picture ({e.strerror or e}); "
                              "expected a file name in a folder you can write to", path) from None
    finally:
        _plt().close(fig)
    return path


def draw_topology(topology: NodeTopology, path: str | Path, *, assignments: Mapping[int, str] | None = None,
                  title: str | None = None) -> Path:
    """Draw one node's topology to ``path`` (``.png`` or ``.svg``).

    Args:
        topology: the node.
        path: output file; its suffix picks the format. Parent folders are created.
        assignments: device index -> label of the work holding it (drawn highlighted, with a legend).
        title: picture title (default: the topology's name).

    Returns:
        The path written.

    Raises:
        VizError: unsupported suffix, a path that cannot be written, or an assignment to a device
            the topology lacks.
    """
    p = _check_path(path)
    plt = _plt()
    w, h = _extent(topology)
    scale = 0.85 if len(topology.devices) <= 24 else 0.55
    fig, ax = plt.subplots(figsize=(max(6.0, w * scale + 3.2), max(3.5, h * scale + 1.0)))
    colours = _colours(list((assignments or {}).values()))
    used = _draw_node(ax, topology, assignments, title, colours)
    handles = _legend_handles(used, colours)
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=7, frameon=False)
    return _save(fig, p)


def draw_cluster(nodes: Sequence[tuple[str, NodeTopology, Mapping[int, str]]], path: str | Path,
                 title: str | None = None) -> Path:
    """Draw several nodes side by side, each with its assignments.

    Args:
        nodes: ``(node name, topology, {device index: work label})`` per node.
        path: output file (``.png`` or ``.svg``).
        title: picture title.

    Returns:
        The path written.

    Raises:
        VizError: no nodes, unsupported suffix, a path that cannot be written, or an assignment to an
            unknown device.
    """
    p = _check_path(path)
    if not nodes:
        raise VizError("draw_cluster needs at least one (name, topology, assignments) node")
    plt = _plt()
    extents = [_extent(t) for _, t, _ in nodes]
    # Two nodes per row keeps the picture readable (a single row of 4 nodes is ~6:1).
    cols = 1 if len(nodes) == 1 else 2
    rows = [list(range(i, min(i + cols, len(nodes)))) for i in range(0, len(nodes), cols)]
    row_w = [sum(max(3.0, extents[i][0] * 0.6) for i in r) for r in rows]
    row_h = [max(max(2.5, extents[i][1] * 0.6) for i in r) + 0.8 for r in rows]
    fig = plt.figure(figsize=(max(row_w) + 3.0, sum(row_h) + 0.8))
    outer = fig.add_gridspec(len(rows), 1, height_ratios=row_h)
    axes_list = []
    for k, r in enumerate(rows):
        ratios = [max(1.0, extents[i][0]) for i in r] + ([max(1.0, extents[r[0]][0])] * (cols - len(r)))
        inner = outer[k].subgridspec(1, cols, width_ratios=ratios)
        axes_list += [fig.add_subplot(inner[0, j]) for j in range(len(r))]
    colours = _colours([label for _, _, a in nodes for label in (a or {}).values()])
    used: set[str] = set()
    for ax, (name, topo, assign) in zip(axes_list, nodes):
        used |= _draw_node(ax, topo, assign, name, colours)
    handles = _legend_handles(used, colours)
    if handles:
        fig.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 0.95), fontsize=7, frameon=False)
    if title:
        fig.suptitle(title, fontsize=12, x=0.02, ha="left")
    fig.tight_layout()
    return _save(fig, p)
