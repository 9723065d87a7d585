"""Where :mod:`rayaccel.viz` puts things: device centres and NUMA boxes, in data units.

Pure geometry over a :class:`~rayaccel.topology.NodeTopology` (no matplotlib): devices
grouped by NUMA node in a grid whose shape is chosen so the fewest drawn direct
links cross another device, and the all-to-all fabrics drawn as one band; the
route of every line (links, NIC joins) so that none runs underneath a device box
it does not end in (tests check this on every catalog machine).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Mapping, Sequence

from ._outputs import VizError
from .topology import PCIE_CLASSES, Nic, NodeTopology

DEV_W, DEV_H = 1.7, 1.05
STEP_X, STEP_Y = 2.3, 1.55
GROUP_PAD = 0.45
GROUP_GAP = 0.9


def _grid(topo: NodeTopology, cols: int, mirror: bool):
    groups: dict[Any, list[int]] = defaultdict(list)
    for d in sorted(topo.devices, key=lambda d: d.index):
        groups[d.numa_node].append(d.index)
    order = list(groups)
    n_groups = len(order)
    gcols = n_groups if n_groups <= 4 else math.ceil(math.sqrt(n_groups))
    biggest = max((len(v) for v in groups.values()), default=1)
    cols = max(1, min(cols, biggest))
    rows = math.ceil(biggest / cols)
    nic_rows = 1 if topo.nics else 0
    gw = cols * STEP_X + 2 * GROUP_PAD - (STEP_X - DEV_W)
    gh = rows * STEP_Y + 2 * GROUP_PAD + 0.35 - (STEP_Y - DEV_H) + nic_rows * 0.85
    pos: dict[int, tuple[float, float]] = {}
    boxes = []
    for g, numa in enumerate(order):
        gx, gy = (g % gcols) * (gw + GROUP_GAP), (g // gcols) * (gh + GROUP_GAP)
        boxes.append((numa, (gx, gy, gx + gw, gy + gh)))
        flip = mirror and g % 2 == 1
        for k, idx in enumerate(groups[numa]):
            col = k % cols
            if flip:
                col = cols - 1 - col
            x = gx + GROUP_PAD + DEV_W / 2 + col * STEP_X
            y = gy + GROUP_PAD + 0.35 + DEV_H / 2 + (k // cols) * STEP_Y
            pos[idx] = (x, y)
    return pos, boxes


def _blocked(pos: Mapping[int, tuple[float, float]], a: int, b: int) -> bool:
    """Whether the straight line between devices a and b runs through another device."""
    (xa, ya), (xb, yb) = pos[a], pos[b]
    dx, dy = xb - xa, yb - ya
    length2 = dx * dx + dy * dy or 1.0
    for i, (x, y) in pos.items():
        if i in (a, b):
            continue
        t = ((x - xa) * dx + (y - ya) * dy) / length2
        if 0.0 < t < 1.0:
            px, py = xa + t * dx, ya + t * dy
            if abs(px - x) < DEV_W / 2 + 0.05 and abs(py - y) < DEV_H / 2 + 0.05:
                return True
    return False


@lru_cache(maxsize=64)
def _layout(topo: NodeTopology):
    """Device centres and NUMA group boxes ``(numa, (x0, y0, x1, y1))`` in data units (y grows down).

    Tries a few grid shapes (and mirroring every second NUMA box) and keeps the
    one where the fewest drawn direct links would cross another device.
    """
    fabric = {i for dom, _, _ in _all_to_all(topo) for i in dom}
    drawn = [l for l in topo.links if l.direct and not (l.a in fabric and l.b in fabric)]
    sizes: dict[Any, int] = defaultdict(int)
    for d in topo.devices:
        sizes[d.numa_node] += 1
    biggest = max(sizes.values(), default=1)
    candidates = sorted({1, 2, 4, math.ceil(math.sqrt(biggest))} & set(range(1, biggest + 1))) or [1]
    best = None
    if len(topo.devices) > 64:  # big machines: a compact square-ish shape, no search
        return _grid(topo, math.ceil(math.sqrt(biggest)), False)
    for cols in candidates:
        for mirror in (False, True):
            pos, boxes = _grid(topo, cols, mirror)
            rows = math.ceil(biggest / cols)
            score = (sum(1 for l in drawn if _blocked(pos, l.a, l.b)), abs(rows - cols), mirror)
            if best is None or score < best[0]:
                best = (score, pos, boxes)
    return best[1], best[2]


def _all_to_all(topo: NodeTopology) -> list[tuple[frozenset[int], str, int | None]]:
    """Direct domains of >= 5 devices where every pair has the same direct link (fabrics)."""
    out = []
    for dom in topo.direct_domains():
        if len(dom) < 5:
            continue
        members = sorted(dom)
        kinds = set()
        complete = True
        for i, a in enumerate(members):
            for b in members[i + 1:]:
                l = topo.link(a, b)
                if l is None or not l.direct:
                    complete = False
                    break
                kinds.add((l.kind, l.count))
            if not complete:
                break
        if complete and len(kinds) == 1:
            kind, count = kinds.pop()
            out.append((dom, kind, count))
    return out


def _extent(topo: NodeTopology) -> tuple[float, float]:
    _, boxes = _layout(topo)
    if not boxes:
        return 4.0, 3.0
    w = max(b[2] for _, b in boxes) - min(b[0] for _, b in boxes)
    h = max(b[3] for _, b in boxes) - min(b[1] for _, b in boxes)
    return w, h


# ------------------------------------------------------------------ routes (pure geometry, tested)
Point = tuple[float, float]
Box = tuple[float, float, float, float]

#: PCIe classes drawn as lines (SYS is what crossing a NUMA box means); PHB/NODE are left out on big machines.
DRAWN_PCIE = ("PIX", "PXB", "PHB", "NODE")
#: Devices beyond which a picture is drawn small (no per-link labels, fewer PCIe lines).
SMALL_ABOVE = 24
#: NIC boxes: height, and the gap from the NUMA box's bottom edge to the NIC's centre.
NIC_H = 0.36
NIC_FROM_BOTTOM = 0.42
_CLEAR = 0.04  # a line must stay this far from a box it does not end in


def device_boxes(pos: Mapping[int, Point], pad: float = 0.0) -> dict[int, Box]:
    """``index -> (x0, y0, x1, y1)`` of each device's box (grown by ``pad``)."""
    return {i: (x - DEV_W / 2 - pad, y - DEV_H / 2 - pad, x + DEV_W / 2 + pad, y + DEV_H / 2 + pad)
            for i, (x, y) in pos.items()}


