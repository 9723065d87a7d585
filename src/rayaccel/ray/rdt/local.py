"""What one end of a transfer knows about itself: node, devices, topology, NICs, NIXL, GPUDirect.

Read once per process where it cannot change (the node, its topology, whether NIXL
imports), per call where it can (a reused worker's devices).
"""

from __future__ import annotations

import functools
import logging
import os
from typing import Any

from ...topology import NodeTopology
from ...transfer import NIXL_HINT
from ...transfer import near_nics as near_nics_of
from ...contract import DEVICES_ENV, NODE_DIR_ENV, RECORD_FILE, host_rdma_devices, parse_devices

log = logging.getLogger("rayaccel.ray.rdt")

def node_id() -> str:
    """This process's Ray node id (hex).

    Asked each time (a core-worker call): a driver that shuts Ray down and connects again -- a
    notebook, a test session -- is on another node afterwards, and a stale id made a consumer on
    the producer's own node take NIXL, the other-node path.
    """
    import ray

    return ray.get_runtime_context().get_node_id()


@functools.lru_cache(maxsize=1)
def _record() -> Any:
    from ..record import NodeRecord  # the topology model loads at a process's first transfer only

    d = os.environ.get(NODE_DIR_ENV)
    if not d:
        return None
    path = os.path.join(d, RECORD_FILE)
    try:
        with open(path, "rb") as f:
            return NodeRecord.from_json(f.read(), path)
    except (OSError, ValueError) as e:
        log.warning("rayaccel transport: cannot read the node record %s (%s); topology unknown", path, e)
        return None


def topology() -> NodeTopology | None:
    """This node's topology on a rayaccel node, else None."""
    r = _record()
    return r.topology if r is not None else None


def simulated() -> bool:
    """Whether this node's devices are simulated (no real hardware behind the topology)."""
    r = _record()
    return bool(r is not None and r.simulated)


def devices() -> tuple[int, ...]:
    """Physical indices of this process's devices, in CUDA ordinal order; () when none or unknown.

    ``RAYACCEL_DEVICES`` (written by the worker hook at each grant) first, else
    ``CUDA_VISIBLE_DEVICES`` (indices, or UUIDs resolved through the topology).
    """
    mine = parse_devices(os.environ.get(DEVICES_ENV))
    if mine is not None:
        return mine
    vis = os.environ.get("CUDA_VISIBLE_DEVICES")
    if vis is None or not vis.strip():
        return ()
    topo = topology()
    by_uuid = {d.uuid: d.index for d in topo.devices if d.uuid} if topo is not None else {}
    out = []
    for part in vis.split(","):
        part = part.strip()
        if part.isdigit():
            out.append(int(part))
        elif part in by_uuid:
            out.append(by_uuid[part])
        else:
            return ()  # MIG instances, placeholders: no whole device to name
    return tuple(out)


def physical(ordinal: int) -> int | None:
    """The physical device behind CUDA ordinal ``ordinal`` in this process, or None."""
    d = devices()
    return d[ordinal] if 0 <= ordinal < len(d) else None


def ordinal(physical_index: int) -> int | None:
    """This process's CUDA ordinal of physical device ``physical_index``, or None when it cannot see it."""
    d = devices()
    return d.index(physical_index) if physical_index in d else None


@functools.lru_cache(maxsize=1)
def nixl() -> tuple[bool, str]:
    """Whether NIXL imports in this process, and if not why (with what to install)."""
    try:
        import nixl._api  # noqa: F401
    except ImportError as e:
        return False, f"NIXL is not installed ({e}): {NIXL_HINT}"
    except OSError as e:  # a broken install: its UCX or CUDA libraries fail to load
        return False, f"NIXL fails to load ({e}): reinstall it, {NIXL_HINT}"
    return True, ""


@functools.lru_cache(maxsize=1)
def gpudirect() -> bool | None:
    """Whether ``rayaccel doctor``'s GPUDirect RDMA check passes on this node (None: unknown or simulated)."""
    topo = topology()
    if topo is None or simulated() or not any(n.rdma for n in topo.nics):
        return None
    from ...doctor._host import gpudirect_check

    return gpudirect_check(topo, "nvidia", "/proc/modules").status == "ok"


def near_nics(devs: tuple[int, ...] | None = None) -> tuple[str, ...]:
    """The names of the RDMA NICs nearest this process's devices (:func:`rayaccel.topology.near_nics`)."""
    topo = topology()
    devs = devices() if devs is None else devs
    return near_nics_of(topo, devs) if topo is not None else ()


_NODES_TTL_S = 30.0
_nodes: tuple[float, int] = (-1e9, 0)


def other_nodes() -> bool:
    """Whether the cluster has alive nodes besides this one (asked at most every 30 s)."""
    global _nodes
    import time

    import ray

    now = time.monotonic()
    if now - _nodes[0] > _NODES_TTL_S:
        _nodes = (now, sum(1 for n in ray.nodes() if n.get("Alive")))
    return _nodes[1] > 1


_UCX_DONE = False


def prepare_ucx() -> tuple[str, ...]:
    """Before this process's NIXL agent starts: point UCX at the NICs nearest its devices.

    Sets ``UCX_NET_DEVICES`` (``mlx5_0:1,...``) unless it is set already (by the user or the
    worker hook) and only to NICs this machine really has (:func:`~rayaccel.contract.host_rdma_devices`): on a
    simulated node nothing is applied. Idempotent; UCX reads it once, when the agent starts.

    Returns:
        The NICs UCX is told to use (empty: UCX chooses).
    """
    global _UCX_DONE
    have = os.environ.get("UCX_NET_DEVICES")
    if have:
        return tuple(p.split(":")[0] for p in have.split(",") if p and p != "all")
    nics = near_nics()
    have_here = host_rdma_devices()
    real = tuple(n for n in nics if n in have_here)
    if not _UCX_DONE and real:
        os.environ["UCX_NET_DEVICES"] = ",".join(f"{n}:1" for n in real)
        log.info("rayaccel transport: UCX_NET_DEVICES=%s (the RDMA NICs next to devices %s)",
                 os.environ["UCX_NET_DEVICES"], list(devices()))
    _UCX_DONE = True
    return real


_ACTOR: tuple | None = None


def current_actor() -> tuple[Any, str | None]:
    """(a handle to the actor this process runs, its id hex), or (None, None) in a driver or a task.

    Cached: an actor's worker process runs that one actor for its whole life.
    """
    global _ACTOR
    if _ACTOR is None:
        import ray

        ctx = ray.get_runtime_context()
        aid = ctx.get_actor_id()
        if aid is None:
            return None, None  # not cached: a task's process may become an actor's
        _ACTOR = (ctx.current_actor, aid)
    return _ACTOR
