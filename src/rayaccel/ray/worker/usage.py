"""Inside a worker: :func:`report_usage`, what the worker says it uses of its devices.

On an NVIDIA node the node's agent reads each process's device memory and utilisation from
NVML (:mod:`rayaccel.ray.node.usage`); a simulated node has no NVML, so its workers say what they
use, and ``rayaccel status``, ``rayaccel top`` and the per-holder metrics show it as they would
NVML's figures. Where NVML lists the process, its figures win over the report.

The transport's spilled bytes reach the agent the same way (:func:`rayaccel.ray.usagefile.note_spilled`).
"""

from __future__ import annotations

import os
from rayaccel.contract import DEVICES_ENV, NODE_DIR_ENV, parse_devices
from rayaccel.errors import RequestError
from rayaccel.ray import usagefile
from rayaccel.units import parse_bytes, shorten


def report_usage(used_bytes: int | str | None = None, utilization: float | None = None, *,
                 device: int | None = None) -> str:
    """Say how much of a device this task or actor uses now (read by its node's agent within a second).

    Args:
        used_bytes: device memory in use, bytes or a size (``"3GiB"``); None: unknown.
        utilization: the device's compute in use by this worker, percent (0..100); None: unknown.
        device: which of the worker's devices (an index ``rayaccel.get_devices()`` names); may be left out
            when the worker holds one device.

    Returns:
        The usage file written (``<node dir>/usage/<pid>.json``).

    Raises:
        RequestError: not in a GPU worker of a rayaccel node, a size that cannot be read, a utilisation
            outside 0..100, or a device the worker does not hold (each names what would be right).
    """
    node_dir = os.environ.get(NODE_DIR_ENV)
    held = parse_devices(os.environ.get(DEVICES_ENV))
    if not node_dir or not held:
        raise RequestError("report_usage: call it inside a Ray task or actor that holds devices of a rayaccel node "
                           "(this process holds none)", "device")
    if used_bytes is None and utilization is None:
        raise RequestError("report_usage: give used_bytes, utilization or both", "used_bytes")
    used = None if used_bytes is None else parse_bytes(used_bytes, "used_bytes")
    util = None
    if utilization is not None:
        try:
            util = float(utilization)
        except (TypeError, ValueError):
            util = float("nan")
        if isinstance(utilization, bool) or not 0.0 <= util <= 100.0:
            raise RequestError(f"utilization={shorten(utilization)}: give a percentage from 0 to 100", "utilization")
    if device is None:
        if len(held) > 1:
            raise RequestError(f"report_usage: this worker holds devices {list(held)}; name one with device=",
                               "device")
        device = held[0]
    elif isinstance(device, bool) or not isinstance(device, int) or device not in held:
        raise RequestError(f"device={shorten(device)}: this worker holds devices {list(held)}", "device")
    return usagefile.report(node_dir, device, used, util, usagefile.identity())
