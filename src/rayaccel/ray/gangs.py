"""Gangs: N workers of k devices each, reserved all at once, with torch.distributed ready.

::

    with rayaccel.gang(workers=2, gpus_per_worker=4, strategy="pack") as g:
        sums = g.run(train_step, batch)     # fn runs on every worker, rank order

A gang is an ordinary Ray placement group of ``{"GPU": k}`` bundles (so Ray's ledger
and autoscaler see it as GPU demand), each bundle pinned to the node
:func:`rayaccel.placement.place_gang` chose by the node marker resource. On each
node, the arbiter treats the group as one gang: its first worker reserves the best
set for all of the group's GPUs there and hands the bundles their devices in ring
order, so rank ``i`` (bundle ``i``) sits next to rank ``i+1``. Workers are actors in
the group. On the first :meth:`Gang.run` every worker calls
``torch.distributed.init_process_group`` (NCCL on real GPUs, gloo on simulated
nodes) with rank 0's node IP and a free port as the rendezvous; rank 0's store
listens on that node IP only.
"""

from __future__ import annotations

import logging
import socket
import uuid
from typing import Any, Callable

from ..errors import ClusterError, RequestError, Unsatisfiable

log = logging.getLogger(__name__)
_WORKER_CLS: Any = None


class _GangWorker:
    """One gang member (an actor; see :func:`_worker_cls`)."""

    def __init__(self, name: str, rank: int):
        from .worker import get_devices

        self.rank = rank
        self.name = name
        self.assignment = get_devices()
        self.dist = False

    def rendezvous(self) -> tuple[str, int]:
        """(node IP, port) of a listening socket bound to this node's IP only; the store serves on it."""
        import ray

        addr = ray.util.get_node_ip_address()
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = socket.socket(family, socket.SOCK_STREAM)
        s.bind((addr, 0))
        s.listen(128)
        self._listen = s
        return addr, s.getsockname()[1]

    def devices(self) -> tuple:
        return self.assignment.indices

    def store_address(self) -> tuple | None:
        """(host, port) rank 0's rendezvous store listens on (None on other ranks)."""
        listen = getattr(self, "_listen", None)
        return listen.getsockname()[:2] if listen is not None else None

    def init_dist(self, world: int, addr: str, port: int, backend: str, timeout_s: float) -> int:
        import datetime
        import os

        import torch.distributed as dist

        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(world), LOCAL_RANK="0")
        # rank 0's store serves on the socket rendezvous() bound to this node's IP, not on every interface
        fd = None
        if self.rank == 0:
            fd = self._listen.fileno()
        store = dist.TCPStore(addr, port, world, self.rank == 0, timeout=datetime.timedelta(seconds=timeout_s),
                              master_listen_fd=fd, use_libuv=False if fd is not None else True)
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.dist = True
        return self.rank

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)

    def close(self) -> None:
        listen = getattr(self, "_listen", None)
        if listen is not None:
            listen.close()
            self._listen = None
        if self.dist:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.dist = False


def _worker_cls() -> Any:
    global _WORKER_CLS
    if _WORKER_CLS is None:
        import ray

        _WORKER_CLS = ray.remote(_GangWorker)
    return _WORKER_CLS


