"""Where :mod:`rayaccel.viz` puts things: device centres and NUMA boxes, in data units.

Pure geometry over a :class:`~rayaccel.topology.NodeTopology` (no matplotlib): devices
grouped by NUMA node in a grid whose shape is chosen so the fewest drawn direct
links cross another device, and the all-to-all fabrics drawn as one band.
"""

from __future__ import annotations

import math
from collections import defaultdict
from functools import lru_cache
from typing import Any, Mapping

from .topology import NodeTopology

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