def segment_hits_box(p: Point, q: Point, box: Box) -> bool:
    """Whether the segment ``p``-``q`` passes through the open interior of ``box`` (Liang-Barsky)."""
    (x0, y0), (x1, y1) = p, q
    bx0, by0, bx1, by1 = box
    dx, dy = x1 - x0, y1 - y0
    lo, hi = 0.0, 1.0
    for d, a, b in ((dx, x0 - bx0, bx1 - x0), (dy, y0 - by0, by1 - y0)):
        if d == 0:
            if a <= 0 or b <= 0:  # parallel and outside (or on the edge)
                return False
            continue
        t1, t2 = -a / d, b / d
        if t1 > t2:
            t1, t2 = t2, t1
        lo, hi = max(lo, t1), min(hi, t2)
        if lo >= hi:
            return False
    return hi - lo > 1e-9


def polyline_hits(points: list[Point], boxes: Mapping[Any, Box], exclude: set[Any] = frozenset()) -> list[Any]:
    """Keys of the boxes (not in ``exclude``) that the polyline through ``points`` passes through."""
    return [k for k, box in boxes.items() if k not in exclude
            and any(segment_hits_box(points[j], points[j + 1], box) for j in range(len(points) - 1))]


def curve_points(p0: Point, c: Point, p2: Point, n: int = 32) -> list[Point]:
    """``n + 1`` points on the quadratic Bezier curve ``p0 -> c -> p2``."""
    out = []
    for k in range(n + 1):
        t = k / n
        u = 1 - t
        out.append((u * u * p0[0] + 2 * u * t * c[0] + t * t * p2[0], u * u * p0[1] + 2 * u * t * c[1] + t * t * p2[1]))
    return out


def drawn_links(topo: NodeTopology) -> list:
    """The links a picture draws as lines: direct links outside all-to-all fabrics, and PCIe
    paths of the classes in :data:`DRAWN_PCIE` (PIX/PXB only on big machines)."""
    fabric = {i for dom, _, _ in _all_to_all(topo) for i in dom}
    small = len(topo.devices) > SMALL_ABOVE
    out = []
    for l in topo.links:
        if l.direct:
            if not (l.a in fabric and l.b in fabric):
                out.append(l)
        elif l.pcie in DRAWN_PCIE and not (small and l.pcie in ("PHB", "NODE")):
            out.append(l)
    return out


