"""The ``nvidia`` backend: discovery through NVML (``pynvml`` from nvidia-ml-py).

What it asks NVML, per device ``i`` (handle ``h``):

* identity: ``nvmlDeviceGetName``, ``nvmlDeviceGetUUID``, ``nvmlDeviceGetPciInfo``
  (``busId``), ``nvmlDeviceGetMemoryInfo`` (``total``), ``nvmlDeviceGetCudaComputeCapability``;
* locality: ``nvmlDeviceGetNumaNodeId`` (falling back to
  ``<sysfs>/bus/pci/devices/<bus id>/numa_node``), ``nvmlDeviceGetCpuAffinity`` (bitmask -> CPU ids);
* health: ``failed`` when NVML says the GPU is lost (``NVML_ERROR_GPU_IS_LOST``, e.g.
  Xid 79) or ``nvmlDeviceGetRemappedRows`` reports a row-remapping failure;
  ``degraded`` when retired pages are pending (``nvmlDeviceGetRetiredPagesPendingStatus``)
  or remapped rows wait for a reset; else ``ok``. Xid events need an NVML event
  loop and are not checked by a one-shot discovery;
* NVLink: for each link ``nvmlDeviceGetNvLinkState``; active links ask
  ``nvmlDeviceGetNvLinkRemoteDeviceType`` and ``nvmlDeviceGetNvLinkRemotePciInfo``.
  A GPU peer adds a lane to that peer (matched by bus id). A SWITCH peer marks an
  NVSwitch system: every pair of GPUs that both reach switches is joined with
  ``min(lanes_a, lanes_b)`` lanes (go-gpuallocator misses these; HAMi's fix).
  ``nvmlDeviceGetNvLinkVersion`` gives the lane speed: NVLink 5.0 -> ``lane_gbps=50``,
  1.0 -> 20; others (2.x-4.x, or unknown) keep the table default (None). A pair gets a
  speed only when all active links of both devices report that one speed;
* PCIe: ``nvmlDeviceGetTopologyCommonAncestor`` for every pair (INTERNAL/SINGLE ->
  PIX, MULTIPLE -> PXB, HOSTBRIDGE -> PHB, NODE -> NODE, SYSTEM -> SYS), kept on
  NVLink links too;
* NVLink fabric: ``nvmlDeviceGetGpuFabricInfoV`` with struct ``nvmlGpuFabricInfo_v3``, then
  ``_v2`` (a driver that knows only v2 answers ARGUMENT_VERSION_MISMATCH), then the original
  ``nvmlDeviceGetGpuFabricInfo``: state, and once completed the cluster UUID, clique id, status
  and health mask (:class:`~rayaccel.topology.Fabric`). "Not supported" (before Hopper, no
  NVSwitch) or state NOT_SUPPORTED is no fabric, never an error;
* MIG: ``nvmlDeviceGetMigMode``; the profile table by profile index with
  ``nvmlDeviceGetGpuInstanceProfileInfo`` + ``nvmlDeviceGetGpuInstancePossiblePlacements``;
  GPU instances (``nvmlDeviceGetGpuInstances``, ``nvmlGpuInstanceGetInfo``) and MIG
  devices (``nvmlDeviceGetMaxMigDeviceCount``, ``nvmlDeviceGetMigDeviceHandleByIndex``,
  ``nvmlDeviceGetGpuInstanceId``, ``nvmlDeviceGetComputeInstanceId``, memory, SMs).

A fact NVML does not support (``NOT_SUPPORTED``, ``FUNCTION_NOT_FOUND``, ``NO_DATA``,
``NO_PERMISSION``, or a function missing from an older nvidia-ml-py) is ``None``.
Any other NVML error raises :class:`~rayaccel.errors.BackendError` naming the call
and the device. A lost GPU is reported as a ``failed`` device; the others are still
discovered.
"""

from __future__ import annotations

import ctypes
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import BackendError, BackendUnavailable
from ..topology import FABRIC_STATES, Device, Fabric, Link, MigProfile, NodeTopology, Partition
from .rayspec import NVIDIA
from .registry import BackendInfo

