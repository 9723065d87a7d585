"""The AMD checks of ``rayaccel doctor``: driver (``amdsmi_get_gpu_driver_info``), amdsmi
(``amdsmi_get_lib_version``) and p2p (``amdsmi_is_P2P_accessible`` on the pairs the
topology joins by xGMI or PCIe short of SYS). MIG, persistence mode and the NVSwitch fabric
have no AMD equivalent and are not reported for AMD devices.
"""

from __future__ import annotations

import logging
from typing import Any

from ..discovery.amd import _Lib
from ..discovery.nvidia import _bus_key
from ..errors import BackendError
from ..topology import NodeTopology
from ._check import Check

log = logging.getLogger(__name__)


def amd_checks(topology: NodeTopology, amdsmi: Any) -> list[Check]:
    """The AMD device checks (``driver``, ``amdsmi``, ``p2p``)."""
    if amdsmi is None:
        try:
            import amdsmi
        except (ImportError, OSError) as e:
            return [Check("driver", "n/a", "cannot ask the amdgpu driver: amdsmi is not importable"),
                    Check("amdsmi", "warn", f"amdsmi is not installed ({e})",
                          "pip install amdsmi (the version of your ROCm; rayaccel discovers AMD GPUs through it)"),
                    Check("p2p", "n/a", "needs amdsmi")]
    lib = _Lib(amdsmi)
    flags = getattr(getattr(amdsmi, "AmdSmiInitFlags", None), "INIT_AMD_GPUS", None)
    try:
        amdsmi.amdsmi_init(flags) if flags is not None else amdsmi.amdsmi_init()
    except (lib.exc, OSError) as e:
        n = sum(1 for d in topology.devices if d.vendor == "amd")
        return [Check("driver", "fail", f"the topology lists {n} AMD GPUs but amdsmi_init failed ({e})",
                      "load the amdgpu driver (`rocm-smi` / `amd-smi list` must work); in a container, pass "
                      "/dev/kfd and /dev/dri"),
                Check("amdsmi", "n/a", "no working amdgpu driver"), Check("p2p", "n/a", "no working amdgpu driver")]
    try:
        return _checks(lib, topology)
    finally:
        try:
            amdsmi.amdsmi_shut_down()
        except lib.exc as e:
            log.debug("rayaccel doctor: amdsmi_shut_down failed: %s", e)


def _checks(lib: _Lib, topology: NodeTopology) -> list[Check]:
    out = []
    devices = [d for d in sorted(topology.devices, key=lambda d: d.index) if d.vendor == "amd"]
    try:
        raw = list(lib.call("amdsmi_get_processor_handles") or [])
    except BackendError as e:
        raw = []
        out.append(Check("driver", "fail", str(e), "check `amd-smi list`"))
    ids = []
    for h in raw:
        try:
            uuid, bdf = lib.call("amdsmi_get_gpu_device_uuid", h), lib.call("amdsmi_get_gpu_device_bdf", h)
        except BackendError:
            uuid = bdf = None
        ids.append((h, str(uuid) if uuid else None, _bus_key(str(bdf)) if bdf else None))
    handles: dict[int, Any] = {}
    missing = []
    for pos, d in enumerate(devices):
        match = next((h for h, u, b in ids if (d.uuid and u == d.uuid) or (d.pci_bus_id and b == _bus_key(d.pci_bus_id))),
                     None)
        if match is None and not d.uuid and not d.pci_bus_id and pos < len(ids):
            match = ids[pos][0]
        if match is None:
            missing.append(f"GPU {d.index} ({d.uuid or d.pci_bus_id or 'no id'}) is not visible to amdsmi")
        else:
            handles[d.index] = match
    if not out:
        try:
            info = lib.call("amdsmi_get_gpu_driver_info", raw[0]) if raw else None
        except BackendError as e:
            info, missing = None, missing + [str(e)]
        version = (info or {}).get("driver_version") or None
        if missing:
            out.append(Check("driver", "fail", f"amdgpu driver {version or '?'}: " + "; ".join(missing),
                             "check `amd-smi list` and dmesg; restart the rayaccel node after hardware changes"))
        elif version is None:
            out.append(Check("driver", "warn", "amdsmi does not report the driver version", "check `amd-smi version`"))
        else:
            gpus = "the GPU" if len(devices) == 1 else f"all {len(devices)} GPUs"
            out.append(Check("driver", "ok", f"amdgpu driver {version}, {gpus} of the topology found"))
    try:
        lv = lib.call("amdsmi_get_lib_version")
        if isinstance(lv, dict):
            text = ".".join(str(lv[k]) for k in ("year", "major", "minor", "release") if k in lv)
            out.append(Check("amdsmi", "ok", f"amdsmi library {text}"))
        else:
            out.append(Check("amdsmi", "warn", "amdsmi does not report its version", "upgrade amdsmi to your ROCm's"))
    except BackendError as e:
        out.append(Check("amdsmi", "warn", str(e), "install the amdsmi of your ROCm version"))
    out.append(_p2p(lib, topology, handles))
    return out


def _p2p(lib: _Lib, topology: NodeTopology, handles: dict[int, Any]) -> Check:
    pairs = [l for l in topology.links if l.a in handles and l.b in handles
             and (l.kind == "xgmi" or (l.kind == "pcie" and l.pcie not in (None, "SYS")))]
    if not pairs:
        return Check("p2p", "n/a", "the topology links no pair of GPUs by xGMI or PCIe short of SYS")
    fails, warns, asked = [], [], 0
    for l in pairs:
        try:
            ok = lib.call("amdsmi_is_P2P_accessible", handles[l.a], handles[l.b])
        except BackendError as e:
            (fails if l.kind == "xgmi" else warns).append(f"GPU {l.a}-{l.b}: {e}")
            continue
        if ok is None:
            continue
        asked += 1
        if not ok:
            (fails if l.kind == "xgmi" else warns).append(f"GPU {l.a}-{l.b} ({l.label}): not P2P accessible")
    if fails:
        return Check("p2p", "fail", "; ".join(fails + warns), "the topology says xGMI but the driver refuses P2P: check "
                     "`amd-smi topology` and the IOMMU setting (iommu=pt)")
    if warns:
        return Check("p2p", "warn", "; ".join(warns), "enable PCIe P2P (IOMMU passthrough, ACS off) or expect "
                     "RCCL to stage transfers through host memory")
    if not asked:
        return Check("p2p", "n/a", "amdsmi does not report P2P access here")
    return Check("p2p", "ok", f"P2P accessible on all {asked} linked GPU pairs")
