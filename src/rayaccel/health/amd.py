"""AMD device health through amdsmi's Python API: :class:`AmdHealthProbe`.

What maps to what (amdsmi names, ROCm/amdsmi ``py-interface/amdsmi_interface.py`` and its README):

=================================================  ================================================
amdsmi                                             event kind
=================================================  ================================================
``AmdSmiEventReader(h, [types]).read(timeout_ms)``  events (the reader wraps
  (``amdsmi_init_gpu_event_notification`` +          ``RING_HANG`` -> ``gpu_hang`` (critical),
  ``amdsmi_set_gpu_event_notification_mask`` +       ``GPU_PRE_RESET`` -> ``gpu_reset``,
  ``amdsmi_get_gpu_event_notification``)             ``VMFAULT`` -> ``vm_fault``,
                                                     ``THERMAL_THROTTLE`` -> ``throttle_thermal``
                                                     (warnings); ``GPU_POST_RESET`` is not reported
``amdsmi_get_gpu_total_ecc_count(h)``               ``uncorrectable_count`` grew -> ``ecc_uncorrectable``
``amdsmi_get_gpu_bad_page_info(h)``                 a page with status PENDING -> ``retired_pages_pending``;
                                                    UNRESERVABLE -> ``retired_pages_failure``
``amdsmi_get_violation_status(h)`` (MI300+)          ``active_ppt_pwr`` -> ``throttle_power``;
                                                    ``active_{prochot,socket,vr,hbm}_thrm`` -> ``throttle_thermal``
``amdsmi_get_gpu_metrics_info(h)["throttle_status"]``  (when there is no violation status) -> ``throttle_hw``
a per-device call failing with FILE_ERROR, IO,       ``gpu_lost`` (amdsmi has no GPU_IS_LOST; these are
NOT_FOUND, DRM_ERROR or AMDGPU_RESTART_ERR           what a device whose sysfs/DRM nodes vanished answers)
=================================================  ================================================

``amdsmi_get_gpu_event_notification`` (under ``read``) is not per device: it returns the
events of every device whose notification was initialised, each naming its
``processor_handle``; the probe reads through one reader and maps the handle back. No
event within the timeout is ``AMDSMI_STATUS_NO_DATA`` (rocm_smi's
``rsmi_event_notification_get``), which is no error.

Devices are matched to topology indices by UUID (``amdsmi_get_gpu_device_uuid``), else by
PCI BDF (``amdsmi_get_gpu_device_bdf``); only a topology device with neither is matched by
its position. NOT_SUPPORTED / NOT_YET_IMPLEMENTED / NO_PERM / NO_DATA, RETRY and BUSY mean
"not now / not here" and are skipped; INIT_ERROR / NOT_INIT mean the library broke
(BackendError); any other failure is a ``probe_error`` warning.
"""

from __future__ import annotations

import ctypes
import logging
import threading
import time
from typing import Any, Callable

from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import NodeTopology
from rayaccel.health.events import KIND_SEVERITY, THROTTLE_REARM_S, Edges, HealthEvent, check_timeout
from rayaccel.discovery.nvidia import _bus_key

log = logging.getLogger(__name__)
_INSTALL_HINT = "pip install amdsmi (the version matching your ROCm), on a machine with ROCm and the amdgpu driver"
_STATUS = {"NOT_SUPPORTED": 2, "NOT_YET_IMPLEMENTED": 3, "NO_PERM": 10, "NO_DATA": 40, "RETRY": 9, "BUSY": 30,
           "TIMEOUT": 8, "INIT_ERROR": 18, "NOT_INIT": 32, "FILE_ERROR": 14, "IO": 12, "NOT_FOUND": 31,
           "DRM_ERROR": 6, "AMDGPU_RESTART_ERR": 54}
