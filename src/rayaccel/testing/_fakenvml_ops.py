"""The operations half of :class:`~rayaccel.testing.fakenvml.FakeNVML`: health, events, doctor facts.

Kept apart from the topology model in :mod:`.fakenvml` (one concept per module). Each
injected condition flows through the same NVML calls a real GPU would answer, so the
real :class:`~rayaccel.health.nvml.NvmlHealthProbe` and the doctor's checks run
against it unchanged:

=============================================  =====================================================
injection (device = topology device index)     what NVML then answers
=============================================  =====================================================
``inject_xid(d, xid, gi=None, ci=None)``       one ``nvmlEventTypeXidCriticalError`` event, eventData = xid
``inject_ecc(d, count=1)``                     volatile + aggregate uncorrectable ECC counts grow by
                                               ``count`` (``nvmlDeviceGetTotalEccErrors``) and one
                                               ``nvmlEventTypeDoubleBitEccError`` event is queued
``inject_remap(d, pending=True, failure=False)``  ``nvmlDeviceGetRemappedRows`` -> (corr, unc, pending, failure)
``inject_retired_pending(d, pending=True)``    ``nvmlDeviceGetRetiredPagesPendingStatus`` -> ENABLED
``inject_throttle(d, thermal=True, power=False)``  ``nvmlDeviceGetCurrentClocksEventReasons`` bits
                                               (SwThermalSlowdown / SwPowerCap; both False clears)
``inject_nvlink_down(d, link=0, down=True)``   ``nvmlDeviceGetNvLinkState(h, link)`` -> DISABLED
``lose(d)``                                    every later call about ``d`` raises NVML_ERROR_GPU_IS_LOST;
                                               the next ``nvmlEventSetWait`` on a set it is registered
                                               in raises it once
=============================================  =====================================================

Doctor facts: ``driver_version`` / ``cuda_driver_version`` / ``nvml_version`` (constructor
arguments or attributes), :meth:`set_persistence`, :meth:`set_mig_pending`,
:meth:`set_fabric` (overrides the NVLink fabric the topology's devices carry) and :meth:`set_p2p`.

Thread-safe: injections may come from one thread while another waits in
``nvmlEventSetWait_v2`` (one condition variable guards the event queues and the state).
"""

from __future__ import annotations

import ctypes
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rayaccel.testing._fakenvml_handles import _deref, _Handle
from rayaccel.discovery._nvml_api import (
    NVMLError, NVML_ERROR_ARGUMENT_VERSION_MISMATCH, NVML_ERROR_GPU_IS_LOST, NVML_ERROR_INVALID_ARGUMENT,
    NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_TIMEOUT, NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED,
    NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE, NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE,
    NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED, NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_UUID_LEN, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_P2P_CAPS_INDEX_NVLINK,
    NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED, NVML_P2P_STATUS_NOT_SUPPORTED, NVML_P2P_STATUS_OK, NVML_VOLATILE_ECC,
    nvmlClocksEventReasonSwPowerCap, nvmlClocksEventReasonSwThermalSlowdown, nvmlEventTypeClock,
    nvmlEventTypeDoubleBitEccError, nvmlEventTypePState, nvmlEventTypeSingleBitEccError,
    nvmlEventTypeXidCriticalError, nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3,
)
from rayaccel.topology import FABRIC_STATES
from rayaccel.discovery.nvidia import _bus_key

_ZERO_UUID = "00000000-0000-0000-0000-000000000000"

#: Event types every fake device supports (``nvmlDeviceGetSupportedEventTypes``), as on a
#: data-center GPU of the Volta-Hopper generations.
SUPPORTED_EVENT_TYPES = (nvmlEventTypeSingleBitEccError | nvmlEventTypeDoubleBitEccError | nvmlEventTypePState
                         | nvmlEventTypeXidCriticalError | nvmlEventTypeClock)
#: ``gpuInstanceId`` / ``computeInstanceId`` of an event about the whole device (NVML's 0xFFFFFFFF).
WHOLE_DEVICE = 0xFFFFFFFF
#: NVIDIA driver branch -> the CUDA version it supports (``nvmlSystemGetCudaDriverVersion_v2``), from the
#: CUDA Toolkit release notes, "CUDA Toolkit and Corresponding Driver Versions".
DRIVER_CUDA = {418: 10010, 440: 10020, 450: 11000, 460: 11020, 470: 11040, 510: 11060, 515: 11070, 520: 11080,
               525: 12000, 530: 12010, 535: 12020, 545: 12030, 550: 12040, 555: 12050, 560: 12060, 565: 12070,
               570: 12080, 575: 12090, 580: 13000}


