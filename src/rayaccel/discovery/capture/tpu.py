"""``tpu-info`` and the TPU VM's ``tpu-env`` metadata: Google TPU chips on a host's ICI grid.

* ``tpu-info`` (Cloud TPU's ``tpu-info`` CLI, every release: rich box tables or the
  plain ``|`` tables, ``Chip``/``Device`` first column, ``Devices``/``Cores`` third): only
  the ``TPU Chips`` table is read, by its header (the chip column is required; without a
  ``Type`` column the ``Accelerator type:`` line gives the generation) -- one row per chip, ``/dev/accel<N>`` (v4) or
  ``/dev/vfio/<N>`` (v5e, v5p, v6e, 7x), its type (``TPU v4 chip``) -- plus the
  ``Accelerator type:`` line when present. ``N`` is the chip index ``TPU_VISIBLE_CHIPS``
  names. The chips' places on the grid are not in the output: they follow the host shape
  of that chip count (:func:`host_grid`), with a warning saying so.
* ``tpu-env`` (the TPU VM metadata attribute, ``KEY: 'value'`` lines, as
  ``curl .../instance/attributes/tpu-env`` or torch_xla's ``get_tpu_env()`` print it):
  ``ACCELERATOR_TYPE`` (``v4-256``), ``TOPOLOGY``, ``CHIPS_PER_HOST_BOUNDS`` (the host's
  grid), ``HOST_BOUNDS``, ``WORKER_ID``, ``NODE_ID`` (the TPU's name), ``TYPE``. Gives the
  host's chips with their coordinates in the slice and the :class:`~rayaccel.topology.Slice`.

Chips are vendor ``"google"``, model ``"TPU v4"``; neighbouring chips on the host's grid
are joined by ``ici`` links (the host's chips form an ICI mesh: a v4/v5p tray is 2x2x1, a
v5e/v6e host 2x2 or 2x4).
"""

from __future__ import annotations

import re

from ...topology import Device, Link, Slice, make_link
from ._base import Fragment, Line, fail, find_hostname

FORMAT_INFO = "tpu-info"
FORMAT_ENV = "tpu-env"

#: HBM per chip by generation, GiB (tpu-info's own TpuChip table).
HBM_GIB = {"v2": 8, "v3": 16, "v4": 32, "v5e": 16, "v5p": 95, "v6e": 32, "7x": 192}
_BOX = "│┃|"
_TITLE = re.compile(r"^\s*TPU Chips\s*$")
_CHIP = re.compile(r"^/dev/(accel|vfio/)(\d+)$")
_TYPE = re.compile(r"^TPU\s*v?\w+(?:\s+chip)?$")
_ACCEL_TYPE = re.compile(r"^\s*Accelerator type:\s*(\S+)\s*$")
_ENV_LINE = re.compile(r"^\s*([A-Z][A-Z0-9_]*):\s*'([^']*)'\s*$")
_BOUNDS = re.compile(r"^(\d+),(\d+),(\d+)$")


def host_grid(n: int) -> tuple[int, int, int] | None:
    """The chip grid of a TPU host with ``n`` chips: 1 -> 1x1x1, 4 -> 2x2x1, 8 -> 2x4x1 (None otherwise).

    Google's host shapes: a v4 / v5p tray is 2x2x1; v5e and v6e hosts are 1x1, 2x2 or 2x4
    (Cloud TPU docs, "TPU v6e" / "TPU v5p" configurations); chip ``i`` sits at
    ``(i % x, i // x % y, i // (x*y))``, as JAX lists single-host devices (``coords=(1,0,0)``
    for device 1 of a v4-8, ``(0,3,0)`` for device 6 of a v6e-8).
    """
    return {1: (1, 1, 1), 4: (2, 2, 1), 8: (2, 4, 1)}.get(n)


