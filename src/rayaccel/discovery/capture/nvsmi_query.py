"""``nvidia-smi -q`` (``-a``): per-GPU facts, and each GPU's NVLink fabric registration.

Reads the full report::

    ==============NVSMI LOG==============
    Attached GPUs                             : 8
    GPU 00000000:18:00.0
        Product Name                          : NVIDIA H100 80GB HBM3
        MIG Mode
            Current                           : Disabled
        GPU UUID                              : GPU-b42dd28e-...
        FB Memory Usage
            Total                             : 81559 MiB
        Fabric
            State                             : Completed
            Status                            : Success
            CliqueId                          : 0
            ClusterUUID                       : 00000000-0000-0000-0000-000000000000

and the excerpts people post of it, ``nvidia-smi -q | grep -A5 Fabric`` (``Fabric`` blocks with no
``GPU <bus id>`` lines, ``--`` between them). GPUs are numbered in the order listed, which is
nvidia-smi's index order; an excerpt's blocks are taken as GPUs 0, 1, ... and a warning says so.

Kept: model (Product Name), UUID, PCI bus id, memory (FB Memory Usage / Total), MIG mode
(Current), and the fabric (:class:`~rayaccel.topology.Fabric`): State (``Completed`` /
``In Progress`` / ``Not Started``; ``Not Supported`` or ``N/A`` is no fabric), Status (``Success``
-> 0, an NVML error name -> its code), CliqueId, ClusterUUID. The cluster and clique count only
once State is Completed, as NVML says. The Health sub-block is not mapped to NVML's health mask.
"""

from __future__ import annotations

import re
import uuid as uuidlib

from ...topology import Fabric
from .._nvml_api import _ERRORS
from ._base import Fragment, Line, fail, find_hostname

FORMAT = "nvidia-smi -q"

_LOG = re.compile(r"^\s*=+\s*NVSMI LOG\s*=+\s*$")
_ATTACHED = re.compile(r"^\s*Attached GPUs\s*:\s*(\d+)\s*$")
_GPU = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])\s*$")
_KV = re.compile(r"^(\s*)([^:]*?\S)\s*:\s?(.*?)\s*$")
_BLOCK = re.compile(r"^(\s*)([A-Za-z][\w ./()-]*?)\s*$")
_FABRIC = re.compile(r"^\s*Fabric\s*$")
_MEMORY = re.compile(r"^(\d+)\s*MiB$")
_STATES = {"completed": "completed", "in progress": "in_progress", "not started": "not_started"}
_NONE = ("n/a", "not supported", "")
#: NVML error names as nvidia-smi prints them ("Insufficient Resources") -> nvmlReturn_t.
_STATUS = {"success": 0, **{name.replace("_", " ").lower(): code for name, code in _ERRORS.items()}}


def detect(lines: list[Line]) -> bool:
    """True for the NVSMI LOG header, ``Attached GPUs : n``, or a ``Fabric`` block with a ``State`` line."""
    for k, ln in enumerate(lines):
        t = ln.text
        if _LOG.match(t) or _ATTACHED.match(t):
            return True
        if _FABRIC.match(t) and any(_key(x.text) == "state" for x in lines[k + 1:k + 3]):
            return True
    return False


def _key(text: str) -> str | None:
    m = _KV.match(text)
    return m.group(2).strip().lower() if m else None


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices with their facts and fabric.

    Raises:
        CaptureError: a Fabric field that cannot be read (names the line and what was expected), or a
            report that lists fewer GPU sections than its ``Attached GPUs`` line (their indices are unknown).
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    attached = next((int(m.group(1)) for ln in lines if (m := _ATTACHED.match(ln.text))), None)
    sections = _sections(lines)
    excerpt = not any(bus for bus, _ in sections)
    if attached is not None and not excerpt and len(sections) != attached:
        raise fail(f"this report lists {len(sections)} GPU section(s) but says 'Attached GPUs : {attached}': the GPUs' "
                   "indices cannot be known from a part of it; capture `nvidia-smi -q` whole", path,
                   sections[0][1][0].no if sections and sections[0][1] else None)
    for index, (bus, body) in enumerate(sections):
        if frag.first_line is None and body:
            frag.first_line = body[0].no
        frag.device(index, vendor="nvidia", pci_bus_id=bus, **_facts(body, frag))
    if excerpt:
        frag.enumerates_devices = False
        frag.warn(f"{len(sections)} Fabric block(s) without their 'GPU <bus id>' lines (a grep of `nvidia-smi -q`): "
                  f"taken as GPU {'0' if len(sections) == 1 else f'0-{len(sections) - 1}'} in nvidia-smi's order")
    if not frag.devices:
        raise fail("no 'GPU <bus id>' section and no Fabric block found (expected `nvidia-smi -q` output)", path)
    return [frag]


