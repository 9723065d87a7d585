"""Whitespace-aligned square matrices (rocm-smi and amd-smi tables) and AMD link rules."""

from __future__ import annotations

from dataclasses import dataclass

from ...topology import Link, make_link
from ._base import Fragment, Line, fail


@dataclass
class Grid:
    """One square table: column labels and the rows read (label -> cells)."""

    title: str
    labels: list[str]
    rows: dict[str, list[str]]
    header_line: int
    last_line: int


def read_grid(lines: list[Line], i: int, title: str, path: str) -> tuple[Grid | None, int]:
    """Read the table whose header is at or after ``lines[i]``.

    Returns:
        The grid (None when no header follows) and the index after it.

    Raises:
        CaptureError: a row whose label is not a column, or with a wrong number of cells
            that is not the last line of the text.
    """
    n = len(lines)
    while i < n and not lines[i].text.strip():
        i += 1
    if i >= n:
        return None, i
    header = lines[i]
    labels = header.text.split()
    if len(labels) < 1 or len(set(labels)) != len(labels):
        return None, i
    grid = Grid(title, labels, {}, header.no, header.no)
    i += 1
    last_text = max((ln.no for ln in lines if ln.text.strip()), default=0)
    while i < n:
        ln = lines[i]
        tok = ln.text.split()
        if not tok or tok[0] not in labels:
            break
        cells = tok[1:]
        if len(cells) != len(labels):
            if ln.no == last_text and len(cells) < len(labels):
                break  # cut at the end of the text: the caller reports missing rows
            raise fail(f"{title}: row {tok[0]} has {len(cells)} cells, expected {len(labels)} "
                       f"({labels[0]}..{labels[-1]}); cells merged or cut?", path, ln.no)
        own = cells[labels.index(tok[0])]
        if own.isdigit() and own != "0":
            raise fail(f"{title}: row {tok[0]} should have 0 (self) under {tok[0]}, got "
                       f"{own!r}; cells shifted?", path, ln.no)
        grid.rows[tok[0]] = cells
        grid.last_line = ln.no
        i += 1
    return grid, i


def cell(grid: Grid | None, a: int, b: int) -> str | None:
    """The value between columns ``a`` and ``b`` (either row), or None."""
    if grid is None:
        return None
    la, lb = grid.labels[a], grid.labels[b]
    if la in grid.rows:
        return grid.rows[la][b]
    if lb in grid.rows:
        return grid.rows[lb][a]
    return None


def _int(v: str | None) -> int | None:
    return int(v) if v is not None and v.isdigit() else None


def amd_link(a: int, b: int, kind: str | None, weight: str | None, hops: str | None,
             numa: tuple[int | None, int | None]) -> tuple[Link | None, bool]:
    """The link between two AMD GPUs from the rocm-smi / amd-smi tables.

    Kind: the link-type table when present (``XGMI`` -> ``xgmi``, ``PCIE`` ->
    ``pcie``); otherwise a weight of 15 (one xGMI hop in AMD SMI's weights) is
    read as xGMI and anything else as PCIe (second return value True: inferred).

    PCIe class: different known NUMA nodes -> ``SYS``; else by hops (1 -> ``PIX``,
    a direct PCIe peer; 2 -> ``PHB``, through the CPU root complex; 3 or more ->
    ``SYS``); without hops by weight (<= 40 -> ``PHB``, else ``SYS``).
    """
    inferred = False
    k = (kind or "").upper()
    w, h = _int(weight), _int(hops)
    if k not in ("XGMI", "PCIE"):
        if w is None:
            return None, False
        k = "XGMI" if w == 15 else "PCIE"
        inferred = True
    if k == "XGMI":
        return make_link(a, b, "xgmi"), inferred
    na, nb = numa
    if na is not None and nb is not None and na != nb:
        cls = "SYS"
    elif h is not None:
        cls = "PIX" if h <= 1 else "PHB" if h == 2 else "SYS"
    elif w is not None:
        cls = "PHB" if w <= 40 else "SYS"
    else:
        cls = "SYS"
    return make_link(a, b, "pcie", pcie=cls), inferred


def add_amd_links(frag: Fragment, n: int, kinds: Grid | None, weights: Grid | None, hops: Grid | None,
                  numa: dict[int, int | None]) -> None:
    """Fill ``frag.links`` for devices ``0..n-1`` from the three tables."""
    guessed = 0
    unknown = []
    for a in range(n):
        for b in range(a + 1, n):
            link, inferred = amd_link(a, b, cell(kinds, a, b), cell(weights, a, b), cell(hops, a, b),
                                      (numa.get(a), numa.get(b)))
            if link is None:
                unknown.append(f"{a}-{b}")
                continue
            guessed += inferred
            frag.links[(a, b)] = link
    if guessed:
        frag.warn(f"no link-type table: the kind of {guessed} links was inferred from weights "
                  "(15 = one xGMI hop, otherwise PCIe)")
    if unknown:
        shown = ", ".join(unknown[:8]) + (" ..." if len(unknown) > 8 else "")
        frag.warn(f"{len(unknown)} device pairs have no link information: {shown}")