def chip_coords(i: int, grid: tuple[int, int, int], origin: tuple[int, int, int] = (0, 0, 0)) -> tuple[int, int, int]:
    """Coordinates of chip ``i`` of a host of ``grid`` whose corner is at ``origin`` (x fastest)."""
    x, y, _ = grid
    return (origin[0] + i % x, origin[1] + i // x % y, origin[2] + i // (x * y))


def grid_links(devices: dict[int, tuple[int, int, int]]) -> list[Link]:
    """``ici`` links between chips one step apart on the grid (chip index -> coordinates)."""
    at = {c: i for i, c in devices.items()}
    out = []
    for i, c in devices.items():
        for dim in range(3):
            nb = tuple(c[k] + (1 if k == dim else 0) for k in range(3))
            j = at.get(nb)
            if j is not None:
                out.append(make_link(i, j, "ici"))
    return out


def _generation(text: str) -> str | None:
    m = re.search(r"(?:tpu\s*)?(v?\d+[a-z]*)", text.strip().lower())
    if not m:
        return None
    g = m.group(1)
    g = {"v5litepod": "v5e", "v5lite": "v5e"}.get(g, g)
    return g if g == "7x" or g.startswith("v") else "v" + g


def detect_info(lines: list[Line]) -> bool:
    """True for a ``tpu-info`` ``TPU Chips`` table."""
    return any(_TITLE.match(ln.text) for ln in lines) and any(
        any(_CHIP.match(c) for c in _box_cells(ln.text)) for ln in lines)


def _box_cells(text: str) -> list[str]:
    """The cells of a table row (rich box ``│``/``┃`` or plain ``|`` separators), stripped; [] for other lines."""
    t = text.strip()
    if not t or t[0] not in _BOX:
        return []
    return [c.strip() for c in re.split(f"[{_BOX}]", t.strip(_BOX))]


def detect_env(lines: list[Line]) -> bool:
    """True for ``tpu-env`` metadata (``ACCELERATOR_TYPE: '...'`` and ``CHIPS_PER_HOST_BOUNDS: '...'``)."""
    keys = {m.group(1) for ln in _env_lines(lines) if (m := _ENV_LINE.match(ln.text))}
    return {"ACCELERATOR_TYPE", "CHIPS_PER_HOST_BOUNDS"} <= keys


def _env_lines(lines: list[Line]) -> list[Line]:
    """The lines, with a printed Python string (``"KEY: 'v'\\nKEY: 'v'..."``, one line) split at its ``\\n``."""
    out = []
    for ln in lines:
        if "\\n" in ln.text and "'" in ln.text:
            for part in ln.text.strip().strip("\"'").split("\\n"):
                out.append(Line(ln.no, part, ln.raw))
        else:
            out.append(ln)
    return out


def parse_info(lines: list[Line], path: str) -> list[Fragment]:
    """The host's chips from the ``TPU Chips`` table.

    Raises:
        CaptureError: a chip listed twice, chips of several types, or a chip count that is
            not a TPU host's (1, 4 or 8).
    """
    frag = Fragment(FORMAT_INFO, path, hostname=find_hostname(lines))
    start = next(k for k, ln in enumerate(lines) if _TITLE.match(ln.text))
    frag.first_line = lines[start].no
    chips: dict[int, str | None] = {}
    cols: dict[str, int] | None = None  # header name (lower case) -> cell index
    for ln in lines[start + 1:]:
        t = ln.text.strip()
        if not t:
            continue
        cells = _box_cells(t)
        if cols is None and cells and any(c.lower() in ("chip", "device") for c in cells):
            cols = {c.lower(): k for k, c in enumerate(cells) if c}
            continue
        if cols is not None and cells and any(_CHIP.match(c) for c in cells):
            chip_col = cols.get("chip", cols.get("device"))
            type_col = cols.get("type")
            if chip_col is None or chip_col >= len(cells) or not (m := _CHIP.match(cells[chip_col])):
                raise fail(f"cannot read this chip row {t[:80]!r} by its header ({', '.join(cols)})", path, ln.no)
            idx = int(m.group(2))
            if idx in chips:
                raise fail(f"chip {idx} listed twice", path, ln.no)
            kind = cells[type_col] if type_col is not None and type_col < len(cells) else None
            if kind is not None and not _TYPE.match(kind):
                raise fail(f"chip {idx}: type {kind[:40]!r} is not a TPU chip type such as 'TPU v4 chip'", path, ln.no)
            chips[idx] = kind
        elif chips and t[0] not in _BOX + "└┡├+-":
            break  # the next table's title
    if not chips:
        raise fail("the TPU Chips table has no chip rows ('/dev/accel<N>' or '/dev/vfio/<N>' under a 'Chip' "
                   "header)", path, lines[start].no)
    accel = next((m.group(1) for ln in lines if (m := _ACCEL_TYPE.match(ln.text))), None)
    if any(c is None for c in chips.values()):
        if accel is None:
            raise fail("the TPU Chips table has no Type column and the capture no 'Accelerator type:' line: "
                       "the chips' generation is unknown", path, lines[start].no)
        chips = {i: c if c is not None else accel for i, c in chips.items()}
    types = {_generation(c) for c in chips.values()}
    if len(types) != 1 or None in types:
        raise fail(f"chips of several or unknown types: {sorted(set(chips.values()))}", path, lines[start].no)
    gen = types.pop()
    grid = host_grid(len(chips))
    if grid is None or sorted(chips) != list(range(len(chips))):
        raise fail(f"{len(chips)} chips {sorted(chips)}: a TPU host has chips 0..n-1 with n = 1, 4 or 8", path,
                   lines[start].no)
    hbm = HBM_GIB.get(gen)  # type: ignore[arg-type]
    coords = {i: chip_coords(i, grid) for i in chips}
    for i in sorted(chips):
        frag.device(i, vendor="google", model=f"TPU {gen}", coords=coords[i],
                    memory_bytes=hbm << 30 if hbm else None)
    for l in grid_links(coords):
        frag.links[(l.a, l.b)] = l
    frag.warn(f"tpu-info gives no chip coordinates: placed as the {len(chips)}-chip host grid "
              f"{'x'.join(map(str, grid))} (chip i at x = i % {grid[0]}); import the host's tpu-env metadata too "
              "for its place in a multi-host slice")
    if accel and _generation(accel) not in (gen, None):
        frag.warn(f"'Accelerator type: {accel}' does not match the chips' type {gen}")
    return [frag]


def parse_env(lines: list[Line], path: str) -> list[Fragment]:
    """The host's chips (with slice coordinates) and its :class:`Slice` from ``tpu-env``.

    Raises:
        CaptureError: bounds that are not ``x,y,z``, a worker id outside the host bounds, or a
            host grid that is not 1, 4 or 8 chips.
    """
    env: dict[str, tuple[str, int]] = {}
    for ln in _env_lines(lines):
        m = _ENV_LINE.match(ln.text)
        if m:
            env.setdefault(m.group(1), (m.group(2), ln.no))
    frag = Fragment(FORMAT_ENV, path, hostname=find_hostname(lines), first_line=env["ACCELERATOR_TYPE"][1])

    def bounds(key: str, default: str | None = None) -> tuple[int, int, int]:
        val, no = env.get(key, (default, frag.first_line))  # type: ignore[assignment]
        m = _BOUNDS.match(val or "")
        if not m or not all(1 <= int(g) <= 4096 for g in m.groups()):
            raise fail(f"{key} {val!r} is not 'x,y,z' (chips per dimension)", path, no)
        return int(m.group(1)), int(m.group(2)), int(m.group(3))

    per_host = bounds("CHIPS_PER_HOST_BOUNDS")
    hosts = bounds("HOST_BOUNDS", "1,1,1")
    n = per_host[0] * per_host[1] * per_host[2]
    if host_grid(n) is None:
        raise fail(f"CHIPS_PER_HOST_BOUNDS {','.join(map(str, per_host))} is {n} chips; a TPU host has 1, 4 or 8",
                   path, env["CHIPS_PER_HOST_BOUNDS"][1])
    worker_text, worker_no = env.get("WORKER_ID", ("", frag.first_line))
    worker = int(worker_text) if worker_text.isdigit() else None
    total_hosts = hosts[0] * hosts[1] * hosts[2]
    if worker is not None and worker >= total_hosts:
        raise fail(f"WORKER_ID {worker} is outside HOST_BOUNDS {','.join(map(str, hosts))} ({total_hosts} hosts)",
                   path, worker_no)
    w = worker or 0
    host_pos = (w % hosts[0], w // hosts[0] % hosts[1], w // (hosts[0] * hosts[1]))
    origin = tuple(host_pos[k] * per_host[k] for k in range(3))
    gen = _generation(env.get("TYPE", ("", 0))[0] or env["ACCELERATOR_TYPE"][0])
    coords = {i: chip_coords(i, per_host, origin) for i in range(n)}  # type: ignore[arg-type]
    hbm = HBM_GIB.get(gen or "")
    for i in range(n):
        frag.device(i, vendor="google", model=f"TPU {gen}" if gen else None, coords=coords[i],
                    memory_bytes=hbm << 30 if hbm else None)
    for l in grid_links(coords):
        frag.links[(l.a, l.b)] = l
    topo = env.get("TOPOLOGY", ("", 0))[0].strip().lower() or None
    if topo is not None and not re.fullmatch(r"[1-9]\d{0,4}(x[1-9]\d{0,4}){1,2}", topo):
        raise fail(f"TOPOLOGY {topo!r} is not chips per dimension such as '4x4x8'", path, env["TOPOLOGY"][1])
    frag.slice = Slice(name=env.get("NODE_ID", ("", 0))[0] or None, worker_id=worker, topology=topo,
                       accelerator_type=env["ACCELERATOR_TYPE"][0] or None)
    return [frag]


def host_devices(n: int, generation: str, origin: tuple[int, int, int] = (0, 0, 0),
                 grid: tuple[int, int, int] | None = None) -> tuple[list[Device], list[Link]]:
    """Devices and ICI links of an ``n``-chip host of ``generation`` (``"v4"``...), for backends and the catalog.

    Raises:
        ValueError: ``n`` is not a host's chip count and no ``grid`` is given.
    """
    grid = grid or host_grid(n)
    if grid is None or grid[0] * grid[1] * grid[2] != n:
        raise ValueError(f"{n} chips is not a TPU host's (1, 4 or 8) or does not fill grid {grid}")
    hbm = HBM_GIB.get(generation)
    coords = {i: chip_coords(i, grid, origin) for i in range(n)}
    devs = [Device(index=i, vendor="google", model=f"TPU {generation}", coords=coords[i],
                   memory_bytes=hbm << 30 if hbm else None) for i in range(n)]
    return devs, grid_links(coords)

