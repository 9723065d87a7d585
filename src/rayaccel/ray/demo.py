"""``rayaccel demo``: a mixed workload really run on Ray, next to what plain Ray would have picked.

Without GPUs: an embedded :class:`SimulatedCluster` of catalog machines (DGX-1
V100 as the head, HGX H100, an 8-GPU two-socket PCIe box, an A100 with MIG
instances). With GPUs: an embedded one-node cluster of the discovered machine
(jobs that can never fit it are skipped and said so).

The workload (:func:`rayaccel.ray.demo_model.workload`) is a sequence of
arrivals and departures: inference singles first, MIG jobs, inference actors
sharing GPUs by memory, then training gangs that run a real torch.distributed
all-reduce (gloo in simulation) and a cross-node gang. Every rayaccel piece is
submitted through ``rayaccel.remote`` / ``rayaccel.gang`` and reports its devices
from inside the worker (``rayaccel.get_devices()``); departures kill the actor or
shut the gang down and wait until Ray shows the devices free again.

Plain Ray is a *shadow* cluster state that evolves only with plain Ray's own
choices through the same event sequence (see :mod:`.demo_model` for how its
hybrid node choice and lowest-free-index device choice are emulated); MIG and
memory-share jobs take a whole GPU there. Bandwidth is the modeled ring
all-reduce bandwidth (:func:`rayaccel.placement.allreduce_bandwidth_gbps`).
"""

from __future__ import annotations

import importlib.util
import json
import time
from pathlib import Path
from typing import Any, Callable

from ..errors import ClusterError
from .demo_model import DEMO_NODES, QUICK_NODES, Job, Placed, Shadow, replay, totals, workload

__all__ = ["DEMO_NODES", "QUICK_NODES", "run_demo"]


def _allreduce(n: int) -> tuple:
    import torch
    import torch.distributed as dist

    t = torch.full((n,), float(dist.get_rank() + 1))
    dist.all_reduce(t)
    return dist.get_rank(), float(t[0]), _where()


def _where_only() -> tuple:
    """Without PyTorch: report the rank's devices, no collective."""
    return None, None, _where()


def _where() -> tuple:
    import rayaccel.ray as rr

    a = rr.get_devices()
    return (a.node_id, a.indices, tuple(p.key for p in a.partitions),
            {int(d): int(b) for d, b in (a.memory_bytes or {}).items()}, a.visible)


class _Holder:
    """A long-lived actor body (an inference server): keeps its devices until killed."""

    def where(self) -> tuple:
        return _where()


def _fits_ever(nodes: list, job: Job) -> bool:
    from ..placement import NodeState, place, place_gang

    idle = [NodeState(t, node_id=n) for n, t in nodes]
    if job.kind == "gang":
        return bool(place_gang(idle, job.workers, job.request.gpus, strategy=job.strategy))
    return bool(place(idle, job.request))


