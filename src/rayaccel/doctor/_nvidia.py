"""The NVIDIA checks of ``rayaccel doctor``: driver, cuda, nvml, mig, persistence, fabric, p2p.

Every NVML call goes through :class:`_Nvml`, which turns "not supported here" into None and
any other NVML error into a value the check reports, never an exception.
"""

from __future__ import annotations

import ctypes
import logging
from dataclasses import dataclass
from typing import Any

from ..discovery.nvidia import _bus_key, _text
from ..topology import Device, NodeTopology
from ._check import Check

log = logging.getLogger(__name__)
_UNKNOWN = {"NOT_SUPPORTED": 3, "FUNCTION_NOT_FOUND": 13, "NO_DATA": 21, "NO_PERMISSION": 4}
_NAMES = ("driver", "cuda", "nvml", "mig", "persistence", "fabric", "p2p")
_P2P_STATUS = {0: "OK", 1: "chipset not supported", 2: "GPU not supported", 3: "IOH topology not supported",
               4: "disabled by regkey", 5: "not supported", 6: "unknown"}
_FABRIC_STATE = {0: "not supported", 1: "not started", 2: "in progress", 3: "completed"}
_RESET_HINT = "reset the GPU with no processes on it (`sudo nvidia-smi -r -i {i}`) or reboot"


class _Failed(Exception):
    """An NVML call failed for a reason other than "not supported" (message in args[0])."""


def _const(nvml: Any, name: str, default: int) -> int:
    """An NVML constant as an int. (nvidia-ml-py defines ``NVML_P2P_CAPS_INDEX_READ = 0,`` -- a tuple.)"""
    value = getattr(nvml, name, default)
    return value if isinstance(value, int) else default


@dataclass
class _Nvml:
    m: Any

    def call(self, fn: str, *args: Any) -> Any:
        """``m.<fn>(*args)``; None when NVML does not support it.

        Raises:
            _Failed: any other NVML error (message names the call and the error).
        """
        func = getattr(self.m, fn, None)
        if func is None:
            return None
        try:
            return func(*args)
        except self.m.NVMLError as e:
            code = getattr(e, "value", None)
            if code in {getattr(self.m, f"NVML_ERROR_{n}", v) for n, v in _UNKNOWN.items()}:
                return None
            raise _Failed(f"{fn}: {e} (NVML error {code})") from None


def _na_all(detail: str, skip: tuple[str, ...] = ()) -> list[Check]:
    return [Check(n, "n/a", detail) for n in _NAMES if n not in skip]


def nvidia_checks(topology: NodeTopology, nvml: Any) -> tuple[list[Check], int | None]:
    """The NVIDIA device checks and the CUDA version the driver supports (e.g. 12040), or None."""
    if nvml is None:
        try:
            import pynvml as nvml  # nvidia-ml-py
        except ImportError as e:
            return ([Check("driver", "n/a", "cannot ask the NVIDIA driver: pynvml is not importable"),
                     Check("cuda", "n/a", "cannot ask the NVIDIA driver: pynvml is not importable"),
                     Check("nvml", "warn", f"pynvml (nvidia-ml-py) is not installed ({e})",
                           "pip install nvidia-ml-py (rayaccel discovers and watches NVIDIA GPUs through it)")]
                    + _na_all("needs NVML (pynvml is not installed)", skip=("driver", "cuda", "nvml")), None)
    lib = _Nvml(nvml)
    try:
        nvml.nvmlInit()
    except (nvml.NVMLError, OSError) as e:
        return [_init_failure(nvml, e, topology)] + _na_all("no working NVIDIA driver", skip=("driver",)), None
    try:
        return _checks(lib, topology)
    finally:
        try:
            nvml.nvmlShutdown()
        except nvml.NVMLError as e:  # nothing left to release
            log.debug("rayaccel doctor: nvmlShutdown failed: %s", e)


