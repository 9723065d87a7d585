"""``RayaccelTransport``: a one-sided Ray Direct Transport whose path is chosen by each consumer.

Producer side (:meth:`RayaccelTransport.extract_tensor_transport_metadata`, when an actor
method returns tensors): CUDA tensors get CUDA IPC handles (no copy); small objects
(up to :data:`EAGER_BYTES`) are prepared at once: a CPU object is copied into a
shared-memory segment (:mod:`.shm`; one the producer's :class:`~.pool.Pool` refills when
a freed object's segment is no longer mapped), and in a cluster of several nodes
registered with NIXL. A producer that was asked for a segment once prepares every later
CPU object's segment at once too (a trainer syncing weights to rollouts on its node: no
request per step). Everything else is prepared only when a consumer asks for it --
the segment of a larger CPU object (first consumer on this node), NIXL registration
(a consumer on another node), GPU memory staged into host memory (a consumer on this
node without a GPU peer path): the consumer calls :func:`_serve` on the producer
(``__ray_call__`` in RDT's short-call group), which does it once per object and keeps it
until Ray frees the object (:meth:`RayaccelTransport.garbage_collect`).

Consumer side (:meth:`fetch_multiple_tensors` / :meth:`wait_fetch_complete`, in a consumer
actor's ``__ray_recv__`` or in ``ray.get``): decide the path with
:func:`rayaccel.transfer.tensor_path` from both ends' devices and this node's topology,
pull the tensors, count bytes and seconds (:mod:`.telemetry`).

Failure: a producer that died, a segment that is gone, a missing NIXL all end in one
:class:`~rayaccel.errors.TransportError` naming the object and why; every wait polls
Ray's abort and the caller's deadline, so nothing hangs.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Optional

from ..._proc import start_time
from ...errors import TransportError, TransportUnavailable
from ...transfer import TensorPath
from .. import _ray_private as rp, usagefile
from . import choose, local, pool, shm, telemetry
from .registrations import Registrations
from .gpu import from_ipc, ipc_handles, synchronize, to_device
from .name import NAME

# Ray's RDT interface (Ray >= 2.56; this module is imported only where the release carries it)
CommunicatorMetadata, FetchRequest, TensorTransportManager, TensorTransportMetadata = rp.rdt_interface()
log = logging.getLogger("rayaccel.ray.rdt")

#: How often a waiting consumer checks for an abort and for its producer's death, seconds.
POLL_S = 0.5


@dataclass
class Producer:
    """Who made an object: enough for a consumer to find, judge and reach it."""

    node_id: str
    pid: int
    start: int
    actor: Any  # an ActorHandle, or None for a driver
    actor_id: Optional[str]
    devices: tuple[int, ...]  # the producer process's physical devices
    nics: tuple[str, ...]  # the RDMA NICs nearest them
    gpudirect: Optional[bool]

    def label(self) -> str:
        who = f"actor {self.actor_id[:8]}" if self.actor_id else "a driver"
        return f"{who} (pid {self.pid}, node {self.node_id[:8]})"


@dataclass
class RayaccelCommunicatorMetadata(CommunicatorMetadata):
    """Nothing: a consumer finds its producer through the object's metadata."""


@dataclass
class RayaccelTransportMetadata(TensorTransportMetadata):
    """What the owner keeps and every consumer receives for one object."""

    producer: Optional[Producer] = None
    nbytes: int = 0
    packed: Optional[shm.Packed] = None  # CPU tensors: the shared-memory segment
    shm_error: Optional[str] = None  # why there is none
    ipc: Optional[list] = None  # CUDA tensors: one IPC handle each
    devices: tuple = ()  # CUDA tensors: the physical device of each (None: unknown)
    nixl: Any = None  # NIXL metadata made at once (a driver's ray.put: no actor to ask later)

    __eq__ = object.__eq__
    __hash__ = object.__hash__


#: Objects up to this size are prepared at once, with the producer's return: a CPU object's
#: segment, and in a cluster of several nodes its NIXL registration (either costs less than a
#: consumer's request for it would). Larger ones are prepared when a consumer first asks, so
#: an object only read from other nodes is never copied into host memory for nothing.
EAGER_BYTES = 16 << 20


