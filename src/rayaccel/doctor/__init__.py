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

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping

from ..topology import NodeTopology

#: Check outcomes, best first.
STATUSES = ("ok", "n/a", "warn", "fail")
#: The checks of an NVIDIA node, in report order.
NVIDIA_CHECKS = ("driver", "cuda", "nvml", "torch", "nccl", "mig", "persistence", "fabric", "p2p", "gpudirect",
                 "imex")
#: The checks of an AMD node, in report order.
AMD_CHECKS = ("driver", "amdsmi", "torch", "nccl", "p2p", "gpudirect")
#: What a simulated node lacks, per check (the ``detail`` reads "simulated node: no <this>").
SIMULATED_LACKS = {
    "driver": "GPU driver", "cuda": "CUDA driver", "nvml": "NVML (FakeNVML answers instead)",
    "amdsmi": "amdsmi (FakeAmdSmi answers instead)", "torch": "GPU for torch to use", "nccl": "GPU for NCCL",
    "mig": "MIG hardware", "persistence": "driver persistence mode", "fabric": "NVSwitch fabric",
    "p2p": "peer-to-peer hardware", "gpudirect": "GPUDirect RDMA kernel module to check",
    "imex": "IMEX daemon or channels to check",
}


@dataclass(frozen=True, slots=True)
class Check:
    """The outcome of one local check.

    Attributes:
        name: e.g. ``"driver"``, ``"p2p"`` (see :data:`NVIDIA_CHECKS`, :data:`AMD_CHECKS`).
        status: one of :data:`STATUSES`.
        detail: what was found, one line.
        fix: what to do about it; None when nothing needs doing.

    Raises:
        ValueError: an unknown status or an empty name.
    """

    name: str
    status: str
    detail: str
    fix: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"Check.name must be a non-empty string, not {self.name!r}")
        if self.status not in STATUSES:
            raise ValueError(f"Check.status {self.status!r} is not one of {list(STATUSES)}")

    def to_dict(self) -> dict[str, Any]:
        """The stable JSON form: ``{"name", "status", "detail", "fix"}``."""
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Check":
        """The inverse of :meth:`to_dict` (e.g. for checks sent back from other nodes).

        Raises:
            ValueError: a missing or mistyped field, or an unknown status.
        """
        if not isinstance(data, Mapping):
            raise ValueError(f"a check must be an object, not {type(data).__name__}")
        for key in ("name", "status", "detail"):
            if not isinstance(data.get(key), str):
                raise ValueError(f"check field {key!r} must be a string, not {data.get(key)!r}")
        fix = data.get("fix")
        if fix is not None and not isinstance(fix, str):
            raise ValueError(f"check field 'fix' must be a string or null, not {fix!r}")
        return cls(data["name"], data["status"], data["detail"], fix)


def worst(checks: Iterable[Check]) -> str:
    """The worst status among ``checks`` (``"ok"`` for none): fail > warn > n/a > ok."""
    return max((c.status for c in checks), key=STATUSES.index, default="ok")


def summarize(checks: Iterable[Check]) -> str:
    """A plain-text report: one line per check (status, name, detail), a ``fix:`` line under
    each one that has a fix, and a closing count per status."""
    checks = list(checks)
    width = max((len(c.name) for c in checks), default=0)
    lines = []
    for c in checks:
        lines.append(f"{c.status:<4}  {c.name:<{width}}  {c.detail}")
        if c.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {c.fix}")
    counts = {s: sum(1 for c in checks if c.status == s) for s in STATUSES}
    lines.append(", ".join(f"{counts[s]} {s}" for s in ("ok", "warn", "fail", "n/a")))
    return "\n".join(lines)


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
        nvml: a ``pynvml``-like module (e.g. a :class:`~rayaccel.discovery.fakenvml.FakeNVML`);
            None imports ``pynvml``.
        amdsmi: an ``amdsmi``-like module; None imports ``amdsmi``.
        torch_module: the ``torch`` module to inspect; None imports it (absent: ``n/a``).
        proc_modules: where loaded kernel modules are listed (for ``gpudirect``).
        proc_dir / dev_dir: where processes and device files are looked up (for ``imex``).

    Never raises for a missing or broken library: that is a check's ``warn``/``fail``/``n/a``.
    """
    if simulated:
        return simulated_checks(topology)
    from ._fabric import imex_check  # these import Check from this module: loaded once it is defined
    from ._host import gpudirect_check, nccl_check, torch_check

    vendors = {d.vendor for d in topology.devices}
    if not vendors & {"nvidia", "amd"}:
        others = ", ".join(sorted(vendors)) or "no devices"
        return [Check("driver", "n/a", f"no NVIDIA or AMD device in the topology ({others}): nothing to check")]
    nv: list[Check] = []
    amd: list[Check] = []
    driver_cuda = None
    if "nvidia" in vendors:
        from ._nvidia import nvidia_checks

        nv, driver_cuda = nvidia_checks(topology, nvml)
    if "amd" in vendors:
        from ._amd import amd_checks

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
