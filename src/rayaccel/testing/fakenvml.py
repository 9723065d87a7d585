"""A fake NVML that answers nvidia-ml-py's calls from a :class:`NodeTopology`.

``NvidiaBackend(nvml=FakeNVML(topology)).discover()`` runs the real backend code
with no GPU and no patching (httpx's ``MockTransport`` idea). The fake exposes
the same function names, constants, ctypes structures and error classes as the
``pynvml`` module of nvidia-ml-py, and behaves like NVML where it matters:

* calls before ``nvmlInit()`` raise ``NVML_ERROR_UNINITIALIZED``;
* a fact the topology does not know (``None``) raises ``NVML_ERROR_NOT_SUPPORTED``;
* NVLink: an all-to-all topology of >= 4 GPUs with one lane count everywhere is
  modeled as an NVSwitch system (every link's remote device type is
  ``NVML_NVLINK_DEVICE_TYPE_SWITCH`` and its remote PCI id is a switch's), so
  the backend has to take its switch path; anything else gets direct GPU peers;
  ``nvmlDeviceGetNvLinkVersion`` answers the version whose per-lane speed is the
  link's (``Link.lane_gbps`` 50 -> NVLink 5.0, 20 -> 1.0, None = the table default -> 4.0);
* NVLink fabric: ``nvmlDeviceGetGpuFabricInfoV`` (struct v2 and v3; another version gets
  ARGUMENT_VERSION_MISMATCH) and the original ``nvmlDeviceGetGpuFabricInfo`` answer from each
  device's ``fabric`` (cluster UUID, clique, state, status, health mask), NOT_SUPPORTED where it
  has none;
* MIG: the profile table (``nvmlDeviceGetGpuInstanceProfileInfo`` by profile
  index, placements through ``nvmlDeviceGetGpuInstancePossiblePlacements`` filling
  a ctypes array), GPU instances and MIG device handles come from the devices'
  ``mig_profiles`` and ``partitions``.

Faults can be injected with :meth:`FakeNVML.fail` (e.g. a lost GPU, a timeout). Health
conditions (Xid events, ECC, row remapping, retired pages, throttling, NVLink down, a lost
GPU), the NVML event API and the facts ``rayaccel doctor`` reads (driver/CUDA/NVML
versions, persistence, pending MIG mode, fabric overrides, P2P status) come from
:class:`~rayaccel.testing._fakenvml_ops.FakeNVMLOps`, whose docstring lists every injection. The processes on
each device, their memory and utilisation (``nvmlDeviceGetComputeRunningProcesses``,
``nvmlDeviceGetProcessesUtilizationInfo``) come from :class:`~rayaccel.testing._fakenvml_usage.FakeNVMLUsage`
(:meth:`set_process_usage`).
"""

from __future__ import annotations

import ctypes
import re
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rayaccel.topology import Device, Link, MigProfile, NodeTopology, Partition
from rayaccel.discovery import _nvml_api
from rayaccel.testing._fakenvml_handles import _deref, _Handle, is_nvswitch_topology
from rayaccel.testing._fakenvml_mig import CONSTANTS as _MIG_CONSTANTS, FakeNVMLMig
from rayaccel.testing._fakenvml_ops import FakeNVMLOps
from rayaccel.testing._fakenvml_usage import FakeNVMLUsage
from rayaccel.discovery._nvml_api import (
    NVMLError, NVML_ERROR_INSUFFICIENT_SIZE, NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND,
    NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_UNINITIALIZED, NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED,
    NVML_GPU_INSTANCE_PROFILE_COUNT, NVML_NVLINK_DEVICE_TYPE_GPU, NVML_NVLINK_DEVICE_TYPE_SWITCH,
    NVML_NVLINK_DEVICE_TYPE_UNKNOWN, NVML_NVLINK_MAX_LINKS, NVML_NVLINK_VERSION_1_0,
    NVML_NVLINK_VERSION_4_0, NVML_NVLINK_VERSION_5_0, NVML_SUCCESS, NVML_TOPOLOGY_HOSTBRIDGE,
    NVML_TOPOLOGY_INTERNAL, NVML_TOPOLOGY_MULTIPLE, NVML_TOPOLOGY_NODE, NVML_TOPOLOGY_SINGLE,
    NVML_TOPOLOGY_SYSTEM, c_nvmlDeviceAttributes, c_nvmlGpuInstanceInfo_t, c_nvmlGpuInstancePlacement_t,
    c_nvmlGpuInstanceProfileInfo_v2_t, c_nvmlGpuInstance_t, c_nvmlMemory_t, nvmlPciInfo_t,
    _ERROR_CLASSES, _pci_info,
)