@dataclass
class _Produced:
    """A producer's state for one object, until Ray frees it."""

    tensors: list
    lock: Any = field(default_factory=threading.Lock)  # one consumer's request at a time, per object
    packed: Optional[shm.Packed] = None
    contiguous: Optional[list] = None  # per tensor, the contiguous copy made of a strided one (or None)
    nixl: Any = None
    nixl_tensors: Optional[list] = None
    host: Optional[shm.Packed] = None  # CUDA tensors staged in a segment


@dataclass
class _Fetch(FetchRequest):
    meta: Any = None
    path: Optional[TensorPath] = None
    kind: str = ""  # what the consumer does: map | ipc | host | nixl | store
    pending: Any = None  # an ObjectRef of the producer's answer
    target: Optional[list] = None
    device: Any = None  # where the tensors must land (torch.device)
    t0: float = 0.0
    what: str = ""


def _serve(actor_self: Any, obj_id: str, kind: str) -> Any:
    """Runs in the producer (RDT's short-call group): prepare ``kind`` for one consumer."""
    return manager().serve(obj_id, kind)


def _ping(actor_self: Any) -> bool:
    return True


_MANAGER: "RayaccelTransport | None" = None


def manager(create: bool = True) -> "RayaccelTransport | None":
    """This process's transport manager (Ray's singleton when Ray made it)."""
    if _MANAGER is None and create:
        return rp.rdt_manager(NAME.upper())
    return _MANAGER