_INSTALL_HINT = "pip install nvidia-ml-py (or `pip install rayaccel`), on a machine with the NVIDIA driver"
_NO_DRIVER_HINT = "install the NVIDIA driver (libnvidia-ml.so), or set RAYACCEL_TOPOLOGY to simulate a machine"
_ABSENT = ("LIBRARY_NOT_FOUND", "DRIVER_NOT_LOADED")
_UNKNOWN = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_DATA", "NO_PERMISSION")
_LEVEL_TO_PCIE = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}
#: nvmlNvlinkVersion_t -> per-lane GB/s per direction, where it differs from the topology table's
#: NVLink default (25 GB/s, NVLink 2.x-4.x): NVML_NVLINK_VERSION_1_0 (P100) and _5_0 (Blackwell).
#: Note NVML numbers versions 1..7 for NVLink 1.0, 2.0, 2.2, 3.0, 3.1, 4.0, 5.0.
_NVLINK_VERSION_LANE_GBPS = {1: 20.0, 7: 50.0}
_MAX_MIG_PLACEMENTS = 32
_MAX_GPU_INSTANCES = 16
_MAX_GI_ID = 32  # GPU instance ids probed when the profile table cannot be read


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)):
        value = bytes(value).decode(errors="replace")
    return str(value).strip("\x00 ") or None


def _bus_key(bus_id: str | None) -> str | None:
    """``00000000:07:00.0`` / ``0000:07:00.0`` -> ``0000:07:00.0`` (sysfs form, lower case)."""
    if not bus_id:
        return None
    parts = bus_id.strip().lower().split(":")
    if len(parts) == 2:
        parts = ["0", *parts]
    if len(parts) != 3:
        return bus_id.strip().lower()
    try:
        return f"{int(parts[0], 16):04x}:{parts[1]}:{parts[2]}"
    except ValueError:
        return bus_id.strip().lower()


class _Lost(Exception):
    """NVML says a GPU fell off the bus (NVML_ERROR_GPU_IS_LOST)."""


