"""``rayaccel doctor``: local checks of one node's accelerator stack (no ``ray`` import).

:func:`local_checks` asks the vendor library, torch and the kernel what this node really
has and returns one :class:`Check` per concern, each ``ok`` / ``warn`` / ``fail`` / ``n/a``
with what was found and, when something is wrong, what to do:

=============  ==============================================================================
check          how (NVIDIA; AMD equivalents where they exist)
=============  ==============================================================================
driver         ``nvmlInit`` + ``nvmlSystemGetDriverVersion``; every topology device found by
               UUID / PCI bus id (AMD: ``amdsmi_init``, ``amdsmi_get_gpu_driver_info``)
cuda           ``nvmlSystemGetCudaDriverVersion_v2``: the CUDA version the driver supports
nvml           ``nvmlSystemGetNVMLVersion`` (AMD, as ``amdsmi``: ``amdsmi_get_lib_version``)
torch          ``torch.__version__``, ``torch.version.cuda`` vs the driver's CUDA (warn when
               torch's is newer in the same major, fail across majors; ``torch.version.hip`` on AMD)
nccl           ``torch.cuda.nccl.version()`` when torch has CUDA (RCCL under ROCm), else n/a
mig            ``nvmlDeviceGetMigMode`` -> [current, pending]: warn when they differ (reset needed)
               or when NVML disagrees with the published topology
persistence    ``nvmlDeviceGetPersistenceMode``: warn when off
fabric         ``nvmlDeviceGetGpuFabricInfoV`` / ``nvmlDeviceGetGpuFabricInfo`` (state, status,
               degraded-bandwidth health bit) on NVSwitch systems; n/a elsewhere or where NVML
               does not report it (before Hopper)
p2p            ``nvmlDeviceGetP2PStatus`` for each pair the topology links: NVLINK capability on
               NVLink pairs (fail when not OK), READ on PCIe pairs short of SYS (warn)
               (AMD: ``amdsmi_is_P2P_accessible`` on xGMI pairs)
gpudirect      with RDMA NICs in the topology: ``nvidia_peermem`` or ``nv_peer_mem`` in
               ``/proc/modules`` (warn when absent)
imex           on a node of a multi-node NVLink domain (:func:`~rayaccel.topology.nvlink_domain`):
               IMEX channels in ``/dev/nvidia-caps-imex-channels`` (warn when none) and the
               ``nvidia-imex`` daemon in ``/proc``; n/a elsewhere
=============  ==============================================================================

On a simulated node every check is ``n/a`` ("simulated node: no ..."), never ``ok``. A
missing library is ``n/a`` or ``warn`` with a hint, never a crash.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..topology import NodeTopology
from ._amd import amd_checks
from ._check import AMD_CHECKS, NVIDIA_CHECKS, SIMULATED_LACKS, STATUSES, Check, summarize, worst
from ._fabric import imex_check
from ._host import gpudirect_check, nccl_check, torch_check
from ._nvidia import nvidia_checks

def simulated_checks(topology: NodeTopology) -> list[Check]:
    """Every check of ``topology``'s vendor(s), each ``n/a`` with "simulated node: no ..."."""
    vendors = {d.vendor for d in topology.devices}
    names = list(NVIDIA_CHECKS if "nvidia" in vendors or "amd" not in vendors else ())
    names += [n for n in AMD_CHECKS if "amd" in vendors and n not in names]
    return [Check(n, "n/a", f"simulated node: no {SIMULATED_LACKS[n]}") for n in names]


def local_checks(topology: NodeTopology, *, simulated: bool, nvml: Any = None, amdsmi: Any = None,
                 torch_module: Any = None, proc_modules: str | Path = "/proc/modules", proc_dir: str | Path = "/proc",
                 dev_dir: str | Path = "/dev") -> list[Check]:
    """Check this node's accelerator stack against ``topology`` (see the module docstring).

    Args:
        topology: the node's published topology (what rayaccel believes it has).
        simulated: the node has no hardware: every check is ``n/a``.
        nvml: a ``pynvml``-like module (e.g. a :class:`~rayaccel.testing.fakenvml.FakeNVML`);
            None imports ``pynvml``.
        amdsmi: an ``amdsmi``-like module; None imports ``amdsmi``.
        torch_module: the ``torch`` module to inspect; None imports it (absent: ``n/a``).
        proc_modules: where loaded kernel modules are listed (for ``gpudirect``).
        proc_dir / dev_dir: where processes and device files are looked up (for ``imex``).

    Never raises for a missing or broken library: that is a check's ``warn``/``fail``/``n/a``.
    """
    if simulated:
        return simulated_checks(topology)
    vendors = {d.vendor for d in topology.devices}
    if not vendors & {"nvidia", "amd"}:
        others = ", ".join(sorted(vendors)) or "no devices"
        return [Check("driver", "n/a", f"no NVIDIA or AMD device in the topology ({others}): nothing to check")]
    nv: list[Check] = []
    amd: list[Check] = []
    driver_cuda = None
    if "nvidia" in vendors:
        nv, driver_cuda = nvidia_checks(topology, nvml)
    if "amd" in vendors:
        amd = amd_checks(topology, amdsmi)
    vendor = "nvidia" if nv else "amd"
    host = {"torch": torch_check(torch_module, vendor, driver_cuda), "nccl": nccl_check(torch_module, vendor),
            "gpudirect": gpudirect_check(topology, vendor, proc_modules)}
    if nv:
        host["imex"] = imex_check(topology, proc_dir, dev_dir)
    order = NVIDIA_CHECKS if nv else AMD_CHECKS
    by_name = {c.name: c for c in (nv or amd)}
    result = [host[n] if n in host else by_name[n] for n in order if n in host or n in by_name]
    if nv and amd:  # a node with both: the AMD device checks follow, under the same names
        result += amd
    return result

__all__ = ["AMD_CHECKS", "Check", "NVIDIA_CHECKS", "SIMULATED_LACKS", "STATUSES", "local_checks", "simulated_checks",
           "summarize", "worst"]
