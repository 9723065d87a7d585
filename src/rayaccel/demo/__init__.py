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
from ..placement import allreduce_bandwidth_gbps
from ..ray.driver.cluster import SimulatedCluster
from . import workload

__all__ = ["MACHINE", "run_demo"]

#: The machine both runs simulate.
MACHINE = "dgx1-v100"


def _side(plain: bool, storage: str, log: Callable[[str], None]) -> dict[str, Any]:
    c = SimulatedCluster([MACHINE], num_cpus=8, plain=[0] if plain else (), logging_level="ERROR",
                         log_to_driver=False)
    try:
        return workload.run(storage, log)
    finally:
        c.shutdown()


def _weakest(topo: Any, devices: list[int]) -> str:
    worst = None
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            l = topo.link(min(a, b), max(a, b))
            if l is not None and (worst is None or l.rank < worst.rank):
                worst = l
    return worst.label if worst else "-"


def run_demo(out: str | Path, quick: bool = False, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run both sides and write ``placement.png`` and ``demo.json`` into ``out``.

    Args:
        out: output directory (created).
        quick: kept for compatibility with scripts; both runs are already short.
        log: progress lines.

    Returns:
        ``{"rows": [...], "totals": {...}, "picture": path, "json": path, "seconds": s}``.

    Raises:
        ClusterError: Ray is already initialised in this process, or a run failed.
    """

    t0 = time.monotonic()
    out = _output_dir(out)
    topo = catalog.load(MACHINE)
    storage = tempfile.mkdtemp(prefix="rayaccel-demo-train-")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    log(f"rayaccel: unchanged Ray code on a simulated {topo.name} ({len(topo.devices)} GPUs) as a rayaccel node ...")
    ours = _side(False, storage, log)
    log("plain Ray: the same code on a plain Ray node of the same machine ...")
    theirs = _side(True, storage, log)
    rows = []
    for job in ours:
        a, b = ours[job], theirs.get(job, {})
        row = {"job": job, "rayaccel": a, "ray": b}
        for side, r in (("rayaccel", a), ("ray", b)):
            devs = r.get("gpus") or []
            if len(devs) > 1 and not job.startswith("serve"):  # replicas are independent: no collective
                r["link"] = _weakest(topo, devs)
                r["bandwidth_gbps"] = round(allreduce_bandwidth_gbps(topo, devs), 1)
        rows.append(row)
    multi = [r for r in rows if "bandwidth_gbps" in r["rayaccel"]]
    ours_bw = sum(r["rayaccel"].get("bandwidth_gbps", 0) for r in multi)
    ray_bw = sum(r["ray"].get("bandwidth_gbps", 0) for r in multi)
    totals = {"multi_gpu_jobs": len(multi), "rayaccel_gbps_sum": round(ours_bw, 1), "ray_gbps_sum": round(ray_bw, 1),
              "ratio": round(ours_bw / ray_bw, 2) if ray_bw else None,
              "better": sum(1 for r in multi if r["rayaccel"].get("bandwidth_gbps", 0) > r["ray"].get("bandwidth_gbps", 0) + 1e-6),
              "worse": sum(1 for r in multi if r["rayaccel"].get("bandwidth_gbps", 0) < r["ray"].get("bandwidth_gbps", 0) - 1e-6)}
    picture = _picture(out, topo, ours, theirs)
    res = {"machine": MACHINE, "rows": rows, "totals": totals, "picture": str(picture),
           "json": str(out / "demo.json"), "seconds": round(time.monotonic() - t0, 1)}
    (out / "demo.json").write_text(json.dumps(res, indent=2))
    return res


def _output_dir(out: str | Path) -> Path:
    """Check ``out`` before any work (:func:`rayaccel.viz.check_output_dir`), then create it."""
    from ..viz import check_output_dir  # viz loads matplotlib: only when pictures are made

    p = check_output_dir(out, what="demo results")
    p.mkdir(parents=True, exist_ok=True)
    return p


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
