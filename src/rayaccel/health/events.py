"""What a health probe reports, and the contract every probe keeps.

A :class:`HealthProbe` waits for the vendor library's error events and reads its
health counters; :meth:`HealthProbe.poll` returns :class:`HealthEvent` s. A
``"critical"`` event means the device should be drained (no new work); a
``"warning"`` is only shown. The probes are edge-triggered: a condition is reported
once when it appears (a counter once per increase; a flag again only after it
cleared), never again on every poll while it lasts.

The kinds (:data:`KINDS`, with their severity in :data:`KIND_SEVERITY`):

=========================  ========  ===============================================================
kind                       severity  meaning (``code``)
=========================  ========  ===============================================================
``xid``                    critical  an NVIDIA Xid error event (the Xid); *warning* for the
                           /warning  application Xids of :data:`APPLICATION_XIDS`
``ecc_uncorrectable``      critical  uncorrectable ECC errors grew (the volatile count)
``row_remap_pending``      warning   a remapped memory row waits for a GPU reset (A100+)
``row_remap_failure``      critical  a row could not be remapped (A100+)
``retired_pages_pending``  warning   retired memory pages wait for a reboot/reset (NVIDIA pre-A100;
                                     AMD: bad pages with status PENDING)
``retired_pages_failure``  critical  AMD: a bad page could not be reserved (UNRESERVABLE)
``gpu_lost``               critical  the GPU fell off the bus / is gone (NVML_ERROR_GPU_IS_LOST,
                                     ``nvmlEventTypeGpuUnavailableError``; AMD: its device files are gone)
``gpu_reset_required``     critical  NVML_ERROR_RESET_REQUIRED: the GPU must be reset before reuse
``gpu_hang``               critical  AMD: a ring hang (``RING_HANG`` event)
``gpu_reset``              warning   AMD: the driver is resetting the GPU (``GPU_PRE_RESET`` event)
``vm_fault``               warning   AMD: a GPU page fault (``VMFAULT``; like Xid 31, an application fault)
``throttle_thermal``       warning   clocks slowed down for temperature
``throttle_power``         warning   clocks held down by the power cap / power brake
``throttle_hw``            warning   clocks slowed down, cause not reported (NVML HwSlowdown alone;
                                     amdsmi ``throttle_status``)
``nvlink_down``            warning   an NVLink that was active when the probe started is down (link no.)
``probe_error``            warning   a health counter of the device could not be read (status code)
=========================  ========  ===============================================================

The probes (:mod:`.health_nvml`, :mod:`.health_amd`) import this module and share its
:class:`Edges` bookkeeping and :func:`check_timeout`; :mod:`.health` picks the probe for
a topology (:func:`~.health.probe_for`) and re-exports everything here.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Hashable, Protocol, runtime_checkable

SEVERITIES = ("critical", "warning")

#: Every event kind, with its one-line meaning (see the module docstring's table).
KINDS: dict[str, str] = {
    "xid": "NVIDIA Xid error event",
    "ecc_uncorrectable": "uncorrectable ECC errors grew",
    "row_remap_pending": "a remapped memory row waits for a GPU reset",
    "row_remap_failure": "a memory row could not be remapped",
    "retired_pages_pending": "retired memory pages wait for a reboot/reset",
    "retired_pages_failure": "a bad memory page could not be retired",
    "gpu_lost": "the GPU fell off the bus or is gone",
    "gpu_reset_required": "the GPU must be reset before it can be used again",
    "gpu_hang": "the GPU hung (ring hang)",
    "gpu_reset": "the driver is resetting the GPU",
    "vm_fault": "GPU page fault (application)",
    "throttle_thermal": "clocks slowed down for temperature",
    "throttle_power": "clocks held down by the power cap",
    "throttle_hw": "clocks slowed down by hardware, cause not reported",
    "nvlink_down": "an NVLink went down",
    "probe_error": "a health counter could not be read",
}
#: Severity of each kind; ``xid`` depends on the Xid (:func:`classify_xid`).
KIND_SEVERITY: dict[str, str | None] = {
    "xid": None, "ecc_uncorrectable": "critical", "row_remap_pending": "warning", "row_remap_failure": "critical",
    "retired_pages_pending": "warning", "retired_pages_failure": "critical", "gpu_lost": "critical",
    "gpu_reset_required": "critical", "gpu_hang": "critical", "gpu_reset": "warning", "vm_fault": "warning",
    "throttle_thermal": "warning", "throttle_power": "warning", "throttle_hw": "warning", "nvlink_down": "warning",
    "probe_error": "warning",
}

#: Xids that are application errors, after which the GPU is still healthy: reported as warnings.
#: Source: NVIDIA/k8s-device-plugin ``internal/rm/health.go`` (``ignoredXids``; the device plugin
#: marks a GPU unhealthy on every other Xid), itself citing NVIDIA's Xid documentation.
APPLICATION_XIDS = frozenset({
    13,   # Graphics Engine Exception
    31,   # GPU memory page fault
    43,   # GPU stopped processing
    45,   # Preemptive cleanup, due to previous errors
    68,   # Video processor exception
    109,  # Context Switch Timeout Error
})

#: One-line descriptions of common Xids, for :attr:`HealthEvent.detail` (NVIDIA Xid catalog,
#: https://docs.nvidia.com/deploy/xid-errors/). An Xid not listed reads "Xid <n>".
XID_DESCRIPTIONS: dict[int, str] = {
    8: "GPU stopped processing", 13: "Graphics Engine Exception", 31: "GPU memory page fault",
    32: "Invalid or corrupted push buffer stream", 38: "Driver firmware error", 43: "GPU stopped processing",
    45: "Preemptive cleanup, due to previous errors", 48: "Double Bit ECC Error",
    61: "Internal micro-controller breakpoint/warning", 62: "Internal micro-controller halt",
    63: "ECC page retirement or row remapping recording event",
    64: "ECC page retirement or row remapper recording failure", 68: "Video processor exception",
    69: "Graphics Engine class error", 74: "NVLink error", 79: "GPU has fallen off the bus",
    92: "High single-bit ECC error rate", 94: "Contained ECC error", 95: "Uncontained ECC error",
    109: "Context Switch Timeout Error", 119: "GSP RPC timeout", 120: "GSP error", 140: "Unrecovered ECC error",
}

#: How long a throttle condition must stay clear before it is reported again, seconds
#: (power capping under load comes and goes every second; one report per episode is enough).
THROTTLE_REARM_S = 300.0


def classify_xid(xid: int, application_xids: frozenset[int] = APPLICATION_XIDS) -> str:
    """``"warning"`` for an application Xid, else ``"critical"`` (the Kubernetes device plugin's rule)."""
    return "warning" if xid in application_xids else "critical"


def xid_detail(xid: int) -> str:
    """``"Xid 79: GPU has fallen off the bus"`` (``"Xid 200"`` when the Xid has no description here)."""
    text = XID_DESCRIPTIONS.get(xid)
    return f"Xid {xid}: {text}" if text else f"Xid {xid}"


@dataclass(frozen=True, slots=True)
class HealthEvent:
    """One health condition of one device, as a probe saw it appear.

    Attributes:
        device: the topology device index.
        kind: one of :data:`KINDS`.
        severity: ``"critical"`` (the caller drains the device) or ``"warning"`` (shown only).
        detail: one human line, e.g. ``"Xid 79: GPU has fallen off the bus"``.
        code: the Xid, the counter value, the link number or the status code; None when none applies.
        at: when the probe saw it, seconds since the epoch (``time.time()``).
        partition: the MIG instance (:attr:`~rayaccel.topology.Partition.key`, e.g. ``"0:mig1"``)
            when the vendor named one; None for the whole device.

    Raises:
        ValueError: an unknown kind or severity, or a device index that is not an int >= 0.
    """

    device: int
    kind: str
    severity: str
    detail: str
    code: int | None = None
    at: float = 0.0
    partition: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.device, int) or isinstance(self.device, bool) or self.device < 0:
            raise ValueError(f"HealthEvent.device must be an int >= 0, not {self.device!r}")
        if self.kind not in KINDS:
            raise ValueError(f"HealthEvent.kind {self.kind!r} is not one of {sorted(KINDS)}")
        if self.severity not in SEVERITIES:
            raise ValueError(f"HealthEvent.severity {self.severity!r} is not one of {list(SEVERITIES)}")

    @property
    def critical(self) -> bool:
        """True when the device should be drained."""
        return self.severity == "critical"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (the field names as keys)."""
        return asdict(self)


@runtime_checkable
class HealthProbe(Protocol):
    """Watches one node's devices of one vendor."""

    def poll(self, timeout_s: float) -> list[HealthEvent]:
        """Wait up to ``timeout_s`` for error events, then read the health counters.

        Returns the conditions that appeared since the last poll (edge-triggered), maybe none.
        A failure of one device is reported as an event (``gpu_lost``, ``probe_error``) or
        skipped, never raised.

        Raises:
            ValueError: ``timeout_s`` is negative or not a finite number.
            BackendError: the vendor library itself broke (uninitialised, unloaded), or the
                probe was closed.
        """
        ...

    def close(self) -> None:
        """Release the library's resources (event sets, the library handle). Idempotent."""
        ...