# Re-export pynvml's whole surface (constants, error classes, structures) from this module too,
# as ``pynvml`` does: ``fakenvml.NVML_ERROR_TIMEOUT``.
globals().update({n: getattr(_nvml_api, n) for n in _nvml_api.__all__})

_PCIE_TO_LEVEL = {"PIX": NVML_TOPOLOGY_SINGLE, "PXB": NVML_TOPOLOGY_MULTIPLE, "PHB": NVML_TOPOLOGY_HOSTBRIDGE,
                  "NODE": NVML_TOPOLOGY_NODE, "SYS": NVML_TOPOLOGY_SYSTEM}
_PROFILE_NAME = re.compile(r"^(\d+)g\.\d+gb(.*)$")
# (compute slices, suffix) -> NVML_GPU_INSTANCE_PROFILE_* index
_PROFILE_INDEX = {(1, ""): 0x0, (2, ""): 0x1, (3, ""): 0x2, (4, ""): 0x3, (7, ""): 0x4, (8, ""): 0x5, (6, ""): 0x6,
                  (1, "+me"): 0x7, (2, "+me"): 0x8, (1, "+gfx"): 0xA, (2, "+gfx"): 0xB, (4, "+gfx"): 0xC,
                  (1, "-me"): 0xD, (2, "-me"): 0xE, (1, "+me.all"): 0xF, (2, "+me.all"): 0x10, (3, "+gfx"): 0x11}


def _profile_index(p: MigProfile) -> int | None:
    m = _PROFILE_NAME.match(p.name)
    if not m:
        return None
    g, suffix = int(m.group(1)), m.group(2)
    if g == 1 and suffix == "" and p.slots > 1:
        return 0x9  # NVML_GPU_INSTANCE_PROFILE_1_SLICE_REV2 (e.g. 1g.10gb on A100-40GB)
    return _PROFILE_INDEX.get((g, suffix))


@dataclass
class _GpuInstance:
    gi_id: int
    profile_id: int
    start: int | None
    size: int | None


@dataclass
class _FakeDevice:
    device: Device
    bus_id: str
    nvlinks: list[tuple[int, str, int]] = field(default_factory=list)  # (remote type, remote bus id, version)
    profiles: dict[int, MigProfile] = field(default_factory=dict)  # profile index -> profile
    profile_ids: dict[str, int] = field(default_factory=dict)  # profile name -> profile id (incl. hidden)
    gpu_instances: dict[int, _GpuInstance] = field(default_factory=dict)
    mig_devices: list[Partition] = field(default_factory=list)


def _bus(domain: int, bus: int) -> str:
    return f"{domain:08X}:{bus:02X}:00.0"


#: ``Link.lane_gbps`` -> the nvmlNvlinkVersion_t a link of that per-lane speed reports
#: (None: the table default of 25 GB/s, NVLink 2.x-4.x; 4.0 is reported).
_VERSION_OF_LANE_GBPS = {None: NVML_NVLINK_VERSION_4_0, 50.0: NVML_NVLINK_VERSION_5_0, 20.0: NVML_NVLINK_VERSION_1_0}


def _nvlink_version(link: Link) -> int:
    try:
        return _VERSION_OF_LANE_GBPS[link.lane_gbps]
    except KeyError:
        raise ValueError(f"link {link.a}-{link.b}: no NVLink version runs {link.lane_gbps} GB/s per lane "
                         f"(NVML reports 20, 25 or 50)") from None


#: How many of the latest calls :attr:`FakeNVML.calls` keeps (a simulated node polls for as long as it runs).
CALLS_KEPT = 10_000