_SKIP = ("NOT_SUPPORTED", "NOT_YET_IMPLEMENTED", "NO_PERM", "NO_DATA", "RETRY", "BUSY", "TIMEOUT")
_BROKEN = ("INIT_ERROR", "NOT_INIT")
_LOST = ("FILE_ERROR", "IO", "NOT_FOUND", "DRM_ERROR", "AMDGPU_RESTART_ERR")
#: amdsmi event name -> (kind, what the detail says); None: not reported.
EVENT_KINDS: dict[str, tuple[str, str] | None] = {
    "RING_HANG": ("gpu_hang", "GPU ring hang"),
    "GPU_PRE_RESET": ("gpu_reset", "the driver is resetting the GPU"),
    "VMFAULT": ("vm_fault", "GPU page fault (VM fault)"),
    "THERMAL_THROTTLE": ("throttle_thermal", "thermal throttling"),
    "GPU_POST_RESET": None,
}
#: Events read per poll.
MAX_EVENTS_PER_POLL = 64
_THERMAL_FLAGS = ("active_prochot_thrm", "active_socket_thrm", "active_vr_thrm", "active_hbm_thrm")


class _Lost(Exception):
    pass


def _key(handle: Any) -> Any:
    """A hashable identity of an amdsmi processor handle (a ``c_void_p`` or the raw address in event data)."""
    if isinstance(handle, ctypes.c_void_p):
        return handle.value
    return handle


