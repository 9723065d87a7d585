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
* MIG: the profile table (``nvmlDeviceGetGpuInstanceProfileInfo`` by profile
  index, placements through ``nvmlDeviceGetGpuInstancePossiblePlacements`` filling
  a ctypes array), GPU instances and MIG device handles come from the devices'
  ``mig_profiles`` and ``partitions``.

Faults can be injected with :meth:`FakeNVML.fail` (e.g. a lost GPU, a timeout).
"""

from __future__ import annotations

import ctypes
import re
from dataclasses import dataclass, field
from typing import Any

from ..topology import Device, Link, MigProfile, NodeTopology, Partition

# ---------------------------------------------------------------- constants (values as in NVML)
NVML_SUCCESS = 0
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_NVLINK_MAX_LINKS = 36
NVML_NVLINK_DEVICE_TYPE_GPU = 0x00
NVML_NVLINK_DEVICE_TYPE_IBMNPU = 0x01
NVML_NVLINK_DEVICE_TYPE_SWITCH = 0x02
NVML_NVLINK_DEVICE_TYPE_UNKNOWN = 0xFF
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_GPU_INSTANCE_PROFILE_COUNT = 0x12

_ERRORS = {
    "UNINITIALIZED": 1, "INVALID_ARGUMENT": 2, "NOT_SUPPORTED": 3, "NO_PERMISSION": 4,
    "ALREADY_INITIALIZED": 5, "NOT_FOUND": 6, "INSUFFICIENT_SIZE": 7, "INSUFFICIENT_POWER": 8,
    "DRIVER_NOT_LOADED": 9, "TIMEOUT": 10, "IRQ_ISSUE": 11, "LIBRARY_NOT_FOUND": 12,
    "FUNCTION_NOT_FOUND": 13, "CORRUPTED_INFOROM": 14, "GPU_IS_LOST": 15, "RESET_REQUIRED": 16,
    "OPERATING_SYSTEM": 17, "LIB_RM_VERSION_MISMATCH": 18, "IN_USE": 19, "MEMORY": 20,
    "NO_DATA": 21, "UNKNOWN": 999,
}
for _n, _v in _ERRORS.items():
    globals()[f"NVML_ERROR_{_n}"] = _v


class NVMLError(Exception):
    """Like ``pynvml.NVMLError``: ``.value`` is the NVML return code;
    ``NVMLError(code)`` builds the matching subclass (``NVMLError_NotSupported`` ...)."""

    _by_value: dict[int, type] = {}

    def __new__(cls, value: int):
        if cls is NVMLError:
            cls = NVMLError._by_value.get(value, cls)
        obj = Exception.__new__(cls)
        obj.value = value
        return obj

    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        names = {v: k for k, v in _ERRORS.items()}
        return names.get(self.value, f"NVML error {self.value}").replace("_", " ").title()


_ERROR_CLASSES: dict[str, type] = {}
for _n, _v in _ERRORS.items():
    _cls_name = "NVMLError_" + "".join(p.capitalize() for p in _n.split("_"))
    _cls = type(_cls_name, (NVMLError,), {})
    NVMLError._by_value[_v] = _cls
    _ERROR_CLASSES[_cls_name] = _cls


# ---------------------------------------------------------------- ctypes structures (layouts as in nvidia-ml-py)
class c_nvmlGpuInstancePlacement_t(ctypes.Structure):
    _fields_ = [("start", ctypes.c_uint), ("size", ctypes.c_uint)]


class struct_c_nvmlGpuInstance_t(ctypes.Structure):
    pass


c_nvmlGpuInstance_t = ctypes.POINTER(struct_c_nvmlGpuInstance_t)


class c_nvmlGpuInstanceInfo_t(ctypes.Structure):
    _fields_ = [("device", ctypes.c_void_p), ("id", ctypes.c_uint), ("profileId", ctypes.c_uint),
                ("placement", c_nvmlGpuInstancePlacement_t)]


class c_nvmlGpuInstanceProfileInfo_v2_t(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint), ("id", ctypes.c_uint), ("isP2pSupported", ctypes.c_uint),
                ("sliceCount", ctypes.c_uint), ("instanceCount", ctypes.c_uint),
                ("multiprocessorCount", ctypes.c_uint), ("copyEngineCount", ctypes.c_uint),
                ("decoderCount", ctypes.c_uint), ("encoderCount", ctypes.c_uint), ("jpegCount", ctypes.c_uint),
                ("ofaCount", ctypes.c_uint), ("memorySizeMB", ctypes.c_ulonglong), ("name", ctypes.c_char * 96)]


class c_nvmlMemory_t(ctypes.Structure):
    _fields_ = [("total", ctypes.c_ulonglong), ("free", ctypes.c_ulonglong), ("used", ctypes.c_ulonglong)]


class nvmlPciInfo_t(ctypes.Structure):
    _fields_ = [("busIdLegacy", ctypes.c_char * 16), ("domain", ctypes.c_uint), ("bus", ctypes.c_uint),
                ("device", ctypes.c_uint), ("pciDeviceId", ctypes.c_uint), ("pciSubSystemId", ctypes.c_uint),
                ("busId", ctypes.c_char * 32)]


class c_nvmlDeviceAttributes(ctypes.Structure):
    _fields_ = [("multiprocessorCount", ctypes.c_uint), ("sharedCopyEngineCount", ctypes.c_uint),
                ("sharedDecoderCount", ctypes.c_uint), ("sharedEncoderCount", ctypes.c_uint),
                ("sharedJpegCount", ctypes.c_uint), ("sharedOfaCount", ctypes.c_uint),
                ("gpuInstanceSliceCount", ctypes.c_uint), ("computeInstanceSliceCount", ctypes.c_uint),
                ("memorySizeMB", ctypes.c_ulonglong)]


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


def _deref(ref: Any) -> Any:
    """The ctypes object behind ``byref(x)`` / ``pointer(x)`` / ``x``."""
    if hasattr(ref, "_obj"):
        return ref._obj
    if hasattr(ref, "contents"):
        return ref.contents
    return ref


@dataclass(frozen=True)
class _Handle:
    index: int
    mig: int | None = None  # MIG device slot on the parent, or None for the full GPU


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
    nvlinks: list[tuple[int, str]] = field(default_factory=list)  # (remote device type, remote bus id)
    profiles: dict[int, MigProfile] = field(default_factory=dict)  # profile index -> profile
    profile_ids: dict[str, int] = field(default_factory=dict)  # profile name -> profile id (incl. hidden)
    gpu_instances: dict[int, _GpuInstance] = field(default_factory=dict)
    mig_devices: list[Partition] = field(default_factory=list)


def _bus(domain: int, bus: int) -> str:
    return f"{domain:08X}:{bus:02X}:00.0"


def is_nvswitch_topology(topology: NodeTopology) -> bool:
    """True when FakeNVML models ``topology`` with NVSwitches: >= 4 GPUs, every pair
    joined by NVLink with one and the same known lane count."""
    n = len(topology.devices)
    links = [l for l in topology.links if l.kind == "nvlink"]
    counts = {l.count for l in links}
    return n >= 4 and len(links) == n * (n - 1) // 2 and len(counts) == 1 and None not in counts


class FakeNVML:
    """An object usable in place of the ``pynvml`` module, answering from ``topology``.

    Args:
        topology: NVIDIA devices (NVML indices are the devices in index order).

    Raises:
        ValueError: a device would need more than ``NVML_NVLINK_MAX_LINKS`` NVLinks.
    """

    def __init__(self, topology: NodeTopology):
        self.topology = topology
        self.initialized = 0
        self.calls: list[str] = []
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
        self._build_nvlinks(topology)
        for fd in self._devices:
            self._build_mig(fd)
        for name, cls in _ERROR_CLASSES.items():
            setattr(self, name, cls)

    # ------------------------------------------------------------ model building
    def _build_nvlinks(self, topology: NodeTopology) -> None:
        links = [l for l in topology.links if l.kind == "nvlink" and l.a in self._pos and l.b in self._pos]
        if is_nvswitch_topology(topology):
            lanes = links[0].count or 1
            for fd in self._devices:
                fd.nvlinks = [(NVML_NVLINK_DEVICE_TYPE_SWITCH, _bus(0, 0xE0 + l % 4)) for l in range(lanes)]
        else:
            for l in links:
                a, b = self._devices[self._pos[l.a]], self._devices[self._pos[l.b]]
                for _ in range(l.count or 1):
                    a.nvlinks.append((NVML_NVLINK_DEVICE_TYPE_GPU, b.bus_id))
                    b.nvlinks.append((NVML_NVLINK_DEVICE_TYPE_GPU, a.bus_id))
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

    def nvmlSystemGetDriverVersion(self) -> str:
        self._enter("nvmlSystemGetDriverVersion")
        return self._known(self.topology.driver)

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

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: _Handle) -> int:
        fd = self._enter("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if fd.device.health == "unknown":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if fd.device.health == "degraded" else NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle: _Handle) -> tuple[int, int, int, int]:
        fd = self._enter("nvmlDeviceGetRemappedRows", handle)
        if fd.device.health == "unknown":
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return (0, 0, 0, 1 if fd.device.health == "failed" else 0)

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
    def _nvlink(self, function: str, handle: _Handle, link: int) -> tuple[int, str] | None:
        fd = self._enter(function, handle)
        if not 0 <= link < NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not fd.nvlinks:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return fd.nvlinks[link] if link < len(fd.nvlinks) else None

    def nvmlDeviceGetNvLinkState(self, device: _Handle, link: int) -> int:
        return NVML_FEATURE_ENABLED if self._nvlink("nvmlDeviceGetNvLinkState", device, link) else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: _Handle, link: int) -> nvmlPciInfo_t:
        end = self._nvlink("nvmlDeviceGetNvLinkRemotePciInfo", device, link)
        if end is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return _pci_info(end[1])

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: _Handle, link: int) -> int:
        end = self._nvlink("nvmlDeviceGetNvLinkRemoteDeviceType", handle, link)
        return NVML_NVLINK_DEVICE_TYPE_UNKNOWN if end is None else end[0]

    # ------------------------------------------------------------ MIG
    def nvmlDeviceGetMigMode(self, device: _Handle) -> list[int]:
        fd = self._enter("nvmlDeviceGetMigMode", device)
        mode = int(self._known(fd.device.mig_mode))
        return [mode, mode]

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


def _pci_info(bus_id: str) -> nvmlPciInfo_t:
    domain, bus, rest = (bus_id.split(":") + ["0", "0", "0"])[:3]
    info = nvmlPciInfo_t(busId=bus_id.encode(), busIdLegacy=bus_id[-12:].encode())
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(rest.split(".")[0] or "0", 16)
    return info


# Module-level aliases so ``FakeNVML`` instances also carry the constants and types.
for _name, _value in list(globals().items()):
    if _name.startswith(("NVML_", "c_nvml", "nvmlPciInfo_t", "struct_c_nvml")) or _name == "NVMLError":
        setattr(FakeNVML, _name, _value)
