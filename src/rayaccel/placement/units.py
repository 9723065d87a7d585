"""Ray's slots -> physical units, for every accelerator Ray knows: cores, chips, devices.

Pure functions over topology data (no ray, no vendor library). A *spec* says how one
accelerator family appears to Ray (:class:`rayaccel.discovery.RaySpec`; any object with
its fields works, see :class:`UnitSpec`). A *unit* is what one Ray slot of the family's
resource stands for:

* ``"device"`` (GPU, Gaudi HPU, Ascend NPU, most plugins): a device; its id is
  ``Device.index`` (a GPU index, a Gaudi module id, an Ascend logical id).
* ``"core"`` (AWS Neuron): a NeuronCore; ids number the cores of the devices in device
  order (device 0 holds cores ``0..c-1``), as ``neuron-ls`` and ``NEURON_RT_VISIBLE_CORES`` do.
* ``"chip"`` (Google TPU): a chip on the host's ICI grid (``Device.coords``); its id is
  the chip index ``TPU_VISIBLE_CHIPS`` names.

:func:`node_units` lists them in the order Ray numbers its slots; :func:`choose_units`
picks the units for a grant of ``k`` among the free ones; :func:`visible_env` is what
Ray's manager would write for them (rayaccel's TPU bounds describe the actual block).

How :func:`choose_units` chooses, by unit:

* devices: :func:`rayaccel.placement.allocate` (best-linked set, ring order).
* cores: a request of up to a device's cores stays on one device (best fit: the device
  with the fewest free cores that still fit, so whole devices stay whole; a contiguous
  run of cores when there is one); a larger one takes whole devices that form a ring
  over direct links (NeuronLink on the torus), else the best path.
* chips: a contiguous rectangular block of the host's grid, the most compact shape
  (most ICI links inside), aligned when it can be, keeping the most aligned free blocks
  whole for later requests.

A grant that cannot get its shape (no device with ``k`` free cores, no free block) is a
:class:`~rayaccel.placement.Rejection` saying so -- the caller waits for one to free --
unless ``strict=False``, which takes the best-linked units there are and says that
the shape was not met. Cores on devices of different core counts (a node given some cores of a
device, :mod:`rayaccel.ray.node.preset`) have no whole-device shape for a request larger than a
device, however long one waits: such a request takes the best-linked cores in either mode.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from itertools import product
from typing import Iterable, Protocol

from ..errors import RequestError
from ..topology import Device, NodeTopology
from ._rings import Graph, best_devices
from .node import allocate
from .request import Request
from .result import Rejection
from .state import NodeState

__all__ = ["Unit", "UnitChoice", "UnitSpec", "choose_units", "node_units", "visible_env"]



class UnitSpec(Protocol):
    """The fields of :class:`rayaccel.discovery.RaySpec` this module reads."""

    vendor: str
    resource: str
    unit: str
    visible_env: tuple[str, ...]
    bounds_env: tuple[str, str] | None
    whole_host_unsets: bool
    valid_counts: tuple[int, ...] | None

    def cores_of(self, device: Device) -> int | None: ...

    def covers(self, device: Device) -> bool: ...


@dataclass(frozen=True, slots=True)
class Unit:
    """One Ray slot's physical unit.

    Attributes:
        id: the id Ray's visible variable names (GPU index, global NeuronCore id, TPU chip
            index, Gaudi module id, Ascend device id).
        device: index of the topology device it belongs to.
    """

    id: int
    device: int


@dataclass(frozen=True, slots=True)
class UnitChoice:
    """The units chosen for a grant.

    Attributes:
        units: unit ids, in the order to hand out (ring order for devices; cores device by
            device; chips ascending).
        devices: the devices they are on, in the same order, each once.
        shape: ``"one device"``, ``"whole devices"``, ``"block"``, ``"devices"`` (device units)
            or ``"fallback"`` (``strict=False`` and the shape could not be met).
        reason: one sentence on why these.
        ring: for several devices: True when consecutive devices (and the last and first) are
            directly linked; None for one device or chips.
        block: for chips: the block's extent ``(x, y, z)``; None otherwise.
    """

    units: tuple[int, ...]
    devices: tuple[int, ...]
    shape: str
    reason: str
    ring: bool | None = None
    block: tuple[int, int, int] | None = None

    def __bool__(self) -> bool:
        return True


@dataclass(eq=False)
class _Plan:
    """What one (topology, spec) pair gives, computed once."""

    units: tuple[Unit, ...]
    of_device: dict[int, tuple[int, ...]]  # device -> its unit ids
    device_of: dict[int, int]  # unit id -> device
    devices: tuple[int, ...]  # the spec's devices, by index
    failed: frozenset[int]  # their failed devices
    adj: dict[int, frozenset[int]]  # direct links among them
    grid: tuple[int, int, int] | None = None  # chips: host grid extent
    chip_at: dict[tuple[int, int, int], int] = field(default_factory=dict)
    blocks: dict[int, list] = field(default_factory=dict)  # k -> [(mask, chips, extent, links, aligned)]
    aligned: list = field(default_factory=list)  # [(size, mask)] for the fragmentation score
    bit: dict[int, int] = field(default_factory=dict)  # chip id -> bit
    graph: Graph | None = None  # direct links over device positions (core units)


_PLANS: dict[tuple[int, int], tuple[NodeTopology, object, _Plan]] = {}


def _plan(topology: NodeTopology, spec: UnitSpec) -> _Plan:
    key = (id(topology), id(spec))
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is topology and hit[1] is spec:
        return hit[2]
    if not isinstance(topology, NodeTopology):
        raise RequestError(f"expected a NodeTopology, got {type(topology).__name__}", "topology")
    if getattr(spec, "unit", None) not in ("device", "core", "chip"):
        raise RequestError(f"expected a RaySpec (unit device/core/chip), got {spec!r}", "spec")
    devs = sorted((d for d in topology.devices if spec.covers(d)), key=lambda d: d.index)
    units: list[Unit] = []
    of_device: dict[int, tuple[int, ...]] = {}
    nxt = 0
    for d in devs:
        if spec.unit == "core":
            n = spec.cores_of(d)
            if n is None:
                raise RequestError(f"device {d.index} ({d.model or 'model unknown'}) does not say how many cores "
                                   f"it has", "topology", "Device.cores set (neuron-ls 'NEURON CORES')")
            ids = tuple(range(nxt, nxt + n))
            nxt += n
        else:
            ids = (d.index,)
        of_device[d.index] = ids
        units.extend(Unit(u, d.index) for u in ids)
    index = {d.index for d in devs}
    adj: dict[int, set[int]] = {d: set() for d in index}
    for l in topology.links:
        if l.direct and l.a in index and l.b in index:
            adj[l.a].add(l.b)
            adj[l.b].add(l.a)
    plan = _Plan(tuple(units), of_device, {u.id: u.device for u in units}, tuple(d.index for d in devs),
                 frozenset(d.index for d in devs if d.health == "failed"), {d: frozenset(s) for d, s in adj.items()})
    pos = {d: i for i, d in enumerate(plan.devices)}
    plan.graph = Graph([sum(1 << pos[e] for e in plan.adj[d]) for d in plan.devices])
    if spec.unit == "chip" and devs and all(d.coords is not None for d in devs):
        _grid(plan, devs, getattr(spec, "valid_counts", None))
    if len(_PLANS) > 1000:
        _PLANS.clear()
    _PLANS[key] = (topology, spec, plan)
    return plan


def _grid(plan: _Plan, devs: list[Device], valid: tuple[int, ...] | None) -> None:
    """Chip coordinates relative to the host's corner, and every block of the grid.

    The fragmentation score counts the aligned free blocks of the sizes a request can have
    (``valid``: the spec's valid counts, e.g. TPU's 1, 2, 4, 8; else powers of two).
    """
    coords = {d.index: tuple(d.coords) + (0,) * (3 - len(d.coords)) for d in devs}  # type: ignore[arg-type]
    lo = [min(c[i] for c in coords.values()) for i in range(3)]
    rel = {d: tuple(c[i] - lo[i] for i in range(3)) for d, c in coords.items()}
    ext = tuple(max(c[i] for c in rel.values()) + 1 for i in range(3))
    plan.grid = ext  # type: ignore[assignment]
    plan.chip_at = {c: d for d, c in rel.items()}  # type: ignore[misc]
    plan.bit = {d: 1 << i for i, d in enumerate(plan.devices)}
    total = len(devs)
    for k in range(1, total + 1):
        out = []
        for a, b, c in product(range(1, ext[0] + 1), range(1, ext[1] + 1), range(1, ext[2] + 1)):
            if a * b * c != k:
                continue
            for x0, y0, z0 in product(range(ext[0] - a + 1), range(ext[1] - b + 1), range(ext[2] - c + 1)):
                cells = [(x, y, z) for x in range(x0, x0 + a) for y in range(y0, y0 + b) for z in range(z0, z0 + c)]
                if not all(cell in plan.chip_at for cell in cells):
                    continue
                chips = tuple(sorted(plan.chip_at[cell] for cell in cells))
                mask = sum(plan.bit[ch] for ch in chips)
                links = (a - 1) * b * c + a * (b - 1) * c + a * b * (c - 1)
                aligned = x0 % a == 0 and y0 % b == 0 and z0 % c == 0
                out.append((mask, chips, (a, b, c), links, aligned))
        if out:
            plan.blocks[k] = out
    # aligned blocks of the sizes requests come in, between one chip and the whole host, largest first
    sizes = set(valid) if valid else {1 << i for i in range(total.bit_length())}
    for k in sorted(plan.blocks, reverse=True):
        if 1 < k < total and k in sizes:
            plan.aligned.extend((k, m) for m, _, _, _, al in plan.blocks[k] if al)


def node_units(topology: NodeTopology, spec: UnitSpec) -> tuple[Unit, ...]:
    """The spec's units on this node, in the order Ray numbers its slots (by unit id).

    Every device of the spec's vendor counts (failed ones too: Ray counts what the node
    advertises; :func:`choose_units` never picks a failed device's units).

    Raises:
        RequestError: not a topology or spec, or a core spec and a device whose core count is unknown.
    """
    return _plan(topology, spec).units


def choose_units(topology: NodeTopology, spec: UnitSpec, free: Iterable[int], k: int,
                 request: Request | None = None, *, strict: bool = True) -> UnitChoice | Rejection:
    """The units for a grant of ``k`` among ``free`` (see the module docstring for how).

    Args:
        topology: the node. spec: the accelerator family (its resource's unit).
        free: unit ids the caller may hand out (not held by running work).
        k: how many units Ray granted (>= 1).
        request: for device units, a placement :class:`Request` carrying constraints
            (interconnect, same_numa, ...); its ``gpus`` is replaced by ``k``.
        strict: False takes the best-linked units there are when the shape (one device, a
            contiguous block) cannot be met, instead of a Rejection.

    Returns:
        a :class:`UnitChoice` (truthy), or a :class:`Rejection` (falsy) whose reasons say what
        is missing; nothing is chosen twice and nothing outside ``free`` is chosen.

    Raises:
        RequestError: ``k`` is not an int >= 1, or ``free`` names a unit the node does not have.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise RequestError(f"expected an int >= 1, got {k!r}", "k", "the number of units Ray granted")
    plan = _plan(topology, spec)
    try:
        given = frozenset(free)
    except TypeError:
        raise RequestError(f"expected unit ids, got {free!r}", "free") from None
    unknown = sorted(u for u in given if u not in plan.device_of) if not given <= plan.device_of.keys() else []
    if unknown:
        raise RequestError(f"no unit {unknown[0]!r} on this node", "free",
                           f"{spec.resource} unit ids {_ranges(u.id for u in plan.units)}")
    usable = frozenset(u for u in given if plan.device_of[u] not in plan.failed)
    if len(usable) < k:
        why = f"only {len(usable)} {spec.resource} unit{'s' if len(usable) != 1 else ''} free, {k} asked"
        if len(usable) < len(given):
            why += f" ({len(given) - len(usable)} free ones are on failed devices)"
        return Rejection((why,))
    if spec.unit == "core":
        return _cores(topology, spec, plan, usable, k, strict)
    if spec.unit == "chip":
        return _chips(topology, spec, plan, usable, k, strict)
    return _devices(topology, plan, usable, k, request, "devices")


# ------------------------------------------------------------------ devices
def _devices(topology: NodeTopology, plan: _Plan, free_devs: frozenset[int], k: int, request: Request | None,
             shape: str, why: str | None = None) -> UnitChoice | Rejection:
    busy = frozenset(d.index for d in topology.devices if d.index not in free_devs)
    req = Request(gpus=k) if request is None else _with_gpus(request, k)
    got = allocate(NodeState(topology, busy=busy), req)
    if isinstance(got, Rejection):
        return got
    devs = got.devices
    reason = why or (got.why[0] if got.why else f"{k} best-linked devices")
    return UnitChoice(tuple(u for d in devs for u in plan.of_device[d]), devs, shape, reason,
                      ring=_is_ring(plan, devs) if len(devs) > 1 else None)


def _with_gpus(request: Request, k: int) -> Request:
    if not isinstance(request, Request):
        raise RequestError(f"expected a Request or None, got {type(request).__name__}", "request")
    if request.kind != "devices":
        raise RequestError(f"only whole-device requests map onto accelerator units, got {request.describe()}",
                           "request", "Request(gpus=..., interconnect=..., same_numa=...)")
    return replace(request, gpus=k)


def _is_ring(plan: _Plan, order: tuple[int, ...]) -> bool:
    n = len(order)
    if n < 2:
        return True
    if n == 2:
        return order[1] in plan.adj[order[0]]
    return all(order[(i + 1) % n] in plan.adj[order[i]] for i in range(n))


# -------------------------------------------------------------------- cores
def _cores(topology: NodeTopology, spec: UnitSpec, plan: _Plan, usable: frozenset[int], k: int,
           strict: bool) -> UnitChoice | Rejection:
    free_on = {d: tuple(u for u in plan.of_device[d] if u in usable) for d in plan.devices if d not in plan.failed}
    cap = {d: len(plan.of_device[d]) for d in plan.devices}
    most = max(cap.values())
    name = spec.resource
    if k <= most:
        fits = [d for d, f in free_on.items() if len(f) >= k]
        if fits:
            whole = {d for d, f in free_on.items() if len(f) == cap[d]}
            g, bit = plan.graph, {d: 1 << i for i, d in enumerate(plan.devices)}
            wmask = sum(bit[d] for d in whole)
            d = min(fits, key=lambda x: (len(free_on[x]) - k, -g.rings_within(wmask & ~bit[x]),  # type: ignore
                                         len(plan.adj[x] & whole), x))
            cores = _run(free_on[d], k)
            left = len(free_on[d]) - k
            return UnitChoice(cores, (d,), "one device",
                              f"{k} {name} on one device ({d}), the best fit: {left} free core"
                              f"{'s' if left != 1 else ''} left there, whole devices and free rings kept whole")
        per = ", ".join(f"{d}: {len(f)}" for d, f in free_on.items() if f)
        if strict:
            return Rejection((f"no device has {k} free {name} (free per device: {per}); a request of up to a "
                              f"device's {most} cores stays on one device: wait for one to free",))
        return _spread(topology, plan, free_on, k, name, "no device has enough free cores")
    whole = frozenset(d for d, f in free_on.items() if len(f) == cap[d])
    if len(set(cap.values())) > 1:
        # no whole-device shape exists (a node given some cores of a device): waiting would never give one
        return _spread(topology, plan, free_on, k, name, "devices have different core counts, so no set of whole "
                                                         "devices fits")
    n_full, rest = divmod(k, most)
    n = n_full + (1 if rest else 0)
    partial = frozenset(d for d, f in free_on.items() if rest and rest <= len(f) < cap[d])
    order = None
    if partial and len(whole) >= n_full:
        order = _device_order(plan, whole | partial, n, partial)
    if order is None and len(whole) >= n:
        order = _device_order(plan, whole, n)
    if order is None:
        if strict:
            return Rejection((f"{k} {name} need {n} devices with their {most} cores free; only {len(whole)} are "
                              f"({_ranges(whole)}): wait for devices to free",))
        return _spread(topology, plan, free_on, k, name, f"fewer than {n} whole devices are free")
    part = next((d for d in order if d in partial), order[-1] if rest else None)
    units: list[int] = []
    for d in order:
        units.extend(_run(free_on[d], rest) if d == part and rest else free_on[d][:most])
    ring = _is_ring(plan, order)
    if n == 1:
        how = "one whole device"
    elif ring:
        how = "forming a ring over direct links"
    elif n > 2 and not plan.graph.ring_possible(n):  # type: ignore[union-attr]
        how = f"the best path (no ring of {n} devices exists on this node)"
    else:
        how = "no free ring of that size: the best path"
    return UnitChoice(tuple(units), order, "whole devices",
                      f"{k} {name} as {n} device{'s' if n > 1 else ''} {list(order)}, {how}", ring=ring if n > 1 else None)


def _device_order(plan: _Plan, pool: frozenset[int], n: int, partial: frozenset[int] = frozenset()
                  ) -> tuple[int, ...] | None:
    """``n`` devices of ``pool`` (at most one of ``partial``), in ring (or path) order: see :mod:`._rings`."""
    bit = {d: 1 << i for i, d in enumerate(plan.devices)}
    got = best_devices(plan.graph, sum(bit[d] for d in pool), n, sum(bit[d] for d in partial))  # type: ignore[arg-type]
    return None if got is None else tuple(plan.devices[p] for p in got[0])


def _run(cores: tuple[int, ...], k: int) -> tuple[int, ...]:
    """``k`` of ``cores`` (ascending): the lowest contiguous run when there is one, else the lowest ids."""
    for i in range(len(cores) - k + 1):
        if cores[i + k - 1] - cores[i] == k - 1:
            return cores[i:i + k]
    return cores[:k]


def _spread(topology: NodeTopology, plan: _Plan, free_on: dict[int, tuple[int, ...]], k: int, name: str,
            why: str) -> UnitChoice | Rejection:
    have = {d: f for d, f in free_on.items() if f}
    sizes = sorted((len(f) for f in have.values()), reverse=True)
    m, total = 0, 0
    while total < k:
        total += sizes[m]
        m += 1
    order = _device_order(plan, frozenset(have), m)
    if order is None or sum(len(have[d]) for d in order) < k:
        order = tuple(sorted(have, key=lambda d: -len(have[d])))[:m]
    units: list[int] = []
    for d in order:
        units.extend(have[d][:k - len(units)])
    return UnitChoice(tuple(units[:k]), tuple(order), "fallback",
                      f"{why}: {k} {name} spread over the best-linked devices {list(order)} (strict=False)",
                      ring=_is_ring(plan, tuple(order)) if len(order) > 1 else None)


# -------------------------------------------------------------------- chips
def _chips(topology: NodeTopology, spec: UnitSpec, plan: _Plan, usable: frozenset[int], k: int,
           strict: bool) -> UnitChoice | Rejection:
    name = spec.resource
    if plan.grid is None:
        return _devices(topology, plan, usable, k, None, "fallback",
                        f"chip coordinates unknown: {k} {name} chosen by links instead of as a block")
    total = len(plan.devices)
    if k > total:
        return Rejection((f"{k} {name} asked; the host has {total}",))
    free_mask = sum(plan.bit[u] for u in usable)
    sizes = sorted({s for s, _ in plan.aligned}, reverse=True)
    best = None
    for mask, chips, ext, links, aligned in plan.blocks.get(k, ()):
        if mask & free_mask != mask:
            continue
        after = free_mask & ~mask
        frag = tuple(sum(1 for s, m in plan.aligned if s == size and m & after == m) for size in sizes)
        key = (links, aligned, frag, ext[0] == 1, -chips[0])
        if best is None or key > best[0]:
            best = (key, chips, ext)
    grid = "x".join(map(str, plan.grid))
    if best is None:
        shapes = sorted({"x".join(map(str, e)) for _, _, e, _, _ in plan.blocks.get(k, ())})
        if not shapes:
            why = f"no block of {k} {name} fits the host's {grid} grid"
        else:
            why = (f"no free contiguous block of {k} {name} ({' or '.join(shapes)}) on the host's {grid} grid; "
                   f"free chips: {_ranges(usable)}")
        if strict:
            return Rejection((why + ": wait for one (Ray would hand out any free chips, which libtpu cannot "
                                    "use as one slice)",))
        return _devices(topology, plan, usable, k, None, "fallback", why + "; best-linked chips instead (strict=False)")
    _, chips, ext = best
    return UnitChoice(chips, chips, "block",
                      f"{k} {name} as a contiguous {'x'.join(map(str, ext))} block of the host's {grid} grid",
                      block=ext)


# -------------------------------------------------------------- environment
def visible_env(topology: NodeTopology, spec: UnitSpec, units: Iterable[int]) -> dict[str, str | None]:
    """The variables Ray's manager would write for a grant of ``units`` (None: unset).

    Each of ``spec.visible_env`` gets the ids comma-joined in the order given, as Ray writes
    them. TPU (a spec with ``bounds_env``): the chip ids ascending; a grant of the whole host
    unsets the visible variable and both bounds (Ray: whole-host grants unset
    ``TPU_VISIBLE_CHIPS``); a sub-host grant that is a contiguous block gets
    ``TPU_CHIPS_PER_HOST_BOUNDS`` = the block's extent ``x,y,z`` (Ray writes ``1,1,1`` / ``1,2,1``
    for 1 / 2 chips whatever they are, nothing for more) and ``TPU_HOST_BOUNDS=1,1,1``;
    chips that are no block get what Ray writes. No units: nothing (Ray 2.60 writes nothing
    when zero units are granted).

    Raises:
        RequestError: a unit id the node does not have, or one named twice.
    """
    plan = _plan(topology, spec)
    ids = list(units)
    for u in ids:
        if isinstance(u, bool) or not isinstance(u, int) or u not in plan.device_of:
            raise RequestError(f"no unit {u!r} on this node", "units",
                               f"{spec.resource} unit ids {_ranges(x.id for x in plan.units)}")
    if len(set(ids)) != len(ids):
        raise RequestError("a unit named twice", "units", "each unit id once")
    if not ids:
        return {}
    if spec.bounds_env is None:
        text = ",".join(map(str, ids))
        return {var: text for var in spec.visible_env}
    chips = sorted(ids)
    per_host, host = spec.bounds_env
    if spec.whole_host_unsets and len(chips) == len(plan.units):
        return {**{var: None for var in spec.visible_env}, per_host: None, host: None}
    out: dict[str, str | None] = {var: ",".join(map(str, chips)) for var in spec.visible_env}
    ext = _block_extent(plan, chips)
    if ext is not None:
        out[per_host] = ",".join(map(str, ext))
        out[host] = "1,1,1"
    elif len(chips) in (1, 2):
        out[per_host] = "1,1,1" if len(chips) == 1 else "1,2,1"
        out[host] = "1,1,1"
    else:
        out[per_host] = None
        out[host] = None
    return out


def _block_extent(plan: _Plan, chips: list[int]) -> tuple[int, int, int] | None:
    """The extent ``(x, y, z)`` of ``chips`` when they are exactly a block of the grid, else None."""
    if plan.grid is None:
        return None
    mask = sum(plan.bit[c] for c in chips)
    for m, _, ext, _, _ in plan.blocks.get(len(chips), ()):
        if m == mask:
            return ext
    return None


def _ranges(ids: Iterable[int]) -> str:
    xs = sorted(set(ids))
    if not xs:
        return "none"
    out, start, prev = [], xs[0], xs[0]
    for x in xs[1:] + [None]:  # type: ignore[list-item]
        if x is not None and x == prev + 1:
            prev = x
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if x is not None:
            start = prev = x
    return ",".join(out)
