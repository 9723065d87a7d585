"""What each process uses of each NVIDIA device, from NVML's per-process figures: :class:`NvmlUsageReader`.

Per watched device ``h`` (matched to topology indices by UUID, else PCI bus id, else index):

* memory: ``nvmlDeviceGetComputeRunningProcesses(h)`` and ``nvmlDeviceGetGraphicsRunningProcesses(h)``:
  each process's ``usedGpuMemory`` (bytes; None where NVML cannot tell, e.g. without permission to see
  other users' processes) and, on a GPU in MIG mode, its ``gpuInstanceId``;
* utilisation: ``nvmlDeviceGetProcessesUtilizationInfo(h, last)`` (driver 550+), else the older
  ``nvmlDeviceGetProcessUtilization(h, last)``: each process's SM utilisation (percent) in the samples
  newer than the last read; a process with no sample since is idle (0). Where neither call is supported
  (MIG devices, older drivers), utilisation is None: unknown, never a made-up 0.

The pids are the host's as NVML reports them (a container without the host's pid namespace sees pids
that are not its own: the node agent then finds no holder for them).
"""

from __future__ import annotations

import logging
from typing import Any, NamedTuple

from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import Device, NodeTopology

log = logging.getLogger(__name__)
#: ``gpuInstanceId`` of a process on a GPU not in MIG mode.
NO_INSTANCE = 0xFFFFFFFF
#: NVML answers these when a fact is not available: the figure is then unknown.
_UNKNOWN = ("NOT_SUPPORTED", "FUNCTION_NOT_FOUND", "NO_PERMISSION", "NO_DATA", "NOT_FOUND", "INVALID_ARGUMENT")


class ProcessUsage(NamedTuple):
    """One process on one device.

    Attributes:
        pid: the process (as NVML reports it). device: the topology device index.
        used_bytes: device memory it uses (None: NVML cannot tell).
        utilization: SM utilisation, percent, since the last read (None: NVML cannot tell).
        gpu_instance: its MIG GPU instance id on a GPU in MIG mode, else None.
    """

    pid: int
    device: int
    used_bytes: int | None
    utilization: float | None
    gpu_instance: int | None


class NvmlUsageReader:
    """Reads :class:`ProcessUsage` of every process on ``topology``'s NVIDIA devices.

    Args:
        nvml: a ``pynvml``-like module (e.g. a :class:`~rayaccel.testing.fakenvml.FakeNVML`); None imports
            ``pynvml`` (nvidia-ml-py) and initialises it.

    Raises:
        BackendUnavailable: nvidia-ml-py is not installed. BackendError: NVML failed to initialise.
    """

    def __init__(self, topology: NodeTopology, *, nvml: Any = None):
        if nvml is None:
            try:
                import pynvml as nvml  # noqa: PLC0415 - the vendor library loads only where it is used
            except ImportError:
                raise BackendUnavailable("nvidia", "nvidia-ml-py is not installed", "pip install nvidia-ml-py") from None
        self.nvml = nvml
        try:
            nvml.nvmlInit()
        except nvml.NVMLError as e:
            raise BackendError(f"nvmlInit failed: {e}", backend="nvidia") from None
        self.devices = [d for d in topology.devices if d.vendor == "nvidia"]
        self._handles: dict[int, Any] = {}
        self._last_ts: dict[int, int] = {}
        self._util_fn: dict[int, str | None] = {}
        codes = {n: getattr(nvml, f"NVML_ERROR_{n}", None) for n in _UNKNOWN}
        self._unknown = {c for c in codes.values() if c is not None}

    def close(self) -> None:
        try:
            self.nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - shutting down: nothing to report
            pass

    def read(self) -> list[ProcessUsage]:
        """Every process on every device NVML answers for (a device that fails is skipped this time)."""
        out: list[ProcessUsage] = []
        for d in self.devices:
            try:
                out.extend(self._device(d))
            except self.nvml.NVMLError as e:
                log.debug("rayaccel usage: device %s: %s", d.index, e)
                self._handles.pop(d.index, None)
        return out

    def _device(self, d: Device) -> list[ProcessUsage]:
        h = self._handle(d)
        if h is None:
            return []
        procs: dict[int, tuple[int | None, int | None]] = {}
        for fn in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
            for p in self._maybe(fn, h) or ():
                used = getattr(p, "usedGpuMemory", None)
                gi = getattr(p, "gpuInstanceId", NO_INSTANCE)
                pid = int(p.pid)
                prev = procs.get(pid, (None, None))
                total = None if used is None and prev[0] is None else (used or 0) + (prev[0] or 0)
                procs[pid] = (total, None if gi in (None, NO_INSTANCE) else int(gi))
        util = self._utilization(d.index, h)
        return [ProcessUsage(pid, d.index, used, (util.get(pid, 0.0) if util is not None else None), gi)
                for pid, (used, gi) in sorted(procs.items())]

    def _utilization(self, index: int, h: Any) -> dict[int, float] | None:
        """pid -> SM percent from the samples since the last read; None when NVML cannot tell."""
        if index in self._util_fn:
            known = self._util_fn[index]
            if known is None:
                return None  # neither call is supported here (found once, not asked again)
            fns = [known]
        else:
            fns = ["nvmlDeviceGetProcessesUtilizationInfo", "nvmlDeviceGetProcessUtilization"]
        last = self._last_ts.get(index, 0)
        for fn in fns:
            func = getattr(self.nvml, fn, None)
            if func is None:
                continue
            try:
                samples = func(h, last)
            except self.nvml.NVMLError as e:
                if getattr(e, "value", None) == getattr(self.nvml, "NVML_ERROR_NOT_FOUND", None):
                    self._util_fn[index] = fn
                    return {}  # supported, and no sample since the last read: every process was idle
                if getattr(e, "value", None) in self._unknown:
                    continue
                raise
            self._util_fn[index] = fn
            out: dict[int, tuple[int, float]] = {}
            for s in samples:
                ts, pid = int(getattr(s, "timeStamp", 0)), int(s.pid)
                if ts >= out.get(pid, (-1, 0.0))[0]:
                    out[pid] = (ts, float(s.smUtil))
                self._last_ts[index] = max(self._last_ts.get(index, 0), ts)
            return {pid: v for pid, (_, v) in out.items()}
        self._util_fn[index] = None
        return None

    def _maybe(self, fn: str, *args: Any) -> Any:
        func = getattr(self.nvml, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.nvml.NVMLError as e:
            if getattr(e, "value", None) in self._unknown:
                return None
            raise

    def _handle(self, d: Device) -> Any:
        h = self._handles.get(d.index)
        if h is not None:
            return h
        tries = ([("nvmlDeviceGetHandleByUUID", d.uuid)] if d.uuid else []) \
            + ([("nvmlDeviceGetHandleByPciBusId", d.pci_bus_id)] if d.pci_bus_id else [])
        if not tries:
            tries = [("nvmlDeviceGetHandleByIndex", d.index)]
        for fn, arg in tries:
            h = self._maybe(fn, arg)
            if h is not None:
                self._handles[d.index] = h
                return h
        return None
