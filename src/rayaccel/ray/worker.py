"""In-worker setup: what runs inside a rayaccel task or actor before user code.

Given the devices rayaccel placed the work on, :func:`setup`:

* sets the vendor's visible-devices variable, ordered as placed (neighbours
  best-linked): ``CUDA_VISIBLE_DEVICES`` (MIG instances by ``MIG-`` UUID),
  ``HIP_VISIBLE_DEVICES`` for AMD, ``NEURON_RT_VISIBLE_CORES`` for AWS;
* sets ``RAYACCEL_DEVICES`` (JSON list of device indices), ``RAYACCEL_NODE_ID``,
  ``RAYACCEL_GPU_MEMORY_BYTES`` (the work's ``gpu_memory``, when given);
* pins the process to the devices' NUMA-local CPUs, intersected with the CPUs
  it may use (in simulation the topology's CPUs may not exist on this host: the
  intersection is empty and nothing is pinned, but the intended set is recorded);
* with ``gpu_memory`` on real hardware and torch importable with CUDA, calls
  ``torch.cuda.set_per_process_memory_fraction``;
* records the holder (node, devices, name, pid) in the registry used by
  ``rayaccel status``.

:func:`get_devices` returns the :class:`Assignment` inside the worker. Tasks
restore the environment and CPU affinity when they end (workers are reused).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from ..errors import ClusterError
from ..topology import Device, Link, NodeTopology, Partition

VISIBLE_ENV = {"nvidia": "CUDA_VISIBLE_DEVICES", "amd": "HIP_VISIBLE_DEVICES", "aws": "NEURON_RT_VISIBLE_CORES"}
_ENV_KEYS = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "NEURON_RT_VISIBLE_CORES",
             "RAYACCEL_DEVICES", "RAYACCEL_NODE_ID", "RAYACCEL_GPU_MEMORY_BYTES")

_CURRENT: "Assignment | None" = None
_TOPOLOGIES: dict[str, tuple[NodeTopology, bool]] = {}
_ORIGINAL_AFFINITY: set[int] | None = None


@dataclass(frozen=True, slots=True)
class Spec:
    """What the driver sends with each piece of work (small: the topology stays in the KV).

    Attributes:
        node_key: the node's marker key. node_id: Ray node id (hex).
        devices: whole devices, in placed order. partitions: MIG instance keys (``Partition.key``).
        shared_memory: ``((device, bytes), ...)`` for memory shares.
        gpu_memory_bytes: the request's gpu_memory, or None. name: label for ``status``.
    """

    node_key: str
    node_id: str
    devices: tuple[int, ...] = ()
    partitions: tuple[str, ...] = ()
    shared_memory: tuple[tuple[int, int], ...] = ()
    gpu_memory_bytes: int | None = None
    name: str = ""


@dataclass(frozen=True, slots=True)
class Assignment:
    """The devices a rayaccel task or actor holds (iterate it for the :class:`Device` objects).

    Attributes:
        node_id: Ray node id. devices: the devices (whole, MIG parents, or shared), in order.
        partitions: MIG instances held. links: links among the devices.
        memory_bytes: device index -> bytes this work may use.
        gpu_memory_bytes: the request's gpu_memory or None.
        visible_env / visible: the variable set and its value.
        cpus_intended: NUMA-local CPUs of the devices (from the topology), or None.
        cpus_applied: the affinity actually set, or None when nothing was pinned.
        simulated: True on simulated hardware.
    """

    node_id: str
    devices: tuple[Device, ...]
    partitions: tuple[Partition, ...] = ()
    links: tuple[Link, ...] = ()
    memory_bytes: dict = field(default_factory=dict)
    gpu_memory_bytes: int | None = None
    visible_env: str | None = None
    visible: str | None = None
    cpus_intended: tuple[int, ...] | None = None
    cpus_applied: tuple[int, ...] | None = None
    simulated: bool = False

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def indices(self) -> tuple[int, ...]:
        """Device indices in placed order."""
        return tuple(d.index for d in self.devices)


def get_devices() -> Assignment:
    """The devices assigned to the current rayaccel task or actor.

    Raises:
        ClusterError: called outside a rayaccel task/actor.
    """
    if _CURRENT is None:
        raise ClusterError("get_devices() is only meaningful inside a @rayaccel.remote task or actor "
                           "(or a gang worker); this process holds no rayaccel devices")
    return _CURRENT


def _topology(node_key: str) -> tuple[NodeTopology, bool]:
    hit = _TOPOLOGIES.get(node_key)
    if hit is None:
        from .kv import fetch_record

        rec = fetch_record(node_key)
        hit = (rec.topology, rec.simulated)
        _TOPOLOGIES[node_key] = hit
    return hit


def _apply_affinity(cpus: set[int] | None) -> tuple[int, ...] | None:
    global _ORIGINAL_AFFINITY
    if not hasattr(os, "sched_setaffinity"):
        return None
    if _ORIGINAL_AFFINITY is None:
        _ORIGINAL_AFFINITY = set(os.sched_getaffinity(0))
    target = (cpus or set()) & _ORIGINAL_AFFINITY
    want = target or _ORIGINAL_AFFINITY
    if set(os.sched_getaffinity(0)) != want:
        os.sched_setaffinity(0, want)
    return tuple(sorted(target)) if target else None


def setup(spec: Spec) -> tuple[Assignment, dict[str, str | None]]:
    """Apply ``spec`` in this process; return the assignment and the env values it replaced.

    Raises:
        TopologyError / ClusterError: the node's topology cannot be read from the KV.
    """
    global _CURRENT
    topo, simulated = _topology(spec.node_key)
    by_key = {p.key: p for p in topo.partitions()}
    parts = tuple(by_key[k] for k in spec.partitions)
    order: list[int] = list(spec.devices)
    for p in parts:
        if p.parent not in order:
            order.append(p.parent)
    for i, _ in spec.shared_memory:
        if i not in order:
            order.append(i)
    devices = tuple(topo.device(i) for i in order)
    mem: dict[int, int] = {}
    for d in devices:
        if d.index in spec.devices and d.memory_bytes:
            mem[d.index] = d.memory_bytes
    for p in parts:
        if p.memory_bytes:
            mem[p.parent] = mem.get(p.parent, 0) + p.memory_bytes
    for i, b in spec.shared_memory:
        mem[i] = mem.get(i, 0) + b
    idx = set(order)
    links = tuple(l for l in topo.links if l.a in idx and l.b in idx)
    vendor = devices[0].vendor if devices else "nvidia"
    env_var = VISIBLE_ENV.get(vendor, "CUDA_VISIBLE_DEVICES")
    if parts and not spec.devices:
        visible = ",".join(p.uuid or str(p.parent) for p in parts)
    else:
        visible = ",".join(str(i) for i in order)
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    os.environ[env_var] = visible
    os.environ["RAYACCEL_DEVICES"] = json.dumps(order)
    os.environ["RAYACCEL_NODE_ID"] = spec.node_id
    if spec.gpu_memory_bytes is not None:
        os.environ["RAYACCEL_GPU_MEMORY_BYTES"] = str(spec.gpu_memory_bytes)
    else:
        os.environ.pop("RAYACCEL_GPU_MEMORY_BYTES", None)
    intended: set[int] = set()
    for d in devices:
        intended.update(d.cpus or ())
    applied = _apply_affinity(intended or None)
    if spec.gpu_memory_bytes and not simulated:
        _torch_memory_fraction(devices, spec.gpu_memory_bytes)
    _CURRENT = Assignment(
        node_id=spec.node_id, devices=devices, partitions=parts, links=links, memory_bytes=mem,
        gpu_memory_bytes=spec.gpu_memory_bytes, visible_env=env_var, visible=visible,
        cpus_intended=tuple(sorted(intended)) or None, cpus_applied=applied, simulated=simulated,
    )
    return _CURRENT, saved


def teardown(saved: dict[str, str | None]) -> None:
    """Undo :func:`setup` after a task (restores env and CPU affinity)."""
    global _CURRENT
    _CURRENT = None
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    if _ORIGINAL_AFFINITY is not None and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, _ORIGINAL_AFFINITY)


def _torch_memory_fraction(devices: tuple[Device, ...], nbytes: int) -> None:
    try:
        import torch
    except ImportError:
        return
    if not torch.cuda.is_available() or not devices or not devices[0].memory_bytes:
        return
    frac = min(1.0, nbytes / devices[0].memory_bytes)
    torch.cuda.set_per_process_memory_fraction(frac, 0)


#: Tasks still running after this long are announced to the holder registry;
#: shorter ones never touch it (keeps tiny tasks cheap), seconds.
ANNOUNCE_AFTER_S = 0.2


def run_task(fn: Any, spec: Spec, args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` under ``spec`` (setup, holder registration when it runs long, teardown)."""
    import threading

    from . import registry

    _, saved = setup(spec)
    token: list = []
    lock = threading.Lock()

    def announce() -> None:
        with lock:
            if token is not None:
                token.append(registry.announce(spec, "task"))

    timer = threading.Timer(ANNOUNCE_AFTER_S, announce)
    timer.daemon = True
    timer.start()
    try:
        return fn(*args, **kwargs)
    finally:
        timer.cancel()
        with lock:
            for t in token:
                registry.retire(t)
            token = None  # noqa: F841 - tells a late timer not to announce
        teardown(saved)
