"""Memory shares that hold: the cap a worker holding a share of a GPU gets, and what enforces it.

A *share* is a grant of part of a device: Ray's fractional GPU (``num_gpus=0.5`` on a rayaccel
node: the fraction of the device's memory) or ``rayaccel.remote(gpu_memory="12GiB")`` (bytes).
Placement packs shares by memory; this module makes a worker keep to its share where the stack
can enforce it:

* **MPS** -- on a node running the CUDA MPS control daemon (``$CUDA_MPS_PIPE_DIRECTORY``, else
  ``/tmp/nvidia-mps``, holds its ``control`` socket), the worker's environment gets
  ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT`` (``<ordinal>=<MiB>M`` per visible device, comma-separated)
  and ``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` (the share, in percent). The CUDA driver reads them when
  the process creates its context, so they bind every framework, not only PyTorch. A value the
  user set is never overridden.
* **torch** -- PyTorch's per-process memory fraction
  (``torch.cuda.set_per_process_memory_fraction(f, ordinal)``), set when CUDA initialises in the
  worker, through ``torch.cuda._lazy_call``. torch is never imported here: when the user's code has
  not imported it yet, a :data:`sys.meta_path` finder waits for ``torch.cuda`` and registers the call
  once that module has run. An allocation past the fraction raises torch's ``OutOfMemoryError``;
  an out-of-memory observer (``torch._C._cuda_attach_out_of_memory_observer``, where torch has it)
  first writes one line to stderr naming the share.

Nothing here runs for a whole-GPU grant on a worker that never held a share (the hook checks the
slot fractions first and imports this module only then). Standard library only.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

#: Where the MPS control daemon's pipes are (NVIDIA's variable) and their default.
MPS_PIPE_ENV = "CUDA_MPS_PIPE_DIRECTORY"
MPS_DEFAULT_PIPE = "/tmp/nvidia-mps"
#: NVIDIA's per-client MPS limits (read by the CUDA driver at context creation).
MPS_MEM_ENV = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
MPS_THREADS_ENV = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
MPS_ENV = (MPS_MEM_ENV, MPS_THREADS_ENV)
MECHANISMS = ("mps", "torch")
_MiB = 1 << 20


@dataclass(frozen=True, slots=True)
class Share:
    """What a grant is a share of, decided from Ray's slots and the request (pure data).

    Attributes:
        label: the share as the user asked it (``num_gpus=0.5``, ``gpu_memory=12.0 GiB``).
        fraction: of each device (Ray's slot fraction), or None when only bytes are known.
        bytes_by_device: device index -> bytes this work may use (devices of unknown size absent).
        devices: the GPUs of the grant in visible order (ordinal ``i`` is ``devices[i]``).
        gpu_memory_bytes: the request's ``gpu_memory``, or None.
    """

    label: str
    fraction: float | None
    bytes_by_device: dict[int, int]
    devices: tuple[int, ...]
    gpu_memory_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class MemoryCap:
    """The memory cap of the current task or actor (``rayaccel.get_devices().memory_cap``).

    Attributes:
        share: the share as asked (``num_gpus=0.5``, ``gpu_memory=12.0 GiB``).
        bytes_by_device: device index -> the cap in bytes.
        mechanism: what enforces it: ``"mps"`` (the CUDA driver, every framework; torch's fraction
            is set as well where torch runs), ``"torch"`` (PyTorch's allocator only), or None.
        reason: why nothing enforces it (``mechanism`` None), else None.
    """

    share: str
    bytes_by_device: dict[int, int] = field(default_factory=dict)
    mechanism: str | None = None
    reason: str | None = None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def share_of(gpu_fractions: tuple[float, ...], devices: tuple[int, ...], device_bytes: Mapping[int, int],
             gpu_memory: int | None = None) -> Share | None:
    """The share a grant is, or None for whole devices (pure).

    Args:
        gpu_fractions: Ray's GPU slot fractions of the grant (``(0.5,)`` for ``num_gpus=0.5``).
        devices: the physical GPUs behind them, in visible order.
        device_bytes: device index -> its memory in bytes (unknown devices absent).
        gpu_memory: the request's ``gpu_memory`` in bytes (``rayaccel.remote``), or None.
    """
    if not devices:
        return None
    frac = gpu_fractions[0] if gpu_fractions and gpu_fractions[0] < 1 - 1e-6 else None
    if gpu_memory is not None:
        mem = {d: min(int(gpu_memory), device_bytes[d]) if device_bytes.get(d) else int(gpu_memory)
               for d in devices}
        return Share(f"gpu_memory={_gib(int(gpu_memory))}", frac, mem, devices, int(gpu_memory))
    if frac is None:
        return None
    mem = {d: int(device_bytes[d] * frac) for d in devices if device_bytes.get(d)}
    return Share(f"num_gpus={frac:g}", frac, mem, devices)


def mps_pipe(env: Mapping[str, str] | None = None) -> str | None:
    """The MPS control daemon's pipe directory when one runs here (its ``control`` socket exists), else None."""
    env = os.environ if env is None else env
    d = env.get(MPS_PIPE_ENV) or MPS_DEFAULT_PIPE
    return d if os.path.exists(os.path.join(d, "control")) else None


def mps_env(share: Share) -> dict[str, str]:
    """NVIDIA's MPS client limits for ``share`` (pure): the device memory per visible ordinal, and the
    share of the SMs (when its fraction is known, else bytes over the device's memory)."""
    out: dict[str, str] = {}
    limits = [f"{i}={max(1, share.bytes_by_device[d] // _MiB)}M" for i, d in enumerate(share.devices)
              if d in share.bytes_by_device]
    if limits:
        out[MPS_MEM_ENV] = ",".join(limits)
    frac = share.fraction
    if frac is not None:
        out[MPS_THREADS_ENV] = str(max(1, min(100, round(frac * 100))))
    return out


def cap_for(share: Share, *, simulated: bool, mps: str | None, torch_present: bool) -> MemoryCap:
    """Which mechanism enforces ``share`` on this node (pure; see the module docstring)."""
    if mps is not None:
        return MemoryCap(share.label, dict(share.bytes_by_device), "mps")
    if simulated:
        return MemoryCap(share.label, dict(share.bytes_by_device), None,
                         "simulated node: no device to enforce a cap on (and no MPS daemon)")
    if torch_present:
        return MemoryCap(share.label, dict(share.bytes_by_device), "torch")
    return MemoryCap(share.label, dict(share.bytes_by_device), None,
                     "no MPS daemon on this node and PyTorch is not installed in this worker: nothing enforces "
                     "the share (start nvidia-cuda-mps-control -d, or cap your framework's allocator)")


def torch_present() -> bool:
    """Is torch importable here (without importing it)?"""
    if "torch" in sys.modules:
        return True
    import importlib.util

    try:
        return importlib.util.find_spec("torch") is not None
    except (ImportError, ValueError):
        return False


# ------------------------------------------------------------- the worker's state
class _State:
    """This process's caps: what the torch hook applies when it fires (it reads the latest)."""

    def __init__(self) -> None:
        self.user_mps: dict[str, str | None] | None = None  # the MPS variables as the worker started
        self.share: Share | None = None  # the share of the current grant, None when none
        self.label: str | None = None
        self.torch_want: dict[int, tuple[float | None, int | None]] = {}  # ordinal -> (fraction, bytes)
        self.torch_set: set[int] = set()  # ordinals torch was given a fraction < 1 for
        self.queued = False  # a torch.cuda._lazy_call is pending
        self.finder: Any = None
        self.observer = False
        self.mps: str | None | bool = False  # False: not looked yet


_S = _State()


def apply(share: Share | None, *, simulated: bool, env: Any = None) -> None:
    """Make this worker keep to ``share`` (None: no share, undo a previous one). Idempotent.

    Writes the MPS variables (where a daemon runs and the user set none) and arms torch's memory
    fraction (real nodes only; torch is not imported). Called by the hook after each grant that
    is a share, and after the first grant that is not, following one.
    """
    env = os.environ if env is None else env
    if _S.user_mps is None:
        _S.user_mps = {v: env.get(v) for v in MPS_ENV}
    _S.share = share
    _S.label = share.label if share is not None else None
    if _S.mps is False:
        _S.mps = mps_pipe(env)
    if _S.mps:
        want = mps_env(share) if share is not None else {}
        for v in MPS_ENV:
            user = _S.user_mps.get(v)
            value = user if user is not None else want.get(v)
            if value is None:
                env.pop(v, None)
            else:
                env[v] = value
    if simulated:
        return
    _S.torch_want = {} if share is None else {
        i: (share.fraction if share.gpu_memory_bytes is None else None,
            share.gpu_memory_bytes) for i, _ in enumerate(share.devices)}
    if not _S.torch_want and not _S.torch_set:
        return
    _arm_torch()


def cap_now(share: Share | None, *, simulated: bool) -> MemoryCap | None:
    """The :class:`MemoryCap` of ``share`` on this node (None: no share)."""
    if share is None:
        return None
    if _S.mps is False:
        _S.mps = mps_pipe()
    return cap_for(share, simulated=simulated, mps=_S.mps or None, torch_present=not simulated and torch_present())


def _arm_torch() -> None:
    cuda = sys.modules.get("torch.cuda")
    if cuda is not None and hasattr(cuda, "_lazy_call"):
        _queue(cuda)
        return
    if _S.finder is None:
        _S.finder = _TorchCudaFinder(_queue)
        sys.meta_path.insert(0, _S.finder)


def _queue(cuda: Any) -> None:
    """Have torch run :func:`_fire` when CUDA initialises (now, if it has)."""
    if _S.queued:
        return
    _S.queued = True
    cuda._lazy_call(lambda: _fire(cuda))


def _fire(cuda: Any) -> None:
    """Inside torch's CUDA initialisation (or now): set the fractions this process's share allows."""
    _S.queued = False
    want = dict(_S.torch_want)
    n = cuda.device_count()
    for i in sorted(set(want) | _S.torch_set):
        if i >= n:
            continue
        frac, nbytes = want.get(i, (None, None))
        if nbytes is not None:
            frac = nbytes / cuda.get_device_properties(i).total_memory
        frac = 1.0 if frac is None else max(0.0, min(1.0, frac))
        cuda.set_per_process_memory_fraction(frac, i)
        if frac < 1.0:
            _S.torch_set.add(i)
        else:
            _S.torch_set.discard(i)
    if not _S.observer:
        _S.observer = True
        attach = getattr(getattr(sys.modules.get("torch"), "_C", None), "_cuda_attach_out_of_memory_observer", None)
        if attach is not None:
            attach(_on_oom)


def _on_oom(device: int, alloc: int, device_allocated: int, device_free: int) -> None:
    """torch's out-of-memory observer: say which share was exceeded (torch raises OutOfMemoryError next)."""
    if _S.label is None or device not in _S.torch_set:
        return
    sys.stderr.write(f"rayaccel: this worker holds a memory share ({_S.label}) of its GPU {device} "
                     f"and enforces it with torch's per-process memory fraction; allocating {alloc} bytes more "
                     f"(with {device_allocated} allocated) exceeds it: torch raises OutOfMemoryError\n")


class _TorchCudaFinder:
    """A :data:`sys.meta_path` finder that lets ``torch.cuda`` load as usual, then calls ``then(module)``.

    It finds nothing itself: for ``torch.cuda`` it asks the path finder (the parent's ``__path__``)
    and wraps the loader's ``exec_module``. It removes itself after the module ran.
    """

    def __init__(self, then: Callable[[Any], None]):
        self.then = then

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch.cuda":
            return None
        from importlib.machinery import PathFinder

        spec = PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _Then(spec.loader, self)
        return spec

    def done(self, module: Any) -> None:
        try:
            sys.meta_path.remove(self)
        except ValueError:
            pass
        if _S.finder is self:
            _S.finder = None
        self.then(module)


class _Then:
    """A loader that runs the real one, then the finder's callback."""

    def __init__(self, loader: Any, finder: _TorchCudaFinder):
        self.loader, self.finder = loader, finder

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        self.finder.done(module)

    def __getattr__(self, name: str) -> Any:  # get_source, is_package, ... as the real loader has them
        return getattr(self.loader, name)


def _reset_for_tests() -> None:
    """Forget this process's caps and remove the finder (tests only)."""
    global _S
    if _S.finder is not None:
        try:
            sys.meta_path.remove(_S.finder)
        except ValueError:
            pass
    _S = _State()
