"""A fake ``amdsmi`` module answering from a :class:`NodeTopology` (for tests and demos).

``AmdBackend(amdsmi=FakeAmdSmi(topology)).discover()`` runs the real backend
code. Shapes follow amdsmi's Python API: ``amdsmi_topo_get_link_type`` returns
``{"hops": int, "type": int}`` (type from ``AmdSmiLinkType``), bandwidths come as
``{"min_bandwidth", "max_bandwidth"}`` in MB/s, failures raise
``AmdSmiLibraryException`` with ``get_error_code()``. Unknown facts (``None`` in the
topology) raise ``AMDSMI_STATUS_NOT_SUPPORTED``. CPU lists live in sysfs, not in
amdsmi; :meth:`FakeAmdSmi.write_sysfs` writes them into a directory tree.

Health conditions can be injected (device = topology device index) and reach the real
:class:`~rayaccel.health.amd.AmdHealthProbe` through amdsmi's own calls:

=================================================  =================================================
injection                                          what amdsmi then answers
=================================================  =================================================
``inject_ecc(d, count=1)``                         ``amdsmi_get_gpu_total_ecc_count`` uncorrectable += count
``inject_retired_pending(d, pending=True)``        ``amdsmi_get_gpu_bad_page_info``: a PENDING page
``inject_remap(d, pending=True, failure=False)``   the same bad-page list (failure: an UNRESERVABLE page)
``inject_throttle(d, thermal=True, power=False)``  ``amdsmi_get_violation_status`` active flags
                                                   (``throttle_status`` of ``amdsmi_get_gpu_metrics_info``)
``inject_event(d, "RING_HANG", message="")``       one event for ``AmdSmiEventReader.read``
``inject_hang(d)`` / ``inject_reset(d)``           a RING_HANG / GPU_PRE_RESET + GPU_POST_RESET event
``lose(d, code=FILE_ERROR)``                       every later call about ``d`` raises that status
=================================================  =================================================

Thread-safe: events may be injected from one thread while another waits in ``read``.
"""

from __future__ import annotations

import threading
import time
import types
from collections import deque
from enum import IntEnum
from pathlib import Path
from typing import Any

from rayaccel.topology import NodeTopology
from rayaccel.discovery.amd import XGMI_LINK_MBPS

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_INVAL = 1
AMDSMI_STATUS_IO = 12
AMDSMI_STATUS_FILE_ERROR = 14
AMDSMI_STATUS_INIT_ERROR = 18
AMDSMI_STATUS_NOT_FOUND = 31
AMDSMI_STATUS_NO_DATA = 40


class AmdSmiException(Exception):
    """Base of amdsmi's exceptions."""


class AmdSmiLibraryException(AmdSmiException):
    def __init__(self, err_code: int):
        super().__init__(f"amdsmi error {err_code}")
        self.err_code = err_code

    def get_error_code(self) -> int:
        return self.err_code


class AmdSmiLinkType(IntEnum):
    AMDSMI_LINK_TYPE_INTERNAL = 0
    AMDSMI_LINK_TYPE_XGMI = 1
    AMDSMI_LINK_TYPE_PCIE = 2
    AMDSMI_LINK_TYPE_NOT_APPLICABLE = 3
    AMDSMI_LINK_TYPE_UNKNOWN = 4


class AmdSmiMemoryType(IntEnum):
    VRAM = 0
    VIS_VRAM = 1
    GTT = 2


class AmdSmiInitFlags(IntEnum):
    INIT_ALL_PROCESSORS = 0xFFFFFFFF
    INIT_AMD_GPUS = 2


class AmdSmiEvtNotificationType(IntEnum):
    NONE = 0
    VMFAULT = 1
    THERMAL_THROTTLE = 2
    GPU_PRE_RESET = 3
    GPU_POST_RESET = 4
    RING_HANG = 5


class AmdSmiMemoryPageStatus(IntEnum):
    RESERVED = 0
    PENDING = 1
    UNRESERVABLE = 2


