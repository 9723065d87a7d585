"""What both halves of :class:`~rayaccel.testing.fakenvml.FakeNVML` share: its handles, ctypes
dereferencing, and the rule that decides when it models NVSwitches.

Below :mod:`.fakenvml` (the topology model) and :mod:`._fakenvml_ops` (health, events,
doctor facts), which both import it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rayaccel.topology import NodeTopology


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None  # MIG device slot on the parent, or None for the full GPU


def _deref(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)`` / ``pointer(x)`` / ``x``."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


def is_nvswitch_topology(topology: NodeTopology) -> bool:
    """True when FakeNVML models ``topology`` with NVSwitches: >= 4 GPUs, every pair
    joined by NVLink with one and the same known lane count."""
    n = len(topology.devices)
    links = [l for l in topology.links if l.kind == "nvlink"]
    counts = {l.count for l in links}
    return n >= 4 and len(links) == n * (n - 1) // 2 and len(counts) == 1 and None not in counts