class _Live:
    """rayaccel's side of the demo: really runs each job on Ray and reports where it landed."""

    def __init__(self, names: dict[str, str], nodes: list, log: Callable[[str], None]):
        self.names, self.topos, self.log = names, dict(nodes), log
        self.handles: dict[str, Any] = {}
        self.placed: dict[str, list[Placed]] = {}
        self.notes: dict[str, str] = {}

    def _placed(self, where: tuple, shared: bool) -> Placed:
        node_id, devs, parts, mem, visible = where
        return Placed(self.names[node_id], tuple(devs), tuple(parts), dict(mem) if shared else {})

    def start(self, job: Job, i: int) -> list[Placed] | None:
        import ray

        from . import gangs, tasks

        req = job.request
        fields = dict(job.fields)
        if job.kind == "gang":
            g = gangs.gang(workers=job.workers, gpus_per_worker=req.gpus, strategy=job.strategy, name=job.name)
            self.handles[job.name] = g
            if importlib.util.find_spec("torch") is not None:
                res = g.run(_allreduce, 1 << 16)
                want = float(sum(range(1, job.workers + 1)))
                ok = all(abs(r[1] - want) < 1e-6 for r in res)
                self.notes[job.name] = f"all-reduce {'ok' if ok else 'WRONG'} ({g.backend}, {job.workers} ranks)"
            else:
                res = ray.get([w.run.remote(_where_only, (), {}) for w in g.workers], timeout=60)
                self.notes[job.name] = (f"{job.workers} ranks reserved; no all-reduce: PyTorch not installed "
                                        "(pip install 'rayaccel[torch]')")
            placed = [self._placed(r[2], False) for r in res]
        elif job.kind == "actor":
            h = tasks.remote(num_cpus=0, name=job.name, **fields)(_Holder).remote()
            self.handles[job.name] = h
            placed = [self._placed(ray.get(h.where.remote(), timeout=60), req.kind == "shared")]
        else:
            fn = tasks.remote(num_cpus=0, name=job.name, **fields)(_where)
            placed = [self._placed(ray.get(fn.remote(), timeout=60), req.kind == "shared")]
        self.placed[job.name] = placed
        return placed

    def end(self, name: str) -> None:
        import ray

        h = self.handles.pop(name, None)
        if h is None:
            self._wait_free(name)
            return
        if hasattr(h, "shutdown"):
            h.shutdown()
        else:
            ray.kill(h)
        self._wait_free(name)

    def _wait_free(self, name: str, timeout_s: float = 20.0) -> None:
        """Block until Ray shows what job ``name`` held as available again (so the next plan sees it)."""
        from ray._private import state

        from .resources import allocation_resources

        need: dict[str, dict[str, float]] = {}
        for p in self.placed.get(name, []):
            t = self.topos[p.node]
            parts = [q for q in t.partitions() if q.key in p.partitions]
            res = allocation_resources(t, () if (p.memory or p.partitions) else p.devices, parts, p.memory)
            node_id = next(k for k, v in self.names.items() if v == p.node)
            for r, v in res.items():
                need.setdefault(node_id, {})[r] = need.get(node_id, {}).get(r, 0.0) + v
        deadline = time.monotonic() + timeout_s
        while need and time.monotonic() < deadline:
            avail = state.available_resources_per_node()
            if all(avail.get(n, {}).get(r, 0.0) >= v - 1e-6 for n, rs in need.items() for r, v in rs.items()):
                return
            time.sleep(0.05)
        if need:
            raise ClusterError(f"demo: {name}'s devices were not free again within {timeout_s:.0f} s")

    def shutdown(self) -> None:
        for name in list(self.handles):
            h = self.handles.pop(name)
            if hasattr(h, "shutdown"):
                h.shutdown()