def link_route(pos: Mapping[int, Point], a: int, b: int, centre: Point) -> tuple[str, list[Point]]:
    """How the line between devices ``a`` and ``b`` is drawn: ``("line", [p, q])``,
    ``("curve", [p0, control, p2])`` (a quadratic Bezier) or ``("poly", points)``.

    A straight line when it crosses no other device; else a curve through the gap between
    rows or columns, bent outward (away from the layout's centre) first, then inward, a
    little further each try, until its sampled points clear every other device box; else
    an orthogonal route along the gaps between rows and columns. The first clear candidate
    wins (the one crossing the fewest boxes when none is clear).
    """
    (xa, ya), (xb, yb) = pos[a], pos[b]
    boxes = device_boxes(pos, _CLEAR)
    if not polyline_hits([(xa, ya), (xb, yb)], boxes, {a, b}):
        return "line", [(xa, ya), (xb, yb)]
    best: tuple[int, str, list[Point]] | None = None
    for kind, pts in _link_candidates(pos[a], pos[b], centre):
        sampled = curve_points(*pts) if kind == "curve" else pts
        hits = len(polyline_hits(sampled, boxes, {a, b}))
        if best is None or hits < best[0]:
            best = (hits, kind, pts)
        if hits == 0:
            break
    return best[1], best[2]


def _link_candidates(pa: Point, pb: Point, centre: Point):
    (xa, ya), (xb, yb) = pa, pb
    mx, my = (xa + xb) / 2, (ya + yb) / 2
    dx, dy = xb - xa, yb - ya
    length = math.hypot(dx, dy) or 1.0
    nx, ny = -dy / length, dx / length
    if (mx - centre[0]) * nx + (my - centre[1]) * ny < 0:
        nx, ny = -nx, -ny
    horizontal = abs(dx) >= abs(dy)
    peak = (DEV_H / 2 + (STEP_Y - DEV_H) / 2) if horizontal else (DEV_W / 2 + (STEP_X - DEV_W) / 2)
    off = 2 * peak / max(abs(ny) if horizontal else abs(nx), 0.3)
    for sign in (1, -1):
        for grow in (1.0, 1.25, 1.5, 1.8, 2.2):
            yield "curve", [pa, (mx + sign * nx * off * grow, my + sign * ny * off * grow), pb]
    # Orthogonal routes along the gaps. They leave and enter a device off its centre line, so
    # their stubs do not lie on top of the straight links between neighbours.
    w, h = DEV_W / 2 + 0.22, DEV_H / 2 + 0.22  # the middle of a gutter / of a gap between rows
    ox = 0.45 if xb >= xa else -0.45
    oy = 0.3 if yb >= ya else -0.3
    for gy in (ya - h, ya + h, yb - h, yb + h):
        yield "poly", [(xa + ox, ya), (xa + ox, gy), (xb - ox, gy), (xb - ox, yb)]
    for gx in (xa - w, xa + w, xb - w, xb + w):
        yield "poly", [(xa, ya + oy), (gx, ya + oy), (gx, yb - oy), (xb, yb - oy)]
    for gx in (xa - w, xa + w):
        for gy in (yb - h, yb + h):
            yield "poly", [(xa, ya + oy), (gx, ya + oy), (gx, gy), (xb - ox, gy), (xb - ox, yb)]


def link_label_point(kind: str, pts: list[Point], a: int) -> Point:
    """Where a link's lane label goes: on the line (split on crossing diagonals), the curve's
    peak, or the middle of a route's middle segment."""
    if kind == "poly":
        mid = len(pts) // 2
        (x0, y0), (x1, y1) = pts[mid - 1], pts[mid]
        return (x0 + x1) / 2, (y0 + y1) / 2
    if kind == "line":
        (xa, ya), (xb, yb) = pts
        t = 0.5 if xa == xb or ya == yb else (0.44 if a % 2 == 0 else 0.56)
        return xa + t * (xb - xa), ya + t * (yb - ya)
    (xa, ya), (cx, cy), (xb, yb) = pts
    return 0.25 * xa + 0.5 * cx + 0.25 * xb, 0.25 * ya + 0.5 * cy + 0.25 * yb