class Gang:
    """A reserved group of workers (see module docstring). Use :func:`gang` to make one.

    Attributes:
        allocation: the :class:`~rayaccel.placement.GangAllocation` the placer expected (rank order).
        placement_group: the Ray placement group. workers: actor handles, rank order.
        backend: ``"nccl"`` or ``"gloo"``.
    """

    def __init__(self, workers: int, gpus_per_worker: int, strategy: str = "pack", interconnect: str = "any",
                 *, backend: str | None = None, timeout_s: float = 60.0, name: str = "gang", **fields: Any):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from ..placement import place_gang
        from .names import NODE_PIN, node_resource
        from .tasks import REQUEST_FIELDS
        from .view import claims, node_state, view

        unknown = sorted(set(fields) - set(REQUEST_FIELDS) - {"gpus"})
        if unknown or "gpus" in fields:
            bad = unknown[0] if unknown else "gpus"
            raise RequestError("not an option of rayaccel.gang()", bad,
                               "workers, gpus_per_worker, strategy, interconnect, backend, timeout_s, name, "
                               + ", ".join(f for f in REQUEST_FIELDS if f not in ("gpus", "interconnect")))
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise RequestError(f"expected a number of seconds > 0, got {timeout_s!r}", "timeout_s")
        if backend not in (None, "nccl", "gloo"):
            raise RequestError(f"unknown torch.distributed backend {backend!r}", "backend", "None (auto), nccl, gloo")
        nodes = view().nodes(fresh=True)
        if not nodes:
            raise Unsatisfiable("the cluster has no usable rayaccel nodes (start them with `rayaccel start` or "
                                "rayaccel.init())")
        c = claims()
        ga = place_gang([node_state(n, c) for n in nodes], workers, gpus_per_worker,
                        strategy=strategy, interconnect=interconnect, **fields)
        if not ga:
            idle = place_gang([node_state(n, idle=True) for n in nodes], workers, gpus_per_worker,
                              strategy=strategy, interconnect=interconnect, **fields)
            if not idle:
                raise Unsatisfiable(f"no placement can ever hold {workers} workers x {gpus_per_worker} devices "
                                    f"({strategy}): " + "; ".join(idle.reasons))
            ga = idle  # wait for these nodes: the placement group queues until their devices are free
        by_id = {n.node_id: n for n in nodes}
        self.allocation = ga
        self.name = name
        self.timeout_s = timeout_s
        self.nodes = [by_id[a.node] for a in ga.workers]
        self.bundles = [{"GPU": float(gpus_per_worker), node_resource(n.node_key): NODE_PIN} for n in self.nodes]
        one_node = len({n.node_id for n in self.nodes}) == 1
        self.placement_group = placement_group(self.bundles, strategy="STRICT_PACK" if one_node else "PACK",
                                               name=f"rayaccel-gang-{name}-{uuid.uuid4().hex[:8]}")
        self.workers = []
        try:
            ready, _ = ray.wait([self.placement_group.ready()], timeout=timeout_s)
            if not ready:
                raise ClusterError(f"gang {name!r}: the placement group was not granted within {timeout_s:.0f} s "
                                   f"(devices still held by other work)")
            for n, a in zip(self.nodes, ga.workers):
                c.add(n.node_id, tuple(a.devices), float(gpus_per_worker))
            self.backend = backend or ("gloo" if any(n.record.simulated for n in self.nodes) else "nccl")
            cls = _worker_cls()
            for i in range(len(self.bundles)):
                strategy_i = PlacementGroupSchedulingStrategy(self.placement_group, placement_group_bundle_index=i)
                self.workers.append(cls.options(num_cpus=0, num_gpus=gpus_per_worker, name=None,
                                                scheduling_strategy=strategy_i).remote(f"{name}[rank {i}]", i))
        except BaseException:
            # never leave the reservation (or half the workers) behind: nobody holds this Gang
            for w in self.workers:
                ray.kill(w)
            remove_placement_group(self.placement_group)
            raise
        self._dist_ready = False
        self._closed = False

    def devices(self) -> list[tuple[int, ...]]:
        """The devices each worker holds, rank order (as the nodes' arbiters chose them)."""
        import ray

        return ray.get([w.devices.remote() for w in self.workers], timeout=self.timeout_s)

    @property
    def world_size(self) -> int:
        """Number of workers."""
        return len(self.workers)

    def _init_dist(self) -> None:
        import importlib.util

        import ray

        if importlib.util.find_spec("torch") is None:
            raise ClusterError(f"gang {self.name!r}: run() initialises torch.distributed, but PyTorch is not "
                               "installed here; pip install 'rayaccel[torch]' (or any torch), or call a worker "
                               "directly through gang.workers[i].run.remote(fn, args, kwargs)")

        addr, port = ray.get(self.workers[0].rendezvous.remote(), timeout=self.timeout_s)
        ray.get([w.init_dist.remote(self.world_size, addr, port, self.backend, self.timeout_s)
                 for w in self.workers], timeout=self.timeout_s + 30)
        self._dist_ready = True

    def run(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Run ``fn(*args, **kwargs)`` on every worker with torch.distributed initialised; results in rank order.

        Raises:
            ClusterError: the gang was shut down, or PyTorch is not installed.
        """
        import ray

        if self._closed:
            raise ClusterError(f"gang {self.name!r} was shut down")
        if not self._dist_ready:
            self._init_dist()
        return ray.get([w.run.remote(fn, args, kwargs) for w in self.workers])

    def submit(self, fn: Callable, *args: Any, **kwargs: Any) -> list:
        """Like :meth:`run` but returns the ObjectRefs without waiting.

        Raises:
            ClusterError: the gang was shut down.
        """
        if self._closed:
            raise ClusterError(f"gang {self.name!r} was shut down")
        if not self._dist_ready:
            self._init_dist()
        return [w.run.remote(fn, args, kwargs) for w in self.workers]

    def shutdown(self) -> None:
        """Tear down torch.distributed, kill the workers and free the placement group (idempotent)."""
        import ray
        from ray.util.placement_group import remove_placement_group

        if self._closed:
            return
        self._closed = True
        if self._dist_ready:
            try:
                ray.get([w.close.remote() for w in self.workers], timeout=10)
            except (ray.exceptions.RayError, TimeoutError) as e:  # a dead worker: killing below still frees it
                log.warning("gang %s: closing torch.distributed failed: %s", self.name, e)
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.placement_group)

    def __enter__(self) -> "Gang":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()


def gang(workers: int, gpus_per_worker: int = 1, strategy: str = "pack", interconnect: str = "any",
         **kwargs: Any) -> Gang:
    """Reserve ``workers`` x ``gpus_per_worker`` devices at once (all or nothing); see :class:`Gang`.

    Raises:
        Unsatisfiable: no placement could ever hold the gang.
        ClusterError: the reservation was not granted within ``timeout_s``.
        RequestError: bad strategy or counts.
    """
    return Gang(workers, gpus_per_worker, strategy, interconnect, **kwargs)
