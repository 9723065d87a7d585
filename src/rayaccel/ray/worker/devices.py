"""Inside a worker: :func:`get_devices`, and what runs before a ``rayaccel.remote`` task's code.

:func:`get_devices` works in *any* GPU task or actor on a rayaccel node (plain
``num_gpus`` work, Ray Train / Serve / Data workers, placement-group members): it
reports what the node's arbiter put behind the grant, the same devices that
``ray.get_gpu_ids()`` and ``CUDA_VISIBLE_DEVICES`` name.

For ``rayaccel.remote`` work, :func:`setup` (actors) and :func:`run_task` (tasks)
first have the arbiter decide the grant, once, with the request's constraints
(:func:`.hook.decide_with`: the hook leaves such grants to them), set
``RAYACCEL_GPU_MEMORY_BYTES`` (the tiered store's device budget) for ``gpu_memory``
requests. The hook caps the memory of every share (fractional ``num_gpus`` or ``gpu_memory``) as
:mod:`.memcap` says; :attr:`Assignment.memory_cap` names the cap and what enforces it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Iterator

from rayaccel.arbiter.state import GPU
from rayaccel.errors import ClusterError
from rayaccel.topology import Device, Link, Partition
from rayaccel.ray.worker import hook
from rayaccel.ray.worker.memcap import MemoryCap
_ENV_KEYS = ("RAYACCEL_GPU_MEMORY_BYTES",)


@dataclass(frozen=True, slots=True)
class Assignment:
    """The devices the current task or actor holds (iterate it for the :class:`Device` objects).

    Attributes:
        node_id: Ray node id. devices: the devices (whole, MIG parents, or shared), in order.
        partitions: MIG instances held (on a node given MIG UUIDs, those behind its GPU slots). links: links
            among the devices.
        memory_bytes: device index -> bytes this work may use.
        gpu_memory_bytes: the request's gpu_memory or None.
        visible_env / visible: the vendor variable and its value.
        cpus_intended: NUMA-local CPUs of the devices (from the topology), or None.
        cpus_applied: the affinity actually set, or None when nothing was pinned.
        simulated: True on simulated hardware. shared: the GPU slot is a fraction (a memory share).
        nics: the RDMA NICs nearest the devices (UCX ``device:port``), empty when none sits at
            PIX/PXB from them. ``UCX_NET_DEVICES`` names those of them this host has (sysfs), unless
            the user set it: a simulated node's NICs are named here but never given to UCX.
        memory_cap: for a share of a GPU (fractional ``num_gpus``, ``gpu_memory``), its cap: bytes per
            device and what enforces it (``"mps"``, ``"torch"``, or None with the reason); None for
            whole devices.
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
    shared: bool = False
    nics: tuple[str, ...] = ()
    memory_cap: MemoryCap | None = None

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    def __len__(self) -> int:
        return len(self.devices)

    @property
    def indices(self) -> tuple[int, ...]:
        """Device indices in order."""
        return tuple(d.index for d in self.devices)


def get_devices() -> Assignment:
    """The devices assigned to the current task or actor on a rayaccel node.

    Raises:
        ClusterError: called outside a GPU task/actor of a rayaccel node.
    """
    ns = hook.node()
    if ns is None:
        raise ClusterError("get_devices() is only meaningful inside a task or actor on a rayaccel node "
                           "(started by rayaccel.init(), `rayaccel start` or SimulatedCluster)")
    # Make sure Ray's grant has been mapped (a plain call in user code maps it too).
    import ray

    ray.get_gpu_ids()
    cur = hook.current()
    if cur is None:
        raise ClusterError("this task or actor holds no devices (it asked for no GPU or MIG instance)")
    topo = ns.topology
    parts = tuple(p for p in topo.partitions() if p.key in set(cur.partitions))
    order = list(cur.devices)
    for p in parts:
        if p.parent not in order:
            order.append(p.parent)
    devices = tuple(topo.device(i) for i in order)
    gpu = [f for _, f in cur.asked.slots.get(GPU, ())]
    shared = bool(gpu) and gpu[0] < 1 - 1e-6
    mem: dict[int, int] = {}
    size = hook.device_bytes(ns, cur)  # a node given MIG UUIDs: a GPU's bytes are its instances'
    for d in devices:
        if d.index in cur.devices and size.get(d.index):
            mem[d.index] = int(size[d.index] * (gpu[0] if shared else 1.0))
    as_gpus = set(cur.units.get(GPU, ())) if cur.parents is not None else set()
    for p in parts:
        if p.memory_bytes and p.key not in as_gpus:
            mem[p.parent] = mem.get(p.parent, 0) + p.memory_bytes
    idx = set(order)
    links = tuple(l for l in topo.links if l.a in idx and l.b in idx)
    intended, applied = hook.affinity()
    gpu_mem = os.environ.get("RAYACCEL_GPU_MEMORY_BYTES")
    cap = _memory_cap(ns, cur, tuple(gpu))
    return Assignment(node_id=_node_id(), devices=devices, partitions=parts, links=links, memory_bytes=mem,
                      gpu_memory_bytes=int(gpu_mem) if gpu_mem else None, visible_env=ns.env_var,
                      visible=os.environ.get(ns.env_var), cpus_intended=intended, cpus_applied=applied,
                      simulated=ns.record.simulated, shared=shared, nics=hook.nics(),
                      memory_cap=cap)


def _memory_cap(ns: Any, cur: Any, fractions: tuple[float, ...]) -> MemoryCap | None:
    from rayaccel.ray.worker import memcap

    gm = getattr(cur.asked.request, "gpu_memory", None)
    if gm is None and os.environ.get("RAYACCEL_GPU_MEMORY_BYTES"):  # a gpu_memory share: Ray's fraction is its bytes
        gm = int(os.environ["RAYACCEL_GPU_MEMORY_BYTES"])
    share = memcap.share_of(fractions, cur.devices, hook.device_bytes(ns, cur), gm)
    return memcap.cap_now(share, simulated=ns.record.simulated)


def _node_id() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()


def setup(spec: Any) -> dict[str, str | None]:
    """Apply a ``rayaccel.remote`` work spec in this worker; return the variables it replaced."""
    saved = {k: os.environ.get(k) for k in _ENV_KEYS}
    hook.decide_with(spec.request)
    req = spec.request
    if req.gpu_memory is not None:
        os.environ["RAYACCEL_GPU_MEMORY_BYTES"] = str(req.gpu_memory)
    else:
        os.environ.pop("RAYACCEL_GPU_MEMORY_BYTES", None)
    return saved


def teardown(saved: dict[str, str | None]) -> None:
    """Undo :func:`setup` after a task (workers may be reused)."""
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def run_task(fn: Any, spec: Any, args: tuple, kwargs: dict) -> Any:
    """Run ``fn`` under ``spec`` (setup, call, teardown)."""
    saved = setup(spec)
    try:
        return fn(*args, **kwargs)
    finally:
        teardown(saved)
