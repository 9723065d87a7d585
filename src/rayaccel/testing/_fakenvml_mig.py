"""FakeNVML's MIG re-partitioning: GPU and compute instances created and destroyed by NVML's rules.

The calls NVIDIA's tools make to re-partition a GPU in MIG mode (``nvidia-smi mig -cgi/-cci/-dci/-dgi``,
the DRA driver's ``DynamicMIG``, mig-parted), answered from the device's profile table
(``Device.mig_profiles``: ids, placements ``{starts}:size`` in memory slices out of 8, max instances):

* ``nvmlDeviceCreateGpuInstanceWithPlacement(device, profileId, placement)``: the placement's start must
  be one of the profile's and its size the profile's slices (else ``INVALID_ARGUMENT``); its slices may
  overlap no existing GPU instance, the profile's count stays within ``max_instances`` and the compute
  slices (the ``Ng`` of the name) within 7 (else ``INSUFFICIENT_RESOURCES``); the GPU must be in MIG
  mode (else ``NOT_SUPPORTED``). ``nvmlDeviceCreateGpuInstance`` takes the lowest start that fits.
* ``nvmlDeviceGetGpuInstanceRemainingCapacity``: how many more instances of a profile fit now.
* ``nvmlGpuInstanceGetComputeInstanceProfileInfo`` / ``nvmlGpuInstanceCreateComputeInstance``: one
  compute instance spanning the GPU instance (the profiles Ray and the device plugin use); it is the
  MIG device (``nvmlDeviceGetMigDeviceHandleByIndex``, a new ``MIG-`` UUID).
* ``nvmlComputeInstanceDestroy`` (``IN_USE`` while :attr:`FakeNVMLMig.mig_in_use` names its UUID: a
  process runs there) and ``nvmlGpuInstanceDestroy`` (``IN_USE`` while it has a compute instance).
"""

from __future__ import annotations

import ctypes
import re
import uuid as _uuid
from typing import Any

from rayaccel.discovery._nvml_api import (
    NVMLError, NVML_ERROR_IN_USE, NVML_ERROR_INSUFFICIENT_RESOURCES, NVML_ERROR_INSUFFICIENT_SIZE,
    NVML_ERROR_INVALID_ARGUMENT, NVML_ERROR_NOT_FOUND, NVML_ERROR_NOT_SUPPORTED, NVML_SUCCESS,
)
from rayaccel.testing._fakenvml_handles import _deref
from rayaccel.topology import MigProfile, Partition

_SLICES = 8
_COMPUTE = 7
#: NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE (index) by compute slices, as nvidia-ml-py numbers them.
CI_PROFILE_OF_SLICES = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED = 0x0
MIB = 1 << 20


class struct_c_nvmlComputeInstance_t(ctypes.Structure):
    pass


c_nvmlComputeInstance_t = ctypes.POINTER(struct_c_nvmlComputeInstance_t)


class c_nvmlComputeInstanceProfileInfo_t(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint), ("sliceCount", ctypes.c_uint), ("instanceCount", ctypes.c_uint),
                ("multiprocessorCount", ctypes.c_uint), ("sharedCopyEngineCount", ctypes.c_uint),
                ("sharedDecoderCount", ctypes.c_uint), ("sharedEncoderCount", ctypes.c_uint),
                ("sharedJpegCount", ctypes.c_uint), ("sharedOfaCount", ctypes.c_uint)]


CONSTANTS = {f"NVML_COMPUTE_INSTANCE_PROFILE_{n}_SLICE": v for n, v in CI_PROFILE_OF_SLICES.items()}
CONSTANTS["NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED"] = NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED
CONSTANTS["c_nvmlComputeInstance_t"] = c_nvmlComputeInstance_t
CONSTANTS["c_nvmlComputeInstanceProfileInfo_t"] = c_nvmlComputeInstanceProfileInfo_t


def compute_slices(profile: str) -> int:
    """The ``N`` of ``"Ng.<mem>gb"`` (0 when the name has none)."""
    m = re.match(r"(\d+)g\.", profile)
    return int(m.group(1)) if m else 0


