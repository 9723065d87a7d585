"""``nvidia-smi -L``: GPUs with their UUIDs and the MIG devices on them.

Lines read::

    GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-2927d07e-...)
      MIG 1g.10gb     Device  0: (UUID: MIG-6e95ef19-...)
      MIG 3g.20gb Device 0: (UUID: MIG-GPU-5c89852c-.../7/0)    (R450 drivers: GI 7, CI 0)

``# `` prefixes, indentation and stray backticks are tolerated. A GPU whose
name says it is a display adapter (``NVIDIA DGX Display`` in a DGX Station) is
imported faithfully, with its own model string, and named in a warning: it is
not a compute GPU, so a user may want to leave it out (``topology.subset``).
"""

from __future__ import annotations

import re

from ...topology import Partition
from ._base import Fragment, Line, fail, find_hostname

FORMAT = "nvidia-smi -L"

_GPU = re.compile(r"^\s*GPU\s+(\d+)\s*:\s*(.*?)\s*\(UUID:\s*(GPU-[0-9A-Za-z-]+)\s*\)")
_GPU_LOOSE = re.compile(r"^\s*GPU\s+\d+\s*:(?![0-9A-Fa-f]{2}:)")  # not `nvidia-smi -q`'s "GPU 00000000:18:00.0"
_MIG = re.compile(r"^\s*MIG\s+(\S+)\s+Device\s+(\d+)\s*:\s*\(UUID:\s*(MIG-[^)\s]+)\s*\)")
_MIG_LOOSE = re.compile(r"^\s*MIG\s+\S+\s+Device\b")
_OLD_MIG_UUID = re.compile(r"^MIG-GPU-[0-9A-Za-z-]+/(\d+)/(\d+)$")
_DISPLAY = re.compile(r"display", re.I)


def detect(lines: list[Line]) -> bool:
    """True when a line looks like ``GPU <n>: <name> (UUID: GPU-...)``."""
    return any(_GPU.match(ln.text) for ln in lines)


def parse(lines: list[Line], path: str) -> list[Fragment]:
    """Devices (index, model, uuid) and their MIG partitions.

    Raises:
        CaptureError: a ``GPU n:`` or ``MIG`` line that cannot be read, or a MIG line
            before any GPU line.
    """
    frag = Fragment(FORMAT, path, hostname=find_hostname(lines))
    current: int | None = None
    parts: dict[int, list[Partition]] = {}
    for ln in lines:
        t = ln.text
        m = _GPU.match(t)
        if m:
            idx, model, uuid = int(m.group(1)), m.group(2).strip(), m.group(3)
            if idx in frag.devices:
                raise fail(f"GPU {idx} listed twice", path, ln.no)
            if frag.first_line is None:
                frag.first_line = ln.no
            frag.device(idx, vendor="nvidia", model=model or None, uuid=uuid)
            if _DISPLAY.search(model):
                frag.warn(f"GPU {idx} is {model!r}, a display adapter rather than a compute GPU; "
                          "imported as listed", ln.no)
            parts[idx] = []
            current = idx
            continue
        if _GPU_LOOSE.match(t):
            raise fail(f"cannot read this GPU line: {t.strip()!r} (expected 'GPU <n>: <name> (UUID: GPU-...)')",
                       path, ln.no)
        m = _MIG.match(t)
        if m:
            if current is None:
                raise fail("MIG device listed before any 'GPU <n>:' line", path, ln.no)
            profile, uuid = m.group(1), m.group(3)
            gi = ci = None
            old = _OLD_MIG_UUID.match(uuid)
            if old:
                gi, ci = int(old.group(1)), int(old.group(2))
            parts[current].append(Partition(parent=current, profile=profile, uuid=uuid, gi_id=gi, ci_id=ci))
            continue
        if _MIG_LOOSE.match(t):
            raise fail(f"cannot read this MIG line: {t.strip()!r} "
                       "(expected 'MIG <profile> Device <n>: (UUID: MIG-...)')", path, ln.no)
    for idx, ps in parts.items():
        if ps:
            frag.device(idx, partitions=tuple(ps), mig_mode=True)
    if not frag.devices:
        raise fail("no 'GPU <n>: <name> (UUID: GPU-...)' line found", path)
    return [frag]
