"""FakeNVML's per-process figures: the processes on each device, their memory and their utilisation.

What a GPU's processes look like to NVML, set by a test (or a simulated node) and answered through the
calls the dashboard, ``nvidia-smi`` and rayaccel's per-holder usage (:mod:`rayaccel.health.usage`) make:

* :meth:`FakeNVMLUsage.set_process_usage` ``(device, pid, used_bytes=, sm_util=, gpu_instance=)``: a process
  on topology device ``device`` (its MIG GPU instance id on a GPU in MIG mode); :meth:`clear_process_usage`
  removes processes; on a simulated node, ``agent.ask("inject", "process_usage", device, pid=..., used_bytes=...)``
  reaches the node's fake (``"process_gone"`` removes it);
* ``nvmlDeviceGetComputeRunningProcesses(h)``: one entry per process (``pid``, ``usedGpuMemory`` in bytes or
  None -- NVML_VALUE_NOT_AVAILABLE --, ``gpuInstanceId`` / ``computeInstanceId``, 0xFFFFFFFF off MIG); on a MIG
  device's handle, only the processes of its GPU instance; ``nvmlDeviceGetGraphicsRunningProcesses``: none;
* ``nvmlDeviceGetProcessesUtilizationInfo(h, lastSeenTimeStamp)`` (driver 550+) and the older
  ``nvmlDeviceGetProcessUtilization(h, lastSeenTimeStamp)``: one sample per process with an ``sm_util``, stamped
  now (microseconds), newer than ``lastSeenTimeStamp``; none newer: ``NVML_ERROR_NOT_FOUND``, as NVML answers.

Cooperative with the other process-list mixins (a leak finder's): each list call asks ``super()`` too, when a
class further along the MRO answers it, and merges the lists by pid (this mixin's entry wins for its pids).
"""

from __future__ import annotations

import time
from typing import Any

from rayaccel.discovery._nvml_api import NVMLError, NVML_ERROR_NOT_FOUND

#: ``gpuInstanceId`` / ``computeInstanceId`` of a process on a GPU not in MIG mode.
NO_INSTANCE = 0xFFFFFFFF


class ProcessInfo:
    """What nvidia-ml-py's friendly ``c_nvmlProcessInfo_v3_t`` object carries."""

    def __init__(self, pid: int, usedGpuMemory: int | None, gpuInstanceId: int = NO_INSTANCE,
                 computeInstanceId: int = NO_INSTANCE):
        self.pid = pid
        self.usedGpuMemory = usedGpuMemory
        self.gpuInstanceId = gpuInstanceId
        self.computeInstanceId = computeInstanceId

    def __repr__(self) -> str:
        return f"ProcessInfo(pid={self.pid}, usedGpuMemory={self.usedGpuMemory}, gpuInstanceId={self.gpuInstanceId})"


class UtilizationSample:
    """What ``c_nvmlProcessUtilizationInfo_v1_t`` (and the older ``..Sample_t``) carries, in percent."""

    def __init__(self, pid: int, timeStamp: int, smUtil: int, memUtil: int = 0):
        self.pid, self.timeStamp, self.smUtil, self.memUtil = pid, timeStamp, smUtil, memUtil
        self.encUtil = self.decUtil = self.jpgUtil = self.ofaUtil = 0


class FakeNVMLUsage:
    """The per-process half of :class:`~rayaccel.testing.fakenvml.FakeNVML` (see the module docstring)."""

    _enter: Any
    _mig: Any

    def _usage(self) -> dict:
        table = self.__dict__.get("_process_usage")
        if table is None:
            table = self.__dict__["_process_usage"] = {}
        return table  # (device, pid) -> (used_bytes, sm_util, gpu_instance)

    def set_process_usage(self, device: int, pid: int, used_bytes: int | None = None, sm_util: int | None = None,
                          gpu_instance: int | None = None) -> None:
        """Process ``pid`` runs on topology device ``device`` using ``used_bytes`` (None: NVML cannot tell)
        and ``sm_util`` percent of its SMs (None: no utilisation samples)."""
        self._usage()[(int(device), int(pid))] = (used_bytes, sm_util, gpu_instance)

    #: the same, under the name a simulated node's health watcher injects by (``agent.ask("inject", "process_usage",
    #: device, pid=..., used_bytes=...)``)
    inject_process_usage = set_process_usage

    def clear_process_usage(self, device: int | None = None, pid: int | None = None) -> None:
        """Remove the processes of ``device`` and/or ``pid`` (both None: all)."""
        table = self._usage()
        for key in [k for k in table if (device is None or k[0] == device) and (pid is None or k[1] == pid)]:
            del table[key]

    def inject_process_gone(self, device: int, pid: int | None = None) -> None:
        """:meth:`clear_process_usage` of ``device`` (and ``pid``), under the name the health watcher injects by."""
        self.clear_process_usage(device, pid)

    def _mine(self, fd: Any, handle: Any) -> list[tuple[int, tuple]]:
        gi = self._mig(fd, handle).gi_id if getattr(handle, "mig", None) is not None else None
        return [(pid, v) for (d, pid), v in sorted(self._usage().items())
                if d == fd.device.index and (gi is None or v[2] == gi)]

    def _merged(self, name: str, handle: Any, mine: list) -> list:
        base = getattr(super(), name, None)
        others = list(base(handle)) if base is not None else []
        have = {p.pid for p in mine}
        return mine + [p for p in others if getattr(p, "pid", None) not in have]

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list:
        fd = self._enter("nvmlDeviceGetComputeRunningProcesses", handle)
        mine = [ProcessInfo(pid, used, NO_INSTANCE if gi is None else gi, NO_INSTANCE if gi is None else 0)
                for pid, (used, _, gi) in self._mine(fd, handle)]
        return self._merged("nvmlDeviceGetComputeRunningProcesses", handle, mine)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list:
        self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle)
        return self._merged("nvmlDeviceGetGraphicsRunningProcesses", handle, [])

    def _samples(self, name: str, handle: Any, last_seen: int) -> list:
        fd = self._enter(name, handle)
        now = max(int(time.time() * 1e6), int(last_seen) + 1)
        out = [UtilizationSample(pid, now, int(util)) for pid, (_, util, _) in self._mine(fd, handle) if util is not None]
        if not out:
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return out

    def nvmlDeviceGetProcessesUtilizationInfo(self, handle: Any, timeStamp: int) -> list:
        return self._samples("nvmlDeviceGetProcessesUtilizationInfo", handle, timeStamp)

    def nvmlDeviceGetProcessUtilization(self, handle: Any, timeStamp: int) -> list:
        return self._samples("nvmlDeviceGetProcessUtilization", handle, timeStamp)