class RayaccelTransport(TensorTransportManager):
    """The ``rayaccel`` transport (one-sided; registered by :func:`rayaccel.ray.rdt.install`)."""

    def __init__(self) -> None:
        global _MANAGER
        self._lock = threading.RLock()
        self._produced: dict[str, _Produced] = {}
        self._aborted: set[str] = set()
        self.pool = pool.Pool()
        self.registrations = Registrations()  # NIXL registrations kept while a tensor's memory lives
        # a consumer on this node asked for a segment once: prepare every CPU object's at once from now
        self._local_readers = False
        #: objects held beyond the producer's device budget spill (:mod:`rayaccel.memory.held`); None: no budget
        self.held = _held_objects(self._swap)
        _MANAGER = self

    # ------------------------------------------------------------------ Ray's interface
    @property
    def tensor_transport_backend(self) -> str:
        return NAME.upper()

    @staticmethod
    def is_one_sided() -> bool:
        return True

    @staticmethod
    def can_abort_transport() -> bool:
        return True  # every wait polls the abort flag: Ray need not kill the actors

    def actor_has_tensor_transport(self, actor: Any) -> bool:
        return True  # every path but NIXL needs nothing; a missing NIXL is a clear error at fetch

    def get_communicator_metadata(self, src_actor: Any, dst_actor: Any, backend: Optional[str] = None) -> Any:
        return RayaccelCommunicatorMetadata()

    def send_multiple_tensors(self, tensors: list, tensor_transport_metadata: Any, communicator_metadata: Any) -> None:
        raise NotImplementedError("the rayaccel transport is one-sided: consumers pull")

    def abort_transport(self, obj_id: str, communicator_metadata: Any) -> None:
        with self._lock:
            self._aborted.add(obj_id)
        try:
            rp.nixl_manager().abort_transport(obj_id, rp.nixl_communicator())
        except Exception:  # noqa: BLE001 - NIXL absent or never used here: nothing of it to abort
            pass

    # ------------------------------------------------------------------ producer
    def extract_tensor_transport_metadata(self, obj_id: str, rdt_object: list) -> RayaccelTransportMetadata:
        tensors = list(rdt_object)
        pid = os.getpid()
        devs = local.devices()
        actor, actor_id = local.current_actor()
        me = Producer(local.node_id(), pid, start_time(pid) or 0, actor, actor_id, devs, local.near_nics(devs),
                      local.gpudirect())
        meta = RayaccelTransportMetadata(tensor_meta=[(t.shape, t.dtype) for t in tensors], producer=me)
        if not tensors:
            return meta
        kinds = {t.device.type for t in tensors}
        if len(kinds) > 1:
            raise ValueError(f"All tensors in an RDT object must have the same device type, got {sorted(kinds)}.")
        meta.tensor_device = kinds.pop()
        meta.nbytes = sum(t.numel() * t.element_size() for t in tensors)
        st = _Produced(tensors)
        if meta.tensor_device == "cpu":
            ok, why = shm.available()
            if not ok:
                meta.shm_error = why
            elif me.actor is None or meta.nbytes <= EAGER_BYTES or self._local_readers:
                meta.packed = self._segment(st)
                if isinstance(meta.packed, str):
                    meta.shm_error, meta.packed = meta.packed, None
        elif meta.tensor_device == "cuda":
            synchronize(tensors)
            # under a budget the handles are asked for (serve "ipc"): an object not mapped yet may spill meanwhile
            meta.ipc = ipc_handles(tensors) if self.held is None else None
            meta.devices = tuple(local.physical(t.device.index) for t in tensors)
        with self._lock:
            self._produced[obj_id] = st
        if self.held is not None:
            self.held.add(obj_id, st.tensors)
            self._note_held()
        small = meta.nbytes <= EAGER_BYTES
        if (me.actor is None or (small and local.other_nodes())) and local.nixl()[0]:
            # a driver's ray.put: no actor a remote consumer could ask later; a small object in a
            # cluster of several nodes: registering costs less than a consumer's request would
            try:
                meta.nixl = self.serve(obj_id, "nixl")
            except Exception as e:  # noqa: BLE001 - same-node consumers still work; remote ones get this reason
                log.warning("rayaccel transport: NIXL registration failed for %s: %s", obj_id, e)
        return meta

    def serve(self, obj_id: str, kind: str) -> Any:
        """Prepare ``kind`` of object ``obj_id`` for a consumer (idempotent per object).

        ``segment``: the CPU tensors' segment (made on the first request); ``nixl``: NIXL metadata
        of the tensors (strided ones: their contiguous copy); ``host``: the CUDA tensors copied
        once into a segment; ``tensors``: the tensors on CPU (Ray's object store carries them
        back). ``segment`` and ``host`` return the reason instead when no segment can be made.

        Raises:
            TransportError: Ray freed the object here already, or this process cannot do ``kind``.
        """
        with self._lock:
            st = self._produced.get(obj_id)
        if st is None:
            raise TransportError(f"object {obj_id} is no longer held by its producer (pid {os.getpid()}): "
                                 "freed, or the actor restarted", obj_id)
        with st.lock, self._reading(obj_id):
            if kind == "ipc":  # under a budget: the handles, and the object stays on the device from now on
                synchronize(st.tensors)
                self.held.keep(obj_id)
                return ipc_handles(st.tensors)
            if kind == "segment":
                self._local_readers = True
                return self._segment(st)
            if kind == "nixl":
                if st.nixl is None:
                    ok, why = local.nixl()
                    if not ok:
                        raise TransportUnavailable(f"the producer of {obj_id} (node {local.node_id()[:8]}) cannot "
                                                   f"serve a consumer on another node: {why}", obj_id)
                    local.prepare_ucx()
                    # the tensors themselves (a long-lived tensor keeps its NIXL registration cached);
                    # a strided one: the contiguous copy made for its segment, else one made now
                    made = st.contiguous or [None] * len(st.tensors)
                    ts = [t if t.is_contiguous() else (c if c is not None else t.contiguous())
                          for t, c in zip(st.tensors, made)]
                    mgr = rp.nixl_manager()
                    self.registrations.sweep(mgr)  # freed storages first: their addresses may be reused now
                    st.nixl = mgr.extract_tensor_transport_metadata(obj_id, ts)
                    st.nixl_tensors = ts
                    # the tensors' own storages stay registered past this object (a trainer's weights: once)
                    self.registrations.hold(mgr, [t for t in st.tensors if t.is_contiguous()])
                    if self.held is not None:
                        self.held.keep(obj_id)  # registered memory is read remotely without asking: it stays
                return st.nixl
            if kind == "host":
                if st.host is None:
                    try:
                        st.host, _ = self.pool.write(st.tensors)
                    except OSError as e:
                        return _no_segment(st, e)
                return st.host
            if kind == "tensors":
                return [t.detach().cpu() for t in st.tensors]
        raise ValueError(f"unknown request {kind!r}")

    def _segment(self, st: _Produced) -> "shm.Packed | str":
        """The object's CPU segment (filled now if it is not yet), or why there can be none."""
        if st.packed is None:
            try:
                # refilled in the background: the copy overlaps with Ray handing the metadata to consumers
                st.packed, st.contiguous = self.pool.write(st.tensors, background=True)
            except OSError as e:
                return _no_segment(st, e)
        return st.packed

    def garbage_collect(self, obj_id: str, tensor_transport_meta: Any, tensors: list) -> None:
        with self._lock:
            st = self._produced.pop(obj_id, None)
            self._aborted.discard(obj_id)
        if st is None:
            return
        with st.lock:  # a request being served finishes first
            self._free(obj_id, st)
        if self.held is not None:
            self.held.drop(obj_id)
            self._note_held()

    @contextmanager
    def _reading(self, obj_id: str) -> Any:
        """A consumer's request is being served: a spilled object is back on the device, and stays, meanwhile."""
        if self.held is None:
            yield
            return
        try:
            with self.held.reading(obj_id):  # restoring swaps the tensors back in (_swap)
                yield
        finally:
            self._note_held()

    def _note_held(self) -> None:
        """Tell the node's agent what this producer's objects have spilled now (per-holder spilled bytes)."""
        usagefile.note_spilled(int(self.held.stats()["spilled_bytes"]))

    def _swap(self, obj_id: str, tensors: list) -> None:
        """An object moved (spilled, or restored): its holders here and Ray's RDT store reference ``tensors`` now."""
        with self._lock:
            st = self._produced.get(obj_id)
        if st is not None:
            st.tensors = list(tensors)
        rp.rdt_swap(obj_id, tensors)

    def _free(self, obj_id: str, st: _Produced) -> None:
        try:
            if st.nixl is not None:
                mgr = rp.nixl_manager()
                mgr.garbage_collect(obj_id, st.nixl, st.nixl_tensors)
                self.registrations.sweep(mgr)
        finally:
            for packed in (st.packed, st.host):
                if packed is not None:
                    self.pool.release(packed)  # kept for a later object of its size

    def live_objects(self) -> int:
        """Objects produced here and not freed by Ray yet."""
        with self._lock:
            return len(self._produced)

    # ------------------------------------------------------------------ consumer
    def recv_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any,
                              target_buffers: Optional[list] = None) -> list:
        req = self.fetch_multiple_tensors(obj_id, tensor_transport_metadata, communicator_metadata, target_buffers)
        return self.wait_fetch_complete(req)

    def fetch_multiple_tensors(self, obj_id: str, tensor_transport_metadata: Any, communicator_metadata: Any,
                               target_buffers: Optional[list] = None) -> _Fetch:
        meta = tensor_transport_metadata
        if not isinstance(meta, RayaccelTransportMetadata):
            raise TransportError(f"object {obj_id} was not made by the rayaccel transport", obj_id)
        what = f"object {obj_id[:16]}"
        req = _Fetch(obj_id=obj_id, tensors=[], meta=meta, target=target_buffers, t0=time.perf_counter(), what=what)
        if not meta.tensor_meta:
            return req
        self._check_abort(obj_id)
        req.device = choose.destination(meta, target_buffers, what)
        req.path, req.kind = choose.decide(meta, req.device, what)
        if req.kind in ("segment", "host", "nixl", "store") and not (req.kind == "nixl" and meta.nixl is not None) \
                or (req.kind == "ipc" and meta.ipc is None):
            if meta.producer.actor is None:
                raise TransportError(f"{what} was put by {meta.producer.label()}, which cannot be asked for it: "
                                     f"{req.path.reason}", obj_id)
            req.pending = rp.call_on_actor(meta.producer.actor, _serve, obj_id,
                                           {"store": "tensors"}.get(req.kind, req.kind))
        return req

    def wait_fetch_complete(self, fetch_request: FetchRequest, timeout: float = -1) -> list:
        req = fetch_request
        assert isinstance(req, _Fetch)
        if not req.meta.tensor_meta:
            return []
        deadline = None if timeout is None or timeout < 0 else time.monotonic() + timeout
        meta, what = req.meta, req.what
        if req.kind == "ipc":
            handles = meta.ipc if meta.ipc is not None else self._answer(req, deadline)
            try:
                out = from_ipc(handles, meta.devices, req.device, req.target)
            except RuntimeError as e:  # the handle cannot be opened here: stage through host memory instead
                req.path = TensorPath("shared-memory", f"CUDA IPC failed ({e}); staged through host memory",
                                      req.path.bandwidth_gbps, req.path.seconds, req.path.nbytes, 2, "host-staged")
                req.kind = "host"
                req.pending = rp.call_on_actor(meta.producer.actor, _serve, req.obj_id, "host")
                return self.wait_fetch_complete(req, -1 if deadline is None else max(0.0, deadline - time.monotonic()))
        elif req.kind == "map":
            if not shm.alive(meta.packed):
                # the tensors lived in the producer (RDT's semantics), whatever its segment still holds
                shm.unlink(meta.packed)
                raise TransportError(f"{what}: its producer {meta.producer.label()} died before it was read", what)
            out = shm.read(meta.packed, meta.tensor_meta, what, _left(deadline))
            out = _deliver(out, req.target, None)
        elif req.kind in ("segment", "host"):
            packed = self._answer(req, deadline)
            if isinstance(packed, str):  # the producer could make no segment: the object store is what is left
                req.path = TensorPath("object-store", packed, None, 0.0, meta.nbytes, 2, "host-staged")
                req.kind = "store"
                req.pending = rp.call_on_actor(meta.producer.actor, _serve, req.obj_id, "tensors")
                return self.wait_fetch_complete(req, -1 if deadline is None else max(0.0, deadline - time.monotonic()))
            out = _deliver(shm.read(packed, meta.tensor_meta, what, _left(deadline)), req.target, req.device)
        elif req.kind == "store":
            telemetry.warn_once(what, req.path.reason)
            out = _deliver(self._answer(req, deadline), req.target, req.device)
        else:
            out = self._nixl(req, deadline)
        telemetry.record(local.node_id(), req.path, time.perf_counter() - req.t0, meta.nbytes)
        return out

    # ------------------------------------------------------------------ consumer helpers
    def _check_abort(self, obj_id: str) -> None:
        with self._lock:
            if obj_id in self._aborted:
                self._aborted.discard(obj_id)
                raise TransportError(f"object {obj_id[:16]}: the transfer was aborted by Ray (a timeout or a failed "
                                     "peer)", obj_id)

    def _answer(self, req: _Fetch, deadline: float | None) -> Any:
        """The producer's answer to ``req.pending``, polling for aborts and the deadline."""
        import ray

        while True:
            self._check_abort(req.obj_id)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{req.what}: no answer from its producer {req.meta.producer.label()} in time")
            ready, _ = ray.wait([req.pending], timeout=POLL_S if left is None else min(POLL_S, left))
            if ready:
                break
        try:
            return ray.get(req.pending)
        except Exception as e:  # noqa: BLE001 - any failure of the producer ends in one clear error
            cause = getattr(e, "cause", None) or e
            if isinstance(cause, TransportError):
                raise cause from None
            if isinstance(e, ray.exceptions.RayActorError):
                raise TransportError(f"{req.what}: its producer {req.meta.producer.label()} died before it could "
                                     f"serve it ({req.path.path})", req.what) from None
            raise TransportError(f"{req.what}: its producer {req.meta.producer.label()} could not serve it "
                                 f"({req.path.path}): {type(cause).__name__}: {_first_line(cause)}", req.what) from None

    def _nixl(self, req: _Fetch, deadline: float | None) -> list:
        meta = req.meta
        nixl_meta = meta.nixl if meta.nixl is not None else self._answer(req, deadline)
        local.prepare_ucx()
        mgr = rp.nixl_manager()
        try:
            fetch = mgr.fetch_multiple_tensors(req.obj_id, nixl_meta, rp.nixl_communicator(), req.target)
        except Exception as e:  # noqa: BLE001 - Ray's NIXL error says the producer may have died: say who
            raise self._nixl_failed(req, e) from None
        ping = None
        while True:
            self._check_abort(req.obj_id)
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"{req.what}: the NIXL read from {meta.producer.label()} did not finish in time")
            try:
                return mgr.wait_fetch_complete(fetch, timeout=POLL_S if left is None else min(POLL_S, left))
            except TimeoutError:
                pass
            except Exception as e:  # noqa: BLE001 - as above
                raise self._nixl_failed(req, e) from None
            ping = self._producer_alive(req, ping)

    def _nixl_failed(self, req: _Fetch, e: BaseException) -> TransportError:
        """One error for a failed NIXL read, saying whether the producer died (asked, a few seconds at most)."""
        import ray

        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        why = f"{type(e).__name__}: {lines[-1] if lines else ''}"
        p = req.meta.producer
        if p.actor is not None:
            try:
                ray.get(rp.call_on_actor(p.actor, _ping), timeout=5)
            except ray.exceptions.RayActorError:
                return TransportError(f"{req.what}: its producer {p.label()} died during the NIXL read ({why})",
                                      req.what)
            except Exception:  # noqa: BLE001 - unknown: report the read's own error
                pass
        return TransportError(f"{req.what}: the NIXL read from its producer {p.label()} failed ({why})", req.what)

    def _producer_alive(self, req: _Fetch, ping: Any) -> Any:
        """One liveness probe of the producer at a time; raises when it died mid-read."""
        import ray

        actor = req.meta.producer.actor
        if actor is None:
            return None
        if ping is None:
            return rp.call_on_actor(actor, _ping)
        ready, _ = ray.wait([ping], timeout=0)
        if not ready:
            return ping
        try:
            ray.get(ping)
        except Exception as e:  # noqa: BLE001 - dead or unreachable: the read cannot finish
            self.abort_transport(req.obj_id, None)
            with self._lock:
                self._aborted.discard(req.obj_id)
            raise TransportError(f"{req.what}: its producer {req.meta.producer.label()} died during the NIXL read "
                                 f"({type(e).__name__})", req.what) from None
        return None


