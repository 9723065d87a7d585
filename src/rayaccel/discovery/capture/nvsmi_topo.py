"""``nvidia-smi topo -m`` / ``--matrix`` / ``-mp`` matrices.

Accepted variations: tab- or space-aligned cells; header with or without a
leading tab or with indentation; with or without ``CPU Affinity``, ``NUMA
Affinity`` and ``GPU NUMA ID`` columns; NIC rows (trimmed or not) and a ``NIC
Legend`` (``NIC0: mlx5_0``); the old ``SOC`` class (read as ``SYS``); shell
prompts, ``#`` comments and markdown indentation around the table; a missing
header row when the device-to-device part is intact (columns are inferred,
with a warning); cut tables (missing rows are reported in a warning).

Field rules:

* ``NV<n>`` -> link ``nvlink`` with ``count=n``; ``PIX/PXB/PHB/NODE/SYS`` ->
  link ``pcie`` with that class. From ``topo -mp`` every link is ``pcie``.
* ``CPU Affinity`` ``"0-11,24-35"`` -> ``cpus``; empty -> None.
* ``NUMA Affinity`` with one node -> ``numa_node``; several nodes
  (``"0-1"``, ``"0,8,252-255"``) -> None (the device has no single node);
  a numeric ``GPU NUMA ID`` wins over both.
* ``nvidia-smi topo -p2p`` status matrices (OK/CNS/GNS/...) are rejected with
  a :class:`CaptureError`: they say whether P2P works, not how devices are wired.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...topology import Nic, make_link
from ._base import Fragment, Line, fail, find_hostname, parse_cpulist, parse_numa, span

FORMAT = "nvidia-smi topo -m"
FORMAT_MP = "nvidia-smi topo -mp"

_LINK = re.compile(r"^(?:X|PIX|PXB|PHB|NODE|SYS|SOC|NV\d+)$")
_P2P = frozenset({"OK", "CNS", "GNS", "TNS", "NS", "DR", "U"})
_GPU = re.compile(r"^GPU(\d+)$")
_NAME = re.compile(r"^[A-Za-z][\w.:-]*$")
_AFFINITY = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_MULTIWORD = {("CPU", "Affinity"): "CPU Affinity", ("NUMA", "Affinity"): "NUMA Affinity",
              ("GPU", "NUMA", "ID"): "GPU NUMA ID"}
_ROW_START = re.compile(r"^\s*GPU0\s+X(?:\s|$)")
_NIC_LEGEND = re.compile(r"^\s*(NIC\d+)\s*:\s*(\S+)\s*$")
_MP_CMD = re.compile(r"topo\s+(?:-mp\b|--matrix_pcie\b)")
_EXPECTED_CELL = "X, NV<n>, PIX, PXB, PHB, NODE, SYS or SOC"


def detect(lines: list[Line]) -> bool:
    """True when some line is a ``topo -m`` header or a ``GPU0  X ...`` row."""
    for i, ln in enumerate(lines):
        if _ROW_START.match(ln.text):
            return True
        if _header_names(ln.text) is not None and _next_row_label(lines, i) is not None:
            return True
    return False


# ------------------------------------------------------------------ splitting
@dataclass
class _Cells:
    values: list[str]
    offsets: list[int]
    tabbed: bool


def _split(text: str) -> _Cells:
    if "\t" in text:
        vals, offs, pos = [], [], 0
        for part in text.split("\t"):
            lead = len(part) - len(part.lstrip())
            vals.append(part.strip())
            offs.append(pos + lead)
            pos += len(part) + 1
        return _Cells(vals, offs, True)
    words = [(m.group(), m.start()) for m in re.finditer(r"\S+", text)]
    vals, offs, i = [], [], 0
    while i < len(words):
        for key, joined in _MULTIWORD.items():
            if tuple(w for w, _ in words[i:i + len(key)]) == key:
                vals.append(joined)
                offs.append(words[i][1])
                i += len(key)
                break
        else:
            vals.append(words[i][0])
            offs.append(words[i][1])
            i += 1
    return _Cells(vals, offs, False)


def _header_names(text: str) -> list[str] | None:
    """The column names when ``text`` is a matrix header, else None."""
    cells = _split(text)
    names = [v for v in cells.values if v]
    if len(names) < 1 or not _GPU.match(names[0]):
        return None
    for n in names:
        if n in _AFFINITY:
            continue
        if _LINK.match(n) or n in _P2P or not _NAME.match(n):
            return None
    return names


def _next_row_label(lines: list[Line], i: int) -> str | None:
    for ln in lines[i + 1:]:
        if ln.text.strip():
            vals = [v for v in _split(ln.text).values]
            while vals and not vals[0]:
                vals.pop(0)
            # a matrix row: a name, then cells among which its own "X" (self)
            if len(vals) >= 2 and _NAME.match(vals[0]) and "X" in vals[1:]:
                return vals[0]
            return None
    return None


def _row_values(cells: _Cells) -> tuple[str, list[str], list[int]]:
    vals, offs = list(cells.values), list(cells.offsets)
    while vals and not vals[0]:
        vals.pop(0)
        offs.pop(0)
    if not vals:
        return "", [], []
    return vals[0], vals[1:], offs[1:]


# ------------------------------------------------------------------- parsing
@dataclass
class _Table:
    header_line: Line | None
    columns: list[str]           # device columns (GPUs then NICs)
    tail_columns: list[str]      # affinity columns
    tail_offsets: list[int]
    rows: list[tuple[Line, str, list[str], list[int]]]
    inferred: bool = False


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """One :class:`Fragment` per matrix in ``lines``.

    Raises:
        CaptureError: a ``-p2p`` matrix, a damaged device-to-device part, or no matrix.
    """
    legend = {m.group(1): m.group(2) for ln in lines if (m := _NIC_LEGEND.match(ln.text))}
    hostname = find_hostname(lines)
    tables = _find_tables(lines, path)
    if not tables:
        raise fail("no nvidia-smi topo matrix found (expected a header like 'GPU0  GPU1 ... CPU Affinity' "
                   "followed by rows like 'GPU0  X  NV12 ...')", path, _first_text_line(lines))
    frags = []
    prev_end = 0
    last_text = max((ln.no for ln in lines if ln.text.strip()), default=0)
    for t in tables:
        start = t.header_line.no if t.header_line else t.rows[0][0].no
        before = " ".join(ln.raw for ln in lines if prev_end < ln.no < start)
        pcie_only = bool(_MP_CMD.search(before)) or (not frags and bool(_MP_CMD.search(
            " ".join(ln.raw for ln in lines if ln.no < start))))
        frags.append(_build(t, path, legend, hostname, pcie_only, last_text))
        prev_end = t.rows[-1][0].no if t.rows else start
    return frags


def _first_text_line(lines: list[Line]) -> int | None:
    return next((ln.no for ln in lines if ln.text.strip()), None)


def _find_tables(lines: list[Line], path: str) -> list[_Table]:
    tables: list[_Table] = []
    i = 0
    n = len(lines)
    while i < n:
        ln = lines[i]
        names = _header_names(ln.text)
        if names is not None and _next_row_label(lines, i) is not None:
            cols = [c for c in names if c not in _AFFINITY]
            tail = [c for c in names if c in _AFFINITY]
            # affinity columns must come after all device columns
            first_aff = next((k for k, c in enumerate(names) if c in _AFFINITY), len(names))
            if any(c not in _AFFINITY for c in names[first_aff:]):
                raise fail(f"unexpected column after the affinity columns: {names}", path, ln.no)
            cells = _split(ln.text)
            toffs = [o for v, o in zip(cells.values, cells.offsets) if v in _AFFINITY]
            rows, i = _collect_rows(lines, i + 1, set(cols))
            tables.append(_Table(ln, cols, tail, toffs, rows))
            continue
        if _ROW_START.match(ln.text):
            rows, j = _collect_rows(lines, i, None)
            if rows:
                tables.append(_infer_header(rows, path))
                i = j
                continue
        i += 1
    return tables


def _collect_rows(lines: list[Line], i: int, labels: set[str] | None):
    rows = []
    n = len(lines)
    while i < n and not lines[i].text.strip():
        i += 1
    while i < n:
        ln = lines[i]
        if not ln.text.strip():
            break
        label, vals, offs = _row_values(_split(ln.text))
        if labels is not None:
            if label not in labels and not _GPU.match(label):
                break
        else:
            if not _NAME.match(label) or not vals or not (_LINK.match(vals[0]) or vals[0] in _P2P):
                break
        rows.append((ln, label, vals, offs))
        i += 1
    return rows, i


def _infer_header(rows, path: str) -> _Table:
    """Columns of a headerless matrix, from its rows."""
    gpu_rows = [r for r in rows if _GPU.match(r[1])]
    if not gpu_rows:
        raise fail("headerless matrix without GPU rows", path, rows[0][0].no)
    labels = [r[1] for r in gpu_rows]
    expected = [f"GPU{k}" for k in range(len(gpu_rows))]
    if labels != expected:
        raise fail(f"headerless matrix: expected rows {span(expected)} in order, got {', '.join(labels)}",
                   path, rows[0][0].no)
    first = gpu_rows[0][2]
    ndev = 0
    while ndev < len(first) and (_LINK.match(first[ndev]) or first[ndev] in _P2P):
        ndev += 1
    nic_labels = [r[1] for r in rows if not _GPU.match(r[1])]
    nnic = ndev - len(gpu_rows)
    if nnic < 0:
        raise fail(f"headerless matrix: row GPU0 has {ndev} link cells but there are {len(gpu_rows)} GPU rows",
                   path, rows[0][0].no)
    if len(nic_labels) == nnic:
        nics = nic_labels
    else:
        nics = [f"NIC{k}" for k in range(nnic)]
    tail_n = len(first) - ndev
    tail = list(_AFFINITY[:min(tail_n, 3)])
    return _Table(None, expected + nics, tail, [], rows, inferred=True)


def _build(t: _Table, path: str, legend: dict[str, str], hostname: str | None, pcie_only: bool,
           last_text: int) -> Fragment:
    frag = Fragment(FORMAT_MP if pcie_only else FORMAT, path, hostname=hostname, pcie_only=pcie_only,
                    first_line=t.header_line.no if t.header_line else t.rows[0][0].no)
    cols = t.columns
    ndev = len(cols)
    gpu_cols = [(k, int(m.group(1))) for k, c in enumerate(cols) if (m := _GPU.match(c))]
    gpu_pos = {idx: k for k, idx in gpu_cols}
    nic_cols = [k for k, c in enumerate(cols) if not _GPU.match(c)]
    if [k for k, _ in gpu_cols] != list(range(len(gpu_cols))):
        line = t.header_line.no if t.header_line else None
        raise fail(f"GPU columns must come before NIC columns, got {cols}", path, line)
    if t.inferred:
        frag.warn(f"no header row: columns inferred from the rows ({len(gpu_cols)} GPUs"
                  + (f", {len(nic_cols)} NICs named {span([cols[k] for k in nic_cols])}" if nic_cols else "")
                  + (f", {', '.join(t.tail_columns)}" if t.tail_columns else "") + ")", t.rows[0][0].no)
    for _, idx in gpu_cols:
        frag.device(idx, vendor="nvidia")

    values: dict[str, list[str]] = {}
    seen_rows: set[str] = set()
    row_labels = {r[1] for r in t.rows}
    table_cut = any(cols[k] not in row_labels for k, _ in gpu_cols)
    for ln, label, vals, offs in t.rows:
        if label not in cols:
            raise fail(f"row {label} is not a column of the header ({span(cols)})", path, ln.no)
        is_gpu = bool(_GPU.match(label))
        if label in seen_rows:
            raise fail(f"second row for {label}", path, ln.no)
        seen_rows.add(label)
        cells = vals[:ndev]
        problem = _check_cells(cells, cols, label)
        if problem and all(c in _P2P or c == "X" for c in cells if c):
            raise fail("this is `nvidia-smi topo -p2p` output (a peer-to-peer status matrix: OK, CNS, GNS, "
                       "...), not a topology; capture `nvidia-smi topo -m` instead", path, ln.no)
        at_eof = ln.no == last_text
        cut_row = table_cut and at_eof
        if problem:
            if at_eof and len(cells) < ndev:
                frag.warn(f"row {label} is cut after {len(cells)} of {ndev} cells (end of the text); skipped", ln.no)
                continue
            if not is_gpu:
                frag.warn(f"row {label} skipped: {problem}", ln.no)
                continue
            raise fail(f"row {label}: {problem}", path, ln.no)
        values[label] = cells
        tail_vals = vals[ndev:]
        if cut_row and any(tail_vals):
            frag.warn(f"row {label} is the last line of a cut table: its affinity cells "
                      f"({' '.join(v for v in tail_vals if v)}) may be cut and were ignored", ln.no)
            tail_vals = []
        tail = _assign_tail(tail_vals, offs[ndev:], t)
        if is_gpu:
            _apply_affinity(frag, int(_GPU.match(label).group(1)), tail, ln)
        else:
            _nic_tail = tail
            values["__numa__" + label] = [_nic_tail.get("NUMA Affinity", "")]

    missing = [cols[k] for k, _ in gpu_cols if cols[k] not in values]
    if missing:
        frag.warn(f"no rows for {span(missing)} (the table looks cut): links among "
                  f"{'them' if len(missing) > 1 else 'it'} and their CPU/NUMA affinity are unknown")
    _links(frag, cols, gpu_cols, gpu_pos, values, pcie_only)
    _nics(frag, cols, gpu_cols, nic_cols, values, legend)
    return frag


def _check_cells(cells: list[str], cols: list[str], label: str) -> str | None:
    ndev = len(cols)
    if len(cells) < ndev:
        return f"{len(cells)} link cells, expected {ndev} ({span(cols)}); cells merged or cut?"
    for k, c in enumerate(cells):
        if not _LINK.match(c):
            return f"{c!r} under {cols[k]} is not a link class (expected {_EXPECTED_CELL})"
        if (c == "X") != (cols[k] == label):
            if cols[k] == label:
                return f"expected X (self) under {cols[k]}, got {c!r}; cells shifted?"
            return f"unexpected X under {cols[k]} (self is {label}); cells shifted?"
    return None


def _assign_tail(vals: list[str], offs: list[int], t: _Table) -> dict[str, str]:
    cols = t.tail_columns
    if not cols:
        return {}
    out = {c: "" for c in cols}
    if len(vals) == len(cols) or not vals:
        out.update(zip(cols, vals))
        return out
    if len(vals) > len(cols):
        # tab output pads an empty cell before GPU NUMA ID: the last column takes the last cell
        out.update(zip(cols[:-1], vals))
        out[cols[-1]] = next((v for v in reversed(vals[len(cols) - 1:]) if v), "")
        return out
    if t.tail_offsets and len(t.tail_offsets) == len(cols) and offs:
        for v, o in zip(vals, offs):
            if not v:
                continue
            k = min(range(len(cols)), key=lambda j: abs(t.tail_offsets[j] - o))
            out[cols[k]] = v
        return out
    out.update(zip(cols, vals))
    return out


def _apply_affinity(frag: Fragment, idx: int, tail: dict[str, str], ln: Line) -> None:
    if "CPU Affinity" in tail:
        try:
            cpus = parse_cpulist(tail["CPU Affinity"])
        except ValueError as e:
            frag.warn(f"GPU{idx} CPU Affinity ignored: {e}", ln.no)
            cpus = None
        if cpus is not None:
            frag.device(idx, cpus=cpus)
    numa = None
    if "NUMA Affinity" in tail:
        numa, ok = parse_numa(tail["NUMA Affinity"])
        if not ok:
            frag.warn(f"GPU{idx} NUMA Affinity {tail['NUMA Affinity']!r} ignored (expected a node number)", ln.no)
    gid = tail.get("GPU NUMA ID", "").strip()
    if gid.isdigit():
        numa = int(gid)
    if numa is not None:
        frag.device(idx, numa_node=numa)


def _links(frag: Fragment, cols, gpu_cols, gpu_pos, values, pcie_only: bool) -> None:
    for ka, a in gpu_cols:
        for kb, b in gpu_cols:
            if b <= a:
                continue
            va = values.get(cols[ka], [None] * len(cols))[kb]
            vb = values.get(cols[kb], [None] * len(cols))[ka]
            if va is not None and vb is not None and va != vb:
                frag.warn(f"asymmetric matrix: {cols[ka]}->{cols[kb]} is {va} but {cols[kb]}->{cols[ka]} "
                          f"is {vb}; kept {va}")
            v = va if va is not None else vb
            if v is None:
                continue
            if v.startswith("NV"):
                frag.links[(a, b)] = make_link(a, b, "nvlink", count=int(v[2:]) or None)
            else:
                frag.links[(a, b)] = make_link(a, b, "pcie", pcie="SYS" if v == "SOC" else v)


def _nics(frag: Fragment, cols, gpu_cols, nic_cols, values, legend) -> None:
    unnamed = [cols[k] for k in nic_cols if re.match(r"^NIC\d+$", cols[k]) and cols[k] not in legend]
    if unnamed:
        frag.warn(f"no NIC Legend for {span(unnamed)}: NICs keep their column names")
    missing = [cols[k] for k in nic_cols if cols[k] not in values]
    if missing and len(missing) < len(nic_cols):
        frag.warn(f"no rows for {span(missing)} (the table looks cut); their paths come from the GPU rows")
    for k in nic_cols:
        label = cols[k]
        paths = []
        for kg, g in gpu_cols:
            v = values.get(cols[kg], [None] * len(cols))[k] if cols[kg] in values else None
            if v is None and label in values:
                v = values[label][kg]
            if v is None:
                continue
            if v.startswith("NV") or v == "X":
                frag.warn(f"{label}->{cols[kg]} is {v}, not a PCIe class; ignored")
                continue
            paths.append((g, "SYS" if v == "SOC" else v))
        numa, _ = parse_numa(values.get("__numa__" + label, [""])[0])
        name = legend.get(label, label)
        frag.nics.append(Nic(name=name, numa_node=numa, paths=tuple(paths), rdma=Nic.guess_rdma(name)))