def _sections(lines: list[Line]) -> list[tuple[str | None, list[Line]]]:
    """``(bus id, lines)`` per GPU section; for an excerpt, ``(None, lines)`` per Fabric block."""
    starts = [(k, m.group(1)) for k, ln in enumerate(lines) if (m := _GPU.match(ln.text))]
    if starts:
        bounds = [k for k, _ in starts] + [len(lines)]
        return [(bus, lines[k + 1:bounds[j + 1]]) for j, (k, bus) in enumerate(starts)]
    blocks = [k for k, ln in enumerate(lines) if _FABRIC.match(ln.text)]
    bounds = blocks + [len(lines)]
    return [(None, lines[k:bounds[j + 1]]) for j, k in enumerate(blocks)]


def _facts(body: list[Line], frag: Fragment) -> dict:
    """The device fields of one section (``fabric`` included when it reports one)."""
    facts: dict = {}
    stack: list[tuple[int, str]] = []  # (indent, block name) of the enclosing blocks
    fabric: dict[str, tuple[str, Line]] = {}
    for ln in body:
        t = ln.text.rstrip()
        if not t.strip() or t.strip() == "--":
            continue
        indent = len(t) - len(t.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        kv = _KV.match(t)
        if kv is None or (not kv.group(3) and ":" not in t):
            b = _BLOCK.match(t)
            if b:
                stack.append((indent, b.group(2).strip().lower()))
            continue
        key, value = kv.group(2).strip().lower(), kv.group(3).strip()
        where = tuple(name for _, name in stack)
        if where == () and key == "product name":
            facts["model"] = value or None
        elif where == () and key == "gpu uuid" and value.startswith("GPU-"):
            facts["uuid"] = value
        elif where == ("mig mode",) and key == "current":
            facts["mig_mode"] = {"enabled": True, "disabled": False}.get(value.lower())
        elif where == ("fb memory usage",) and key == "total":
            m = _MEMORY.match(value)
            if m:
                facts["memory_bytes"] = int(m.group(1)) << 20
        elif where == ("fabric",):
            fabric[key] = (value, ln)
    if fabric:
        facts["fabric"] = _fabric(fabric, frag)
    return {k: v for k, v in facts.items() if v is not None}


def _fabric(fields: dict[str, tuple[str, Line]], frag: Fragment) -> Fabric | None:
    path = frag.path
    if "state" not in fields:
        first = next(iter(fields.values()))[1]
        raise fail("a Fabric block without its 'State' line (expected State, Status, CliqueId, ClusterUUID)",
                   path, first.no)
    value, ln = fields["state"]
    if value.lower() in _NONE:
        return None
    state = _STATES.get(value.lower())
    if state is None:
        raise fail(f"fabric State {value!r} is not one of Completed, In Progress, Not Started, Not Supported, N/A",
                   path, ln.no)
    if state != "completed":
        return Fabric(state=state)
    return Fabric(state=state, cluster_uuid=_uuid(fields.get("clusteruuid"), path),
                  clique_id=_clique(fields.get("cliqueid"), path), status=_status(fields.get("status"), frag))


def _uuid(field: tuple[str, Line] | None, path: str) -> str | None:
    if field is None or field[0].lower() in _NONE:
        return None
    try:
        return str(uuidlib.UUID(field[0]))
    except ValueError:
        raise fail(f"fabric ClusterUUID {field[0][:60]!r} is not a UUID (expected e.g. "
                   "dc6e40c4-d722-4357-9ba6-5291dd461278)", path, field[1].no) from None


def _clique(field: tuple[str, Line] | None, path: str) -> int | None:
    if field is None or field[0].lower() in _NONE:
        return None
    if not field[0].isdigit() or int(field[0]) >= 1 << 32:
        raise fail(f"fabric CliqueId {field[0][:60]!r} is not a 32-bit unsigned integer", path, field[1].no)
    return int(field[0])


def _status(field: tuple[str, Line] | None, frag: Fragment) -> int | None:
    if field is None or field[0].lower() in _NONE:
        return None
    code = _STATUS.get(field[0].lower())
    if code is None:  # an error this table does not name: still not a success
        frag.warn(f"fabric Status {field[0][:60]!r} is not an NVML error name this importer knows; recorded as "
                  f"NVML error {_ERRORS['UNKNOWN']} (unknown)", field[1].no)
        return _ERRORS["UNKNOWN"]
    return code