class AmdHealthProbe:
    """Watches a node's AMD devices through amdsmi (see the module docstring for the calls).

    Args:
        topology: the node's devices; only those with ``vendor == "amd"`` are watched.
        amdsmi: an ``amdsmi``-like module (a :class:`~rayaccel.testing.fakeamdsmi.FakeAmdSmi` in tests); None imports it.
        throttle_rearm_s: how long a throttle flag must stay clear before it is reported again.
        clock: time source for :attr:`HealthEvent.at`.

    Raises:
        BackendUnavailable: amdsmi is missing or ``amdsmi_init`` failed (no amdgpu driver).
    """

    name = "amdsmi"

    def __init__(self, topology: NodeTopology, *, amdsmi: Any = None, throttle_rearm_s: float = THROTTLE_REARM_S,
                 clock: Callable[[], float] = time.time):
        if amdsmi is None:
            try:
                import amdsmi  # type: ignore[no-redef]
            except (ImportError, OSError) as e:
                raise BackendUnavailable("amd", f"amdsmi is not importable ({e})", _INSTALL_HINT) from None
        self.amdsmi = amdsmi
        self.topology = topology
        self.throttle_rearm_s = float(throttle_rearm_s)
        self._clock = clock
        wrapper = getattr(amdsmi, "amdsmi_wrapper", None)
        self._code = {n: getattr(wrapper, f"AMDSMI_STATUS_{n}", v) for n, v in _STATUS.items()}
        self._exc = getattr(amdsmi, "AmdSmiException", Exception)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._edges = Edges()
        self._pending: list[HealthEvent] = []
        self._handles: dict[int, Any] = {}  # topology index -> handle
        self._by_handle: dict[Any, int] = {}
        self._readers: list[Any] = []
        self._gone: set[int] = set()
        flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        try:
            amdsmi.amdsmi_init(flags) if flags is not None else amdsmi.amdsmi_init()
        except (self._exc, OSError) as e:
            raise BackendUnavailable("amd", f"amdsmi_init failed (no amdgpu driver?): {e}",
                                     "load the amdgpu driver / install ROCm") from None
        try:
            self._setup()
        except BaseException:
            self._release()
            raise

    # ------------------------------------------------------------ set-up
    def _status(self, e: Exception) -> int | None:
        return e.get_error_code() if hasattr(e, "get_error_code") else getattr(e, "err_code", None)

    def _call(self, index: int | None, fn: str, *args: Any, report: bool = True) -> Any:
        """``amdsmi.<fn>(*args)``; None when unavailable.

        Raises:
            _Lost: the device is gone. BackendError: amdsmi itself broke.
        """
        func = getattr(self.amdsmi, fn, None)
        if func is None:
            return None
        try:
            value = func(*args)
        except self._exc as e:
            code = self._status(e)
            if code in {self._code[n] for n in _SKIP}:
                return None
            if code in {self._code[n] for n in _BROKEN}:
                raise BackendError(f"{fn} failed: {e} (amdsmi status {code})", backend="amd") from None
            if index is not None and code in {self._code[n] for n in _LOST}:
                raise _Lost(f"{fn}: amdsmi status {code}") from None
            if report and index is not None and self._edges.rose(("probe_error", index, fn), True, 0.0):
                self._pending.append(self._event(index, "probe_error", f"{fn} failed: {e} (amdsmi status {code})",
                                                 code, self._clock()))
            return None
        if report and index is not None:
            self._edges.rose(("probe_error", index, fn), False, 0.0)
        return value

    def _event(self, device: int, kind: str, detail: str, code: int | None, at: float) -> HealthEvent:
        return HealthEvent(device, kind, KIND_SEVERITY[kind] or "critical", detail, code, at)

    def _mark_gone(self, index: int, why: Exception, now: float) -> None:
        if index not in self._gone:
            self._gone.add(index)
            self._pending.append(self._event(index, "gpu_lost", f"GPU {index} is gone ({why})", None, now))

    def _setup(self) -> None:
        m, now = self.amdsmi, self._clock()
        wanted = [d for d in sorted(self.topology.devices, key=lambda d: d.index) if d.vendor == "amd"]
        handles = list(self._call(None, "amdsmi_get_processor_handles") or [])
        ids = []
        for pos, h in enumerate(handles):
            try:
                uuid = self._call(None, "amdsmi_get_gpu_device_uuid", h, report=False)
                bdf = self._call(None, "amdsmi_get_gpu_device_bdf", h, report=False)
            except _Lost:
                uuid = bdf = None
            ids.append((pos, h, str(uuid) if uuid else None, _bus_key(str(bdf)) if bdf else None))
        taken: set[int] = set()
        for d in wanted:
            match = next((x for x in ids if x[0] not in taken and d.uuid and x[2] == d.uuid), None)
            match = match or next((x for x in ids if x[0] not in taken and d.pci_bus_id
                                   and x[3] == _bus_key(d.pci_bus_id)), None)
            if match is None and not d.uuid and not d.pci_bus_id:
                position = wanted.index(d)
                match = ids[position] if position < len(ids) and ids[position][0] not in taken else None
            if match is None:
                self._gone.add(d.index)
                self._pending.append(self._event(d.index, "gpu_lost", f"amdsmi does not find GPU {d.index} "
                                                 f"({d.uuid or d.pci_bus_id}) any more", None, now))
                continue
            taken.add(match[0])
            self._handles[d.index] = match[1]
            self._by_handle[_key(match[1])] = d.index
        types_enum = getattr(m, "AmdSmiEvtNotificationType", None)
        reader_cls = getattr(m, "AmdSmiEventReader", None)
        if types_enum is None or reader_cls is None:
            return
        types = [getattr(types_enum, n) for n in EVENT_KINDS if hasattr(types_enum, n)]
        for index, h in self._handles.items():
            try:
                self._readers.append(reader_cls(h, types))
            except self._exc as e:  # this device cannot notify: its counters are still read
                log.info("rayaccel: no amdsmi event notification for GPU %s: %s", index, e)

    # ------------------------------------------------------------ poll
    @property
    def devices(self) -> tuple[int, ...]:
        """Topology indices of the devices being watched (lost ones included)."""
        return tuple(sorted(set(self._handles) | self._gone))

    @property
    def lost(self) -> frozenset[int]:
        """Devices found gone; they are no longer asked."""
        return frozenset(self._gone)

    def poll(self, timeout_s: float) -> list[HealthEvent]:
        """Wait up to ``timeout_s`` for amdsmi events, then read the counters (see :meth:`.health.HealthProbe.poll`).

        Raises:
            ValueError: a bad ``timeout_s``. BackendError: amdsmi broke, or the probe is closed.
        """
        timeout_s = check_timeout(timeout_s)
        with self._lock:
            if self._closed.is_set():
                raise BackendError("the amdsmi health probe is closed", backend="amd")
            raw = self._wait(timeout_s)
            now = self._clock()
            events = self._from_events(raw, now)
            for index, h in sorted(self._handles.items()):
                if index in self._gone:
                    continue
                try:
                    events.extend(self._device_counters(index, h, now))
                except _Lost as e:
                    self._mark_gone(index, e, now)
            out, self._pending = self._pending + events, []
            return out

    def _wait(self, timeout_s: float) -> list[dict]:
        if not self._readers:
            self._closed.wait(timeout_s)
            return []
        ms = min(int(round(timeout_s * 1000)), 2**31 - 1)
        try:
            return list(self._readers[0].read(ms, MAX_EVENTS_PER_POLL) or [])
        except self._exc as e:
            code = self._status(e)
            if code in {self._code[n] for n in _SKIP}:
                return []
            raise BackendError(f"amdsmi_get_gpu_event_notification failed: {e} (amdsmi status {code})",
                               backend="amd") from None

    def _from_events(self, raw: list[dict], now: float) -> list[HealthEvent]:
        out: list[HealthEvent] = []
        seen: set[tuple[int, str]] = set()
        for ev in raw:
            index = self._by_handle.get(_key(ev.get("processor_handle")))
            name = str(ev.get("event", "")).rsplit(".", 1)[-1]
            kind = EVENT_KINDS.get(name)
            if index is None or index in self._gone or kind is None or (index, kind[0]) in seen:
                continue
            seen.add((index, kind[0]))
            message = str(ev.get("message") or "").strip()
            if kind[0] == "throttle_thermal" and not self._edges.rose((index, kind[0]), True, now, self.throttle_rearm_s):
                continue
            out.append(self._event(index, kind[0], kind[1] + (f": {message}" if message else ""), None, now))
        return out

    def _device_counters(self, i: int, h: Any, now: float) -> list[HealthEvent]:
        m, out = self.amdsmi, []
        ecc = self._call(i, "amdsmi_get_gpu_total_ecc_count", h)
        unc = ecc.get("uncorrectable_count") if isinstance(ecc, dict) else None
        if isinstance(unc, int):
            grew = self._edges.grew((i, "ecc"), unc)
            if grew:
                out.append(self._event(i, "ecc_uncorrectable", f"{unc} uncorrectable ECC errors (+{grew})", unc, now))
        pages = self._call(i, "amdsmi_get_gpu_bad_page_info", h)
        if isinstance(pages, list):
            status = getattr(m, "AmdSmiMemoryPageStatus", None)
            pending_v, unres_v = int(getattr(status, "PENDING", 1)), int(getattr(status, "UNRESERVABLE", 2))
            states = [_int(p.get("status")) for p in pages if isinstance(p, dict)]
            n_pending, n_unres = states.count(pending_v), states.count(unres_v)
            if self._edges.rose((i, "pages_pending"), n_pending > 0, now):
                out.append(self._event(i, "retired_pages_pending", f"{n_pending} bad memory pages are pending "
                                       "retirement: reset the GPU or reboot", n_pending, now))
            if self._edges.rose((i, "pages_unreservable"), n_unres > 0, now):
                out.append(self._event(i, "retired_pages_failure", f"{n_unres} bad memory pages could not be "
                                       "retired: the GPU needs service", n_unres, now))
        flags = self._throttle(i, h)
        for kind, on in flags.items():
            if self._edges.rose((i, kind), on, now, self.throttle_rearm_s):
                text = {"throttle_thermal": "thermal throttling (amdsmi violation status)",
                        "throttle_power": "power throttling (amdsmi violation status: PPT)",
                        "throttle_hw": "clocks throttled (amdsmi throttle_status)"}[kind]
                out.append(self._event(i, kind, text, None, now))
        return out

    def _throttle(self, i: int, h: Any) -> dict[str, bool]:
        vio = self._call(i, "amdsmi_get_violation_status", h)
        if isinstance(vio, dict):
            return {"throttle_thermal": any(vio.get(k) is True for k in _THERMAL_FLAGS),
                    "throttle_power": vio.get("active_ppt_pwr") is True}
        metrics = self._call(i, "amdsmi_get_gpu_metrics_info", h)
        if isinstance(metrics, dict) and isinstance(metrics.get("throttle_status"), bool):
            return {"throttle_hw": metrics["throttle_status"]}
        return {}

    # ------------------------------------------------------------ close
    def _release(self) -> None:
        for r in self._readers:
            try:
                r.stop()
            except self._exc as e:
                log.debug("rayaccel: amdsmi event reader stop failed: %s", e)
        self._readers = []
        try:
            self.amdsmi.amdsmi_shut_down()
        except self._exc as e:
            log.debug("rayaccel: amdsmi_shut_down failed: %s", e)

    def close(self) -> None:
        """Stop the event readers and shut amdsmi down; waits for a poll in progress. Idempotent."""
        if self._closed.is_set():
            return
        self._closed.set()
        with self._lock:
            self._release()


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None