@dataclass(frozen=True, slots=True)
class FakeEventData:
    """What the fake's ``nvmlEventSetWait_v2`` returns: the fields of pynvml's ``c_nvmlEventData_t``
    (``device`` is a fake device handle, as a real one is an NVML handle)."""

    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = WHOLE_DEVICE
    computeInstanceId: int = WHOLE_DEVICE


@dataclass
class _EventSet:
    registered: dict[int, int] = field(default_factory=dict)  # device position -> event mask
    queue: deque = field(default_factory=deque)
    lost: deque = field(default_factory=deque)  # device positions whose loss is still to be raised
    freed: bool = False


@dataclass
class _DeviceOps:
    ecc_volatile: int = 0
    ecc_aggregate: int = 0
    remap: tuple[bool, bool] | None = None  # (pending, failure); None: from Device.health
    retired_pending: bool | None = None  # None: from Device.health
    throttle: int = 0
    nvlink_down: set[int] = field(default_factory=set)
    persistence: bool = True
    mig_pending: bool | None = None  # None: same as the current mode
    fabric: tuple | None = None  # (state, status, degraded bw, cluster UUID, clique); None: the topology's
    lost: bool = False


class FakeNVMLOps:
    """Mixin of :class:`FakeNVML`: injections, the NVML event API and the facts ``rayaccel doctor`` reads."""

    # set by FakeNVML.__init__
    topology: Any
    _devices: list
    _pos: dict[int, int]

    def _init_ops(self, driver_version: str | None, cuda_driver_version: int | None, nvml_version: str | None) -> None:
        self._cond = threading.Condition()
        self._ops = [_DeviceOps() for _ in self._devices]
        self._sets: list[_EventSet] = []
        self._p2p: dict[tuple[int, int, int | None], int] = {}
        #: struct versions ``nvmlDeviceGetGpuFabricInfoV`` accepts (drop v3 to model a driver that predates it)
        self.fabric_struct_versions = {nvmlGpuFabricInfo_v2, nvmlGpuFabricInfo_v3}
        self.driver_version = driver_version if driver_version is not None else self.topology.driver
        if cuda_driver_version is None and self.driver_version:
            branch = self.driver_version.split(".")[0]
            cuda_driver_version = DRIVER_CUDA.get(int(branch)) if branch.isdigit() else None
        self.cuda_driver_version = cuda_driver_version
        if nvml_version is None and self.driver_version and cuda_driver_version:
            nvml_version = f"{cuda_driver_version // 1000}.{self.driver_version}"
        self.nvml_version = nvml_version

    # ------------------------------------------------------------ helpers
    def _position(self, device: int) -> int:
        try:
            return self._pos[device]
        except (KeyError, TypeError):
            raise ValueError(f"no device {device!r} in this FakeNVML (devices: {sorted(self._pos)})") from None

    def _queue(self, pos: int, event_type: int, data: int, gi: int = WHOLE_DEVICE, ci: int = WHOLE_DEVICE) -> None:
        ev = FakeEventData(_Handle(pos), event_type, data, gi, ci)
        with self._cond:
            for s in self._sets:
                if not s.freed and s.registered.get(pos, 0) & event_type:
                    s.queue.append(ev)
            self._cond.notify_all()

    # ------------------------------------------------------------ injection
    def inject_xid(self, device: int, xid: int, gi: int | None = None, ci: int | None = None) -> None:
        """Queue an Xid critical-error event (``eventData`` = ``xid``) for ``device``.

        Args:
            gi / ci: the MIG GPU / compute instance the Xid is about; None = the whole device.

        Raises:
            ValueError: unknown device, or an Xid that is not a positive integer.
        """
        if not isinstance(xid, int) or isinstance(xid, bool) or xid <= 0:
            raise ValueError(f"xid must be a positive integer, not {xid!r}")
        self._queue(self._position(device), nvmlEventTypeXidCriticalError, xid,
                    WHOLE_DEVICE if gi is None else gi, WHOLE_DEVICE if ci is None else ci)

    def inject_ecc(self, device: int, count: int = 1) -> None:
        """Add ``count`` uncorrectable (double-bit) ECC errors to ``device`` and queue a DBE event.

        Raises:
            ValueError: unknown device or ``count`` < 1.
        """
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count must be an integer >= 1, not {count!r}")
        pos = self._position(device)
        with self._cond:
            self._ops[pos].ecc_volatile += count
            self._ops[pos].ecc_aggregate += count
        self._queue(pos, nvmlEventTypeDoubleBitEccError, 0)

    def inject_remap(self, device: int, pending: bool = True, failure: bool = False) -> None:
        """Set ``device``'s row-remapper state: a remap pending (applied at the next reset) and/or a failed remap."""
        pos = self._position(device)
        with self._cond:
            self._ops[pos].remap = (bool(pending), bool(failure))

    def inject_retired_pending(self, device: int, pending: bool = True) -> None:
        """Set whether ``device`` has retired pages waiting for a reboot/reset."""
        pos = self._position(device)
        with self._cond:
            self._ops[pos].retired_pending = bool(pending)

    def inject_throttle(self, device: int, thermal: bool = True, power: bool = False) -> None:
        """Set ``device``'s clock event reasons: thermal slowdown and/or power cap (both False: none)."""
        pos = self._position(device)
        bits = (nvmlClocksEventReasonSwThermalSlowdown if thermal else 0) | (nvmlClocksEventReasonSwPowerCap if power else 0)
        with self._cond:
            self._ops[pos].throttle = bits

    def inject_nvlink_down(self, device: int, link: int = 0, down: bool = True) -> None:
        """Take NVLink ``link`` of ``device`` down (or, with ``down=False``, up again)."""
        pos = self._position(device)
        if not isinstance(link, int) or not 0 <= link < max(1, len(self._devices[pos].nvlinks)):
            raise ValueError(f"device {device} has no NVLink {link!r} (links: {len(self._devices[pos].nvlinks)})")
        with self._cond:
            (self._ops[pos].nvlink_down.add if down else self._ops[pos].nvlink_down.discard)(link)

    def lose(self, device: int) -> None:
        """Make ``device`` fall off the bus: every later call about it raises NVML_ERROR_GPU_IS_LOST."""
        pos = self._position(device)
        with self._cond:
            self._ops[pos].lost = True
            for s in self._sets:
                if not s.freed and pos in s.registered:
                    s.lost.append(pos)
            self._cond.notify_all()
        self.fail("*", NVML_ERROR_GPU_IS_LOST, device)  # type: ignore[attr-defined]

    # ------------------------------------------------------------ doctor facts
    def set_persistence(self, device: int, enabled: bool) -> None:
        """What ``nvmlDeviceGetPersistenceMode`` answers for ``device`` (default: enabled)."""
        self._ops[self._position(device)].persistence = bool(enabled)

    def set_mig_pending(self, device: int, enabled: bool) -> None:
        """Set the MIG mode ``device`` will have after its next reset (``nvmlDeviceGetMigMode``'s second value)."""
        self._ops[self._position(device)].mig_pending = bool(enabled)

    def set_fabric(self, device: int, state: int, status: int = 0, degraded_bw: bool = False, *,
                   cluster_uuid: str | None = None, clique_id: int | None = None) -> None:
        """What ``nvmlDeviceGetGpuFabricInfo[V]`` answers for ``device`` from now on (state:
        NVML_GPU_FABRIC_STATE_*; status: an NVML return code, 0 = success), in place of the
        topology's fabric. Makes the call supported on any device. The cluster UUID and clique id
        default to the topology's (all zeros / 0 where it has none).

        Raises:
            ValueError: unknown device, or a cluster UUID that is not a UUID.
        """
        if cluster_uuid is not None:
            cluster_uuid = str(uuid.UUID(cluster_uuid))
        self._ops[self._position(device)].fabric = (int(state), int(status), bool(degraded_bw), cluster_uuid,
                                                    None if clique_id is None else int(clique_id))

    def set_p2p(self, a: int, b: int, status: int, index: int | None = None) -> None:
        """What ``nvmlDeviceGetP2PStatus(a, b, index)`` answers, both ways (index None: every capability)."""
        pa, pb = self._position(a), self._position(b)
        self._p2p[(pa, pb, index)] = self._p2p[(pb, pa, index)] = int(status)

    # ------------------------------------------------------------ NVML: system
    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")  # type: ignore[attr-defined]
        return self._known(self.driver_version)  # type: ignore[attr-defined]

    def nvmlSystemGetCudaDriverVersion_v2(self) -> int:
        self._enter("nvmlSystemGetCudaDriverVersion_v2")  # type: ignore[attr-defined]
        return self._known(self.cuda_driver_version)  # type: ignore[attr-defined]

    nvmlSystemGetCudaDriverVersion = nvmlSystemGetCudaDriverVersion_v2

    def nvmlSystemGetNVMLVersion(self) -> str:
        self._enter("nvmlSystemGetNVMLVersion")  # type: ignore[attr-defined]
        return self._known(self.nvml_version)  # type: ignore[attr-defined]

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByUUID")  # type: ignore[attr-defined]
        key = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
        for pos, fd in enumerate(self._devices):
            if fd.device.uuid == key:
                self._enter("nvmlDeviceGetHandleByUUID", _Handle(pos))  # type: ignore[attr-defined]
                return _Handle(pos)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    def nvmlDeviceGetHandleByPciBusId(self, pciBusId: str | bytes) -> Any:
        self._enter("nvmlDeviceGetHandleByPciBusId")  # type: ignore[attr-defined]
        key = _bus_key(pciBusId.decode() if isinstance(pciBusId, bytes) else str(pciBusId))
        for pos, fd in enumerate(self._devices):
            if _bus_key(fd.bus_id) == key:
                self._enter("nvmlDeviceGetHandleByPciBusId", _Handle(pos))  # type: ignore[attr-defined]
                return _Handle(pos)
        raise NVMLError(NVML_ERROR_NOT_FOUND)

    # ------------------------------------------------------------ NVML: events
    def nvmlEventSetCreate(self) -> _EventSet:
        self._enter("nvmlEventSetCreate")  # type: ignore[attr-defined]
        s = _EventSet()
        with self._cond:
            self._sets.append(s)
        return s

    def nvmlDeviceGetSupportedEventTypes(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetSupportedEventTypes", handle)  # type: ignore[attr-defined]
        return SUPPORTED_EVENT_TYPES

    def nvmlDeviceRegisterEvents(self, handle: Any, eventTypes: int, eventSet: _EventSet) -> None:
        self._enter("nvmlDeviceRegisterEvents", handle)  # type: ignore[attr-defined]
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if int(eventTypes) & ~SUPPORTED_EVENT_TYPES:  # NVML refuses the whole mask when one type is unsupported
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        with self._cond:
            eventSet.registered[handle.index] = eventSet.registered.get(handle.index, 0) | int(eventTypes)

    def nvmlEventSetWait_v2(self, eventSet: _EventSet, timeoutms: int) -> FakeEventData:
        """The next event of ``eventSet``, waiting up to ``timeoutms`` ms.

        Raises:
            NVMLError: NVML_ERROR_TIMEOUT when nothing arrived in time; NVML_ERROR_GPU_IS_LOST once
                for each registered device that was lost; NVML_ERROR_INVALID_ARGUMENT for a freed set.
        """
        self._enter("nvmlEventSetWait_v2")  # type: ignore[attr-defined]
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        deadline = time.monotonic() + max(0, int(timeoutms)) / 1000.0
        with self._cond:
            while not eventSet.queue and not eventSet.lost and not eventSet.freed:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
            if eventSet.freed:
                raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
            if eventSet.lost:
                eventSet.lost.popleft()
                raise NVMLError(NVML_ERROR_GPU_IS_LOST)
            if not eventSet.queue:
                raise NVMLError(NVML_ERROR_TIMEOUT)
            return eventSet.queue.popleft()

    nvmlEventSetWait = nvmlEventSetWait_v2

    def nvmlEventSetFree(self, eventSet: _EventSet) -> None:
        self._enter("nvmlEventSetFree")  # type: ignore[attr-defined]
        if not isinstance(eventSet, _EventSet) or eventSet.freed:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        with self._cond:
            eventSet.freed = True
            self._sets.remove(eventSet)
            self._cond.notify_all()

    # ------------------------------------------------------------ NVML: health counters
    def nvmlDeviceGetTotalEccErrors(self, handle: Any, errorType: int, counterType: int) -> int:
        self._enter("nvmlDeviceGetTotalEccErrors", handle)  # type: ignore[attr-defined]
        if errorType != NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return 0
        ops = self._ops[handle.index]
        return ops.ecc_volatile if counterType == NVML_VOLATILE_ECC else ops.ecc_aggregate

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        fd = self._enter("nvmlDeviceGetRemappedRows", handle)  # type: ignore[attr-defined]
        ops = self._ops[handle.index]
        if ops.remap is None:
            if fd.device.health == "unknown":
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return (0, 0, 0, 1 if fd.device.health == "failed" else 0)
        pending, failure = ops.remap
        return (0, 1 if pending or failure else 0, int(pending), int(failure))

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        fd = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)  # type: ignore[attr-defined]
        pending = self._ops[handle.index].retired_pending
        if pending is None:
            if fd.device.health == "unknown":
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            pending = fd.device.health == "degraded"
        return NVML_FEATURE_ENABLED if pending else NVML_FEATURE_DISABLED

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle)  # type: ignore[attr-defined]
        return self._ops[handle.index].throttle

    nvmlDeviceGetCurrentClocksThrottleReasons = nvmlDeviceGetCurrentClocksEventReasons

    # ------------------------------------------------------------ NVML: doctor
    def nvmlDeviceGetPersistenceMode(self, handle: Any) -> int:
        self._enter("nvmlDeviceGetPersistenceMode", handle)  # type: ignore[attr-defined]
        return NVML_FEATURE_ENABLED if self._ops[handle.index].persistence else NVML_FEATURE_DISABLED

    def nvmlDeviceGetMigMode(self, device: Any) -> list[int]:
        fd = self._enter("nvmlDeviceGetMigMode", device)  # type: ignore[attr-defined]
        mode = int(self._known(fd.device.mig_mode))  # type: ignore[attr-defined]
        pending = self._ops[device.index].mig_pending
        return [mode, mode if pending is None else int(pending)]

    def _fabric(self, function: str, device: Any, info_ref: Any) -> int:
        """Fill an ``nvmlGpuFabricInfo*`` struct from the device's :class:`~rayaccel.topology.Fabric`
        (or :meth:`set_fabric`'s override); NOT_SUPPORTED where the device has none. The versioned call
        accepts the struct versions in :attr:`fabric_struct_versions` and answers
        ARGUMENT_VERSION_MISMATCH for others, as a driver that predates that version does."""
        fd = self._enter(function, device)  # type: ignore[attr-defined]
        info = _deref(info_ref)
        if function.endswith("V") and getattr(info, "version", None) not in self.fabric_struct_versions:
            raise NVMLError(NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        state, status, uuid_text, clique, mask = self._fabric_answer(fd.device, self._ops[device.index].fabric)
        info.state, info.status, info.cliqueId = state, status, clique
        info.clusterUuid = (ctypes.c_uint8 * NVML_GPU_FABRIC_UUID_LEN)(*uuid.UUID(uuid_text).bytes)
        if hasattr(info, "healthMask"):
            info.healthMask = mask
        if hasattr(info, "healthSummary"):
            info.healthSummary = NVML_GPU_FABRIC_HEALTH_SUMMARY_NOT_SUPPORTED
        return 0

    @staticmethod
    def _fabric_answer(dev: Any, override: tuple | None) -> tuple[int, int, str, int, int]:
        """(state, status, cluster UUID, clique id, health mask) NVML reports for ``dev``.

        Raises:
            NVMLError: NOT_SUPPORTED for a device without a fabric (and no override).
        """
        f = dev.fabric
        if override is None:
            if f is None:
                raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
            return (FABRIC_STATES.index(f.state), f.status or 0, f.cluster_uuid or _ZERO_UUID, f.clique_id or 0,
                    f.health_mask or 0)
        state, status, degraded, cluster, clique = override
        done = state == NVML_GPU_FABRIC_STATE_COMPLETED
        cluster = cluster or (f.cluster_uuid if f is not None and done and f.cluster_uuid else _ZERO_UUID)
        clique = clique if clique is not None else (f.clique_id if f is not None and done and f.clique_id else 0)
        mask = NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE if degraded else NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        return state, status, cluster, clique, mask

    def nvmlDeviceGetGpuFabricInfo(self, device: Any, gpuFabricInfo: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfo", device, gpuFabricInfo)

    def nvmlDeviceGetGpuFabricInfoV(self, device: Any, gpuFabricInfo: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", device, gpuFabricInfo)

    def nvmlDeviceGetP2PStatus(self, device1: Any, device2: Any, p2pIndex: int) -> int:
        a = self._enter("nvmlDeviceGetP2PStatus", device1)  # type: ignore[attr-defined]
        b = self._enter("nvmlDeviceGetP2PStatus", device2)  # type: ignore[attr-defined]
        if a is b or not isinstance(p2pIndex, int):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        for key in ((device1.index, device2.index, p2pIndex), (device1.index, device2.index, None)):
            if key in self._p2p:
                return self._p2p[key]
        link = self.topology.link(a.device.index, b.device.index)
        if link is None:
            return NVML_P2P_STATUS_NOT_SUPPORTED
        if p2pIndex == NVML_P2P_CAPS_INDEX_NVLINK:
            return NVML_P2P_STATUS_OK if link.kind == "nvlink" else NVML_P2P_STATUS_NOT_SUPPORTED
        if link.kind == "nvlink" or link.pcie in ("PIX", "PXB", "PHB", "NODE"):
            return NVML_P2P_STATUS_OK
        return NVML_P2P_STATUS_CHIPSET_NOT_SUPPORTED