class FakeNVMLMig:
    """The re-partitioning calls (mixed into :class:`~rayaccel.testing.FakeNVML`; see the module docstring)."""

    _devices: list
    _gi_cls: type
    mig_in_use: set

    def _enter(self, function: str, handle: Any = None) -> Any:  # pragma: no cover - FakeNVML's
        raise NotImplementedError

    # ------------------------------------------------------------ helpers
    def _gi_of(self, gpu_instance: Any, function: str) -> tuple[Any, Any]:
        self._enter(function)
        token = ctypes.cast(gpu_instance, ctypes.c_void_p).value or 0
        pos, gi_id = (token >> 16) - 1, (token & 0xFFFF) - 1
        if not 0 <= pos < len(self._devices) or gi_id not in self._devices[pos].gpu_instances:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._devices[pos], self._devices[pos].gpu_instances[gi_id]

    def _ci_handle(self, fd: Any, gi_id: int, ci_id: int) -> Any:
        token = (self._devices.index(fd) + 1) << 24 | (gi_id + 1) << 8 | (ci_id + 1)
        return ctypes.cast(ctypes.c_void_p(token), c_nvmlComputeInstance_t)

    def _profile(self, fd: Any, profile_id: int) -> MigProfile:
        p = next((p for p in fd.profiles.values() if p.id == profile_id), None)
        if p is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return p

    @staticmethod
    def _name_of(fd: Any, profile_id: int) -> str | None:
        return next((n for n, i in fd.profile_ids.items() if i == profile_id), None)

    def _fits(self, fd: Any, p: MigProfile, start: int) -> bool:
        span = set(range(start, start + p.slots))
        if start not in p.placements or start + p.slots > _SLICES:
            return False
        used, comp, same = set(), 0, 0
        for gi in fd.gpu_instances.values():
            if gi.start is None or gi.size is None:
                return False  # an instance of unknown placement: nothing is known to be free
            used |= set(range(gi.start, gi.start + gi.size))
            comp += compute_slices(self._name_of(fd, gi.profile_id) or "")
            same += gi.profile_id == p.id
        return not span & used and comp + compute_slices(p.name) <= _COMPUTE and same < p.max_instances

    def _check_mode(self, fd: Any) -> None:
        if fd.device.mig_mode is not True:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)

    # ------------------------------------------------------------ GPU instances
    def nvmlDeviceGetGpuInstanceRemainingCapacity(self, device: Any, profileId: int) -> int:
        fd = self._enter("nvmlDeviceGetGpuInstanceRemainingCapacity", device)
        self._check_mode(fd)
        p = self._profile(fd, profileId)
        made: list = []
        try:
            for start in sorted(p.placements):
                if self._fits(fd, p, start):
                    gi = self._gi_cls(-1 - len(made), p.id, start, p.slots)
                    fd.gpu_instances[gi.gi_id] = gi
                    made.append(gi.gi_id)
            return len(made)
        finally:
            for k in made:
                del fd.gpu_instances[k]

    def nvmlDeviceCreateGpuInstanceWithPlacement(self, device: Any, profileId: int, placement: Any) -> Any:
        fd = self._enter("nvmlDeviceCreateGpuInstanceWithPlacement", device)
        self._check_mode(fd)
        p = self._profile(fd, profileId)
        pl = _deref(placement)
        if int(pl.start) not in p.placements or int(pl.size) != p.slots:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        if not self._fits(fd, p, int(pl.start)):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._new_gi(fd, p, int(pl.start))

    def nvmlDeviceCreateGpuInstance(self, device: Any, profileId: int) -> Any:
        fd = self._enter("nvmlDeviceCreateGpuInstance", device)
        self._check_mode(fd)
        p = self._profile(fd, profileId)
        start = next((s for s in sorted(p.placements) if self._fits(fd, p, s)), None)
        if start is None:
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        return self._new_gi(fd, p, start)

    def _new_gi(self, fd: Any, p: MigProfile, start: int) -> Any:
        gi_id = next(i for i in range(1, 1 << 15) if i not in fd.gpu_instances)
        gi = self._gi_cls(gi_id, p.id, start, p.slots)
        fd.gpu_instances[gi_id] = gi
        return self._gi_handle(fd, gi)  # type: ignore[attr-defined]

    def nvmlGpuInstanceDestroy(self, gpuInstance: Any) -> None:
        fd, gi = self._gi_of(gpuInstance, "nvmlGpuInstanceDestroy")
        if any(part.gi_id == gi.gi_id for part in fd.mig_devices):
            raise NVMLError(NVML_ERROR_IN_USE)
        del fd.gpu_instances[gi.gi_id]

    # ------------------------------------------------------------ compute instances
    def nvmlGpuInstanceGetComputeInstanceProfileInfo(self, gpuInstance: Any, profile: int, engProfile: int,
                                                     version: int = 1) -> c_nvmlComputeInstanceProfileInfo_t:
        fd, gi = self._gi_of(gpuInstance, "nvmlGpuInstanceGetComputeInstanceProfileInfo")
        p = self._profile(fd, gi.profile_id)
        g = compute_slices(p.name)
        if profile != CI_PROFILE_OF_SLICES.get(g) or engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)  # only the compute instance that spans the GPU instance
        return c_nvmlComputeInstanceProfileInfo_t(id=profile, sliceCount=g, instanceCount=1,
                                                  multiprocessorCount=p.sms or 0)

    nvmlGpuInstanceGetComputeInstanceProfileInfoV = nvmlGpuInstanceGetComputeInstanceProfileInfo

    def nvmlGpuInstanceCreateComputeInstance(self, gpuInstance: Any, profileId: int) -> Any:
        fd, gi = self._gi_of(gpuInstance, "nvmlGpuInstanceCreateComputeInstance")
        p = self._profile(fd, gi.profile_id)
        if profileId != CI_PROFILE_OF_SLICES.get(compute_slices(p.name)):
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        if any(part.gi_id == gi.gi_id for part in fd.mig_devices):
            raise NVMLError(NVML_ERROR_INSUFFICIENT_RESOURCES)
        name = f"{fd.device.uuid or fd.device.index}/{gi.gi_id}/{gi.start}/{self._serial()}"
        part = Partition(parent=fd.device.index, profile=p.name, uuid=f"MIG-{_uuid.uuid5(_uuid.NAMESPACE_OID, name)}",
                         gi_id=gi.gi_id, ci_id=0, start=gi.start, size=gi.size,
                         memory_bytes=(p.memory_mib or 0) * MIB or None, sms=p.sms)
        fd.mig_devices.append(part)
        return self._ci_handle(fd, gi.gi_id, 0)

    def _serial(self) -> int:
        n = getattr(self, "_mig_serial", 0) + 1
        self._mig_serial = n
        return n

    def nvmlGpuInstanceGetComputeInstances(self, gpuInstance: Any, profileId: int, computeInstancesRef: Any,
                                           countRef: Any) -> int:
        fd, gi = self._gi_of(gpuInstance, "nvmlGpuInstanceGetComputeInstances")
        p = self._profile(fd, gi.profile_id)
        found = [part for part in fd.mig_devices if part.gi_id == gi.gi_id
                 and profileId == CI_PROFILE_OF_SLICES.get(compute_slices(p.name))]
        count = _deref(countRef)
        if count.value < len(found):
            count.value = len(found)
            raise NVMLError(NVML_ERROR_INSUFFICIENT_SIZE)
        for i, part in enumerate(found):
            computeInstancesRef[i] = self._ci_handle(fd, gi.gi_id, part.ci_id or 0)
        count.value = len(found)
        return NVML_SUCCESS

    def nvmlComputeInstanceDestroy(self, computeInstance: Any) -> None:
        self._enter("nvmlComputeInstanceDestroy")
        token = ctypes.cast(computeInstance, ctypes.c_void_p).value or 0
        pos, gi_id, ci_id = (token >> 24) - 1, ((token >> 8) & 0xFFFF) - 1, (token & 0xFF) - 1
        if not 0 <= pos < len(self._devices):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        fd = self._devices[pos]
        part = next((x for x in fd.mig_devices if x.gi_id == gi_id and (x.ci_id or 0) == ci_id), None)
        if part is None:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        if part.uuid in self.mig_in_use:
            raise NVMLError(NVML_ERROR_IN_USE)
        fd.mig_devices.remove(part)
