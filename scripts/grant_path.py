#!/usr/bin/env python3
"""The path of one plain grant through rayaccel, traced in a real Ray worker: how many module crossings.

One simulated rayaccel node (a DGX-1 V100, 8 GPUs) runs one plain ``@ray.remote(num_gpus=2)`` task
in a new worker. The worker's ``worker_process_setup_hook`` (which Ray runs after the preloaded
worker hook) wraps ``ray._private.utils.set_visible_accelerator_ids`` -- what ``_raylet`` calls
before the task's code, and the one entry of a grant -- and profiles that call with
``sys.setprofile``: Ray's slots turned into units by the node's arbiter, the ids Ray reads back,
``CUDA_VISIBLE_DEVICES`` and the variables rayaccel writes.

A *crossing* is a Python call whose function lives in another module than its caller's (C
functions are not counted; the first call, from ``_raylet``, counts as one from ``ray._raylet``).
Printed: every crossing, those between two rayaccel modules, and those with rayaccel on either
side. ``--list`` lists them (caller -> callee, with counts, in order of first occurrence).
The task also reports its ``ray.get_gpu_ids()`` and ``CUDA_VISIBLE_DEVICES``, so a trace of a
grant that went wrong is never counted.

Usage (starts Ray: run it under the shared lock on a shared machine)::

    python scripts/grant_path.py [--list] [--gpus 2] [--topology dgx1-v100]
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

#: The module the worker keeps its trace in (made by the setup hook, read by the task).
TRACE_MODULE = "_rayaccel_grant_path"


def _setup() -> None:
    """Ray's ``worker_process_setup_hook``: wrap the grant's entry, outermost, with a profiler."""
    import sys
    import types

    from ray._private import utils

    mod = types.ModuleType(TRACE_MODULE)
    mod.calls = []
    sys.modules[TRACE_MODULE] = mod
    inner = utils.set_visible_accelerator_ids

    def _module(frame):
        return frame.f_globals.get("__name__") or "?"

    def prof(frame, event, arg):
        if event != "call":
            return
        back = frame.f_back
        caller = "ray._raylet" if back is None or back.f_code is traced.__code__ else _module(back)
        callee = _module(frame)
        if caller != callee:
            fn = back.f_code.co_name if back is not None and back.f_code is not traced.__code__ else "execute_task"
            mod.calls.append((caller, fn, callee, frame.f_code.co_name))

    def traced():
        if mod.calls:  # only the worker's first grant
            return inner()
        sys.setprofile(prof)
        try:
            return inner()
        finally:
            sys.setprofile(None)
            mod.calls.append(None)  # the end marker: later grants are not traced

    utils.set_visible_accelerator_ids = traced


def _task():
    import os
    import sys

    import ray

    calls = [c for c in sys.modules[TRACE_MODULE].calls if c is not None]
    return calls, ray.get_gpu_ids(), os.environ.get("CUDA_VISIBLE_DEVICES")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list every crossing (caller -> callee, count)")
    ap.add_argument("--gpus", type=int, default=2, help="the task's num_gpus (default 2)")
    ap.add_argument("--topology", default="dgx1-v100", help="the simulated node (a catalog name)")
    a = ap.parse_args()
    if a.gpus < 1:
        sys.exit(f"error: --gpus must be a whole number >= 1, got {a.gpus}")
    import ray

    from rayaccel.errors import RayaccelError
    from rayaccel.ray.driver.cluster import SimulatedCluster

    try:
        c = SimulatedCluster([a.topology], num_cpus=2, logging_level="ERROR", log_to_driver=False,
                             runtime_env={"worker_process_setup_hook": _setup})
    except RayaccelError as e:
        sys.exit(f"error: {e}")
    try:
        calls, ids, visible = ray.get(ray.remote(num_gpus=a.gpus)(_task).remote())
    finally:
        c.shutdown()
    if len(ids) != a.gpus or visible != ",".join(map(str, ids)):
        sys.exit(f"error: the traced grant is wrong: ray.get_gpu_ids()={ids}, CUDA_VISIBLE_DEVICES={visible!r}")

    def ours(m: str) -> bool:
        return m == "rayaccel" or m.startswith("rayaccel.")

    inner = sum(1 for c in calls if ours(c[0]) and ours(c[2]))
    touching = sum(1 for c in calls if ours(c[0]) or ours(c[2]))
    rayaccel_modules = sorted({m for c in calls for m in (c[0], c[2]) if ours(m)})
    print(f"one plain num_gpus={a.gpus} grant in a new Ray {ray.__version__} worker on a simulated {a.topology} "
          f"(devices {ids}, CUDA_VISIBLE_DEVICES={visible})")
    print(f"module crossings: {len(calls)} in all, {inner} rayaccel->rayaccel, {touching} touching rayaccel")
    print(f"rayaccel modules on the path ({len(rayaccel_modules)}): {', '.join(rayaccel_modules)}")
    if a.list:
        for (cm, cf, m, f), n in Counter(calls).items():
            print(f"{n:4d}  {cm}.{cf} -> {m}.{f}")


if __name__ == "__main__":
    main()