@dataclass(frozen=True, slots=True)
class NicPlace:
    """Where a NIC is drawn and how it is joined to its closest devices.

    Attributes:
        nic: the NIC. x, y: centre of its box. width: box width (height :data:`NIC_H`).
        routes: ``(device index, polyline)`` per joined device; each polyline runs from the
            NIC's top edge to the device's edge through the gaps between devices, never
            underneath another device's box.
    """

    nic: Nic
    x: float
    y: float
    width: float
    routes: tuple[tuple[int, tuple[Point, ...]], ...]


def nic_places(topo: NodeTopology, pos: Mapping[int, Point], boxes: list) -> list[NicPlace]:
    """NICs in a strip at the bottom of their NUMA box, ordered under their closest devices,
    each joined to (at most 4 of) its closest devices by an orthogonal route."""
    if not topo.nics or not boxes:
        return []
    order = PCIE_CLASSES
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
    dev_boxes = device_boxes(pos, _CLEAR)
    out = []
    for numa, items in per_box.items():
        x0, y0, x1, y1 = box_of[numa]
        items.sort(key=lambda t: (t[0], t[1]))
        count = len(items)
        width = min(1.0, (x1 - x0 - 0.3) / count - 0.08)
        ny = y1 - NIC_FROM_BOTTOM
        in_box = [pos[d] for d in pos if dev_numa.get(d) == numa]
        bottom = max((y + DEV_H / 2 for _, y in in_box), default=y0)
        lanes = max(1, sum(min(4, len(it[3])) for it in items))
        lane = 0
        for k, (_, _, nic, near) in enumerate(items):
            nx = x0 + 0.15 + k * (width + 0.08) + width / 2
            routes = []
            joined = near[:4]
            for j, d in enumerate(joined):
                start = (nx - width / 2 + width * (j + 1) / (len(joined) + 1), ny - NIC_H / 2)
                channel = bottom + (ny - NIC_H / 2 - bottom) * (0.3 + 0.4 * (lane + 0.5) / lanes)
                lane += 1
                routes.append((d, tuple(_nic_route(start, pos[d], channel, dev_boxes, d, k))))
            out.append(NicPlace(nic, nx, ny, width, tuple(routes)))
    return out


def _nic_route(start: Point, dev: Point, channel: float, boxes: Mapping[int, Box], d: int, k: int) -> list[Point]:
    """From a NIC's top edge to device ``d``: straight up to its bottom edge when nothing is in
    the way, else along the channel above the NIC strip, up a gutter beside the device and
    into its side; the candidate crossing the fewest other boxes (none, on every catalog machine)."""
    x, y = dev
    straight = [start, (x + 0.12 * ((k % 3) - 1), y + DEV_H / 2)]
    if not polyline_hits(straight, boxes, {d}):
        return straight
    best = None
    shift = 0.05 * ((k % 5) - 2)
    for side in sorted((-1, 1), key=lambda s: abs((x + s * DEV_W / 2) - start[0])):
        gx = x + side * (DEV_W / 2 + 0.22 + shift * side)
        ey = y + 0.22 + 0.04 * (k % 3)
        route = [start, (start[0], channel), (gx, channel), (gx, ey), (x + side * DEV_W / 2, ey)]
        hits = len(polyline_hits(route, boxes, {d}))
        if best is None or hits < best[0]:
            best = (hits, route)
        if hits == 0:
            break
    return best[1]


# ------------------------------------------------------------------ packing node blocks (cluster pictures)
def pack_blocks(sizes: list[tuple[float, float]], gap: float) -> tuple[list[tuple[float, float]], float, float]:
    """Pack ``(width, height)`` blocks ``gap`` apart on shelves: ``(origins, width, height)``,
    ``origins`` (top-left corners) in the order of ``sizes``.

    Each shelf is filled left to right; a block goes on the first shelf it fits on. Blocks
    are taken in the given order, or tallest first (first-fit decreasing height) when that
    is more than 5% tighter. Every shelf width some run of blocks gives is tried, and the
    smallest bounding area wins, avoiding pictures flatter than 3:1 or taller than 1:1.2.
    """
    given = list(range(len(sizes)))
    tallest_first = sorted(given, key=lambda i: (-sizes[i][1], i))
    widest = max(w for w, _ in sizes)
    candidates = {widest}
    for a in range(len(given)):
        acc = 0.0
        for i in tallest_first[a:]:
            acc += sizes[i][0] + (gap if acc else 0.0)
            candidates.add(max(acc, widest))
    best = None
    # the given order first: it wins unless tallest-first packs more than 5% tighter
    for order, bias in ((given, 1.0), (tallest_first, 1.05)):
        for limit in sorted(candidates):
            placed = _shelves(sizes, order, limit, gap)
            width, height = placed[1], placed[2]
            aspect = width / height
            score = width * height * (1.0 if 1 / 1.2 <= aspect <= 3.0 else 4.0) * bias
            if best is None or score < best[0]:
                best = (score, *placed)
    return best[1], best[2], best[3]


