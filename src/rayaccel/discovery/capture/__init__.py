"""Importers of text captures of accelerator tools, into :class:`~rayaccel.topology.NodeTopology`.

Supported (auto-detected; several may appear in one text)::

    nvidia-smi topo -m | --matrix | -mp     nvsmi_topo   links, NICs, CPU/NUMA affinity
    nvidia-smi -L                           nvsmi_list   models, UUIDs, MIG devices
    nvidia-smi -q (or a grep of its Fabric) nvsmi_query  models, UUIDs, memory, MIG mode, NVLink fabric
    nvidia-smi mig -lgip | -lgipp | -lgi    mig          MIG profiles, placements, GPU instances
    rocm-smi --showtopo | --showtoponuma    rocm         xGMI/PCIe links, NUMA nodes (every NUMA-line form)
    rocm-smi --json                         rocm         NUMA nodes, PCI bus, VRAM per card
    amd-smi topology                        amdsmi       xGMI/PCIe links, PCI bus ids
    neuron-ls [--topology|--wide|-a]        neuron       devices, NeuronCores, NeuronLink neighbours, CPU/NUMA
    neuron-ls --json-output                 neuron       the same, from the JSON form
    hl-smi topo -c -N                       hlsmi        Gaudi CPU/NUMA affinity (no links)
    npu-smi info -t topo                    npusmi       Ascend HCCS/PCIe links, CPU affinity
    npu-smi info                            npusmi       Ascend models, PCI bus, HBM size, health
    tpu-info                                tpu          TPU chips (type, /dev path -> chip index)
    tpu-env metadata (KEY: 'value')         tpu          TPU host grid, chip coordinates, pod slice

Recognised and rejected with a :class:`CaptureError` that says why:
``nvidia-smi topo -p2p`` (P2P status, not wiring) and ``nvidia-smi mig -lcip``/``-lci``.

Public API::

    parse_capture(text, path="<text>") -> ImportResult      one capture
    import_captures([path | text, ...], name=None) -> ImportResult   captures of ONE machine
    looks_like_capture(text) -> bool

Every failure is a :class:`CaptureError` naming the file, the line when there is
one, and what was expected; recoverable damage gives a topology plus warnings.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from ...errors import CaptureError, TopologyError
from ...topology import NodeTopology
from . import amdsmi, hlsmi, mig, neuron, npusmi, nvsmi_list, nvsmi_query, nvsmi_topo, rocm, tpu
from ._base import Fragment, Line, clean_lines
from .combine import combine

__all__ = ["FORMATS", "ImportResult", "import_captures", "looks_like_capture", "parse_capture"]

#: (name, detect(lines) -> bool, parse(lines, path) -> [Fragment]) in detection order.
FORMATS: tuple[tuple[str, Callable[[list[Line]], bool], Callable[[list[Line], str], list[Fragment]]], ...] = (
    ("rocm-smi --json", rocm.detect_json, rocm.parse_json),
    ("rocm-smi --showtopo", rocm.detect, rocm.parse),
    ("amd-smi topology", amdsmi.detect, amdsmi.parse),
    ("neuron-ls --json-output", neuron.detect_json, neuron.parse_json),
    ("neuron-ls", neuron.detect, neuron.parse),
    ("hl-smi topo -c -N", hlsmi.detect, hlsmi.parse),
    ("npu-smi info -t topo", npusmi.detect_topo, npusmi.parse_topo),
    ("npu-smi info", npusmi.detect_info, npusmi.parse_info),
    ("tpu-env", tpu.detect_env, tpu.parse_env),
    ("tpu-info", tpu.detect_info, tpu.parse_info),
    ("nvidia-smi mig", mig.detect, mig.parse),
    ("nvidia-smi -L", nvsmi_list.detect, nvsmi_list.parse),
    ("nvidia-smi -q", nvsmi_query.detect, nvsmi_query.parse),
    ("nvidia-smi topo -m", nvsmi_topo.detect, nvsmi_topo.parse),
)

_EXPECTED = ("expected the text output of one of: " + ", ".join(n for n, _, _ in FORMATS))
_MAX_BYTES = 16 << 20


@dataclass(frozen=True, slots=True)
class ImportResult:
    """A topology imported from captures, and what had to be skipped or guessed.

    Attributes:
        topology: validated; ``sources`` names each capture (``capture:<file>``).
        warnings: one sentence each, prefixed with the file (and line).
    """

    topology: NodeTopology
    warnings: tuple[str, ...] = ()


def looks_like_capture(text: str) -> bool:
    """True when some importer recognises ``text``.

    Formats recognised only to be rejected with a specific message (``topo
    -p2p``, ``mig -lcip``) count as recognised, so a caller routes them to
    :func:`parse_capture` and shows that message. Never raises.
    """
    if not isinstance(text, str) or not text.strip() or _binary_reason(text):
        return False
    lines = clean_lines(text[:_MAX_BYTES])
    return any(det(lines) for _, det, _ in FORMATS)


def parse_capture(text: str, path: str = "<text>", *, name: str | None = None) -> ImportResult:
    """Import one capture.

    Args:
        text: the capture's text (may hold several formats of one machine, e.g.
            ``mig -lgip`` followed by ``mig -lgipp``).
        path: where it came from, used in messages and ``sources``.
        name: the topology's name; default: the file stem of ``path`` (None for ``<text>``).

    Raises:
        CaptureError: not a recognised capture, or damaged beyond what can be
            imported safely (message names file, line and what was expected).
    """
    _check_name(name)
    frags = _fragments(text, path)
    return _result(frags, name if name is not None else _stem(path), (f"capture:{Path(path).name}",))


def import_captures(paths_or_texts: Sequence[str | Path], *, name: str | None = None) -> ImportResult:
    """Import several captures of ONE machine into one topology.

    Each item is a :class:`~pathlib.Path`, a path string, or the text of a
    capture (a string with a newline, or one that is not an existing file but
    looks like a capture). Devices are merged by index (see :mod:`.combine`):
    e.g. ``topo -m`` + ``topo -mp`` + ``-L`` + ``mig -lgip`` + ``mig -lgipp``.

    Args:
        paths_or_texts: at least one capture.
        name: the topology's name; default: the stem of the first file.

    Raises:
        CaptureError: unreadable file, unrecognised or damaged capture, or
            captures that cannot describe one machine (different device sets,
            vendors or hosts).
    """
    _check_name(name)
    if isinstance(paths_or_texts, (str, Path)):
        paths_or_texts = [paths_or_texts]
    if not paths_or_texts:
        raise CaptureError("no capture given (expected one or more files or texts)")
    frags: list[Fragment] = []
    sources: list[str] = []
    first_stem = None
    for k, item in enumerate(paths_or_texts):
        text, label = _read(item, k)
        if label != "<text>" and first_stem is None:
            first_stem = _stem(label)
        frags.extend(_fragments(text, label))
        sources.append(f"capture:{Path(label).name if label != '<text>' else label}")
    return _result(frags, name if name is not None else first_stem, tuple(sources))


# ------------------------------------------------------------------ helpers
def _result(frags: list[Fragment], name: str | None, sources: tuple[str, ...]) -> ImportResult:
    topo, warnings = combine(frags, name=name, sources=sources)
    return ImportResult(topo, warnings)


def _check_name(name: object) -> None:
    if name is not None and not isinstance(name, str):
        raise CaptureError(f"name: expected a str or None, got {type(name).__name__}")


def _stem(path: str) -> str | None:
    return None if path == "<text>" else Path(path).stem


def _fragments(text: str, path: str) -> list[Fragment]:
    if not isinstance(text, str):
        raise CaptureError(f"expected text, got {type(text).__name__}", path)
    if not text.strip():
        raise CaptureError(f"empty capture; {_EXPECTED}", path)
    why = _binary_reason(text)
    if why:
        raise CaptureError(f"not a text capture ({why}); {_EXPECTED}", path)
    if len(text) > _MAX_BYTES:
        raise CaptureError(f"capture too large ({len(text)} characters; at most {_MAX_BYTES})", path)
    lines = clean_lines(text)
    frags: list[Fragment] = []
    for fmt, det, parse in FORMATS:
        if not det(lines):
            continue
        try:
            frags.extend(parse(lines, path))
        except CaptureError:
            raise
        except (IndexError, KeyError, ValueError, TypeError, TopologyError) as e:  # a parser bug: say so clearly
            raise CaptureError(f"internal error reading this {fmt} capture ({type(e).__name__}: {e}); "
                               "please report it with the capture", path) from e
    if not frags:
        if text.lstrip().startswith("{") and '"schema"' in text[:4096]:
            raise CaptureError("not a recognised capture: this is a topology JSON file; load it alone with "
                               "rayaccel.load_topology(path) or NodeTopology.load(path)", path)
        first = next((ln for ln in lines if ln.text.strip()), None)
        shown = first.text.strip()[:60] if first else ""
        raise CaptureError(f"not a recognised capture (starts with {shown!r}); {_EXPECTED}", path,
                           first.no if first else None)
    return frags


def _binary_reason(text: str) -> str | None:
    sample = text[:65536]
    if "\x00" in sample:
        return "it contains NUL bytes"
    bad = sum(1 for ch in sample if (ord(ch) < 32 and ch not in "\t\n\r\f\v") or ch == "\ufffd")
    if bad > max(8, len(sample) // 100):
        return f"{bad} control or undecodable characters"
    return None


def _read(item: str | Path, k: int) -> tuple[str, str]:
    if isinstance(item, Path):
        return _read_file(item), str(item)
    if not isinstance(item, str):
        raise CaptureError(f"item {k}: expected a path or the text of a capture, got {type(item).__name__}")
    if "\n" in item:
        return item, "<text>"
    p = Path(item)
    try:
        is_file = p.is_file()
    except (OSError, ValueError):
        is_file = False
    if is_file:
        return _read_file(p), item
    if looks_like_capture(item):
        return item, "<text>"
    if p.is_dir():
        raise CaptureError("is a directory, not a file; expected a capture file", item)
    if p.exists():
        raise CaptureError("not a regular file; expected a capture file", item)
    raise CaptureError("no such file (and the string is not the text of a capture)", item)


def _read_file(p: Path) -> str:
    if p.is_dir():
        raise CaptureError("is a directory, not a file; expected a capture file", str(p))
    try:
        data = p.read_bytes()
    except OSError as e:
        raise CaptureError(f"cannot read: {e.strerror or e}", str(p)) from None
    if len(data) > _MAX_BYTES:
        raise CaptureError(f"file too large ({len(data)} bytes; at most {_MAX_BYTES})", str(p))
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        enc = "utf-16"  # e.g. `nvidia-smi topo -m > file` in Windows PowerShell
    elif data.startswith(b"\xef\xbb\xbf"):
        enc = "utf-8-sig"
    else:
        enc = "utf-8"
    try:
        return data.decode(enc)
    except UnicodeDecodeError:
        if b"\x00" in data[:65536]:
            raise CaptureError(f"not a text capture (binary data); {_EXPECTED}", str(p)) from None
        return data.decode("latin-1")
