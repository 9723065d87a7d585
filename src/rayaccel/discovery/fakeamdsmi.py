"""A fake ``amdsmi`` module answering from a :class:`NodeTopology` (for tests and demos).

``AmdBackend(amdsmi=FakeAmdSmi(topology)).discover()`` runs the real backend
code. Shapes follow amdsmi's Python API: ``amdsmi_topo_get_link_type`` returns
``{"hops": int, "type": int}`` (type from ``AmdSmiLinkType``), bandwidths come as
``{"min_bandwidth", "max_bandwidth"}`` in MB/s, failures raise
``AmdSmiLibraryException`` with ``get_error_code()``. Unknown facts (``None`` in the
topology) raise ``AMDSMI_STATUS_NOT_SUPPORTED``. CPU lists live in sysfs, not in
amdsmi; :meth:`FakeAmdSmi.write_sysfs` writes them into a directory tree.
"""

from __future__ import annotations

import types
from enum import IntEnum
from pathlib import Path
from typing import Any

from ..topology import NodeTopology
from .amd import XGMI_LINK_MBPS

AMDSMI_STATUS_NOT_SUPPORTED = 2
AMDSMI_STATUS_INIT_ERROR = 18


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
    amdsmi_wrapper = types.SimpleNamespace(AMDSMI_STATUS_NOT_SUPPORTED=AMDSMI_STATUS_NOT_SUPPORTED,
                                           AMDSMI_STATUS_NOT_YET_IMPLEMENTED=3, AMDSMI_STATUS_NO_PERM=10)

    def __init__(self, topology: NodeTopology, compute_partition: str | None = "SPX", memory_partition: str | None = "NPS1"):
        self.topology = topology
        self.devices = sorted(topology.devices, key=lambda d: d.index)
        self.modes = (compute_partition, memory_partition)
        self.initialized = 0
        self._faults: dict[str, int] = {}

    def fail(self, function: str, code: int) -> None:
        """Make ``function`` raise ``AmdSmiLibraryException(code)``."""
        self._faults[function] = code

    def _enter(self, fn: str, *handles: Any) -> list:
        if fn in self._faults:
            raise AmdSmiLibraryException(self._faults[fn])
        if not self.initialized:
            raise AmdSmiLibraryException(AMDSMI_STATUS_INIT_ERROR)
        return [self.devices[h] for h in handles]

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
        return {"driver_name": "amdgpu", "driver_version": self._known(self.topology.driver)}

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