class FakeNVML(FakeNVMLMig, FakeNVMLOps, FakeNVMLUsage):
    """An object usable in place of the ``pynvml`` module, answering from ``topology``.

    Args:
        topology: NVIDIA devices (NVML indices are the devices in index order).
        driver_version: what ``nvmlSystemGetDriverVersion`` answers (default: ``topology.driver``;
            None there too: NOT_SUPPORTED).
        cuda_driver_version: ``nvmlSystemGetCudaDriverVersion_v2`` (e.g. 12040 for CUDA 12.4); default:
            the CUDA version of the driver's branch (:data:`~._fakenvml_ops.DRIVER_CUDA`).
        nvml_version: ``nvmlSystemGetNVMLVersion``; default ``"<CUDA major>.<driver>"`` as NVML reports it.

    Raises:
        ValueError: a device would need more than ``NVML_NVLINK_MAX_LINKS`` NVLinks, or an
            NVLink has a per-lane speed no NVLink version has.
    """

    def __init__(self, topology: NodeTopology, *, driver_version: str | None = None,
                 cuda_driver_version: int | None = None, nvml_version: str | None = None):
        self.topology = topology
        self.initialized = 0
        #: names of the latest :data:`CALLS_KEPT` NVML calls, oldest first
        self.calls: deque[str] = deque(maxlen=CALLS_KEPT)
        self._faults: dict[tuple[str, int | None], int] = {}
        devs = sorted(topology.devices, key=lambda d: d.index)
        self._pos = {d.index: i for i, d in enumerate(devs)}
        taken = {d.pci_bus_id for d in devs if d.pci_bus_id}
        self._devices = []
        for i, d in enumerate(devs):
            bus = d.pci_bus_id or _bus(0xFA00, 0x10 + i)
            while bus in taken and not d.pci_bus_id:
                bus = _bus(0xFA01, 0x10 + i)
            self._devices.append(_FakeDevice(d, bus))
        self._gi_cls = _GpuInstance
        #: MIG UUIDs a process runs on (destroying their compute instance is IN_USE)
        self.mig_in_use: set[str] = set()
        self._build_nvlinks(topology)
        for fd in self._devices:
            self._build_mig(fd)
        for name, cls in _ERROR_CLASSES.items():
            setattr(self, name, cls)
        self._init_ops(driver_version, cuda_driver_version, nvml_version)

    # ------------------------------------------------------------ model building
    def _build_nvlinks(self, topology: NodeTopology) -> None:
        links = [l for l in topology.links if l.kind == "nvlink" and l.a in self._pos and l.b in self._pos]
        if is_nvswitch_topology(topology):
            lanes = links[0].count or 1
            version = _nvlink_version(links[0])
            for fd in self._devices:
                fd.nvlinks = [(NVML_NVLINK_DEVICE_TYPE_SWITCH, _bus(0, 0xE0 + l % 4), version) for l in range(lanes)]
        else:
            for l in links:
                a, b = self._devices[self._pos[l.a]], self._devices[self._pos[l.b]]
                version = _nvlink_version(l)
                for _ in range(l.count or 1):
                    a.nvlinks.append((NVML_NVLINK_DEVICE_TYPE_GPU, b.bus_id, version))
                    b.nvlinks.append((NVML_NVLINK_DEVICE_TYPE_GPU, a.bus_id, version))
        for fd in self._devices:
            if len(fd.nvlinks) > NVML_NVLINK_MAX_LINKS:
                raise ValueError(f"device {fd.device.index}: {len(fd.nvlinks)} NVLinks exceed NVML_NVLINK_MAX_LINKS")

    def _build_mig(self, fd: _FakeDevice) -> None:
        free = [i for i in range(NVML_GPU_INSTANCE_PROFILE_COUNT)]
        pending = []
        for p in fd.device.mig_profiles:
            idx = _profile_index(p)
            if idx is None or idx not in free:
                pending.append(p)
                continue
            free.remove(idx)
            fd.profiles[idx] = p
        for p in pending:  # unknown or clashing names get the first unused index
            fd.profiles[free.pop(0)] = p
        fd.profile_ids = {p.name: p.id for p in fd.device.mig_profiles}
        hidden = 1000
        used_gi = {p.gi_id for p in fd.device.partitions if p.gi_id is not None}
        next_gi = 1
        for part in fd.device.partitions:
            if part.profile not in fd.profile_ids:
                fd.profile_ids[part.profile] = hidden
                hidden += 1
            gi = part.gi_id
            if gi is None and part.uuid is None:  # an instance with no MIG device needs some id
                while next_gi in used_gi:
                    next_gi += 1
                gi = next_gi
                used_gi.add(gi)
            if gi is not None and gi not in fd.gpu_instances:
                fd.gpu_instances[gi] = _GpuInstance(gi, fd.profile_ids[part.profile], part.start, part.size)
            if part.uuid is not None:
                fd.mig_devices.append(part)

    # ------------------------------------------------------------ helpers
    def fail(self, function: str, error: int = 999, device: int | None = None) -> None:
        """Make ``function`` raise ``NVMLError(error)`` from now on.

        Args:
            function: an nvml* name, or ``"*"`` for every call about ``device``.
            error: the NVML return code (e.g. ``NVML_ERROR_GPU_IS_LOST``).
            device: the topology device index the fault applies to; None for all.
        """
        self._faults[(function, device)] = error

    def _enter(self, function: str, handle: _Handle | None = None) -> _FakeDevice | None:
        self.calls.append(function)
        fd = None
        if isinstance(handle, _Handle) and 0 <= handle.index < len(self._devices):
            fd = self._devices[handle.index]
        idx = fd.device.index if fd else None
        code = self._faults.get((function, idx), self._faults.get((function, None)))
        if code is None and fd is not None:
            code = self._faults.get(("*", idx))
        if code is not None:
            raise NVMLError(code)
        if not self.initialized and function not in ("nvmlInit", "nvmlInitWithFlags"):
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if handle is not None and fd is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return fd

    @staticmethod
    def _known(value: Any) -> Any:
        if value is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return value

    def _mig(self, fd: _FakeDevice, handle: _Handle) -> Partition:
        return fd.mig_devices[handle.mig]  # type: ignore[index]

    # ------------------------------------------------------------ init / system
    def nvmlInit(self) -> None:
        self._enter("nvmlInit")
        self.initialized += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._enter("nvmlShutdown")
        self.initialized -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._enter("nvmlDeviceGetCount")
        return len(self._devices)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        self._enter("nvmlDeviceGetHandleByIndex", _Handle(index))
        return _Handle(index)

    # ------------------------------------------------------------ per device
    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        fd = self._enter("nvmlDeviceGetName", handle)
        model = self._known(fd.device.model)
        return f"{model} MIG {self._mig(fd, handle).profile}" if handle.mig is not None else model

    def nvmlDeviceGetUUID(self, handle: _Handle) -> str:
        fd = self._enter("nvmlDeviceGetUUID", handle)
        return self._known(self._mig(fd, handle).uuid if handle.mig is not None else fd.device.uuid)

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> nvmlPciInfo_t:
        fd = self._enter("nvmlDeviceGetPciInfo", handle)
        return _pci_info(fd.bus_id)

    nvmlDeviceGetPciInfo_v3 = nvmlDeviceGetPciInfo

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle, version: int | None = None) -> c_nvmlMemory_t:
        fd = self._enter("nvmlDeviceGetMemoryInfo", handle)
        total = self._mig(fd, handle).memory_bytes if handle.mig is not None else fd.device.memory_bytes
        return c_nvmlMemory_t(total=self._known(total), free=self._known(total), used=0)

    def nvmlDeviceGetNumaNodeId(self, handle: _Handle) -> int:
        fd = self._enter("nvmlDeviceGetNumaNodeId", handle)
        return self._known(fd.device.numa_node)

    def nvmlDeviceGetCpuAffinity(self, handle: _Handle, cpuSetSize: int) -> Any:
        fd = self._enter("nvmlDeviceGetCpuAffinity", handle)
        cpus = fd.device.cpus
        if not cpus:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        words = (ctypes.c_ulonglong * cpuSetSize)()
        for c in cpus:
            if c // 64 < cpuSetSize:
                words[c // 64] |= 1 << (c % 64)
        return words

    def nvmlDeviceGetCudaComputeCapability(self, handle: _Handle) -> tuple[int, int]:
        fd = self._enter("nvmlDeviceGetCudaComputeCapability", handle)
        major, _, minor = self._known(fd.device.compute_capability).partition(".")
        return int(major), int(minor or 0)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: _Handle, device2: _Handle) -> int:
        a = self._enter("nvmlDeviceGetTopologyCommonAncestor", device1)
        b = self._enter("nvmlDeviceGetTopologyCommonAncestor", device2)
        if a is b:
            return NVML_TOPOLOGY_INTERNAL
        link: Link | None = self.topology.link(a.device.index, b.device.index)
        if link is None or link.pcie is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _PCIE_TO_LEVEL[link.pcie]

    # ------------------------------------------------------------ NVLink
    def _nvlink(self, function: str, handle: _Handle, link: int) -> tuple[int, str, int] | None:
        fd = self._enter(function, handle)
        if not 0 <= link < NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not fd.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return fd.nvlinks[link] if link < len(fd.nvlinks) else None

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        end = self._nvlink("nvmlDeviceGetNvLinkState", device, link)
        return NVML_FEATURE_ENABLED if end and link not in self._ops[device.index].nvlink_down else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: _Handle, link: int) -> nvmlPciInfo_t:
        end = self._nvlink("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if end is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(end[1])

    def nvmlDeviceGetNvLinkVersion(self, device: _Handle, link: int) -> int:
        end = self._nvlink("nvmlDeviceGetNvLinkVersion", device, link)
        if end is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return end[2]

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        end = self._nvlink("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return NVML_NVLINK_DEVICE_TYPE_UNKNOWN if end is None else end[0]

    # ------------------------------------------------------------ MIG
    def nvmlDeviceGetGpuInstanceProfileInfo(self, device: _Handle, profile: int, version: int = 2) -> Any:
        fd = self._enter("nvmlDeviceGetGpuInstanceProfileInfo", device)
        if not 0 <= profile < NVML_GPU_INSTANCE_PROFILE_COUNT:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        p = fd.profiles.get(profile)
        if p is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        m = _PROFILE_NAME.match(p.name)
        return c_nvmlGpuInstanceProfileInfo_v2_t(
            version=0x02000098, id=p.id, isP2pSupported=0, sliceCount=int(m.group(1)) if m else p.slots,
            instanceCount=p.max_instances, multiprocessorCount=p.sms or 0, memorySizeMB=p.memory_mib or 0,
            name=f"MIG {p.name}".encode())

    nvmlDeviceGetGpuInstanceProfileInfoV = nvmlDeviceGetGpuInstanceProfileInfo

    def nvmlDeviceGetGpuInstanceProfileInfoById(self, device: _Handle, profileId: int) -> Any:
        fd = self._enter("nvmlDeviceGetGpuInstanceProfileInfoById", device)
        for idx, p in fd.profiles.items():
            if p.id == profileId:
                return self.nvmlDeviceGetGpuInstanceProfileInfo(device, idx)
        name = next((n for n, i in fd.profile_ids.items() if i == profileId), None)
        if name is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return c_nvmlGpuInstanceProfileInfo_v2_t(version=0x02000098, id=profileId, name=f"MIG {name}".encode())

    nvmlDeviceGetGpuInstanceProfileInfoByIdV = nvmlDeviceGetGpuInstanceProfileInfoById

    def _profile_by_id(self, fd: _FakeDevice, profile_id: int) -> MigProfile | None:
        return next((p for p in fd.profiles.values() if p.id == profile_id), None)

    def nvmlDeviceGetGpuInstancePossiblePlacements(self, device: _Handle, profileId: int, placementsRef: Any, countRef: Any) -> int:
        fd = self._enter("nvmlDeviceGetGpuInstancePossiblePlacements", device)
        p = self._profile_by_id(fd, profileId)
        if p is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        count = _deref(countRef)
        if placementsRef is None or count.value < len(p.placements):
            count.value = len(p.placements)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, start in enumerate(p.placements):
            placementsRef[i].start, placementsRef[i].size = start, p.slots
        count.value = len(p.placements)
        return NVML_SUCCESS

    def _gi_handle(self, fd: _FakeDevice, gi: _GpuInstance) -> Any:
        token = (self._devices.index(fd) + 1) << 16 | (gi.gi_id + 1)
        return ctypes.cast(ctypes.c_void_p(token), c_nvmlGpuInstance_t)

    def nvmlDeviceGetGpuInstances(self, device: _Handle, profileId: int, gpuInstancesRef: Any, countRef: Any) -> int:
        fd = self._enter("nvmlDeviceGetGpuInstances", device)
        if not fd.device.mig_mode and fd.device.mig_mode is not None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        found = [gi for gi in fd.gpu_instances.values() if gi.profile_id == profileId]
        count = _deref(countRef)
        if count.value < len(found):
            count.value = len(found)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, gi in enumerate(found):
            gpuInstancesRef[i] = self._gi_handle(fd, gi)
        count.value = len(found)
        return NVML_SUCCESS

    def nvmlDeviceGetGpuInstanceById(self, device: _Handle, gpuInstanceId: int) -> Any:
        fd = self._enter("nvmlDeviceGetGpuInstanceById", device)
        gi = fd.gpu_instances.get(gpuInstanceId)
        if gi is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return self._gi_handle(fd, gi)

    def nvmlGpuInstanceGetInfo(self, gpuInstance: Any) -> c_nvmlGpuInstanceInfo_t:
        self._enter("nvmlGpuInstanceGetInfo")
        token = ctypes.cast(gpuInstance, ctypes.c_void_p).value or 0
        fd_pos, gi_id = (token >> 16) - 1, (token & 0xFFFF) - 1
        if not 0 <= fd_pos < len(self._devices) or gi_id not in self._devices[fd_pos].gpu_instances:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        gi = self._devices[fd_pos].gpu_instances[gi_id]
        if gi.start is None or gi.size is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return c_nvmlGpuInstanceInfo_t(id=gi.gi_id, profileId=gi.profile_id,
                                       placement=c_nvmlGpuInstancePlacement_t(gi.start, gi.size))

    def nvmlDeviceGetMaxMigDeviceCount(self, device: _Handle) -> int:
        fd = self._enter("nvmlDeviceGetMaxMigDeviceCount", device)
        return max(7, len(fd.mig_devices)) if fd.device.mig_mode is not False else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: _Handle, index: int) -> _Handle:
        fd = self._enter("nvmlDeviceGetMigDeviceHandleByIndex", device)
        if not 0 <= index < len(fd.mig_devices):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(device.index, index)

    def nvmlDeviceGetGpuInstanceId(self, device: _Handle) -> int:
        fd = self._enter("nvmlDeviceGetGpuInstanceId", device)
        if device.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._known(self._mig(fd, device).gi_id)

    def nvmlDeviceGetComputeInstanceId(self, device: _Handle) -> int:
        fd = self._enter("nvmlDeviceGetComputeInstanceId", device)
        if device.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._known(self._mig(fd, device).ci_id)

    def nvmlDeviceGetAttributes(self, device: _Handle) -> c_nvmlDeviceAttributes:
        fd = self._enter("nvmlDeviceGetAttributes", device)
        part = self._mig(fd, device) if device.mig is not None else None
        sms = part.sms if part is not None else None
        return c_nvmlDeviceAttributes(multiprocessorCount=self._known(sms))

    nvmlDeviceGetAttributes_v2 = nvmlDeviceGetAttributes


# Module-level aliases so ``FakeNVML`` instances also carry the constants and types.
for _name, _value in list(globals().items()):
    if _name.startswith(("NVML_", "c_nvml", "nvmlPciInfo_t", "struct_c_nvml", "nvmlEvent", "nvmlClocks",
                         "nvmlGpuFabricInfo_v")) or _name == "NVMLError":
        setattr(FakeNVML, _name, _value)
for _name, _value in _MIG_CONSTANTS.items():
    setattr(FakeNVML, _name, _value)