@dataclass
class _Session:
    nvml: Any

    def code(self, name: str, default: int) -> int:
        return getattr(self.nvml, f"NVML_ERROR_{name}", default)

    def call(self, fn: str, *args: Any, device: int | None = None, unknown: tuple[str, ...] = ()) -> Any:
        """``nvml.<fn>(*args)``; None when the fact is not available.

        Raises:
            _Lost: the GPU is lost. BackendError: any other NVML error.
        """
        func = getattr(self.nvml, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.nvml.NVMLError as e:
            value = getattr(e, "value", None)
            defaults = {"NOT_SUPPORTED": 3, "FUNCTION_NOT_FOUND": 13, "NO_DATA": 21, "NO_PERMISSION": 4,
                        "INVALID_ARGUMENT": 2, "NOT_FOUND": 6, "ARGUMENT_VERSION_MISMATCH": 25}
            if value in {self.code(n, defaults.get(n, -1)) for n in _UNKNOWN + unknown}:
                return None
            if value == self.code("GPU_IS_LOST", 15):
                raise _Lost(device) from None
            where = f"device {device}" if device is not None else "the system"
            raise BackendError(f"{fn} failed for {where}: {e} (NVML error {value})", backend="nvidia") from None


class NvidiaBackend:
    """Discovers NVIDIA GPUs through NVML.

    Args:
        nvml: an object with nvidia-ml-py's ``pynvml`` API (e.g.
            :class:`~rayaccel.testing.fakenvml.FakeNVML`); None imports ``pynvml`` lazily.
        sysfs_root: where ``bus/pci/devices/<bus>/numa_node`` is read when NVML
            cannot tell a device's NUMA node.
    """

    name = "nvidia"
    #: How NVIDIA GPUs appear to Ray (``GPU``, ``CUDA_VISIBLE_DEVICES``, Ray's NVML-name rule).
    ray_spec = NVIDIA

    def __init__(self, nvml: Any = None, *, sysfs_root: str | Path = "/sys"):
        self._nvml = nvml
        self._sysfs = Path(sysfs_root)

    # ------------------------------------------------------------ availability
    def _module(self) -> Any:
        if self._nvml is None:
            try:
                import pynvml  # nvidia-ml-py
            except ImportError as e:
                raise BackendUnavailable(self.name, f"pynvml is not importable ({e})", _INSTALL_HINT) from None
            self._nvml = pynvml
        return self._nvml

    def _init(self, nvml: Any) -> None:
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            value = getattr(e, "value", None)
            if value in {getattr(nvml, f"NVML_ERROR_{n}", d) for n, d in zip(_ABSENT, (12, 9))}:
                raise BackendUnavailable(self.name, f"no NVIDIA driver: nvmlInit failed: {e}", _NO_DRIVER_HINT) from None
            raise BackendError(f"nvmlInit failed: {e} (NVML error {value})", backend=self.name) from None
        except OSError as e:  # some pynvml versions surface a missing libnvidia-ml.so this way
            raise BackendUnavailable(self.name, f"no NVIDIA driver: {e}", _NO_DRIVER_HINT) from None

    def available(self) -> BackendInfo:
        """Imports pynvml, initialises NVML and counts devices (no other queries)."""
        try:
            nvml = self._module()
            self._init(nvml)
        except BackendUnavailable as e:
            return BackendInfo(self.name, False, e.reason, e.hint)
        except BackendError as e:
            return BackendInfo(self.name, False, str(e), None)
        try:
            count = _Session(nvml).call("nvmlDeviceGetCount")
        except (BackendError, _Lost) as e:
            return BackendInfo(self.name, False, f"nvmlDeviceGetCount failed: {e}", None)
        finally:
            nvml.nvmlShutdown()
        if not count:
            return BackendInfo(self.name, False, "the NVIDIA driver is loaded but NVML sees no GPU",
                               "check CUDA_VISIBLE_DEVICES / container GPU access (e.g. --gpus all)")
        return BackendInfo(self.name, True)

    # ------------------------------------------------------------ discovery
    def discover(self) -> NodeTopology:
        """This node's NVIDIA GPUs, links and MIG layout.

        Raises:
            BackendUnavailable: pynvml or the driver is missing.
            BackendError: an NVML call failed (names the call and the device).
        """
        nvml = self._module()
        self._init(nvml)
        try:
            return self._discover(_Session(nvml))
        finally:
            nvml.nvmlShutdown()

    def _discover(self, s: _Session) -> NodeTopology:
        count = s.call("nvmlDeviceGetCount") or 0
        devices: list[Device] = []
        handles: dict[int, Any] = {}
        for i in range(count):
            dev, h = self._device(s, i)
            devices.append(dev)
            if h is not None and dev.health != "failed":
                handles[i] = h
        links = self._links(s, devices, handles)
        return NodeTopology(
            devices=tuple(devices),
            links=tuple(links),
            hostname=socket.gethostname(),
            driver=_text(s.call("nvmlSystemGetDriverVersion")),
            sources=("nvml",),
        ).validate()

    def _device(self, s: _Session, i: int) -> tuple[Device, Any]:
        facts: dict[str, Any] = {"index": i, "vendor": "nvidia"}
        h = None
        try:
            h = s.call("nvmlDeviceGetHandleByIndex", i, device=i)
            if h is None:
                return Device(index=i, health="unknown"), None
            facts["model"] = _text(s.call("nvmlDeviceGetName", h, device=i))
            facts["uuid"] = _text(s.call("nvmlDeviceGetUUID", h, device=i))
            pci = s.call("nvmlDeviceGetPciInfo", h, device=i)
            facts["pci_bus_id"] = _text(pci.busId) if pci is not None else None
            mem = s.call("nvmlDeviceGetMemoryInfo", h, device=i)
            facts["memory_bytes"] = int(mem.total) if mem is not None else None
            facts["numa_node"] = self._numa(s, h, i, facts["pci_bus_id"])
            facts["cpus"] = self._cpus(s, h, i)
            cc = s.call("nvmlDeviceGetCudaComputeCapability", h, device=i)
            facts["compute_capability"] = f"{cc[0]}.{cc[1]}" if cc else None
            facts["health"] = self._health(s, h, i)
            facts["fabric"] = self._fabric(s, h, i)
            mode = s.call("nvmlDeviceGetMigMode", h, device=i)
            facts["mig_mode"] = None if mode is None else bool(mode[0])
            profiles = self._mig_profiles(s, h, i)
            facts["mig_profiles"] = tuple(profiles)
            if facts["mig_mode"] is not False:
                facts["partitions"] = tuple(self._partitions(s, h, i, {p.id: p for p in profiles}))
        except _Lost:
            facts["health"] = "failed"
            facts.pop("partitions", None)
        return Device(**facts), h

    def _numa(self, s: _Session, h: Any, i: int, bus_id: str | None) -> int | None:
        node = s.call("nvmlDeviceGetNumaNodeId", h, device=i)
        if node is not None and node >= 0:
            return int(node)
        key = _bus_key(bus_id)
        if key is None:
            return None
        try:
            value = int((self._sysfs / "bus" / "pci" / "devices" / key / "numa_node").read_text().strip())
        except (OSError, ValueError):
            return None
        return value if value >= 0 else None

    def _cpus(self, s: _Session, h: Any, i: int) -> tuple[int, ...] | None:
        words = max(128, -(-(os.cpu_count() or 1) // 64))  # >= 8192 CPUs
        mask = s.call("nvmlDeviceGetCpuAffinity", h, words, device=i)
        if mask is None:
            return None
        cpus = tuple(w * 64 + b for w in range(words) for b in range(64) if (int(mask[w]) >> b) & 1)
        return cpus or None

    def _health(self, s: _Session, h: Any, i: int) -> str:
        rows = s.call("nvmlDeviceGetRemappedRows", h, device=i)
        if rows is not None and rows[3]:
            return "failed"
        pending = s.call("nvmlDeviceGetRetiredPagesPendingStatus", h, device=i)
        if pending or (rows is not None and rows[2]):
            return "degraded"
        return "ok"

    # ------------------------------------------------------------ NVLink fabric
    #: (struct, function) pairs, newest first: v3 adds healthSummary, v2 healthMask; the original has neither.
    _FABRIC_CALLS = (("c_nvmlGpuFabricInfo_v3_t", "nvmlDeviceGetGpuFabricInfoV"),
                     ("c_nvmlGpuFabricInfo_v2_t", "nvmlDeviceGetGpuFabricInfoV"),
                     ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo"))

    def _fabric(self, s: _Session, h: Any, i: int) -> Fabric | None:
        for struct, fn in self._FABRIC_CALLS:
            cls = getattr(s.nvml, struct, None)
            if cls is None or getattr(s.nvml, fn, None) is None:
                continue
            info = cls()
            if s.call(fn, h, ctypes.byref(info), device=i, unknown=("ARGUMENT_VERSION_MISMATCH",)) is None:
                continue  # not supported here, or this struct version is unknown to the driver: try the next
            return _fabric_of(info)
        return None

    # ------------------------------------------------------------ MIG
    def _mig_profiles(self, s: _Session, h: Any, i: int) -> list[MigProfile]:
        nvml = s.nvml
        out: list[tuple[int, MigProfile]] = []
        for idx in range(getattr(nvml, "NVML_GPU_INSTANCE_PROFILE_COUNT", 0x12)):
            info = s.call("nvmlDeviceGetGpuInstanceProfileInfo", h, idx, device=i, unknown=("INVALID_ARGUMENT", "NOT_FOUND"))
            if info is None or not info.instanceCount:
                continue
            arr = (nvml.c_nvmlGpuInstancePlacement_t * _MAX_MIG_PLACEMENTS)()
            n = ctypes.c_uint(_MAX_MIG_PLACEMENTS)
            ok = s.call("nvmlDeviceGetGpuInstancePossiblePlacements", h, info.id, arr, ctypes.byref(n),
                        device=i, unknown=("INVALID_ARGUMENT",))
            starts = tuple(sorted(arr[k].start for k in range(n.value))) if ok is not None else ()
            size = arr[0].size if ok is not None and n.value else info.sliceCount
            out.append((int(info.sliceCount), MigProfile(
                name=_profile_name(info), id=int(info.id), max_instances=int(info.instanceCount),
                memory_mib=int(info.memorySizeMB) or None, placements=starts, slots=int(size),
                sms=int(info.multiprocessorCount) or None)))
        # the order of `nvidia-smi mig -lgip`: by compute slices, then memory, then name
        out.sort(key=lambda sp: (sp[0], sp[1].memory_mib or 0, sp[1].name))
        return [p for _, p in out]

    def _gi_info(self, s: _Session, gi: Any, i: int) -> tuple[int, int, int | None, int | None] | None:
        info = s.call("nvmlGpuInstanceGetInfo", gi, device=i, unknown=("INVALID_ARGUMENT",))
        if info is None:
            return None
        return int(info.id), int(info.profileId), int(info.placement.start), int(info.placement.size)

    def _partitions(self, s: _Session, h: Any, i: int, profiles: dict[int, MigProfile]) -> list[Partition]:
        nvml = s.nvml
        gis: dict[int, tuple[int, int, int | None, int | None]] = {}
        for pid in profiles:
            arr = (nvml.c_nvmlGpuInstance_t * _MAX_GPU_INSTANCES)()
            n = ctypes.c_uint(_MAX_GPU_INSTANCES)
            if s.call("nvmlDeviceGetGpuInstances", h, pid, arr, ctypes.byref(n), device=i, unknown=("INVALID_ARGUMENT",)) is None:
                continue
            for k in range(n.value):
                info = self._gi_info(s, arr[k], i)
                if info is not None:
                    gis[info[0]] = info
        if not profiles:  # no profile table to enumerate by: probe instance ids instead
            for gi_id in range(_MAX_GI_ID):
                handle = s.call("nvmlDeviceGetGpuInstanceById", h, gi_id, device=i, unknown=("NOT_FOUND", "INVALID_ARGUMENT"))
                info = self._gi_info(s, handle, i) if handle is not None else None
                if info is not None:
                    gis[info[0]] = info
        names = {pid: p.name for pid, p in profiles.items()}

        def profile_name(pid: int) -> str | None:
            if pid not in names:
                info = s.call("nvmlDeviceGetGpuInstanceProfileInfoById", h, pid, device=i, unknown=("INVALID_ARGUMENT", "NOT_FOUND"))
                names[pid] = _profile_name(info) if info is not None else None
            return names[pid]
        parts: list[Partition] = []
        seen_gi: set[int] = set()
        for k in range(s.call("nvmlDeviceGetMaxMigDeviceCount", h, device=i) or 0):
            mh = s.call("nvmlDeviceGetMigDeviceHandleByIndex", h, k, device=i, unknown=("NOT_FOUND", "INVALID_ARGUMENT"))
            if mh is None:
                continue
            gi_id = s.call("nvmlDeviceGetGpuInstanceId", mh, device=i)
            gi = gis.get(gi_id) if gi_id is not None else None
            if gi is None and gi_id is not None:
                handle = s.call("nvmlDeviceGetGpuInstanceById", h, gi_id, device=i, unknown=("NOT_FOUND", "INVALID_ARGUMENT"))
                gi = self._gi_info(s, handle, i) if handle is not None else None
            if gi_id is not None:
                seen_gi.add(gi_id)
            mem = s.call("nvmlDeviceGetMemoryInfo", mh, device=i)
            attrs = s.call("nvmlDeviceGetAttributes", mh, device=i)
            profile = profile_name(gi[1]) if gi is not None else None
            if profile is None:
                name = _text(s.call("nvmlDeviceGetName", mh, device=i)) or ""
                profile = name.rsplit("MIG ", 1)[1].strip() if "MIG " in name else "unknown"
            parts.append(Partition(
                parent=i, profile=profile, uuid=_text(s.call("nvmlDeviceGetUUID", mh, device=i)), gi_id=gi_id,
                ci_id=s.call("nvmlDeviceGetComputeInstanceId", mh, device=i),
                start=gi[2] if gi else None, size=gi[3] if gi else None,
                memory_bytes=int(mem.total) if mem is not None else None,
                sms=int(attrs.multiprocessorCount) if attrs is not None else None))
        for gi_id, (_, pid, start, size) in sorted(gis.items()):
            if gi_id not in seen_gi:  # a GPU instance with no compute instance (no MIG device yet)
                parts.append(Partition(parent=i, profile=profile_name(pid) or f"profile-{pid}", gi_id=gi_id, start=start, size=size))
        return parts

    # ------------------------------------------------------------ links
    def _links(self, s: _Session, devices: list[Device], handles: dict[int, Any]) -> list[Link]:
        nvml = s.nvml
        by_bus = {_bus_key(d.pci_bus_id): d.index for d in devices if d.pci_bus_id}
        gpu_t = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_GPU", 0)
        switch_t = getattr(nvml, "NVML_NVLINK_DEVICE_TYPE_SWITCH", 2)
        enabled = getattr(nvml, "NVML_FEATURE_ENABLED", 1)
        lanes: dict[int, dict[int, int]] = {i: {} for i in handles}
        speeds: dict[int, set[float | None]] = {i: set() for i in handles}  # per-lane GB/s of each active link
        to_switch: dict[int, int] = {}
        lost: set[int] = set()
        for i, h in handles.items():
            try:
                for link in range(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18)):
                    state = s.call("nvmlDeviceGetNvLinkState", h, link, device=i, unknown=("INVALID_ARGUMENT",))
                    if state != enabled:
                        continue
                    version = s.call("nvmlDeviceGetNvLinkVersion", h, link, device=i, unknown=("INVALID_ARGUMENT",))
                    speeds[i].add(_NVLINK_VERSION_LANE_GBPS.get(version) if isinstance(version, int) else None)
                    kind = s.call("nvmlDeviceGetNvLinkRemoteDeviceType", h, link, device=i, unknown=("INVALID_ARGUMENT",))
                    if kind == switch_t:
                        to_switch[i] = to_switch.get(i, 0) + 1
                        continue
                    pci = s.call("nvmlDeviceGetNvLinkRemotePciInfo", h, link, device=i, unknown=("INVALID_ARGUMENT",))
                    peer = by_bus.get(_bus_key(_text(pci.busId))) if pci is not None else None
                    if peer is not None and peer != i and kind in (gpu_t, None):
                        lanes[i][peer] = lanes[i].get(peer, 0) + 1
            except _Lost:
                lost.add(i)
        alive = sorted(set(handles) - lost)
        links = []
        for x, a in enumerate(alive):
            for b in alive[x + 1:]:
                ab, ba = lanes[a].get(b), lanes[b].get(a)
                count = min(ab, ba) if ab and ba else (ab or ba or 0)
                if a in to_switch and b in to_switch:
                    count += min(to_switch[a], to_switch[b])
                pcie = self._pcie(s, handles[a], handles[b], a, b)
                if count:
                    same = speeds[a] | speeds[b]
                    links.append(Link(a, b, "nvlink", count, pcie, next(iter(same)) if len(same) == 1 else None))
                elif pcie is not None:
                    links.append(Link(a, b, "pcie", None, pcie))
        return links

    def _pcie(self, s: _Session, ha: Any, hb: Any, a: int, b: int) -> str | None:
        try:
            level = s.call("nvmlDeviceGetTopologyCommonAncestor", ha, hb, device=a)
        except _Lost:
            return None
        return _LEVEL_TO_PCIE.get(level) if level is not None else None


def _fabric_of(info: Any) -> Fabric | None:
    """A :class:`Fabric` from an ``nvmlGpuFabricInfo*`` struct (None for state NOT_SUPPORTED).

    The cluster UUID, clique id and status are kept only once registration completed: NVML says
    the status "must be checked only if state returns complete", and the others are zeros until then.
    A health mask of 0 (every field NOT_SUPPORTED) is kept as None: the driver reports no health.
    """
    state = int(info.state)
    if not 0 < state < len(FABRIC_STATES):  # NOT_SUPPORTED, or a state newer than this code knows
        return None
    name = FABRIC_STATES[state]
    mask = int(info.healthMask) if hasattr(info, "healthMask") else None
    mask = mask or None  # 0: every health field NOT_SUPPORTED, i.e. the driver reports no health
    if name != "completed":
        return Fabric(state=name, health_mask=mask)
    return Fabric(state=name, cluster_uuid=str(uuid.UUID(bytes=bytes(info.clusterUuid))), clique_id=int(info.cliqueId),
                  status=int(info.status), health_mask=mask)


def _profile_name(info: Any) -> str:
    """``"MIG 3g.40gb"`` -> ``"3g.40gb"``; a v1 struct without a name gets ``<slices>g.<GiB>gb``."""
    name = _text(getattr(info, "name", None))
    if name:
        return name[4:].strip() if name.startswith("MIG ") else name
    return f"{info.sliceCount}g.{round(int(info.memorySizeMB) / 1024)}gb"
