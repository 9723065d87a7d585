"""``rayaccel demo``: a mixed workload on a (simulated) cluster, next to what plain Ray would pick.

Without GPUs: an embedded :class:`SimulatedCluster` of catalog machines (DGX-1
V100, HGX H100, an 8-GPU two-socket PCIe box, an A100 with MIG instances). With
GPUs: an embedded one-node cluster of the discovered machine (jobs that cannot
fit are skipped and said so). The workload, all through ``rayaccel.remote`` /
``rayaccel.gang`` on real Ray:

* training gangs (2 workers x 2 GPUs each) running a real torch.distributed
  all-reduce (gloo in simulation);
* a 4-GPU fine-tuning actor that wants NVLink;
* single-GPU and 2-GPU tasks;
* inference actors sharing GPUs by memory;
* MIG jobs.

For every piece, the "plain Ray" column is what ``num_gpus`` would get on the
same node from the same free state: the raylet takes the lowest free indices
(:func:`rayaccel.placement.baselines.first_free`). Bandwidth is the modeled ring
all-reduce bandwidth (:func:`rayaccel.placement.allreduce_bandwidth_gbps`).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

DEMO_NODES = ("dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "a100-mig")


@dataclass
class Row:
    """One piece of the workload and where it landed."""

    job: str
    kind: str
    request: str
    node: str = ""
    devices: tuple = ()
    bandwidth_gbps: float | None = None
    ray_devices: tuple | None = None
    ray_bandwidth_gbps: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)


def _weakest(topo: Any, devices: tuple) -> str:
    worst = None
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            link = topo.link(a, b)
            r = topo.rank(a, b)
            if worst is None or r < worst[0]:
                worst = (r, link.label if link else "?")
    return worst[1] if worst else "-"


def _allreduce(n: int) -> tuple:
    import torch
    import torch.distributed as dist

    import rayaccel.ray as rr

    t = torch.full((n,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return dist.get_rank(), float(t[0]), rr.get_devices().indices


def _where() -> tuple:
    import rayaccel.ray as rr

    a = rr.get_devices()
    return a.node_id, a.indices, a.visible


class _Holder:
    """A long-lived actor body: keeps its devices until the demo ends."""

    def where(self) -> tuple:
        return _where()


def run_demo(out: str | Path = "rayaccel-demo", *, quick: bool = False, nodes: tuple = DEMO_NODES,
             log: Callable[[str], None] = print) -> dict:
    """Run the demo; return ``{"rows": [...], "totals": {...}, "picture": path, "json": path}``.

    Raises:
        ClusterError: Ray is already initialised in this process.
    """
    import ray

    from .. import placement
    from ..placement import baselines
    from . import context, gangs, tasks
    from .cluster import SimulatedCluster
    from .node import init, node_topology, shutdown
    from .view import node_state

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    topo, simulated = node_topology(None)
    cluster = None
    if simulated:
        names = tuple(n for n in nodes if n != "pcie-8gpu-2socket") if quick else nodes
        log(f"no GPUs found: starting a simulated {len(names)}-node cluster ({', '.join(names)}) ...")
        cluster = SimulatedCluster(list(names), num_cpus=4, logging_level="ERROR", log_to_driver=False)
    else:
        log(f"using this machine's {len(topo.devices)} devices ({topo.name or topo.hostname})")
        init(logging_level="ERROR", log_to_driver=False)
    rows: list[Row] = []
    holders: list = []
    gang_list: list = []
    try:
        log(f"cluster up in {time.monotonic() - t0:.1f} s; placing the workload ...")

        def snapshot():
            time.sleep(0.2)  # let Ray's numbers catch up with what just finished
            nv = context.view().nodes(fresh=True)
            recent = context.recent_claims(nv)
            return {n.node_id: (n, node_state(n, recent.get(n.node_id))) for n in nv}

        def baseline(snap, node_id, req):
            n, st = snap[node_id]
            alloc = baselines.first_free(st, req)
            if not alloc or req.kind != "devices":
                return None, None
            return tuple(alloc.devices), placement.allreduce_bandwidth_gbps(n.topology, alloc.devices)

        def record(job, kind, req, node_id, devices, snap, note=""):
            n = snap[node_id][0]
            bw = placement.allreduce_bandwidth_gbps(n.topology, devices) if req.kind == "devices" else None
            rd, rbw = baseline(snap, node_id, req)
            if req.kind != "devices":
                note = note or ("plain Ray: no MIG" if req.kind == "mig" else "plain Ray: no memory shares")
            rows.append(Row(job, kind, req.describe(), n.topology.name or n.node_key, tuple(devices), bw, rd, rbw,
                            note, {"link": _weakest(n.topology, tuple(devices)),
                                   "ray_link": _weakest(n.topology, rd) if rd else None}))

        def submit_actor(job, **opts):
            cls = tasks.remote(num_cpus=0, name=job, **opts)(_Holder)
            snap = snapshot()
            try:
                h = cls.remote()
            except Exception as e:  # noqa: BLE001 - shown to the user, the demo goes on
                rows.append(Row(job, "actor", cls.request.describe(), note=f"skipped: {e}"))
                return
            try:
                node_id, devs, _ = ray.get(h.where.remote(), timeout=60)
            except ray.exceptions.GetTimeoutError:
                rows.append(Row(job, "actor", cls.request.describe(), note="still queued after 60 s: cluster full"))
                ray.kill(h)
                return
            holders.append(h)
            record(job, "actor", cls.request, node_id, devs, snap)

        def submit_task(job, **opts):
            fn = tasks.remote(name=job, **opts)(_where)
            snap = snapshot()
            try:
                node_id, devs, _ = ray.get(fn.remote(), timeout=60)
            except ray.exceptions.GetTimeoutError:
                rows.append(Row(job, "task", fn.request.describe(), note="still queued after 60 s: cluster full"))
                return
            record(job, "task", fn.request, node_id, devs, snap)

        def submit_gang(job, workers, per):
            snap = snapshot()
            try:
                g = gangs.gang(workers=workers, gpus_per_worker=per, strategy="pack", name=job)
            except Exception as e:  # noqa: BLE001 - shown to the user, the demo goes on
                rows.append(Row(job, "gang", f"{workers} x {per} GPUs", note=f"skipped: {e}"))
                return
            gang_list.append(g)
            res = g.run(_allreduce, 1024)
            expect = sum(range(1, workers + 1))
            ok = all(abs(r[1] - expect) < 1e-6 for r in res)
            req = placement.Request(gpus=per)
            for rank, a in enumerate(g.allocation.workers):
                record(f"{job}[{rank}]", "gang", req, a.node, tuple(a.devices), snap,
                       note=f"all-reduce {'ok' if ok else 'WRONG'} ({g.backend})")
                n, st = snap[a.node]
                snap[a.node] = (n, st.with_busy(a.devices))

        submit_gang("train-a", 2, 4)
        submit_actor("finetune", gpus=4, interconnect="nvlink")
        submit_actor("eval", gpus=1)
        if not quick:
            submit_gang("train-b", 2, 2)
            submit_actor("rl-policy", gpus=2)
        for i in range(2 if quick else 3):
            submit_actor(f"infer-{i}", gpu_memory="12GiB")
        if any(n.topology.partitions() for n in context.view().nodes(fresh=True)):
            submit_actor("mig-small", mig="1g.5gb")
            submit_actor("mig-medium", mig="3g.20gb")
        submit_task("pair-task", gpus=2)
        for i in range(1 if quick else 2):
            submit_task(f"single-{i}", gpus=1)
        picture = _draw(out, rows, context.view().nodes(fresh=True), log)
        totals = _totals(rows)
        result = {"rows": [r.__dict__ for r in rows], "totals": totals, "picture": str(picture) if picture else None,
                  "seconds": round(time.monotonic() - t0, 1), "simulated": simulated}
        jpath = out / "demo.json"
        jpath.write_text(json.dumps(result, indent=2, default=list) + "\n")
        result["json"] = str(jpath)
        return result
    finally:
        for g in gang_list:
            g.shutdown()
        if cluster is not None:
            cluster.shutdown()
        else:
            shutdown()


def _totals(rows: list[Row]) -> dict:
    both = [r for r in rows if r.bandwidth_gbps and r.ray_bandwidth_gbps is not None]
    ours = sum(r.bandwidth_gbps for r in both)
    theirs = sum(r.ray_bandwidth_gbps for r in both)
    better = sum(1 for r in both if r.bandwidth_gbps > r.ray_bandwidth_gbps + 1e-9)
    return {"compared": len(both), "rayaccel_gbps": round(ours, 1), "ray_gbps": round(theirs, 1),
            "ratio": round(ours / theirs, 2) if theirs else None, "better": better,
            "ray_cannot": sum(1 for r in rows if r.note.startswith("plain Ray"))}


def _draw(out: Path, rows: list[Row], nodes: list, log: Callable[[str], None]) -> Path | None:
    from .. import viz

    by_node: dict[str, dict[int, str]] = {}
    for r in rows:
        if r.kind in ("actor", "gang") and r.devices:
            a = by_node.setdefault(r.node, {})
            for d in r.devices:
                a[d] = f"{a[d]}+{r.job}" if d in a else r.job
    spec = [(n.topology.name or n.node_key, n.topology, by_node.get(n.topology.name or n.node_key, {}))
            for n in nodes]
    path = out / "placement.png"
    viz.draw_cluster(spec, path, title="rayaccel demo: final placement")
    return path