def run_demo(out: str | Path = "rayaccel-demo", *, quick: bool = False, log: Callable[[str], None] = print) -> dict:
    """Run the demo; write ``placement.png`` and ``demo.json`` under ``out``; return the JSON data.

    Returns:
        ``{"nodes", "rows", "totals", "picture", "json", "seconds", "simulated", "skipped"}``;
        each row as from :func:`rayaccel.ray.demo_model.compare`, with ``ours`` measured
        from inside the Ray workers and ``note``.

    Raises:
        ClusterError: Ray is already initialised in this process, or a departure did not free its devices.
    """
    from .cluster import SimulatedCluster
    from .node import init, node_topology, shutdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    topo, simulated = node_topology(None)
    cluster = None
    if simulated:
        names = QUICK_NODES if quick else DEMO_NODES
        log(f"no GPUs found: starting a simulated {len(names)}-node cluster ({', '.join(names)}; "
            f"head {names[0]}) ...")
        cluster = SimulatedCluster(list(names), num_cpus=4, logging_level="ERROR", log_to_driver=False)
        ids = {n.node_id: n.topology.name or n.node_key for n in cluster.nodes}
        nodes = [(n.topology.name or n.node_key, n.topology) for n in cluster.nodes]
    else:
        log(f"using this machine's {len(topo.devices)} devices ({topo.name or topo.hostname})")
        init(logging_level="ERROR", log_to_driver=False)
        from . import context

        nv = context.view().nodes(fresh=True)
        ids = {n.node_id: n.topology.name or n.node_key for n in nv}
        nodes = [(n.topology.name or n.node_key, n.topology) for n in nv]
    live = _Live(ids, nodes, log)
    try:
        events, skipped = [], []
        for what, item in workload(quick):
            if what == "start" and not _fits_ever(nodes, item):
                skipped.append(item.name)
            elif not (what == "end" and item in skipped):
                events.append((what, item))
        if skipped:
            log(f"skipped (cannot fit this cluster even when idle): {', '.join(skipped)}")
        log(f"cluster up in {time.monotonic() - t0:.1f} s; running {sum(e[0] == 'start' for e in events)} jobs "
            f"({sum(e[0] == 'end' for e in events)} departures) ...")
        rows = replay(nodes, events, live.start, live.end, Shadow(nodes, "ray"))
        for r in rows:
            r["note"] = _note(r, live.notes.get(r["job"], ""))
        tot = totals(rows)
        holders: dict = {n: {} for n, _ in nodes}
        for r in rows:
            if r["end"] is None and r["ours"].get("placed"):
                for n, devs in zip(r["ours"]["nodes"], r["ours"]["devices"]):
                    for d in devs:
                        holders[n].setdefault(d, []).append(r["job"])
        final = {n: {d: js[0] if len(js) == 1 else f"{js[0]} +{len(js) - 1}" for d, js in hs.items()}
                 for n, hs in holders.items()}
        picture = _draw(out, nodes, final, tot)
        result = {"nodes": [n for n, _ in nodes], "rows": rows, "totals": tot,
                  "final_placement": {n: {str(d): js for d, js in hs.items()} for n, hs in holders.items()},
                  "picture": str(picture), "simulated": simulated, "skipped": skipped,
                  "seconds": round(time.monotonic() - t0, 1)}
        jpath = out / "demo.json"
        result["json"] = str(jpath)
        jpath.write_text(json.dumps(result, indent=2) + "\n")
        return result
    finally:
        live.shutdown()
        if cluster is not None:
            cluster.shutdown()
        else:
            shutdown()


def _note(row: dict, live_note: str) -> str:
    ours, ray_ = row["ours"], row["ray"]
    bits = [live_note] if live_note else []
    if row["fraction"] and ray_.get("placed"):
        bits.append(f"plain Ray: whole GPU {ray_['devices'][0][0]} "
                    f"({'no MIG' if 'MIG' in row['asks'] else 'no memory shares'})")
    if ray_.get("queued_until"):
        bits.append(f"plain Ray: queued until {ray_['queued_until']} ended")
    if not ray_.get("placed"):
        bits.append("plain Ray: still queued at the end")
    if row["kind"] == "task":
        bits.append("ran and finished")
    if ours.get("bandwidth_gbps") is not None and ray_.get("bandwidth_gbps") is not None:
        a, b = ours["bandwidth_gbps"], ray_["bandwidth_gbps"]
        if a > b + 1e-6:
            bits.append(f"{a / b:.1f}x bandwidth")
        elif a < b - 1e-6:
            bits.append(f"plain Ray {b / a:.1f}x here: rayaccel's earlier choices left it fewer good sets")
    return "; ".join(bits)


def _draw(out: Path, nodes: list, final: dict, tot: dict) -> Path:
    from .. import viz

    path = out / "placement.png"
    ratio = f"; modeled all-reduce bandwidth {tot['ratio']}x plain Ray's" if tot.get("ratio") else ""
    viz.draw_cluster([(n, t, final.get(n, {})) for n, t in nodes], path,
                     title=f"rayaccel demo: jobs still running at the end, as rayaccel placed them{ratio}")
    return path
