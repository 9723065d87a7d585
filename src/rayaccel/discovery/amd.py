"""The ``amd`` backend: discovery through AMD SMI's Python API (``amdsmi``).

What it asks amdsmi, per GPU handle:

* identity: ``amdsmi_get_gpu_device_bdf``, ``amdsmi_get_gpu_device_uuid``,
  ``amdsmi_get_gpu_asic_info`` (``market_name``, ``target_graphics_version`` ->
  ``compute_capability`` such as ``gfx942``), memory from
  ``amdsmi_get_gpu_memory_total(h, VRAM)`` (bytes) or ``amdsmi_get_gpu_vram_info``
  (``vram_size`` / ``vram_size_mb``, MiB);
* locality: ``amdsmi_topo_get_numa_node_number`` (sysfs ``numa_node`` as fallback) and
  the PCI device's ``local_cpulist`` in sysfs (amdsmi has no CPU-affinity call);
* links, per pair: ``amdsmi_topo_get_link_type`` (``{"hops", "type"}``; the type is
  read with the module's own enum, ``AmdSmiLinkType`` or the older ``AmdSmiIoLinkType``),
  ``amdsmi_topo_get_link_weight`` (used only when the type is unknown: weight 15 =
  one xGMI hop) and ``amdsmi_get_minmax_bandwidth_between_processors`` (xGMI lanes =
  max bandwidth / :data:`XGMI_LINK_MBPS`, None when not reported). PCIe class, as the
  ``rocm-smi --showtopo`` importer does it: different NUMA nodes -> SYS, else 1 hop ->
  PIX, 2 -> PHB, more -> SYS;
* partitions: ``amdsmi_get_gpu_compute_partition`` / ``amdsmi_get_gpu_memory_partition``
  (SPX/CPX..., NPS1/NPS4...), kept in :meth:`AmdBackend.partition_modes`: in a
  non-SPX mode amdsmi already lists each partition as its own processor handle.

``NOT_SUPPORTED``/``NOT_YET_IMPLEMENTED``/``NO_PERM`` answers are ``None``; any
other amdsmi error raises :class:`~rayaccel.errors.BackendError` naming the call and device.
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

from ..errors import BackendError, BackendUnavailable
from ..topology import Device, Link, NodeTopology, make_link
from .rayspec import AMD
from .registry import BackendInfo

#: Modeled max bandwidth of one xGMI link as amdsmi reports it, MB/s.
XGMI_LINK_MBPS = 64_000
_INSTALL_HINT = "pip install amdsmi (the version matching your ROCm), on a machine with ROCm and the amdgpu driver"
_NO_DRIVER_HINT = "load the amdgpu driver / install ROCm, or set RAYACCEL_TOPOLOGY to simulate a machine"
_UNKNOWN_STATUS = {"AMDSMI_STATUS_NOT_SUPPORTED": 2, "AMDSMI_STATUS_NOT_YET_IMPLEMENTED": 3, "AMDSMI_STATUS_NO_PERM": 10}


def parse_cpulist(text: str) -> tuple[int, ...] | None:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``; empty -> None.

    Raises:
        ValueError: not a CPU list.
    """
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        cpus.extend(range(int(lo), int(hi or lo) + 1))
    return tuple(cpus) or None


