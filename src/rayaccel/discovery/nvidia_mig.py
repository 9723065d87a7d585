"""Re-partitioning a GPU in MIG mode through NVML: create and destroy GPU + compute instances.

Used by the node agent's dynamic MIG (:mod:`rayaccel.ray.node.dynmig`) on an NVML module: the
real ``pynvml`` on a GPU node, :class:`rayaccel.testing.FakeNVML` on a simulated one (the same
calls, NVML's placement rules). Enabling MIG mode itself is the operator's (it needs a GPU reset);
these calls refuse a GPU that is not in MIG mode.

``create`` is ``nvmlDeviceCreateGpuInstanceWithPlacement`` (the placement the layout planner chose)
then one compute instance spanning it (``nvmlGpuInstanceCreateComputeInstance``; what ``nvidia-smi
mig -cgi <id>:<start> -C`` does), and returns the new MIG device as a :class:`Partition` (its UUID
read back from NVML). ``destroy`` is ``nvmlComputeInstanceDestroy`` of its compute instances then
``nvmlGpuInstanceDestroy`` (``-dci`` then ``-dgi``); NVML answers ``IN_USE`` while a process runs there.
"""

from __future__ import annotations

import ctypes
import re
from typing import Any

from ..errors import BackendError
from ..topology import MigProfile, Partition

#: NVML_COMPUTE_INSTANCE_PROFILE_<n>_SLICE by compute slices (nvidia-ml-py's numbering).
_CI_PROFILE = {1: 0x0, 2: 0x1, 3: 0x2, 4: 0x3, 7: 0x4, 8: 0x5, 6: 0x6}
_MAX_CI = 8


class MigOpError(BackendError):
    """An NVML MIG call failed (the message names the GPU, the call and NVML's answer)."""


def _slices(profile: str) -> int:
    m = re.match(r"(\d+)g\.", profile)
    return int(m.group(1)) if m else 0


class NvmlMigOps:
    """Create and destroy MIG instances on ``nvml`` (an initialised ``pynvml``-like module).

    Args:
        nvml: ``pynvml`` or a :class:`~rayaccel.testing.FakeNVML`; ``nvmlInit`` is called here.
    """

    def __init__(self, nvml: Any):
        self.nvml = nvml
        nvml.nvmlInit()

    def _call(self, gpu: int, fn: str, *args: Any) -> Any:
        try:
            return getattr(self.nvml, fn)(*args)
        except self.nvml.NVMLError as e:
            raise MigOpError(f"GPU {gpu}: {fn} failed: {e}") from None

    def mig_mode(self, gpu: int) -> bool:
        """True when GPU ``gpu`` is in MIG mode now."""
        h = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu)
        return bool(self._call(gpu, "nvmlDeviceGetMigMode", h)[0])

    def create(self, gpu: int, profile: MigProfile, start: int) -> Partition:
        """A new instance of ``profile`` at slice ``start`` of GPU ``gpu`` (its GPU and compute instance).

        Raises:
            MigOpError: NVML refused (not in MIG mode, the placement taken, ...); nothing is left half made.
        """
        nvml = self.nvml
        h = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu)
        placement = nvml.c_nvmlGpuInstancePlacement_t(start, profile.slots)
        gi = self._call(gpu, "nvmlDeviceCreateGpuInstanceWithPlacement", h, profile.id, ctypes.byref(placement))
        try:
            ci_profile = _CI_PROFILE[_slices(profile.name)]
            info = self._call(gpu, "nvmlGpuInstanceGetComputeInstanceProfileInfo", gi, ci_profile,
                              getattr(nvml, "NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED", 0))
            self._call(gpu, "nvmlGpuInstanceCreateComputeInstance", gi, info.id)
            gi_id = int(self._call(gpu, "nvmlGpuInstanceGetInfo", gi).id)
            for part in self.instances(gpu):
                if part.gi_id == gi_id:
                    return part
            raise MigOpError(f"GPU {gpu}: the new {profile.name} instance (GPU instance {gi_id}) has no MIG device")
        except (MigOpError, KeyError):
            try:
                self._call(gpu, "nvmlGpuInstanceDestroy", gi)
            except MigOpError:
                pass
            raise

    def destroy(self, gpu: int, gi_id: int) -> None:
        """Destroy GPU instance ``gi_id`` of GPU ``gpu`` and its compute instances.

        Raises:
            MigOpError: NVML refused (``IN_USE``: a process runs there) or no such instance.
        """
        nvml = self.nvml
        h = self._call(gpu, "nvmlDeviceGetHandleByIndex", gpu)
        gi = self._call(gpu, "nvmlDeviceGetGpuInstanceById", h, gi_id)
        for ci_profile in sorted(set(_CI_PROFILE.values())):
            arr = (nvml.c_nvmlComputeInstance_t * _MAX_CI)()
            n = ctypes.c_uint(_MAX_CI)
            try:
                nvml.nvmlGpuInstanceGetComputeInstances(gi, ci_profile, arr, ctypes.byref(n))
            except nvml.NVMLError:
                continue
            for k in range(n.value):
                self._call(gpu, "nvmlComputeInstanceDestroy", arr[k])
        self._call(gpu, "nvmlGpuInstanceDestroy", gi)

    def instances(self, gpu: int) -> list[Partition]:
        """GPU ``gpu``'s MIG devices now (profile, UUID, GPU/compute instance, placement)."""
        from .nvidia import NvidiaBackend

        topo = NvidiaBackend(nvml=self.nvml).discover()
        dev = next((d for d in topo.devices if d.index == gpu), None)
        return [p for p in dev.partitions if p.uuid] if dev is not None else []


def host_ops() -> NvmlMigOps:
    """:class:`NvmlMigOps` on this host's NVML (``pynvml``, nvidia-ml-py).

    Raises:
        BackendUnavailable: pynvml is not importable.
    """
    from .nvidia import NvidiaBackend

    return NvmlMigOps(NvidiaBackend()._module())


__all__ = ["MigOpError", "NvmlMigOps", "host_ops"]
