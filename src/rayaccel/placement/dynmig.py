"""Dynamic MIG, as data: the units a re-partitionable GPU offers Ray and the steps that serve waiting work.

A GPU the operator lets rayaccel re-partition (``rayaccel start --dynamic-mig``) offers Ray one
unit per *possible* instance: for every profile of its table without a ``+`` suffix (the
profiles NVIDIA's device plugin exposes in its ``mixed`` strategy) and every placement of that
profile, the unit ``"<gpu>:<profile>@<start>"`` (:func:`unit_key`). At most one instance can sit
at a placement, so a unit names one instance whenever it exists; the node's agent holds the units
that do not exist in Ray's ledger (see :mod:`rayaccel.ray.node.dynmig`).

:func:`plan_steps` turns waiting requests (profile -> count) into steps over the GPUs' current
instances: reuse a free instance of the profile, else create one where the layout planner
(:func:`~.mig.plan_mig_layout`: most requests placed, then the placement that blocks the fewest
others) puts it, and only when nothing fits without it destroy *idle* instances that are in the
way. An instance with work is never destroyed. Pure: no NVML, no ``ray``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from ..errors import RequestError
from ..topology import Device, Partition
from .mig import plan_mig_layout
from .migunits import UNIT_SEP, _PLAIN, dynamic_profiles, dynamic_units, instance_unit, parse_unit, unit_key

def check_dynamic(device: Device) -> str | None:
    """Why ``device`` cannot be re-partitioned by rayaccel, or None when it can."""
    if device.mig_mode is not True:
        return (f"GPU {device.index} is not in MIG mode (enabling it is the operator's: "
                f"`nvidia-smi -i {device.index} -mig 1` and a GPU reset)")
    if device.health == "failed":
        return f"GPU {device.index} has failed"
    if not dynamic_profiles(device):
        return f"GPU {device.index} has no MIG profile table"
    for p in device.partitions:
        if p.start is None:
            return f"GPU {device.index}: MIG instance {p.key} has no known placement start"
        if not _PLAIN.match(p.profile) or device.profile(p.profile) is None:
            return f"GPU {device.index}: MIG instance {p.key} has profile {p.profile}, which dynamic MIG does not offer"
    return None


@dataclass(frozen=True, slots=True)
class MigStep:
    """One step the agent takes: ``action`` is ``"create"`` or ``"destroy"``, on ``gpu`` at ``start``.

    Attributes:
        why: the sentence the decision log and ``rayaccel status`` show.
    """

    action: str
    gpu: int
    profile: str
    start: int
    why: str

    @property
    def unit(self) -> str:
        """The unit the step creates or frees."""
        return unit_key(self.gpu, self.profile, self.start)


@dataclass(frozen=True, slots=True)
class StepPlan:
    """What :func:`plan_steps` decided.

    Attributes:
        steps: destroys first, then creates (apply in order).
        reused: requests a free existing instance serves (Ray hands them out; nothing to do).
        unserved: (profile, reason) for each request no step serves.
    """

    steps: tuple[MigStep, ...] = ()
    reused: int = 0
    unserved: tuple[tuple[str, str], ...] = ()


def plan_steps(gpus: Sequence[Device], demand: Mapping[str, int], busy: Iterable[str] = (), *,
               max_requests: int = 32) -> StepPlan:
    """The steps that serve the most of ``demand`` on ``gpus`` (see the module docstring).

    Args:
        gpus: the re-partitionable GPUs, each with its current instances (``partitions``, placements known).
        demand: profile -> how many requests wait for an instance of it.
        busy: units (:func:`unit_key`) of instances with work: never destroyed.
        max_requests: at most this many requests are planned at once (the rest wait for the next round).

    Raises:
        RequestError: a count that is not a non-negative integer.
    """
    busy = set(busy)
    reqs: list[str] = []
    for name, n in sorted(demand.items()):
        if not isinstance(n, int) or isinstance(n, bool) or n < 0:
            raise RequestError(f"demand for {name}: {n!r} is not a count", "demand", "a non-negative integer")
        reqs += [name] * n
    reqs = reqs[:max_requests]
    devices = [_keyed(d) for d in sorted(gpus, key=lambda d: d.index) if d.health != "failed"]
    if not reqs or not devices:
        return StepPlan()
    by_key = {p.key: p for d in devices for p in d.partitions}
    busy_keys = {k for k, p in by_key.items() if instance_unit(p) in busy}
    first = plan_mig_layout(devices, reqs, busy_partitions=busy_keys)
    layout = first
    if first.unplaced:
        second = plan_mig_layout(devices, reqs, busy_partitions=busy_keys, reclaim_free=True)
        if second.placed > first.placed:
            layout = second
    destroy = _in_the_way(devices, layout)
    steps = [MigStep("destroy", p.parent, p.profile, p.start, f"idle {p.profile} at slice {p.start} is in the way "
                     f"of a waiting {_for(layout, p)}") for p in destroy]
    for ni in layout.create:
        steps.append(MigStep("create", ni.gpu, ni.profile.name, ni.start,
                             f"{ni.profile.name} waits and no free instance serves it: slices "
                             f"[{ni.start}, {ni.end}) of GPU {ni.gpu} (the placement that blocks the fewest others)"))
    reused = sum(1 for a in layout.assigned.values() if isinstance(a, Partition))
    unserved = tuple((reqs[i], why) for i, why in layout.unplaced)
    return StepPlan(tuple(steps), reused, unserved)


def _keyed(d: Device) -> Device:
    """``d`` with every instance given a GPU-instance id (the planner names instances by key)."""
    if all(p.gi_id is not None for p in d.partitions):
        return d
    used = {p.gi_id for p in d.partitions if p.gi_id is not None}
    parts, n = [], 1000
    for p in d.partitions:
        if p.gi_id is None:
            while n in used:
                n += 1
            used.add(n)
            p = replace(p, gi_id=n)
        parts.append(p)
    return replace(d, partitions=tuple(parts))


def _in_the_way(devices: list[Device], layout) -> list[Partition]:
    """Of the layout's destroys, those whose slices a new instance needs (or, when the compute
    slices would not fit otherwise, all of that GPU's)."""
    out = []
    for p in layout.destroy:
        news = [ni for ni in layout.create if ni.gpu == p.parent]
        span = range(p.start, p.start + (p.size or 1))
        if any(set(span) & set(range(ni.start, ni.end)) for ni in news):
            out.append(p)
    for d in devices:
        kept = [p for p in d.partitions if p not in layout.destroy or p in out]
        comp = sum(_g(p.profile) for p in kept) + sum(_g(ni.profile.name) for ni in layout.create if ni.gpu == d.index)
        if comp > 7:
            out += [p for p in layout.destroy if p.parent == d.index and p not in out]
    return sorted(out, key=lambda p: (p.parent, p.start))


def _g(profile: str) -> int:
    m = re.match(r"(\d+)g\.", profile)
    return int(m.group(1)) if m else 0


def _for(layout, p: Partition) -> str:
    news = [ni.profile.name for ni in layout.create if ni.gpu == p.parent]
    return " / ".join(sorted(set(news))) or "request"


__all__ = ["MigStep", "StepPlan", "UNIT_SEP", "check_dynamic", "dynamic_profiles", "dynamic_units", "instance_unit",
           "parse_unit", "plan_steps", "unit_key"]
