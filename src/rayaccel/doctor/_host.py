"""The host checks of ``rayaccel doctor``: torch (and its CUDA against the driver's), NCCL/RCCL,
and the GPUDirect RDMA kernel module."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..topology import NodeTopology
from ._check import Check

#: Kernel modules that give NVIDIA GPUs GPUDirect RDMA with RDMA NICs (the driver's own since
#: 470, and Mellanox's older one).
PEERMEM_MODULES = ("nvidia_peermem", "nv_peer_mem")


def _torch(torch_module: Any) -> tuple[Any, str | None]:
    """``(torch, None)``, or ``(None, why)`` when it cannot be imported."""
    if torch_module is not None:
        return torch_module, None
    try:
        import torch
    except ImportError as e:
        return None, f"torch is not installed ({e})"
    except OSError as e:  # a torch whose CUDA libraries are broken fails to load them at import
        return None, f"torch fails to import: {e}"
    return torch, None


def _version(text: Any) -> tuple[int, int] | None:
    """``"12.1"`` -> ``(12, 1)``; None when not a version."""
    parts = str(text).split(".")
    try:
        return int(parts[0]), int(parts[1]) if len(parts) > 1 else 0
    except ValueError:
        return None


def torch_check(torch_module: Any, vendor: str, driver_cuda: int | None) -> Check:
    """torch's version and GPU build, against the driver's CUDA version (NVIDIA) or for ROCm (AMD)."""
    torch, why = _torch(torch_module)
    if torch is None:
        status = "warn" if why and "fails" in why else "n/a"
        return Check("torch", status, why or "torch is not installed",
                     "pip install torch (a build for this node's GPUs) if your workloads use it")
    version = str(getattr(torch, "__version__", "?"))
    tv = getattr(torch, "version", None)
    cuda, hip = getattr(tv, "cuda", None), getattr(tv, "hip", None)
    if vendor == "amd":
        if not hip:
            return Check("torch", "warn", f"torch {version} is {'a CUDA' if cuda else 'a CPU-only'} build: it cannot "
                         "use AMD GPUs", "install a ROCm build of torch (https://pytorch.org/get-started/locally/)")
        return Check("torch", "ok", f"torch {version} (ROCm/HIP {hip})")
    if hip and not cuda:
        return Check("torch", "warn", f"torch {version} is a ROCm build: it cannot use NVIDIA GPUs",
                     "install a CUDA build of torch")
    dv = (driver_cuda // 1000, driver_cuda % 1000 // 10) if driver_cuda else None
    wheel = f"a CUDA build no newer than CUDA {dv[0]}.{dv[1]}" if dv else "a CUDA build"
    if not cuda:
        return Check("torch", "warn", f"torch {version} is a CPU-only build: it cannot use the GPUs",
                     f"install {wheel} of torch (https://pytorch.org/get-started/locally/)")
    tc = _version(cuda)
    if tc is None or dv is None:
        return Check("torch", "ok", f"torch {version} (CUDA {cuda}); the driver's CUDA version is unknown, not compared")
    if tc[0] > dv[0]:
        return Check("torch", "fail", f"torch {version} is built for CUDA {cuda}, but the driver supports only CUDA "
                     f"{dv[0]}.{dv[1]}: CUDA will not initialise", f"upgrade the NVIDIA driver, or install {wheel} of torch")
    if tc > dv:
        return Check("torch", "warn", f"torch {version} is built for CUDA {cuda}, newer than the driver's CUDA "
                     f"{dv[0]}.{dv[1]}: it runs through minor-version compatibility, but PTX JIT and newer CUDA "
                     "features fail", f"upgrade the NVIDIA driver, or install {wheel} of torch")
    return Check("torch", "ok", f"torch {version} (CUDA {cuda}; the driver supports CUDA {dv[0]}.{dv[1]})")


def _nccl_text(v: Any) -> str:
    if isinstance(v, (tuple, list)):
        return ".".join(str(x) for x in v)
    if isinstance(v, int):  # NCCL_VERSION_CODE: major*1000+minor*100+patch before 2.9, major*10000+... since
        major, rest = (v // 10000, v % 10000) if v >= 10000 else (v // 1000, v % 1000)
        return f"{major}.{rest // 100}.{rest % 100}"
    return str(v)


def nccl_check(torch_module: Any, vendor: str) -> Check:
    """The NCCL (RCCL under ROCm) torch carries, when torch has a GPU build."""
    torch, why = _torch(torch_module)
    if torch is None:
        return Check("nccl", "n/a", f"no torch to ask: {why}")
    tv = getattr(torch, "version", None)
    gpu = getattr(tv, "hip", None) if vendor == "amd" else getattr(tv, "cuda", None)
    lib = "RCCL" if vendor == "amd" else "NCCL"
    if not gpu:
        return Check("nccl", "n/a", f"torch {getattr(torch, '__version__', '?')} has no "
                     f"{'ROCm' if vendor == 'amd' else 'CUDA'} build, so no {lib}")
    try:
        v = torch.cuda.nccl.version()
    except (AttributeError, RuntimeError, ImportError, OSError) as e:
        return Check("nccl", "warn", f"torch has GPU support but no {lib} ({type(e).__name__}: {e})",
                     f"install a torch build with {lib} (the pip wheels carry it)")
    return Check("nccl", "ok", f"{lib} {_nccl_text(v)} (in torch)")


def gpudirect_check(topology: NodeTopology, vendor: str, proc_modules: str | Path) -> Check:
    """Whether the GPUDirect RDMA module is loaded, when the topology has RDMA NICs."""
    nics = [n.name for n in topology.nics if n.rdma]
    if not nics:
        return Check("gpudirect", "n/a", "no RDMA NIC in the topology")
    if vendor == "amd":
        return Check("gpudirect", "n/a", f"RDMA NICs {', '.join(nics)}: GPUDirect for AMD GPUs (ROCm peer memory, "
                     "part of amdgpu) is not checked")
    try:
        text = Path(proc_modules).read_text()
    except OSError as e:
        return Check("gpudirect", "n/a", f"cannot read {proc_modules}: {e}")
    loaded = {line.split()[0] for line in text.splitlines() if line.strip()}
    found = [m for m in PEERMEM_MODULES if m in loaded]
    if found:
        return Check("gpudirect", "ok", f"{found[0]} is loaded: GPUDirect RDMA between the GPUs and {', '.join(nics)}")
    return Check("gpudirect", "warn", f"RDMA NICs {', '.join(nics)} but neither {' nor '.join(PEERMEM_MODULES)} is "
                 "loaded: GPU<->NIC transfers go through host memory, unless NCCL uses DMA-BUF",
                 "`sudo modprobe nvidia_peermem` (part of the NVIDIA driver since 470; list it in "
                 "/etc/modules-load.d/ to keep it), or use DMA-BUF (open GPU kernel modules on Linux >= 5.12)")
