"""Backends that discover accelerators through their vendor's command-line tool.

* ``neuron`` (AWS Inferentia / Trainium): ``neuron-ls --json-output`` and ``neuron-ls``
  (the table adds the instance type, hence the model), on ``PATH`` or in
  ``/opt/aws/neuron/bin`` (where Ray's Neuron manager looks).
* ``gaudi`` (Intel Gaudi): ``hl-smi topo -c -N`` (modules with their CPU / NUMA affinity).
* ``ascend`` (Huawei Ascend): ``npu-smi info -t topo`` (HCCS / PCIe links) and ``npu-smi info``.

Each reads the tool's output with the capture importers (:mod:`.capture`), so what a
backend sees on a machine and what ``rayaccel topo import`` reads from a saved capture
are the same code, and each declares its accelerator's :class:`~.rayspec.RaySpec`. A tool
that is absent makes the backend unavailable (reason + hint); a tool that runs and finds
no device is unavailable too (its message is the reason); anything else is a
:class:`~rayaccel.errors.BackendError` naming the command.

Tests and other callers inject ``which`` (name -> path or None) and ``run`` (argv ->
``(returncode, stdout, stderr)``), so no test patches ``subprocess``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Callable, Sequence

from ..errors import BackendError, BackendUnavailable, CaptureError
from ..topology import NodeTopology
from .capture import import_captures
from .rayspec import HPU, NEURON, NPU, RaySpec
from .registry import BackendInfo

Runner = Callable[[Sequence[str]], tuple[int, str, str]]
Which = Callable[[str], "str | None"]
#: Seconds one tool invocation may take.
TOOL_TIMEOUT_S = 30.0
_MAX_OUTPUT = 16 << 20


def run_tool(argv: Sequence[str]) -> tuple[int, str, str]:
    """Run ``argv`` (no shell), return ``(returncode, stdout, stderr)``.

    Raises:
        BackendError: it could not be started, or ran past :data:`TOOL_TIMEOUT_S`.
    """
    try:
        p = subprocess.run(list(argv), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S, errors="replace")
    except subprocess.TimeoutExpired:
        raise BackendError(f"`{' '.join(argv)}` did not finish within {TOOL_TIMEOUT_S:g} s") from None
    except OSError as e:
        raise BackendError(f"`{' '.join(argv)}` could not be started: {e.strerror or e}") from None
    return p.returncode, p.stdout[:_MAX_OUTPUT], p.stderr[:_MAX_OUTPUT]


class ToolBackend:
    """A backend over one vendor tool (see the module docstring); subclasses set the class attributes.

    Args:
        which: finds the tool (default: ``shutil.which``, then :attr:`extra_dirs`).
        run: runs one command (default :func:`run_tool`).
    """

    name = "tool"
    tool = ""
    commands: tuple[tuple[str, ...], ...] = ()
    extra_dirs: tuple[str, ...] = ()
    install_hint = ""
    ray_spec: RaySpec | None = None

    def __init__(self, which: Which | None = None, run: Runner | None = None):
        self._which = which
        self._run = run or run_tool

    def _path(self) -> str | None:
        if self._which is not None:
            return self._which(self.tool)
        found = shutil.which(self.tool)
        if found:
            return found
        for d in self.extra_dirs:
            p = os.path.join(d, self.tool)
            if os.path.isfile(p) and os.access(p, os.X_OK):
                return p
        return None

    def available(self) -> BackendInfo:
        """Cheap: only looks for the tool (running it is :meth:`discover`'s job)."""
        if self._path() is None:
            where = " or ".join(("PATH", *self.extra_dirs))
            return BackendInfo(self.name, False, f"{self.tool} not found (looked in {where})", self.install_hint)
        return BackendInfo(self.name, True)

    def discover(self) -> NodeTopology:
        """The node's devices, from the tool's output.

        Raises:
            BackendUnavailable: the tool is absent, or it found no device.
            BackendError: it failed otherwise, or printed what its importer cannot read.
        """
        path = self._path()
        if path is None:
            info = self.available()
            raise BackendUnavailable(self.name, info.reason or f"{self.tool} not found", info.hint)
        texts, failed = [], []
        for cmd in self.commands:  # each view adds fields; one that fails (an older tool) is left out
            rc, out, err = self._run((path, *cmd))
            if rc != 0 or not out.strip():
                msg = " ".join((err or out).split())[:300] or f"exit status {rc}, no output"
                failed.append(f"`{' '.join((self.tool, *cmd))}`: {msg}")
                continue
            texts.append(out)
        if not texts:
            raise BackendUnavailable(self.name, f"{self.tool} found no device ({'; '.join(failed)})",
                                     self.install_hint)
        try:
            res = import_captures([t if "\n" in t else t + "\n" for t in texts], name=None)
        except CaptureError as e:
            raise BackendError(f"cannot read the output of {self.tool}: {e}", backend=self.name) from None
        return res.topology


class NeuronBackend(ToolBackend):
    """AWS Inferentia / Trainium devices through ``neuron-ls``."""

    name = "neuron"
    tool = "neuron-ls"
    commands = (("--json-output",), ())
    extra_dirs = ("/opt/aws/neuron/bin",)
    install_hint = "install the AWS Neuron tools (aws-neuronx-tools) and driver (aws-neuronx-dkms) on a Neuron instance"
    ray_spec = NEURON


class GaudiBackend(ToolBackend):
    """Intel Gaudi modules through ``hl-smi topo -c -N``."""

    name = "gaudi"
    tool = "hl-smi"
    commands = (("topo", "-c", "-N"),)
    install_hint = "install the Intel Gaudi software (habanalabs driver and hl-smi) on a Gaudi server"
    ray_spec = HPU


class AscendBackend(ToolBackend):
    """Huawei Ascend NPUs through ``npu-smi``."""

    name = "ascend"
    tool = "npu-smi"
    commands = (("info", "-t", "topo"), ("info",))
    extra_dirs = ("/usr/local/sbin", "/usr/local/bin")
    install_hint = "install the Ascend driver and npu-smi (Ascend HDK) on an Ascend server"
    ray_spec = NPU