class _Lib:
    def __init__(self, amdsmi: Any):
        self.m = amdsmi
        wrapper = getattr(amdsmi, "amdsmi_wrapper", None)
        self.unknown = {getattr(wrapper, k, v) for k, v in _UNKNOWN_STATUS.items()}
        self.exc = getattr(amdsmi, "AmdSmiException", Exception)

    def call(self, fn: str, *args: Any, device: int | None = None) -> Any:
        func = getattr(self.m, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.exc as e:
            code = e.get_error_code() if hasattr(e, "get_error_code") else getattr(e, "err_code", None)
            if code in self.unknown:
                return None
            where = f"device {device}" if device is not None else "the system"
            raise BackendError(f"{fn} failed for {where}: {e} (amdsmi status {code})", backend="amd") from None


class AmdBackend:
    """Discovers AMD Instinct/Radeon GPUs through amdsmi.

    Args:
        amdsmi: an object with amdsmi's Python API (e.g.
            :class:`~rayaccel.testing.fakeamdsmi.FakeAmdSmi`); None imports ``amdsmi`` lazily.
        sysfs_root: where ``bus/pci/devices/<bdf>/{numa_node,local_cpulist}`` are read.
    """

    name = "amd"
    #: How its GPUs appear to Ray (``GPU``, ``HIP_VISIBLE_DEVICES``, Ray's device-id naming).
    ray_spec = AMD

    def __init__(self, amdsmi: Any = None, *, sysfs_root: str | Path = "/sys"):
        self._amdsmi = amdsmi
        self._sysfs = Path(sysfs_root)
        self._modes: dict[int, tuple[str | None, str | None]] = {}

    def _module(self) -> Any:
        if self._amdsmi is None:
            try:
                import amdsmi
            except (ImportError, OSError) as e:  # the wheel loads libamd_smi.so at import
                raise BackendUnavailable(self.name, f"amdsmi is not importable ({e})", _INSTALL_HINT) from None
            self._amdsmi = amdsmi
        return self._amdsmi

    def _init(self, lib: _Lib) -> None:
        flags = getattr(getattr(lib.m, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
        try:
            lib.m.amdsmi_init(flags) if flags is not None else lib.m.amdsmi_init()
        except (lib.exc, OSError) as e:
            raise BackendUnavailable(self.name, f"amdsmi_init failed (no amdgpu driver?): {e}", _NO_DRIVER_HINT) from None

    def available(self) -> BackendInfo:
        """Imports amdsmi, initialises it and lists processor handles."""
        try:
            lib = _Lib(self._module())
            self._init(lib)
        except BackendUnavailable as e:
            return BackendInfo(self.name, False, e.reason, e.hint)
        try:
            handles = lib.call("amdsmi_get_processor_handles")
        except BackendError as e:
            return BackendInfo(self.name, False, str(e), None)
        finally:
            lib.m.amdsmi_shut_down()
        if not handles:
            return BackendInfo(self.name, False, "amdsmi sees no AMD GPU", "check HIP_VISIBLE_DEVICES / container device access")
        return BackendInfo(self.name, True)

    def partition_modes(self) -> dict[int, tuple[str | None, str | None]]:
        """(compute, memory) partition mode of each device from the last :meth:`discover`."""
        return dict(self._modes)

    def discover(self) -> NodeTopology:
        """This node's AMD GPUs and their xGMI/PCIe links.

        Raises:
            BackendUnavailable: amdsmi or the driver is missing.
            BackendError: an amdsmi call failed (names the call and the device).
        """
        lib = _Lib(self._module())
        self._init(lib)
        try:
            handles = list(lib.call("amdsmi_get_processor_handles") or [])
            devices = [self._device(lib, i, h) for i, h in enumerate(handles)]
            links = [l for a in range(len(handles)) for b in range(a + 1, len(handles))
                     if (l := self._link(lib, a, b, handles, devices)) is not None]
            drv = lib.call("amdsmi_get_gpu_driver_info", handles[0], device=0) if handles else None
            return NodeTopology(devices=tuple(devices), links=tuple(links), hostname=socket.gethostname(),
                                driver=(drv or {}).get("driver_version") or None, sources=("amdsmi",)).validate()
        finally:
            lib.m.amdsmi_shut_down()

    def _sysfs_read(self, bdf: str | None, name: str) -> str | None:
        if not bdf:
            return None
        try:
            return (self._sysfs / "bus" / "pci" / "devices" / bdf.lower() / name).read_text().strip()
        except OSError:
            return None

    def _device(self, lib: _Lib, i: int, h: Any) -> Device:
        bdf = lib.call("amdsmi_get_gpu_device_bdf", h, device=i)
        asic = lib.call("amdsmi_get_gpu_asic_info", h, device=i) or {}
        vram = getattr(getattr(lib.m, "AmdSmiMemoryType", None), "VRAM", None)
        memory = lib.call("amdsmi_get_gpu_memory_total", h, vram, device=i) if vram is not None else None
        if not memory:
            info = lib.call("amdsmi_get_gpu_vram_info", h, device=i) or {}
            mib = info.get("vram_size", info.get("vram_size_mb"))
            memory = int(mib) << 20 if isinstance(mib, int) and mib > 0 else None
        numa = lib.call("amdsmi_topo_get_numa_node_number", h, device=i)
        if numa is None or numa < 0:
            raw = self._sysfs_read(bdf, "numa_node")
            numa = int(raw) if raw and raw.lstrip("-").isdigit() and int(raw) >= 0 else None
        raw_cpus = self._sysfs_read(bdf, "local_cpulist")
        try:
            cpus = parse_cpulist(raw_cpus) if raw_cpus else None
        except ValueError:
            cpus = None
        self._modes[i] = (lib.call("amdsmi_get_gpu_compute_partition", h, device=i) or None,
                          lib.call("amdsmi_get_gpu_memory_partition", h, device=i) or None)
        return Device(index=i, vendor="amd", model=_str(asic.get("market_name")),
                      uuid=_str(lib.call("amdsmi_get_gpu_device_uuid", h, device=i)), pci_bus_id=_str(bdf),
                      memory_bytes=memory, numa_node=numa, cpus=cpus,
                      compute_capability=_str(asic.get("target_graphics_version")))

    def _link_kind(self, lib: _Lib, value: Any) -> str | None:
        new = getattr(lib.m, "AmdSmiLinkType", None)
        if new is not None:
            table = {getattr(new, "AMDSMI_LINK_TYPE_XGMI", None): "xgmi", getattr(new, "AMDSMI_LINK_TYPE_PCIE", None): "pcie"}
        else:
            old = getattr(lib.m, "AmdSmiIoLinkType", None)
            table = {getattr(old, "XGMI", None): "xgmi", getattr(old, "PCIEXPRESS", None): "pcie"}
        table.pop(None, None)
        return table.get(int(value)) if value is not None else None

    def _link(self, lib: _Lib, a: int, b: int, handles: list[Any], devices: list[Device]) -> Link | None:
        ha, hb = handles[a], handles[b]
        lt = lib.call("amdsmi_topo_get_link_type", ha, hb, device=a) or {}
        kind, hops = self._link_kind(lib, lt.get("type")), lt.get("hops")
        if kind is None:
            weight = lib.call("amdsmi_topo_get_link_weight", ha, hb, device=a)
            if weight is None:
                return None
            kind = "xgmi" if weight == 15 else "pcie"
        if kind == "xgmi":
            bw = lib.call("amdsmi_get_minmax_bandwidth_between_processors", ha, hb, device=a) or {}
            mbps = bw.get("max_bandwidth") or 0
            return make_link(a, b, "xgmi", max(1, round(mbps / XGMI_LINK_MBPS)) if mbps > 0 else None)
        na, nb = devices[a].numa_node, devices[b].numa_node
        if na is not None and nb is not None and na != nb:
            cls = "SYS"
        elif hops is not None:
            cls = "PIX" if hops <= 1 else "PHB" if hops == 2 else "SYS"
        else:
            cls = "SYS"
        return make_link(a, b, "pcie", None, cls)


def _str(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    value = str(value).strip()
    return value if value and value.upper() != "N/A" else None