class _EventReader:
    """``amdsmi.AmdSmiEventReader`` of a :class:`FakeAmdSmi` (same constructor, ``read``, ``stop``)."""

    def __init__(self, fake: "FakeAmdSmi", processor_handle: int, event_types: Any):
        fake._enter("amdsmi_init_gpu_event_notification", processor_handle)
        mask = 0
        for t in event_types:
            if not isinstance(t, AmdSmiEvtNotificationType):
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            mask |= 1 << (int(t) - 1) if t else 0
        self.fake, self.processor_handle = fake, processor_handle
        with fake._cond:
            fake._masks[processor_handle] = mask

    def read(self, timestamp: int, num_elem: int = 10) -> list[dict]:
        """Events of every notifying device, waiting up to ``timestamp`` ms for the first.

        Raises:
            AmdSmiLibraryException: AMDSMI_STATUS_NO_DATA when none arrived in time.
        """
        return self.fake._read_events(int(timestamp), int(num_elem))

    def stop(self) -> None:
        self.fake._enter("amdsmi_stop_gpu_event_notification", self.processor_handle)
        with self.fake._cond:
            self.fake._masks.pop(self.processor_handle, None)

    def __enter__(self) -> "_EventReader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


_HOPS = {"PIX": 1, "PXB": 2, "PHB": 2, "NODE": 2, "SYS": 3}


