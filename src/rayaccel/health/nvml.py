"""NVIDIA device health through NVML: :class:`NvmlHealthProbe`.

What it asks NVML (nvidia-ml-py's ``pynvml`` names), per watched device ``h``:

* **events**: one ``nvmlEventSetCreate`` set; ``nvmlDeviceRegisterEvents(h, mask, set)`` with
  ``mask = (nvmlEventTypeXidCriticalError | nvmlEventTypeDoubleBitEccError |
  nvmlEventTypeGpuUnavailableError) & nvmlDeviceGetSupportedEventTypes(h)`` (the Kubernetes
  device plugin masks the same way, ``internal/rm/health.go``); :meth:`~NvmlHealthProbe.poll`
  waits in ``nvmlEventSetWait_v2`` (``nvmlEventSetWait`` on older bindings), then drains
  what is queued. An Xid event is ``xid``, classified by :func:`~.health.classify_xid`
  (critical unless one of :data:`~.health.APPLICATION_XIDS`); its ``gpuInstanceId`` names
  the MIG instance when it is not 0xFFFFFFFF. A double-bit ECC event is confirmed by the
  ECC counter below; ``GpuUnavailableError`` is ``gpu_lost``.
* **counters**, every poll: ``nvmlDeviceGetTotalEccErrors(h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
  NVML_VOLATILE_ECC)`` (``ecc_uncorrectable`` on each increase); ``nvmlDeviceGetRemappedRows``
  -> (corrected, uncorrected, pending, failure) (``row_remap_pending`` / ``row_remap_failure``);
  ``nvmlDeviceGetRetiredPagesPendingStatus`` (``retired_pages_pending``);
  ``nvmlDeviceGetCurrentClocksEventReasons`` (``...ThrottleReasons`` on older bindings):
  SwThermalSlowdown|HwThermalSlowdown -> ``throttle_thermal``, SwPowerCap|HwPowerBrakeSlowdown
  -> ``throttle_power``, HwSlowdown alone -> ``throttle_hw``; ``nvmlDeviceGetNvLinkState`` of
  every link that was active when the probe started (``nvlink_down``).
* **lost GPUs**: ``NVML_ERROR_GPU_IS_LOST`` from any call about a device -> ``gpu_lost`` (once;
  the device is not asked again); ``NVML_ERROR_RESET_REQUIRED`` -> ``gpu_reset_required``.
  A wait that raises GPU_IS_LOST only says "some GPU": the counter reads that follow find which.

Devices are matched to topology indices by UUID (``nvmlDeviceGetHandleByUUID``), else by PCI
bus id (``nvmlDeviceGetHandleByPciBusId``); events by their handle, else by the UUID NVML
gives for it. Only a topology device with neither UUID nor bus id is looked up by its index.

A fact NVML does not support (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NO_DATA, NO_PERMISSION, a
function the bindings lack) is simply not watched. Another error about one device is a
``probe_error`` warning (once, until that call works again). UNINITIALIZED, LIBRARY_NOT_FOUND,
DRIVER_NOT_LOADED or UNKNOWN from the event wait mean NVML itself broke: BackendError.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import Device, NodeTopology
from rayaccel.health.events import (
    APPLICATION_XIDS, KIND_SEVERITY, THROTTLE_REARM_S, Edges, HealthEvent, check_timeout, classify_xid, xid_detail,
)
from rayaccel.discovery.nvidia import _bus_key, _text

log = logging.getLogger(__name__)
_INSTALL_HINT = "pip install nvidia-ml-py, on a machine with the NVIDIA driver"
_UNKNOWN = {"NOT_SUPPORTED": 3, "FUNCTION_NOT_FOUND": 13, "NO_DATA": 21, "NO_PERMISSION": 4}
_BROKEN = {"UNINITIALIZED": 1, "LIBRARY_NOT_FOUND": 12, "DRIVER_NOT_LOADED": 9}
#: Most events drained from the event set in one poll (an Xid storm must not stall the caller).
MAX_EVENTS_PER_POLL = 256
_WHOLE = 0xFFFFFFFF
_CLOCK_BITS = {  # pynvml name -> value (the same bits under the older ...ThrottleReason... names)
    "SwPowerCap": 0x04, "HwSlowdown": 0x08, "SwThermalSlowdown": 0x20, "HwThermalSlowdown": 0x40,
    "HwPowerBrakeSlowdown": 0x80,
}
_THERMAL = _CLOCK_BITS["SwThermalSlowdown"] | _CLOCK_BITS["HwThermalSlowdown"]
_POWER = _CLOCK_BITS["SwPowerCap"] | _CLOCK_BITS["HwPowerBrakeSlowdown"]


class _Lost(Exception):
    pass


class _ResetRequired(Exception):
    pass


def handle_key(handle: Any) -> Any:
    """A hashable identity of an NVML device handle: the address behind a ctypes pointer (pynvml
    hands out the same handle for a device every time), or the object itself (a fake's handle)."""
    try:
        return ("ptr", ctypes.cast(handle, ctypes.c_void_p).value)
    except (ctypes.ArgumentError, TypeError):
        return handle


@dataclass
class _Watched:
    device: Device
    handle: Any
    links: list[int] = field(default_factory=list)  # NVLinks active at start


class NvmlHealthProbe:
    """Watches a node's NVIDIA devices through NVML (see the module docstring for the calls).

    Args:
        topology: the node's devices; only those with ``vendor == "nvidia"`` are watched.
        nvml: a ``pynvml``-like module (a :class:`~rayaccel.testing.fakenvml.FakeNVML` in tests and on simulated
            nodes); None imports ``pynvml``.
        application_xids: Xids reported as warnings instead of critical.
        throttle_rearm_s: how long a throttle reason must stay clear before it is reported again.
        clock: time source for :attr:`HealthEvent.at`.

    Raises:
        BackendUnavailable: pynvml is missing or the driver is not loaded.
        BackendError: ``nvmlInit`` failed otherwise.
    """

    name = "nvml"

    def __init__(self, topology: NodeTopology, *, nvml: Any = None, application_xids: frozenset[int] = APPLICATION_XIDS,
                 throttle_rearm_s: float = THROTTLE_REARM_S, clock: Callable[[], float] = time.time):
        if nvml is None:
            try:
                import pynvml as nvml  # nvidia-ml-py
            except ImportError as e:
                raise BackendUnavailable("nvidia", f"pynvml is not importable ({e})", _INSTALL_HINT) from None
        self.nvml = nvml
        self.topology = topology
        self.application_xids = frozenset(application_xids)
        self.throttle_rearm_s = float(throttle_rearm_s)
        self._clock = clock
        self._codes = {n: getattr(nvml, f"NVML_ERROR_{n}", v) for n, v in {**_UNKNOWN, **_BROKEN}.items()}
        self._code_lost = getattr(nvml, "NVML_ERROR_GPU_IS_LOST", 15)
        self._code_reset = getattr(nvml, "NVML_ERROR_RESET_REQUIRED", 16)
        self._code_timeout = getattr(nvml, "NVML_ERROR_TIMEOUT", 10)
        self._code_not_found = getattr(nvml, "NVML_ERROR_NOT_FOUND", 6)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._edges = Edges()
        self._pending: list[HealthEvent] = []
        self._watched: dict[int, _Watched] = {}
        self._by_handle: dict[Any, int] = {}
        self._gone: set[int] = set()
        self._set: Any = None
        self._init()
        try:
            self._setup()
        except BaseException:
            self._shutdown()
            raise

    # ------------------------------------------------------------ set-up
    def _init(self) -> None:
        nvml = self.nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            value = getattr(e, "value", None)
            if value in (self._codes["LIBRARY_NOT_FOUND"], self._codes["DRIVER_NOT_LOADED"]):
                raise BackendUnavailable("nvidia", f"no NVIDIA driver: nvmlInit failed: {e}",
                                         "install the NVIDIA driver (libnvidia-ml.so)") from None
            raise BackendError(f"nvmlInit failed: {e} (NVML error {value})", backend="nvidia") from None
        except OSError as e:
            raise BackendUnavailable("nvidia", f"no NVIDIA driver: {e}", "install the NVIDIA driver") from None

    def _shutdown(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except self.nvml.NVMLError as e:  # a library already broken has nothing left to release
            log.debug("rayaccel: nvmlShutdown failed: %s", e)

    def _setup(self) -> None:
        nvml = self.nvml
        now = self._clock()
        try:
            self._set = nvml.nvmlEventSetCreate() if hasattr(nvml, "nvmlEventSetCreate") else None
        except nvml.NVMLError as e:
            if getattr(e, "value", None) not in self._unknown_codes():
                raise BackendError(f"nvmlEventSetCreate failed: {e}", backend="nvidia") from None
            self._set = None  # no events on this platform: counters only
        wanted = (getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8) | getattr(nvml, "nvmlEventTypeDoubleBitEccError", 0x2)
                  | getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0))
        for d in sorted(self.topology.devices, key=lambda d: d.index):
            if d.vendor != "nvidia":
                continue
            try:
                h = self._find(d)
                if h is None:
                    self._gone.add(d.index)
                    self._pending.append(self._event(d.index, "gpu_lost", f"NVML does not find GPU {d.index} "
                                                     f"({d.uuid or d.pci_bus_id}) any more", None, now))
                    continue
                w = _Watched(d, h)
                self._watched[d.index] = w
                self._by_handle[handle_key(h)] = d.index
                if self._set is not None:
                    supported = self._call(d.index, "nvmlDeviceGetSupportedEventTypes", h)
                    mask = wanted & int(supported if supported is not None else wanted)
                    if mask:
                        self._call(d.index, "nvmlDeviceRegisterEvents", h, mask, self._set)
                if any(l.kind == "nvlink" and d.index in (l.a, l.b) for l in self.topology.links):
                    w.links = self._active_links(d.index, h)
            except (_Lost, _ResetRequired) as e:
                self._mark_gone(d.index, e, now)

    def _find(self, d: Device) -> Any:
        """The NVML handle of topology device ``d``, or None when NVML does not know it."""
        nvml = self.nvml
        tries: list[tuple[str, Any]] = []
        if d.uuid:
            tries.append(("nvmlDeviceGetHandleByUUID", d.uuid))
        if d.pci_bus_id:
            tries.append(("nvmlDeviceGetHandleByPciBusId", d.pci_bus_id))
        if not tries:
            tries.append(("nvmlDeviceGetHandleByIndex", d.index))  # nothing else to match by
        for fn, arg in tries:
            if hasattr(nvml, fn):
                h = self._call(d.index, fn, arg, unknown=(self._code_not_found,))
                if h is not None:
                    return h
        if all(hasattr(nvml, fn) for fn, _ in tries):
            return None
        # old bindings without the lookup functions: enumerate and compare
        for i in range(self._call(d.index, "nvmlDeviceGetCount") or 0):
            try:
                h = self._call(d.index, "nvmlDeviceGetHandleByIndex", i)
            except (_Lost, _ResetRequired):
                continue
            if h is None:
                continue
            uuid = _text(self._call(d.index, "nvmlDeviceGetUUID", h))
            pci = self._call(d.index, "nvmlDeviceGetPciInfo", h)
            bus = _bus_key(_text(pci.busId)) if pci is not None else None
            if (d.uuid and uuid == d.uuid) or (d.pci_bus_id and bus == _bus_key(d.pci_bus_id)):
                return h
        return None

    def _active_links(self, index: int, h: Any) -> list[int]:
        enabled = getattr(self.nvml, "NVML_FEATURE_ENABLED", 1)
        invalid = getattr(self.nvml, "NVML_ERROR_INVALID_ARGUMENT", 2)
        active = []
        for link in range(getattr(self.nvml, "NVML_NVLINK_MAX_LINKS", 18)):
            state = self._call(index, "nvmlDeviceGetNvLinkState", h, link, unknown=(invalid,), report=False)
            if state is None and not active and link == 0:
                break  # no NVLink on this device
            if state == enabled:
                active.append(link)
        return active

    # ------------------------------------------------------------ calls
    def _unknown_codes(self) -> set[int]:
        return {self._codes[n] for n in _UNKNOWN}

    def _call(self, index: int, fn: str, *args: Any, unknown: tuple[int, ...] = (), report: bool = True) -> Any:
        """``nvml.<fn>(*args)`` about device ``index``; None when the fact is unavailable.

        Raises:
            _Lost / _ResetRequired: the device is gone / needs a reset.
            BackendError: NVML itself is broken.
        """
        nvml = self.nvml
        func = getattr(nvml, fn, None)
        if func is None:
            return None
        try:
            value = func(*args)
        except nvml.NVMLError as e:
            code = getattr(e, "value", None)
            if code in self._unknown_codes() or code in unknown:
                return None
            if code == self._code_lost:
                raise _Lost(fn) from None
            if code == self._code_reset:
                raise _ResetRequired(fn) from None
            if code in (self._codes["UNINITIALIZED"], self._codes["LIBRARY_NOT_FOUND"], self._codes["DRIVER_NOT_LOADED"]):
                raise BackendError(f"{fn} failed for device {index}: {e} (NVML error {code})", backend="nvidia") from None
            if report and self._edges.rose(("probe_error", index, fn), True, 0.0):
                self._pending.append(self._event(index, "probe_error", f"{fn} failed: {e} (NVML error {code})",
                                                 code, self._clock()))
            return None
        if report:
            self._edges.rose(("probe_error", index, fn), False, 0.0)
        return value

    def _event(self, device: int, kind: str, detail: str, code: int | None, at: float, severity: str | None = None,
               partition: str | None = None) -> HealthEvent:
        return HealthEvent(device, kind, severity or KIND_SEVERITY[kind] or "critical", detail, code, at, partition)

    def _mark_gone(self, index: int, why: Exception, now: float) -> None:
        if index in self._gone:
            return
        self._gone.add(index)
        if isinstance(why, _ResetRequired):
            self._pending.append(self._event(index, "gpu_reset_required", f"GPU {index} must be reset before it can be "
                                             f"used again (NVML_ERROR_RESET_REQUIRED from {why})", None, now))
        else:
            self._pending.append(self._event(index, "gpu_lost", f"GPU {index} has fallen off the bus "
                                             f"(NVML_ERROR_GPU_IS_LOST from {why})", None, now))

    # ------------------------------------------------------------ poll
    @property
    def devices(self) -> tuple[int, ...]:
        """Topology indices of the devices being watched (lost ones included)."""
        return tuple(sorted(set(self._watched) | self._gone))

    @property
    def lost(self) -> frozenset[int]:
        """Devices found lost (or needing a reset); they are no longer asked."""
        return frozenset(self._gone)

    def poll(self, timeout_s: float) -> list[HealthEvent]:
        """Wait up to ``timeout_s`` for NVML events, then read the counters (see :meth:`.health.HealthProbe.poll`).

        Raises:
            ValueError: a bad ``timeout_s``. BackendError: NVML broke, or the probe is closed.
        """
        timeout_s = check_timeout(timeout_s)
        with self._lock:
            if self._closed.is_set():
                raise BackendError("the NVML health probe is closed", backend="nvidia")
            raw = self._wait(timeout_s)
            now = self._clock()
            events = self._from_events(raw, now)
            events.extend(self._counters(raw, now))
            out, self._pending = self._pending + events, []
            return out

    def _wait(self, timeout_s: float) -> list[Any]:
        """Events from the event set: the first waited for up to ``timeout_s``, the rest already queued."""
        nvml = self.nvml
        if self._set is None or not self._watched:
            self._closed.wait(timeout_s)
            return []
        wait = getattr(nvml, "nvmlEventSetWait_v2", None) or nvml.nvmlEventSetWait
        got: list[Any] = []
        ms = min(int(round(timeout_s * 1000)), 2**31 - 1)
        while len(got) < MAX_EVENTS_PER_POLL:
            try:
                got.append(wait(self._set, ms))
            except nvml.NVMLError as e:
                code = getattr(e, "value", None)
                if code == self._code_timeout:
                    break
                if code == self._code_lost:
                    continue  # some GPU is gone: the counter reads find which
                raise BackendError(f"nvmlEventSetWait failed: {e} (NVML error {code})", backend="nvidia") from None
            ms = 0
        return got

    def _device_of(self, handle: Any) -> int | None:
        index = self._by_handle.get(handle_key(handle))
        if index is not None:
            return index
        try:
            uuid = _text(self.nvml.nvmlDeviceGetUUID(handle))
        except self.nvml.NVMLError:
            return None
        return next((i for i, w in self._watched.items() if w.device.uuid and w.device.uuid == uuid), None)

    def _from_events(self, raw: list[Any], now: float) -> list[HealthEvent]:
        nvml = self.nvml
        xid_t = getattr(nvml, "nvmlEventTypeXidCriticalError", 0x8)
        lost_t = getattr(nvml, "nvmlEventTypeGpuUnavailableError", 0x4000)
        seen: dict[tuple[int, int, str | None], int] = {}
        out: list[HealthEvent] = []
        for ev in raw:
            index = self._device_of(ev.device)
            if index is None or index in self._gone:
                continue
            etype = int(ev.eventType)
            if etype & lost_t:
                self._mark_gone(index, _Lost("nvmlEventTypeGpuUnavailableError"), now)
            if etype & xid_t:
                xid = int(ev.eventData)
                part = self._partition(index, int(getattr(ev, "gpuInstanceId", _WHOLE)))
                seen[(index, xid, part)] = seen.get((index, xid, part), 0) + 1
        for (index, xid, part), n in seen.items():
            detail = xid_detail(xid) + (f" (MIG instance {part})" if part else "") + (f" (x{n})" if n > 1 else "")
            out.append(self._event(index, "xid", detail, xid, now, classify_xid(xid, self.application_xids), part))
        return out

    def _partition(self, index: int, gi: int) -> str | None:
        if gi == _WHOLE:
            return None
        w = self._watched.get(index)
        for p in w.device.partitions if w else ():
            if p.gi_id == gi:
                return p.key
        return f"{index}:mig{gi}"

    def _counters(self, raw: list[Any], now: float) -> list[HealthEvent]:
        dbe_t = getattr(self.nvml, "nvmlEventTypeDoubleBitEccError", 0x2)
        dbe = {self._device_of(ev.device) for ev in raw if int(ev.eventType) & dbe_t}
        out: list[HealthEvent] = []
        for index, w in sorted(self._watched.items()):
            if index in self._gone:
                continue
            try:
                out.extend(self._device_counters(index, w, index in dbe, now))
            except (_Lost, _ResetRequired) as e:
                self._mark_gone(index, e, now)
        return out

    def _device_counters(self, i: int, w: _Watched, dbe_event: bool, now: float) -> list[HealthEvent]:
        nvml, h, out = self.nvml, w.handle, []
        ecc = self._call(i, "nvmlDeviceGetTotalEccErrors", h, getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
                         getattr(nvml, "NVML_VOLATILE_ECC", 0))
        grew = self._edges.grew((i, "ecc"), int(ecc)) if ecc is not None else 0
        if grew or dbe_event:
            text = (f"{int(ecc)} uncorrectable ECC errors since the driver loaded (+{grew})" if grew
                    else "double-bit (uncorrectable) ECC error event")
            out.append(self._event(i, "ecc_uncorrectable", text, int(ecc) if ecc is not None else None, now))
        rows = self._call(i, "nvmlDeviceGetRemappedRows", h)
        if rows is not None:
            if self._edges.rose((i, "remap_pending"), bool(rows[2]), now):
                out.append(self._event(i, "row_remap_pending", "a remapped memory row is pending: reset the GPU "
                                       "when it is idle to apply it", int(rows[1]), now))
            if self._edges.rose((i, "remap_failure"), bool(rows[3]), now):
                out.append(self._event(i, "row_remap_failure", "row remapping failed: the GPU needs service",
                                       int(rows[1]), now))
        pending = self._call(i, "nvmlDeviceGetRetiredPagesPendingStatus", h)
        if pending is not None and self._edges.rose((i, "retired"), bool(pending), now):
            out.append(self._event(i, "retired_pages_pending", "retired memory pages are pending: reboot or reset "
                                   "the GPU to retire them", None, now))
        reasons = self._call(i, "nvmlDeviceGetCurrentClocksEventReasons", h)
        if reasons is None:
            reasons = self._call(i, "nvmlDeviceGetCurrentClocksThrottleReasons", h)
        if reasons is not None:
            bits = int(reasons)
            flags = {"throttle_thermal": bool(bits & _THERMAL), "throttle_power": bool(bits & _POWER)}
            flags["throttle_hw"] = bool(bits & _CLOCK_BITS["HwSlowdown"]) and not any(flags.values())
            texts = {"throttle_thermal": "clocks slowed down for temperature",
                     "throttle_power": "clocks held down by the power cap", "throttle_hw": "hardware clock slowdown"}
            for kind, on in flags.items():
                if self._edges.rose((i, kind), on, now, self.throttle_rearm_s):
                    out.append(self._event(i, kind, f"{texts[kind]} (clock event reasons 0x{bits:x})", bits, now))
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        for link in w.links:
            state = self._call(i, "nvmlDeviceGetNvLinkState", h, link)
            if state is not None and self._edges.rose((i, "nvlink", link), state != enabled, now):
                out.append(self._event(i, "nvlink_down", f"NVLink {link} is down (it was active when the probe "
                                       "started)", link, now))
        return out

    # ------------------------------------------------------------ close
    def close(self) -> None:
        """Free the event set and shut NVML down; waits for a poll in progress. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            if self._set is not None:
                try:
                    self.nvml.nvmlEventSetFree(self._set)
                except self.nvml.NVMLError as e:  # the set dies with the NVML session anyway
                    log.debug("rayaccel: nvmlEventSetFree failed: %s", e)
                self._set = None
            self._shutdown()