def check_timeout(timeout_s: Any) -> float:
    """``timeout_s`` as a float.

    Raises:
        ValueError: negative, NaN, infinite or not a number.
    """
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
            or timeout_s < 0:
        raise ValueError(f"timeout_s must be a finite number of seconds >= 0, not {timeout_s!r}")
    return float(timeout_s)


class Edges:
    """Edge-trigger bookkeeping shared by the probes (not thread-safe; a probe polls under its lock)."""

    def __init__(self) -> None:
        self._on: set[Hashable] = set()
        self._off_since: dict[Hashable, float] = {}
        self._counts: dict[Hashable, int] = {}

    def rose(self, key: Hashable, on: bool, now: float, rearm_s: float = 0.0) -> bool:
        """True when the flag ``key`` turns on. A flag that clears is re-armed at once, or after
        it stayed clear for ``rearm_s`` seconds."""
        if on:
            self._off_since.pop(key, None)
            if key in self._on:
                return False
            self._on.add(key)
            return True
        if key in self._on:
            since = self._off_since.setdefault(key, now)
            if now - since >= rearm_s:
                self._on.discard(key)
                self._off_since.pop(key, None)
        return False

    def grew(self, key: Hashable, value: int) -> int:
        """How much the counter ``key`` grew since its last reading (0 on the first reading of 0, or when it
        fell: a driver reload resets volatile counters, and the new value becomes the baseline)."""
        last = self._counts.get(key, 0)
        self._counts[key] = value
        return value - last if value > last else 0


__all__ = ["APPLICATION_XIDS", "Edges", "HealthEvent", "HealthProbe", "KINDS", "KIND_SEVERITY", "SEVERITIES",
           "THROTTLE_REARM_S", "XID_DESCRIPTIONS", "check_timeout", "classify_xid", "xid_detail"]