def _shelves(sizes: list[tuple[float, float]], order: list[int], limit: float, gap: float):
    """First-fit shelves of at most ``limit`` wide, blocks taken in ``order``: ``(origins, width, height)``.

    A block joins an earlier shelf only if it is no taller; the last shelf grows to fit."""
    shelves: list[list[float]] = []  # [y, height, x filled]
    origins: dict[int, tuple[float, float]] = {}
    for i in order:
        w, h = sizes[i]
        for shelf in shelves:
            if shelf[2] + gap + w <= limit + 1e-9 and (h <= shelf[1] + 1e-9 or shelf is shelves[-1]):
                origins[i] = (shelf[2] + gap, shelf[0])
                shelf[2] += gap + w
                shelf[1] = max(shelf[1], h)
                break
        else:
            y = shelves[-1][0] + shelves[-1][1] + gap if shelves else 0.0
            shelves.append([y, h, w])
            origins[i] = (0.0, y)
    width = max(sh[2] for sh in shelves)
    height = shelves[-1][0] + shelves[-1][1]
    return [origins[i] for i in range(len(sizes))], width, height


def pack_groups(sizes: list[tuple[float, float]], groups: list[list[int]], gap: float, pad: float, head: float,
                extra: tuple[float, float] | None = None):
    """Pack blocks in framed groups (one frame per NVLink domain of a cluster picture).

    Each group's blocks are packed with :func:`pack_blocks`; the group's frame adds ``pad``
    around them and ``head`` above them for its label; the frames (and ``extra``, e.g. the
    legend, as one more unframed block) are packed the same way.

    Returns:
        ``(origins, frames, extra_origin, width, height)``: top-left corner of every block (in
        the order of ``sizes``), ``(x, y, w, h)`` of every group's frame (in the order of
        ``groups``), the top-left corner of ``extra`` (None without it), the picture's size.
    """
    inner = []
    outer: list[tuple[float, float]] = []
    for members in groups:
        org, w, h = pack_blocks([sizes[i] for i in members], gap)
        inner.append(org)
        outer.append((w + 2 * pad, h + 2 * pad + head))
    if extra is not None:
        outer.append(extra)
    at, width, height = pack_blocks(outer, gap)
    origins: list[tuple[float, float]] = [(0.0, 0.0)] * len(sizes)
    frames = []
    for g, members in enumerate(groups):
        gx, gy = at[g]
        frames.append((gx, gy, outer[g][0], outer[g][1]))
        for i, (ox, oy) in zip(members, inner[g]):
            origins[i] = (gx + pad + ox, gy + pad + head + oy)
    return origins, frames, (at[-1] if extra is not None else None), width, height


def domain_groups(domains: Sequence[str | None] | None, n: int) -> list[tuple[str, list[int]]] | None:
    """(frame label, node positions) per NVLink domain, or None when there is nothing to group.

    Raises:
        VizError: ``domains`` is not one name (or None) per node.
    """
    if domains is None:
        return None
    if isinstance(domains, (str, bytes)) or not isinstance(domains, Sequence) or len(domains) != n:
        raise VizError(f"domains: expected one NVLink domain name (or None) per node ({n}), got {domains!r}"[:200])
    if any(d is not None and not isinstance(d, str) for d in domains):
        raise VizError("domains: expected strings or None")
    if all(d is None for d in domains):
        return None
    order: dict[str | None, list[int]] = {}
    for i, d in enumerate(domains):
        order.setdefault(d, []).append(i)
    keys = sorted(order, key=lambda d: (d is None, list(order).index(d)))
    return [(f"NVLink domain {d}" if d is not None else "no NVLink domain", order[d]) for d in keys]