class FakeAmdSmi:
    """Usable in place of the ``amdsmi`` module.

    Args:
        topology: AMD devices (handles in index order).
        compute_partition / memory_partition: what the partition calls answer.
    """

    AmdSmiException = AmdSmiException
    AmdSmiLibraryException = AmdSmiLibraryException
    AmdSmiLinkType = AmdSmiLinkType
    AmdSmiMemoryType = AmdSmiMemoryType
    AmdSmiInitFlags = AmdSmiInitFlags
    AmdSmiEvtNotificationType = AmdSmiEvtNotificationType
    AmdSmiMemoryPageStatus = AmdSmiMemoryPageStatus
    amdsmi_wrapper = types.SimpleNamespace(
        AMDSMI_STATUS_NOT_SUPPORTED=AMDSMI_STATUS_NOT_SUPPORTED, AMDSMI_STATUS_NOT_YET_IMPLEMENTED=3,
        AMDSMI_STATUS_NO_PERM=10, AMDSMI_STATUS_NO_DATA=AMDSMI_STATUS_NO_DATA, AMDSMI_STATUS_INIT_ERROR=AMDSMI_STATUS_INIT_ERROR,
        AMDSMI_STATUS_FILE_ERROR=AMDSMI_STATUS_FILE_ERROR, AMDSMI_STATUS_IO=AMDSMI_STATUS_IO,
        AMDSMI_STATUS_NOT_FOUND=AMDSMI_STATUS_NOT_FOUND, AMDSMI_STATUS_INVAL=AMDSMI_STATUS_INVAL)

    def __init__(self, topology: NodeTopology, compute_partition: str | None = "SPX", memory_partition: str | None = "NPS1",
                 *, driver_version: str | None = None, lib_version: tuple[int, int, int, int] | None = (24, 6, 2, 0)):
        self.topology = topology
        self.devices = sorted(topology.devices, key=lambda d: d.index)
        self.modes = (compute_partition, memory_partition)
        self.initialized = 0
        self.driver_version = driver_version if driver_version is not None else topology.driver
        self.lib_version = lib_version
        self._faults: dict[str, int] = {}
        self._pos = {d.index: i for i, d in enumerate(self.devices)}
        self._cond = threading.Condition()
        self._masks: dict[int, int] = {}  # handle -> event notification mask
        self._events: deque = deque()
        self._ecc = [0] * len(self.devices)
        self._pages: list[list[int]] = [[] for _ in self.devices]  # bad page statuses
        self._throttle = [(False, False)] * len(self.devices)
        self._lost: dict[int, int] = {}  # handle -> status every call about it raises
        self._p2p: dict[tuple[int, int], bool] = {}
        self.AmdSmiEventReader = lambda processor_handle, event_types: _EventReader(self, processor_handle, event_types)

    def fail(self, function: str, code: int) -> None:
        """Make ``function`` raise ``AmdSmiLibraryException(code)``."""
        self._faults[function] = code

    def _enter(self, fn: str, *handles: Any) -> list:
        if fn in self._faults:
            raise AmdSmiLibraryException(self._faults[fn])
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INIT_ERROR)
        for h in handles:
            if not isinstance(h, int) or not 0 <= h < len(self.devices):
                raise AmdSmiLibraryException(AMDSMI_STATUS_INVAL)
            if h in self._lost:
                raise AmdSmiLibraryException(self._lost[h])
        return [self.devices[h] for h in handles]

    def _handle(self, device: int) -> int:
        try:
            return self._pos[device]
        except (KeyError, TypeError):
            raise ValueError(f"no device {device!r} in this FakeAmdSmi (devices: {sorted(self._pos)})") from None

    # ------------------------------------------------------------ injection
    def inject_event(self, device: int, event: str, message: str = "") -> None:
        """Queue one amdsmi event (``"RING_HANG"``, ``"GPU_PRE_RESET"``, ``"VMFAULT"`` ...) for ``device``;
        it is delivered only while the device's event reader asks for that type.

        Raises:
            ValueError: unknown device or event name.
        """
        h = self._handle(device)
        try:
            t = AmdSmiEvtNotificationType[event]
        except KeyError:
            raise ValueError(f"unknown amdsmi event {event!r} (known: {[e.name for e in AmdSmiEvtNotificationType][1:]})") from None
        with self._cond:
            if self._masks.get(h, 0) & (1 << (int(t) - 1)):
                self._events.append({"processor_handle": h, "event": t.name, "message": message[:63]})
                self._cond.notify_all()

    def inject_hang(self, device: int) -> None:
        """A ring hang on ``device`` (RING_HANG event)."""
        self.inject_event(device, "RING_HANG", "ring gfx_0.0.0 timeout")

    def inject_reset(self, device: int) -> None:
        """The driver resets ``device`` (GPU_PRE_RESET then GPU_POST_RESET events)."""
        self.inject_event(device, "GPU_PRE_RESET")
        self.inject_event(device, "GPU_POST_RESET")

    def inject_ecc(self, device: int, count: int = 1) -> None:
        """Add ``count`` uncorrectable ECC errors to ``device``.

        Raises:
            ValueError: unknown device or ``count`` < 1.
        """
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"count must be an integer >= 1, not {count!r}")
        h = self._handle(device)
        with self._cond:
            self._ecc[h] += count

    def inject_retired_pending(self, device: int, pending: bool = True) -> None:
        """Add (or, with ``pending=False``, remove) a bad page pending retirement on ``device``."""
        self._set_pages(device, int(AmdSmiMemoryPageStatus.PENDING), pending)

    def inject_remap(self, device: int, pending: bool = True, failure: bool = False) -> None:
        """AMD's nearest equivalent of NVIDIA's row remapping: bad pages pending retirement and/or unreservable."""
        self._set_pages(device, int(AmdSmiMemoryPageStatus.PENDING), pending)
        self._set_pages(device, int(AmdSmiMemoryPageStatus.UNRESERVABLE), failure)

    def _set_pages(self, device: int, status: int, present: bool) -> None:
        h = self._handle(device)
        with self._cond:
            self._pages[h] = [s for s in self._pages[h] if s != status] + ([status] if present else [])

    def inject_throttle(self, device: int, thermal: bool = True, power: bool = False) -> None:
        """Set ``device``'s active thermal / power (PPT) violation flags."""
        h = self._handle(device)
        with self._cond:
            self._throttle[h] = (bool(thermal), bool(power))

    def lose(self, device: int, code: int = AMDSMI_STATUS_FILE_ERROR) -> None:
        """Make ``device`` disappear: every later call about it raises ``AmdSmiLibraryException(code)``."""
        h = self._handle(device)
        with self._cond:
            self._lost[h] = int(code)
            self._masks.pop(h, None)

    def set_p2p(self, a: int, b: int, accessible: bool) -> None:
        """What ``amdsmi_is_P2P_accessible`` answers between ``a`` and ``b`` (both ways)."""
        ha, hb = self._handle(a), self._handle(b)
        self._p2p[(ha, hb)] = self._p2p[(hb, ha)] = bool(accessible)

    def _read_events(self, timeout_ms: int, num_elem: int) -> list[dict]:
        self._enter("amdsmi_get_gpu_event_notification")
        deadline = time.monotonic() + max(0, timeout_ms) / 1000.0
        with self._cond:
            while not self._events:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AmdSmiLibraryException(AMDSMI_STATUS_NO_DATA)
                self._cond.wait(left)
            out = []
            while self._events and len(out) < max(1, num_elem):
                out.append(self._events.popleft())
            return out

    # ------------------------------------------------------------ health and doctor calls
    def amdsmi_get_gpu_total_ecc_count(self, h: int) -> dict:
        self._enter("amdsmi_get_gpu_total_ecc_count", h)
        return {"correctable_count": 0, "uncorrectable_count": self._ecc[h], "deferred_count": 0}

    def amdsmi_get_gpu_bad_page_info(self, h: int) -> list[dict]:
        self._enter("amdsmi_get_gpu_bad_page_info", h)
        return [{"value": i, "page_address": 0x1000 * (i + 1), "page_size": 4096, "status": s}
                for i, s in enumerate(self._pages[h])]

    def amdsmi_get_violation_status(self, h: int) -> dict:
        self._enter("amdsmi_get_violation_status", h)
        thermal, power = self._throttle[h]
        return {"active_prochot_thrm": False, "active_ppt_pwr": power, "active_socket_thrm": thermal,
                "active_vr_thrm": False, "active_hbm_thrm": "N/A"}

    def amdsmi_get_gpu_metrics_info(self, h: int) -> dict:
        self._enter("amdsmi_get_gpu_metrics_info", h)
        return {"throttle_status": any(self._throttle[h]), "temperature_hotspot": 60}

    def amdsmi_is_P2P_accessible(self, a: int, b: int) -> bool:
        da, db = self._enter("amdsmi_is_P2P_accessible", a, b)
        if (a, b) in self._p2p:
            return self._p2p[(a, b)]
        link = self.topology.link(da.index, db.index)
        return link is not None and (link.kind == "xgmi" or link.pcie in ("PIX", "PXB", "PHB", "NODE"))

    def amdsmi_get_lib_version(self) -> dict:
        self._enter("amdsmi_get_lib_version")
        v = self._known(self.lib_version)
        return {"year": v[0], "major": v[1], "minor": v[2], "release": v[3], "build": "fake"}

    @staticmethod
    def _known(value: Any) -> Any:
        if value is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return value

    def amdsmi_init(self, flags: int = AmdSmiInitFlags.INIT_AMD_GPUS) -> None:
        if "amdsmi_init" in self._faults:
            raise AmdSmiLibraryException(self._faults["amdsmi_init"])
        self.initialized += 1

    def amdsmi_shut_down(self) -> None:
        self.initialized -= 1

    def amdsmi_get_processor_handles(self) -> list[int]:
        self._enter("amdsmi_get_processor_handles")
        return list(range(len(self.devices)))

    def amdsmi_get_gpu_device_bdf(self, h: int) -> str:
        (d,) = self._enter("amdsmi_get_gpu_device_bdf", h)
        return self._known(d.pci_bus_id)

    def amdsmi_get_gpu_device_uuid(self, h: int) -> str:
        (d,) = self._enter("amdsmi_get_gpu_device_uuid", h)
        return self._known(d.uuid)

    def amdsmi_get_gpu_asic_info(self, h: int) -> dict:
        (d,) = self._enter("amdsmi_get_gpu_asic_info", h)
        return {"market_name": d.model or "N/A", "target_graphics_version": d.compute_capability or "N/A",
                "vendor_id": "0x1002"}

    def amdsmi_get_gpu_memory_total(self, h: int, mem_type: int) -> int:
        (d,) = self._enter("amdsmi_get_gpu_memory_total", h)
        return self._known(d.memory_bytes)

    def amdsmi_get_gpu_vram_info(self, h: int) -> dict:
        (d,) = self._enter("amdsmi_get_gpu_vram_info", h)
        return {"vram_type": "HBM3", "vram_size": (self._known(d.memory_bytes) >> 20)}

    def amdsmi_get_gpu_driver_info(self, h: int) -> dict:
        self._enter("amdsmi_get_gpu_driver_info", h)
        return {"driver_name": "amdgpu", "driver_version": self._known(self.driver_version)}

    def amdsmi_topo_get_numa_node_number(self, h: int) -> int:
        (d,) = self._enter("amdsmi_topo_get_numa_node_number", h)
        return self._known(d.numa_node)

    def amdsmi_get_gpu_compute_partition(self, h: int) -> str:
        self._enter("amdsmi_get_gpu_compute_partition", h)
        return self._known(self.modes[0])

    def amdsmi_get_gpu_memory_partition(self, h: int) -> str:
        self._enter("amdsmi_get_gpu_memory_partition", h)
        return self._known(self.modes[1])

    def _pair(self, fn: str, a: int, b: int):
        da, db = self._enter(fn, a, b)
        return self.topology.link(da.index, db.index)

    def amdsmi_topo_get_link_type(self, a: int, b: int) -> dict:
        link = self._pair("amdsmi_topo_get_link_type", a, b)
        if a == b:
            return {"hops": 0, "type": int(AmdSmiLinkType.AMDSMI_LINK_TYPE_INTERNAL)}
        if link is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        if link.kind == "xgmi":
            return {"hops": 1, "type": int(AmdSmiLinkType.AMDSMI_LINK_TYPE_XGMI)}
        return {"hops": _HOPS.get(link.pcie or "SYS", 3), "type": int(AmdSmiLinkType.AMDSMI_LINK_TYPE_PCIE)}

    def amdsmi_topo_get_link_weight(self, a: int, b: int) -> int:
        link = self._pair("amdsmi_topo_get_link_weight", a, b)
        if link is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return 15 if link.kind == "xgmi" else 40 if link.pcie in ("PIX", "PXB", "PHB") else 72

    def amdsmi_get_minmax_bandwidth_between_processors(self, a: int, b: int) -> dict:
        link = self._pair("amdsmi_get_minmax_bandwidth_between_processors", a, b)
        if link is None or link.kind != "xgmi" or link.count is None:
            raise AmdSmiLibraryException(AMDSMI_STATUS_NOT_SUPPORTED)
        return {"min_bandwidth": XGMI_LINK_MBPS // 2, "max_bandwidth": link.count * XGMI_LINK_MBPS}

    def write_sysfs(self, root: str | Path) -> Path:
        """Write ``bus/pci/devices/<bdf>/{numa_node,local_cpulist}`` for every device with a bus id."""
        root = Path(root)
        for d in self.devices:
            if not d.pci_bus_id:
                continue
            node = root / "bus" / "pci" / "devices" / d.pci_bus_id.lower()
            node.mkdir(parents=True, exist_ok=True)
            (node / "numa_node").write_text(f"{d.numa_node if d.numa_node is not None else -1}\n")
            if d.cpus:
                (node / "local_cpulist").write_text(_cpulist(d.cpus) + "\n")
        return root


def _cpulist(cpus: tuple[int, ...]) -> str:
    out, run = [], [cpus[0], cpus[0]]
    for c in cpus[1:]:
        if c == run[1] + 1:
            run[1] = c
        else:
            out.append(run)
            run = [c, c]
    out.append(run)
    return ",".join(f"{a}-{b}" if a != b else f"{a}" for a, b in out)
