"""A gang member's actor: devices, the rendezvous socket, torch.distributed set-up and clean teardown.

Its own module because every gang worker imports it: it loads only what a member needs
(not the placer or the cluster view, which :mod:`.gangs` uses on the driver).
"""

from __future__ import annotations

import datetime
import os
import socket
from typing import Any, Callable

from rayaccel.ray.worker.devices import get_devices


class GangWorker:
    """One gang member (an actor: :func:`rayaccel.ray.driver.gangs._worker_cls`)."""

    def __init__(self, name: str, rank: int):
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
        self._store_addr = tuple(s.getsockname()[:2])
        return addr, s.getsockname()[1]

    def devices(self) -> tuple:
        return self.assignment.indices

    def store_address(self) -> tuple | None:
        """(host, port) rank 0's rendezvous store listens on (None on other ranks)."""
        return getattr(self, "_store_addr", None)

    def init_dist(self, world: int, addr: str, port: int, backend: str, timeout_s: float) -> int:
        import torch.distributed as dist  # torch is optional: only gangs that use torch.distributed need it

        os.environ.update(MASTER_ADDR=addr, MASTER_PORT=str(port), RANK=str(self.rank),
                          WORLD_SIZE=str(world), LOCAL_RANK="0")
        # rank 0's store serves on the socket rendezvous() bound to this node's IP, not on every interface
        fd = None
        if self.rank == 0:
            fd = self._listen.fileno()
        store = dist.TCPStore(addr, port, world, self.rank == 0, timeout=datetime.timedelta(seconds=timeout_s),
                              master_listen_fd=fd, use_libuv=False if fd is not None else True)
        if fd is not None:  # the store owns the socket now and closes it when it is destroyed
            self._listen.detach()
            self._listen = None
        dist.init_process_group(backend, store=store, rank=self.rank, world_size=world,
                                timeout=datetime.timedelta(seconds=timeout_s))
        self.dist = True
        return self.rank

    def run(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        return fn(*args, **kwargs)

    def barrier(self) -> None:
        """Wait until every rank got here (nothing of the gang's collectives is in flight after it)."""
        if self.dist:
            import torch.distributed as dist

            dist.barrier()

    def close(self) -> None:
        """Destroy the process group (rank 0 last: its store serves the others until they are gone)."""
        if self.dist:
            import torch.distributed as dist

            dist.destroy_process_group()
            self.dist = False
        listen = getattr(self, "_listen", None)
        if listen is not None:  # a rendezvous socket no store took over
            listen.close()
            self._listen = None
