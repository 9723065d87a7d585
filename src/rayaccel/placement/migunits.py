"""Dynamic MIG units: the names of the instances a re-partitionable GPU can hold (pure; see :mod:`.dynmig`).

Apart from :mod:`.dynmig` so that :mod:`.pools` (which the planner's index imports) can name them.
"""

from __future__ import annotations

import re

from ..errors import RequestError
from ..topology import Device, Partition

#: Separates a dynamic unit's profile from its placement start: ``"0:1g.5gb@2"``.
UNIT_SEP = "@"
_PLAIN = re.compile(r"^\d+g\.\d+gb$")
_UNIT = re.compile(r"^(\d+):(\d+g\.\d+gb)@(\d+)$")


def unit_key(gpu: int, profile: str, start: int) -> str:
    """The unit of ``profile`` at slice ``start`` of GPU ``gpu``: ``"0:1g.5gb@2"``."""
    return f"{gpu}:{profile}{UNIT_SEP}{start}"


def parse_unit(key: str) -> tuple[int, str, int] | None:
    """``(gpu, profile, start)`` of a dynamic unit key, or None when ``key`` is not one."""
    m = _UNIT.match(key)
    return (int(m.group(1)), m.group(2), int(m.group(3))) if m else None


def dynamic_profiles(device: Device) -> tuple:
    """The profiles a dynamic GPU offers (its table's profiles without a ``+`` suffix), in table order."""
    return tuple(p for p in device.mig_profiles if _PLAIN.match(p.name))


def dynamic_units(device: Device) -> dict[str, tuple[str, ...]]:
    """Profile -> every unit the GPU offers for it (one per placement), by start."""
    return {p.name: tuple(unit_key(device.index, p.name, s) for s in sorted(p.placements))
            for p in dynamic_profiles(device)}


def instance_unit(part: Partition) -> str:
    """The unit an existing instance occupies.

    Raises:
        RequestError: the instance's placement start is unknown (it cannot be named by placement).
    """
    if part.start is None:
        raise RequestError(f"MIG instance {part.key} ({part.profile}) has no known placement start",
                           "partition", "a GPU whose instances report their placement (NVML GPU-instance info)")
    return unit_key(part.parent, part.profile, part.start)


__all__ = ["UNIT_SEP", "dynamic_profiles", "dynamic_units", "instance_unit", "parse_unit", "unit_key"]
