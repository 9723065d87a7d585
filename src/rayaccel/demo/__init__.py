"""``rayaccel demo``: the same unchanged Ray code on a rayaccel node and on a plain Ray node.

Both runs are real: a simulated cluster of one DGX-1 V100 is started twice, once
as a rayaccel node and once as a plain ``ray start --num-gpus=8`` node, and
:func:`.workload.run` (Ray Serve, a plain ``num_gpus`` task and Ray Train, written
exactly as a Ray user writes them) runs on each. Each piece reports the GPUs it
got from inside its workers; the demo compares the links between them and the
modeled ring all-reduce bandwidth (:func:`rayaccel.placement.allreduce_bandwidth_gbps`).

With real GPUs present the same comparison runs on a simulated copy of the
catalog default (the demo never touches real devices).
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Callable

from .. import catalog
from ..arbiter.groupmap import weakest_link
from ..errors import ClusterError
from ..placement import allreduce_bandwidth_gbps
from ..ray.driver.cluster import SimulatedCluster
from . import workload

__all__ = ["MACHINE", "run_demo"]

#: The machine both runs simulate.
MACHINE = "dgx1-v100"


def _side(plain: bool, storage: str, log: Callable[[str], None]) -> dict[str, Any]:
    """Start one side's cluster, run the workload, stop the cluster.

    Raises:
        ClusterError: the cluster did not start or the run failed (one line naming the side).
    """
    side = "plain Ray" if plain else "rayaccel"
    try:
        c = SimulatedCluster([MACHINE], num_cpus=8, plain=[0] if plain else (), logging_level="ERROR",
                             log_to_driver=False)
    except ClusterError:
        raise
    except Exception as e:  # Ray's own start-up errors: one line, not a traceback
        raise ClusterError(f"the demo's {side} cluster did not start: {type(e).__name__}: {_first(e)}") from e
    try:
        return workload.run(storage, log)
    except ClusterError:
        raise
    except Exception as e:  # a Ray error of the run: one line (the CLI prints it), not a traceback
        raise ClusterError(f"the demo's {side} run failed: {type(e).__name__}: {_first(e)}") from e
    finally:
        c.shutdown()


def _first(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0][:300]


def run_demo(out: str | Path | None = None, quick: bool = False,
             log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run both sides; with ``out``, write ``placement.png`` and ``demo.json`` there.

    Args:
        out: output folder (created, with missing parents); None writes nothing. It is
            checked before any work and is all or nothing: a failed run removes what it wrote
            and the folders it created (:func:`rayaccel._outputs.output_dir`).
        quick: kept for compatibility with scripts; both runs are already short.
        log: progress lines.

    Returns:
        ``{"rows": [...], "totals": {...}, "serve_kept": {...}, "picture": path or None,
        "json": path or None, "seconds": s}``. ``serve_kept`` is the GPU each side's Serve
        kept when it scaled down: Serve picks which replica to stop, so the GPU freed for
        Train can differ from run to run and between the sides.

    Raises:
        OutputPathError: ``out`` cannot be written (before any work).
        ClusterError: Ray is already initialised in this process, or a run failed.
    """
    if out is None:
        return _run(None, log)
    from .._outputs import output_dir

    with output_dir(out, what="demo results") as folder:
        return _run(folder, log)


def _run(out: Path | None, log: Callable[[str], None]) -> dict[str, Any]:
    t0 = time.monotonic()
    topo = catalog.load(MACHINE)
    storage = tempfile.mkdtemp(prefix="rayaccel-demo-train-")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        log(f"rayaccel: unchanged Ray code on a simulated {topo.name} ({len(topo.devices)} GPUs) as a rayaccel node ...")
        ours = _side(False, storage, log)
        log("plain Ray: the same code on a plain Ray node of the same machine ...")
        theirs = _side(True, storage, log)
    finally:
        import shutil

        shutil.rmtree(storage, ignore_errors=True)
    rows = []
    for job in ours:
        a, b = ours[job], theirs.get(job, {})
        row = {"job": job, "rayaccel": a, "ray": b}
        for side, r in (("rayaccel", a), ("ray", b)):
            devs = r.get("gpus") or []
            if len(devs) > 1 and not job.startswith("serve"):  # replicas are independent: no collective
                r["link"] = weakest_link(topo, devs) or "-"
                r["bandwidth_gbps"] = round(allreduce_bandwidth_gbps(topo, devs), 1)
        rows.append(row)
    multi = [r for r in rows if "bandwidth_gbps" in r["rayaccel"]]
    ours_bw = sum(r["rayaccel"].get("bandwidth_gbps", 0) for r in multi)
    ray_bw = sum(r["ray"].get("bandwidth_gbps", 0) for r in multi)
    totals = {"multi_gpu_jobs": len(multi), "rayaccel_gbps_sum": round(ours_bw, 1), "ray_gbps_sum": round(ray_bw, 1),
              "ratio": round(ours_bw / ray_bw, 2) if ray_bw else None,
              "better": sum(1 for r in multi if r["rayaccel"].get("bandwidth_gbps", 0) > r["ray"].get("bandwidth_gbps", 0) + 1e-6),
              "worse": sum(1 for r in multi if r["rayaccel"].get("bandwidth_gbps", 0) < r["ray"].get("bandwidth_gbps", 0) - 1e-6)}
    kept = {side: next((r[side].get("after_scale_down") for r in rows if "after_scale_down" in r[side]), None)
            for side in ("rayaccel", "ray")}
    res = {"machine": MACHINE, "rows": rows, "totals": totals, "serve_kept": kept, "picture": None, "json": None,
           "seconds": None}
    if out is not None:
        from .._outputs import write_text

        picture = _picture(out, topo, ours, theirs)
        res["picture"], res["json"] = str(picture), str(out / "demo.json")
        res["seconds"] = round(time.monotonic() - t0, 1)
        try:
            write_text(out / "demo.json", json.dumps(res, indent=2), what="demo results")
        except BaseException:
            picture.unlink(missing_ok=True)  # both files or neither, also in a folder that existed before
            raise
    res["seconds"] = round(time.monotonic() - t0, 1)
    return res


def _picture(out: Path, topo: Any, ours: dict, theirs: dict) -> Path:
    from ..viz import draw_cluster  # matplotlib, only for the picture

    def assign(side: dict) -> dict[int, str]:
        """Who holds each GPU at the end (while Train runs): Serve after scaling down, the task, Train."""
        a: dict[int, str] = {}
        for job, r in side.items():
            short = job.split(":")[0]
            for d in r.get("after_scale_down", r.get("gpus", ())):
                a[d] = short
        return a

    return draw_cluster([("rayaccel", topo, assign(ours)), ("plain Ray", topo, assign(theirs))],
                        out / "placement.png", title=f"the same Ray code on a {topo.name}: where each job's GPUs are")