def _held_objects(swap: Any) -> Any:
    """The producer's held objects under its device budget (:data:`~rayaccel.contract.RDT_DEVICE_BYTES_ENV`, else
    the worker's ``gpu_memory`` share), or None when it has none (objects stay until freed, as in Ray).

    Raises:
        TransportError: a budget variable that is not a size (naming it).
    """
    from ...contract import GPU_MEMORY_ENV, RDT_DEVICE_BYTES_ENV
    from ...errors import RequestError

    name = RDT_DEVICE_BYTES_ENV if os.environ.get(RDT_DEVICE_BYTES_ENV) else GPU_MEMORY_ENV
    value = os.environ.get(name)
    if not value:
        return None
    from ...memory.held import HeldObjects

    try:
        return HeldObjects(value, os.environ.get("RAYACCEL_HOST_MEMORY_BYTES") or 4 << 30, swap=swap,
                           spill_dir=os.environ.get("RAYACCEL_SPILL_DIR") or None,
                           disk_bytes=os.environ.get("RAYACCEL_DISK_BYTES") or None)
    except RequestError as e:
        raise TransportError(f"{name}={value!r} (or RAYACCEL_HOST_MEMORY_BYTES / RAYACCEL_DISK_BYTES) is not a "
                             f"size: {e}; give bytes or a size such as '8GiB'", name) from None


def _no_segment(st: _Produced, e: OSError) -> str:
    n = sum(t.numel() * t.element_size() for t in st.tensors)
    return f"no shared-memory segment of {n} bytes could be made in {shm.SHM_DIR}: {e.strerror or e}"


def _deliver(tensors: list, target: Optional[list], device: Any) -> list:
    """Into the target buffers when given (one copy), else onto ``device`` when it differs."""
    if target:
        for t, src in zip(target, tensors):
            t.copy_(src)
        return target
    if device is not None and device.type == "cuda":
        return [to_device(t, device) for t in tensors]
    return tensors


def _left(deadline: float | None) -> float:
    """Seconds to the caller's deadline (a producer's fill may still be running), or the default wait."""
    return shm.FILL_WAIT_S if deadline is None else max(0.0, deadline - time.monotonic())


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return text[-1] if text else ""