def _init_failure(nvml: Any, e: Exception, topology: NodeTopology) -> Check:
    n = sum(1 for d in topology.devices if d.vendor == "nvidia")
    code = getattr(e, "value", None)
    if code == _const(nvml, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", 18):
        return Check("driver", "fail", f"the NVIDIA kernel driver and libnvidia-ml do not match ({e})",
                     "a driver upgrade is half done: reboot (or reload the nvidia kernel modules)")
    if isinstance(e, OSError) or code in (_const(nvml, "NVML_ERROR_LIBRARY_NOT_FOUND", 12),
                                          _const(nvml, "NVML_ERROR_DRIVER_NOT_LOADED", 9)):
        return Check("driver", "fail", f"the topology lists {n} NVIDIA GPUs but no NVIDIA driver is loaded ({e})",
                     "install / load the NVIDIA driver (`nvidia-smi` must work); in a container, give it the GPUs "
                     "(--gpus all, or the NVIDIA device plugin)")
    return Check("driver", "fail", f"nvmlInit failed: {e} (NVML error {code})", "check `nvidia-smi` and dmesg for Xid errors")


def _find(lib: _Nvml, d: Device) -> Any:
    """The NVML handle of ``d`` (by UUID, else PCI bus id, else its index when it has neither)."""
    if d.uuid and hasattr(lib.m, "nvmlDeviceGetHandleByUUID"):
        try:
            h = lib.call("nvmlDeviceGetHandleByUUID", d.uuid)
        except _Failed:
            h = None
        if h is not None:
            return h
    if d.pci_bus_id and hasattr(lib.m, "nvmlDeviceGetHandleByPciBusId"):
        try:
            h = lib.call("nvmlDeviceGetHandleByPciBusId", d.pci_bus_id)
        except _Failed:
            h = None
        if h is not None:
            return h
    if not d.uuid and not d.pci_bus_id:
        return lib.call("nvmlDeviceGetHandleByIndex", d.index)
    for i in range(lib.call("nvmlDeviceGetCount") or 0):  # old bindings: enumerate and compare
        h = lib.call("nvmlDeviceGetHandleByIndex", i)
        pci = lib.call("nvmlDeviceGetPciInfo", h) if h is not None else None
        if h is not None and ((d.uuid and _text(lib.call("nvmlDeviceGetUUID", h)) == d.uuid)
                              or (pci is not None and d.pci_bus_id and _bus_key(_text(pci.busId)) == _bus_key(d.pci_bus_id))):
            return h
    return None


def _checks(lib: _Nvml, topology: NodeTopology) -> tuple[list[Check], int | None]:
    out: list[Check] = []
    devices = [d for d in sorted(topology.devices, key=lambda d: d.index) if d.vendor == "nvidia"]
    handles: dict[int, Any] = {}
    missing: list[str] = []
    for d in devices:
        try:
            h = _find(lib, d)
        except _Failed as e:
            missing.append(f"GPU {d.index} ({e})")
            continue
        if h is None:
            missing.append(f"GPU {d.index} ({d.uuid or d.pci_bus_id or 'no id'}) is not visible to NVML")
        else:
            handles[d.index] = h
    try:
        driver = _text(lib.call("nvmlSystemGetDriverVersion"))
    except _Failed as e:
        driver, missing = None, missing + [str(e)]
    if missing:
        out.append(Check("driver", "fail", f"NVIDIA driver {driver or '?'}: " + "; ".join(missing),
                         "check `nvidia-smi` and dmesg (Xid 79: fallen off the bus); restart the rayaccel node "
                         "after hardware changes so its topology is rediscovered"))
    elif driver is None:
        out.append(Check("driver", "warn", "NVML does not report the driver version", "check `nvidia-smi`"))
    else:
        out.append(Check("driver", "ok", f"NVIDIA driver {driver}, {_all_gpus(len(devices))} of the topology found"))
    cuda = _cuda_version(lib)
    if isinstance(cuda, int):
        out.append(Check("cuda", "ok", f"the driver supports CUDA {cuda // 1000}.{cuda % 1000 // 10}"))
    else:
        out.append(Check("cuda", "warn", f"the driver's CUDA version is unknown ({cuda})", "check `nvidia-smi`"))
        cuda = None
    try:
        version = _text(lib.call("nvmlSystemGetNVMLVersion"))
        out.append(Check("nvml", "ok", f"NVML {version}") if version
                   else Check("nvml", "warn", "NVML does not report its version", "upgrade nvidia-ml-py"))
    except _Failed as e:
        out.append(Check("nvml", "warn", str(e), "upgrade nvidia-ml-py to match the driver"))
    out.append(_mig(lib, devices, handles))
    out.append(_persistence(lib, handles))
    out.append(_fabric(lib, topology, handles))
    out.append(_p2p(lib, topology, handles))
    return out, cuda


def _cuda_version(lib: _Nvml) -> int | str:
    for fn in ("nvmlSystemGetCudaDriverVersion_v2", "nvmlSystemGetCudaDriverVersion"):
        try:
            v = lib.call(fn)
        except _Failed as e:
            return str(e)
        if isinstance(v, int) and v > 0:
            return v
    return "NVML does not report it"


def _per_device(lib: _Nvml, handles: dict[int, Any], fn: str, *args: Any) -> tuple[dict[int, Any], list[str]]:
    values, errors = {}, []
    for i, h in handles.items():
        try:
            v = lib.call(fn, h, *args)
        except _Failed as e:
            errors.append(f"GPU {i}: {e}")
            continue
        if v is not None:
            values[i] = v
    return values, errors


def _mig(lib: _Nvml, devices: list[Device], handles: dict[int, Any]) -> Check:
    modes, errors = _per_device(lib, handles, "nvmlDeviceGetMigMode")
    if errors:
        return Check("mig", "warn", "; ".join(errors), "check `nvidia-smi -q -d MIG`")
    if not modes:
        return Check("mig", "n/a", "no GPU here supports MIG")
    topo = {d.index: d.mig_mode for d in devices}
    warns, fixes = [], []
    for i, (current, pending) in sorted(modes.items()):
        if int(current) != int(pending):
            warns.append(f"GPU {i}: MIG {'on' if current else 'off'} now, {'on' if pending else 'off'} after a reset")
            fixes.append(_RESET_HINT.format(i=i))
        elif topo.get(i) is not None and bool(topo[i]) != bool(current):
            warns.append(f"GPU {i}: MIG is {'on' if current else 'off'} but the published topology says "
                         f"{'on' if topo[i] else 'off'}")
            fixes.append("restart the rayaccel node so it rediscovers the GPUs")
    if warns:
        return Check("mig", "warn", "; ".join(warns), "; ".join(dict.fromkeys(fixes)))
    on = [i for i, (c, _) in sorted(modes.items()) if c]
    off = [i for i, (c, _) in sorted(modes.items()) if not c]
    return Check("mig", "ok", f"MIG on: {_list(on)}; off: {_list(off)}; nothing pending")


def _persistence(lib: _Nvml, handles: dict[int, Any]) -> Check:
    modes, errors = _per_device(lib, handles, "nvmlDeviceGetPersistenceMode")
    if errors:
        return Check("persistence", "warn", "; ".join(errors), "check `nvidia-smi -q | grep -i persistence`")
    if not modes:
        return Check("persistence", "n/a", "NVML does not report persistence mode here")
    enabled = _const(lib.m, "NVML_FEATURE_ENABLED", 1)
    off = [i for i, v in sorted(modes.items()) if v != enabled]
    if off:
        return Check("persistence", "warn", f"persistence mode is off on GPUs {_list(off)}: the driver tears the GPUs "
                     "down when idle, so every first use pays seconds of initialisation",
                     "enable nvidia-persistenced (`sudo systemctl enable --now nvidia-persistenced`) or "
                     "`sudo nvidia-smi -pm 1`")
    return Check("persistence", "ok", f"persistence mode on for {_all_gpus(len(modes))}")


def _nvswitch(topology: NodeTopology) -> bool:
    """An NVSwitch system as the topology models it: >= 4 NVIDIA GPUs, every pair NVLinked with one lane count."""
    devs = [d.index for d in topology.devices if d.vendor == "nvidia"]
    pairs = [(a, b) for x, a in enumerate(devs) for b in devs[x + 1:]]
    links = [topology.link(a, b) for a, b in pairs]
    return (len(devs) >= 4 and all(l is not None and l.kind == "nvlink" for l in links)
            and len({l.count for l in links if l is not None}) == 1)


def _fabric_info(lib: _Nvml, h: Any) -> Any:
    """The fabric info struct of ``h`` (the versioned call first, then the original), or None."""
    m = lib.m
    for struct, fn in (("c_nvmlGpuFabricInfo_v2_t", "nvmlDeviceGetGpuFabricInfoV"),
                       ("c_nvmlGpuFabricInfo_t", "nvmlDeviceGetGpuFabricInfo")):
        cls = getattr(m, struct, None)
        if cls is None or not hasattr(m, fn):
            continue
        info = cls()
        if lib.call(fn, h, ctypes.byref(info)) is not None:
            return info
    return None


def _fabric(lib: _Nvml, topology: NodeTopology, handles: dict[int, Any]) -> Check:
    switch = _nvswitch(topology)
    infos, errors = {}, []
    for i, h in handles.items():
        try:
            info = _fabric_info(lib, h)
        except _Failed as e:
            errors.append(f"GPU {i}: {e}")
            continue
        if info is not None and int(info.state) != _const(lib.m, "NVML_GPU_FABRIC_STATE_NOT_SUPPORTED", 0):
            infos[i] = info
    if errors:
        return Check("fabric", "warn", "; ".join(errors), "check `nvidia-smi -q | grep -A3 -i fabric`")
    if not infos:
        if not switch:
            return Check("fabric", "n/a", "no NVSwitch in this topology")
        return Check("fabric", "n/a", "NVSwitch system, but NVML does not report the fabric state here (before "
                     "Hopper, or an older driver)", "make sure nvidia-fabricmanager runs: "
                     "`systemctl status nvidia-fabricmanager`")
    done = _const(lib.m, "NVML_GPU_FABRIC_STATE_COMPLETED", 3)
    not_started = _const(lib.m, "NVML_GPU_FABRIC_STATE_NOT_STARTED", 1)
    degraded_true = _const(lib.m, "NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_TRUE", 1)
    fails, warns = [], []
    for i, info in sorted(infos.items()):
        state, status = int(info.state), int(info.status)
        if state == done and status != 0:
            fails.append(f"GPU {i}: fabric registration failed (NVML error {status})")
        elif state == not_started:
            fails.append(f"GPU {i}: fabric registration not started")
        elif state != done:
            warns.append(f"GPU {i}: fabric registration {_FABRIC_STATE.get(state, state)}")
        elif hasattr(info, "healthMask") and int(info.healthMask) & 0x3 == degraded_true:
            warns.append(f"GPU {i}: fabric bandwidth degraded")
    fix = ("start nvidia-fabricmanager (`sudo systemctl enable --now nvidia-fabricmanager`, same version as the "
           "driver); until the fabric is up, CUDA work on these GPUs fails or waits")
    if fails:
        return Check("fabric", "fail", "; ".join(fails + warns), fix)
    if warns:
        return Check("fabric", "warn", "; ".join(warns), "wait for registration to finish, then check "
                     "`nvidia-smi -q | grep -A3 -i fabric` and the fabric manager's log")
    return Check("fabric", "ok", f"NVSwitch fabric registration completed on {_all_gpus(len(infos))}")


def _p2p(lib: _Nvml, topology: NodeTopology, handles: dict[int, Any]) -> Check:
    nvlink_i = _const(lib.m, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
    read_i = _const(lib.m, "NVML_P2P_CAPS_INDEX_READ", 0)
    ok_v = _const(lib.m, "NVML_P2P_STATUS_OK", 0)
    pairs = [l for l in topology.links if l.a in handles and l.b in handles
             and (l.kind == "nvlink" or (l.kind == "pcie" and l.pcie not in (None, "SYS")))]
    if not pairs:
        return Check("p2p", "n/a", "the topology links no pair of GPUs by NVLink or PCIe short of SYS")
    fails, warns, asked = [], [], 0
    for l in pairs:
        index = nvlink_i if l.kind == "nvlink" else read_i
        try:
            status = lib.call("nvmlDeviceGetP2PStatus", handles[l.a], handles[l.b], index)
        except _Failed as e:
            (fails if l.kind == "nvlink" else warns).append(f"GPU {l.a}-{l.b}: {e}")
            continue
        if status is None:
            continue
        asked += 1
        if status != ok_v:
            what = f"GPU {l.a}-{l.b} ({l.label}): P2P {'over NVLink' if l.kind == 'nvlink' else 'read'} " \
                   f"{_P2P_STATUS.get(int(status), status)}"
            (fails if l.kind == "nvlink" else warns).append(what)
    if fails:
        return Check("p2p", "fail", "; ".join(fails + warns), "the topology says NVLink but the driver refuses P2P "
                     "over it: check `nvidia-smi topo -p2p n` and `nvidia-smi nvlink -s`, the fabric manager on "
                     "NVSwitch systems, and that no BIOS/regkey disables P2P")
    if warns:
        return Check("p2p", "warn", "; ".join(warns), "PCIe P2P is off: enable it in the BIOS (ACS/IOMMU settings) "
                     "or expect NCCL to stage transfers through host memory")
    if not asked:
        return Check("p2p", "n/a", "NVML does not report P2P status here")
    return Check("p2p", "ok", f"P2P OK on all {asked} linked GPU pairs")


def _all_gpus(n: int) -> str:
    return "the GPU" if n == 1 else f"all {n} GPUs"


def _list(items: list[int]) -> str:
    return ", ".join(map(str, items)) if items else "none"
