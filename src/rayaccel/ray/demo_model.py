"""The demo's workload and its two shadow clusters: what rayaccel and plain Ray would each do.

Pure functions over topology data (no ``ray`` import), so the comparison is
testable in milliseconds. :func:`compare` replays one workload (the same
arrivals and departures, in the same order) on two independent cluster states:

* **rayaccel**: :func:`rayaccel.placement.place` / :func:`~rayaccel.placement.place_gang`
  (what ``rayaccel.remote`` / ``rayaccel.gang`` decide); the real demo runs these on Ray.
* **plain Ray**: a shadow state that evolves only with plain Ray's own choices.
  Node choice emulates Ray's default *hybrid* policy simply: nodes in order, the
  head (driver's) node first; the first node that fits and whose GPU utilisation
  is below 50% wins, else the fitting node with the lowest utilisation (ties: the
  earlier node). Placement groups (gangs) follow Ray's bundle scheduler:
  ``STRICT_PACK``/``PACK`` take the fitting node left with the fewest free GPUs
  (best fit, ties: earlier node), ``SPREAD`` one bundle per node, best fit each.
  On the node, the raylet hands out the lowest free GPU indices
  (:func:`rayaccel.placement.baselines.first_free`). Ray counts only GPUs here.
  Ray has no MIG and no GPU-memory resource: such jobs take a whole GPU
  (``num_gpus=1``) on a cluster whose A100 is not partitioned. A job that fits
  nowhere waits in Ray's queue and is placed at the first departure that frees room.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from ..placement import NodeState, Request, allreduce_bandwidth_gbps, place, place_gang
from ..placement.baselines import first_free
from ..topology import NodeTopology

#: Nodes of the simulated demo cluster, head (the driver's node) first.
DEMO_NODES = ("dgx1-v100", "hgx-h100", "pcie-8gpu-2socket", "a100-mig")
QUICK_NODES = ("dgx1-v100", "a100-mig")
SPREAD_THRESHOLD = 0.5


@dataclass(frozen=True)
class Job:
    """One piece of the workload.

    Attributes:
        name: unique job name. kind: ``"actor"`` (holds its devices until its end
            event), ``"task"`` (runs and ends at once) or ``"gang"`` (torch.distributed
            workers, all-reduce on arrival, held until its end event).
        fields: :class:`Request` fields of the job (per worker for gangs).
        workers / strategy: gangs only. what: a few words on the job.
    """

    name: str
    kind: str
    fields: tuple = ()
    workers: int = 1
    strategy: str = "pack"
    what: str = ""

    @property
    def request(self) -> Request:
        """The per-worker request (``gpus`` defaults like ``rayaccel.remote``: mig/memory alone share)."""
        f = dict(self.fields)
        if "gpus" not in f:
            f["gpus"] = 0 if ("mig" in f or "gpu_memory" in f) else 1
        if "gpu_memory" in f and f["gpus"] == 0:
            f.setdefault("exclusive", False)
        return Request(**f)

    @property
    def gpus(self) -> int:
        """Whole GPUs the job uses in all (0 for MIG / memory shares)."""
        return self.request.gpus * self.workers

    def asks(self) -> str:
        """A short human form of the request."""
        r = self.request.describe()
        if self.kind == "gang":
            return f"gang {self.workers} x {r} ({self.strategy})"
        return r


def workload(quick: bool = False) -> list[tuple[str, Job | str]]:
    """The demo's event list: ``("start", Job)`` and ``("end", job name)``, in arrival order.

    Inference singles arrive first and finish unevenly (this is what breaks NVLink
    groups under lowest-index placement), then MIG jobs, memory-shared inference
    actors, and training: 2- and 4-GPU gangs, a 4-GPU NVLink fine-tune, a cross-node gang.
    """
    def actor(name, what, **f):
        return ("start", Job(name, "actor", tuple(f.items()), what=what))

    def gang(name, what, workers, per, strategy):
        return ("start", Job(name, "gang", (("gpus", per),), workers, strategy, what))

    ev: list = [
        actor("serve-a", "inference, 1 GPU", gpus=1),
        actor("serve-b", "inference, 1 GPU", gpus=1),
        actor("serve-c", "inference, 1 GPU", gpus=1),
        actor("mig-embed", "embeddings on a MIG slice", mig="1g.5gb"),
        actor("chat-0", "LLM server, 12 GiB", gpu_memory="12GiB"),
    ]
    if quick:
        return ev + [("end", "serve-b"), gang("ddp-2", "DDP training, 2 ranks", 2, 1, "strict-pack"),
                     ("end", "serve-a"), ("end", "chat-0")]
    return ev + [
        actor("chat-1", "LLM server, 12 GiB", gpu_memory="12GiB"),
        ("end", "serve-b"),
        gang("ddp-2", "DDP training, 2 ranks", 2, 1, "strict-pack"),
        gang("ddp-4", "DDP training, 4 ranks", 4, 1, "strict-pack"),
        actor("finetune", "4-GPU fine-tune, wants NVLink", gpus=4, interconnect="nvlink"),
        gang("pretrain", "2 nodes x 2 GPUs", 2, 2, "spread"),
        actor("mig-asr", "speech on a MIG slice", mig="3g.20gb"),
        actor("chat-2", "LLM server, 12 GiB", gpu_memory="12GiB"),
        actor("chat-3", "LLM server, 24 GiB", gpu_memory="24GiB"),
        actor("serve-d", "inference, 1 GPU", gpus=1),
        ("end", "ddp-2"),
        ("end", "serve-a"),
        ("start", Job("eval-2", "task", (("gpus", 2),), what="2-GPU eval task")),
        ("end", "chat-0"),
    ]


# ------------------------------------------------------------------ placements
@dataclass
class Placed:
    """Where one job (or one gang worker) landed on one side.

    Attributes:
        node: node name. devices: whole devices (or the MIG parent / shared device).
        partitions: MIG instance keys. memory: device -> bytes for memory shares.
        whole_for_fraction: plain Ray held a whole GPU for a MIG/memory job.
    """

    node: str
    devices: tuple = ()
    partitions: tuple = ()
    memory: dict = field(default_factory=dict)
    whole_for_fraction: bool = False


def plain_topology(t: NodeTopology) -> NodeTopology:
    """The node as plain Ray sees it: whole GPUs, no MIG instances."""
    devs = tuple(dataclasses.replace(d, mig_mode=False, partitions=()) for d in t.devices)
    return dataclasses.replace(t, devices=devs)


class Shadow:
    """One side's evolving cluster state: ``start(job)`` / ``end(name)``.

    Args:
        nodes: ``(name, topology)`` per node, head first. policy: ``"rayaccel"`` or ``"ray"``.
    """

    def __init__(self, nodes: Sequence[tuple[str, NodeTopology]], policy: str):
        if policy not in ("rayaccel", "ray"):
            raise ValueError(f"policy must be 'rayaccel' or 'ray', got {policy!r}")
        self.policy = policy
        self.order = [n for n, _ in nodes]
        conv = plain_topology if policy == "ray" else (lambda t: t)
        self.states = {n: NodeState(conv(t), node_id=n) for n, t in nodes}
        self.held: dict[str, list[Placed]] = {}

    # state bookkeeping
    def take(self, name: str, placed: list[Placed]) -> None:
        """Mark ``placed`` as held by job ``name``."""
        for p in placed:
            st = self.states[p.node]
            mem = dict(st.memory_used)
            for d, b in p.memory.items():
                mem[d] = mem.get(d, 0) + b
            busy = st.busy | (frozenset(p.devices) if not p.memory and not p.partitions else frozenset())
            self.states[p.node] = NodeState(st.topology, busy, st.busy_partitions | frozenset(p.partitions), mem, p.node)
        self.held[name] = placed

    def end(self, name: str) -> None:
        """Free what job ``name`` holds (nothing when it never started)."""
        for p in self.held.pop(name, []):
            st = self.states[p.node]
            mem = dict(st.memory_used)
            for d, b in p.memory.items():
                mem[d] = mem.get(d, 0) - b
            busy = st.busy - (frozenset(p.devices) if not p.memory and not p.partitions else frozenset())
            self.states[p.node] = NodeState(st.topology, busy, st.busy_partitions - frozenset(p.partitions), mem, p.node)

    def start(self, job: Job) -> list[Placed] | None:
        """Place ``job`` (and hold it); None when it fits nowhere now."""
        placed = self._rayaccel(job) if self.policy == "rayaccel" else self._ray(job)
        if placed is not None:
            self.take(job.name, placed)
        return placed

    # rayaccel
    def _rayaccel(self, job: Job) -> list[Placed] | None:
        states = [self.states[n] for n in self.order]
        if job.kind == "gang":
            ga = place_gang(states, job.workers, job.request.gpus, strategy=job.strategy)
            return [Placed(a.node, tuple(a.devices)) for a in ga.workers] if ga else None
        a = place(states, job.request)
        if not a:
            return None
        return [Placed(a.node, tuple(a.devices), tuple(p.key for p in a.partitions),
                       dict(a.memory_bytes) if job.request.kind == "shared" else {})]

    # plain Ray
    def _util(self, n: str) -> float:
        st = self.states[n]
        return len(st.busy) / max(1, len(st.topology.devices))

    def _fits(self, n: str, k: int) -> bool:
        st = self.states[n]
        return len(st.topology.devices) - len(st.busy) >= k

    def _hybrid_node(self, k: int) -> str | None:
        fit = [n for n in self.order if self._fits(n, k)]
        if not fit:
            return None
        for n in fit:
            if self._util(n) < SPREAD_THRESHOLD:
                return n
        return min(fit, key=lambda n: (self._util(n), self.order.index(n)))

    def _best_fit(self, k: int, exclude: Iterable[str] = ()) -> str | None:
        fit = [n for n in self.order if n not in exclude and self._fits(n, k)]
        if not fit:
            return None
        return min(fit, key=lambda n: (len(self.states[n].topology.devices) - len(self.states[n].busy) - k,
                                       self.order.index(n)))

    def _first_free(self, n: str, k: int) -> tuple:
        return tuple(first_free(self.states[n], Request(gpus=k)).devices)

    def _ray(self, job: Job) -> list[Placed] | None:
        req = job.request
        fraction = req.kind != "devices"
        k = 1 if fraction else req.gpus
        if job.kind == "gang" and job.strategy == "spread":
            saved, out, used = dict(self.states), [], []
            try:
                for _ in range(job.workers):  # one bundle per node where possible, best fit each
                    n = self._best_fit(k, used) or self._best_fit(k)
                    if n is None:
                        return None
                    out.append(Placed(n, self._first_free(n, k)))
                    used.append(n)
                    self.states[n] = self.states[n].with_busy(out[-1].devices)
            finally:
                self.states = saved
            return out
        if job.kind == "gang":
            n = self._best_fit(k * job.workers)
            if n is None:
                return None
            devs = self._first_free(n, k * job.workers)
            return [Placed(n, devs[i * k:(i + 1) * k]) for i in range(job.workers)]
        n = self._hybrid_node(k)
        if n is None:
            return None
        return [Placed(n, self._first_free(n, k), whole_for_fraction=fraction)]


# ------------------------------------------------------------------ comparison
def weakest_link(topo: NodeTopology, devices: Sequence[int]) -> str | None:
    """The label of the weakest link among ``devices`` (None for fewer than two)."""
    worst = None
    for i, a in enumerate(devices):
        for b in devices[i + 1:]:
            r = topo.rank(a, b)
            if worst is None or r < worst[0]:
                link = topo.link(a, b)
                worst = (r, link.label if link else "?")
    return worst[1] if worst else None


def side_summary(topos: dict, placed: list[Placed] | None, job: Job) -> dict:
    """JSON-able facts of one side's placement of ``job``: nodes, devices, link, modeled GB/s, best?"""
    if placed is None:
        return {"placed": False}
    out: dict = {"placed": True, "nodes": [p.node for p in placed], "devices": [list(p.devices) for p in placed],
                 "partitions": [list(p.partitions) for p in placed],
                 "memory_bytes": [{str(d): b for d, b in p.memory.items()} for p in placed],
                 "whole_for_fraction": any(p.whole_for_fraction for p in placed),
                 "gpu_share": round(sum(gpu_share(topos[p.node], p) for p in placed), 3)}
    if job.kind == "gang" and len({p.node for p in placed}) == 1:
        groups = [(placed[0].node, tuple(d for p in placed for d in p.devices))]
    else:
        groups = [(p.node, p.devices) for p in placed]
    if job.gpus > 1 and all(len(g) > 1 for _, g in groups):
        bws, links, best = [], [], True
        for n, devs in groups:
            t = topos[n]
            bws.append(allreduce_bandwidth_gbps(t, devs))
            links.append(weakest_link(t, devs))
            best = best and abs(bws[-1] - best_bandwidth(t, len(devs))) < 1e-6
        out.update(bandwidth_gbps=round(min(bws), 1), link=" / ".join(dict.fromkeys(links)), best=best)
    return out


def gpu_share(topo: NodeTopology, p: Placed) -> float:
    """How much of a GPU ``p`` really holds: 1 per whole device, a MIG slice's compute share
    (``3g`` = 3/7 of an A100), a memory share's fraction of the device memory."""
    if p.partitions:
        parts = {q.key: q for q in topo.partitions()}
        return sum(int(parts[k].profile.split("g", 1)[0]) / 7 for k in p.partitions)
    if p.memory:
        return sum(b / (topo.device(d).memory_bytes or b) for d, b in p.memory.items())
    return float(len(p.devices))


_BEST: dict = {}


def best_bandwidth(topo: NodeTopology, k: int) -> float:
    """Modeled all-reduce GB/s of the best ``k``-set on an idle ``topo`` (cached)."""
    key = (topo.name, topo.to_json() if topo.name is None else "", k)
    if key not in _BEST:
        a = place([NodeState(topo)], Request(gpus=k))
        _BEST[key] = allreduce_bandwidth_gbps(topo, a.devices) if a else 0.0
    return _BEST[key]


def totals(rows: list[dict]) -> dict:
    """Sums over rows from :func:`compare` (or the live demo): bandwidth, best-interconnect counts, waste."""
    multi = [r for r in rows if r["ours"].get("bandwidth_gbps") is not None and r["ray"].get("bandwidth_gbps") is not None]
    ours = sum(r["ours"]["bandwidth_gbps"] for r in multi)
    theirs = sum(r["ray"]["bandwidth_gbps"] for r in multi)
    frac = [r for r in rows if r["fraction"]]
    shared_devs = {(n, d) for r in frac if r["ours"].get("placed")
                   for n, ds in zip(r["ours"]["nodes"], r["ours"]["devices"]) for d in ds}
    share = sum(r["ours"].get("gpu_share", 0.0) for r in frac)
    return {
        "multi_gpu_jobs": len(multi),
        "rayaccel_gbps_sum": round(ours, 1), "ray_gbps_sum": round(theirs, 1),
        "rayaccel_gbps_mean": round(ours / len(multi), 1) if multi else None,
        "ray_gbps_mean": round(theirs / len(multi), 1) if multi else None,
        "ratio": round(ours / theirs, 2) if theirs else None,
        "better": sum(1 for r in multi if r["ours"]["bandwidth_gbps"] > r["ray"]["bandwidth_gbps"] + 1e-6),
        "worse": sum(1 for r in multi if r["ours"]["bandwidth_gbps"] < r["ray"]["bandwidth_gbps"] - 1e-6),
        "rayaccel_best": sum(1 for r in multi if r["ours"].get("best")),
        "ray_best": sum(1 for r in multi if r["ray"].get("best")),
        "fraction_jobs": len(frac),
        "rayaccel_gpus_for_fraction_jobs": len(shared_devs),
        "rayaccel_gpu_share_of_fraction_jobs": round(share, 2),
        "ray_gpus_for_fraction_jobs": sum(1 for r in frac if r["ray"].get("placed")),
        "ray_queued": [r["job"] for r in rows if r["ray"].get("queued_until")],
    }


def compare(nodes: Sequence[tuple[str, NodeTopology]], events: Sequence[tuple[str, Job | str]]) -> list[dict]:
    """Replay ``events`` on a rayaccel shadow and a plain-Ray shadow; one row per job (arrival order).

    Each row: ``job``, ``kind``, ``asks``, ``what``, ``fraction`` (MIG / memory share),
    ``start``/``end`` (event numbers), ``ours`` and ``ray`` (:func:`side_summary`).
    Use :func:`totals` on the rows. A job plain Ray cannot place waits and is placed
    at the first later departure that makes room (``ray.queued_until``).
    """
    ours, theirs = Shadow(nodes, "rayaccel"), Shadow(nodes, "ray")
    return replay(nodes, events, lambda job, i: ours.start(job), ours.end, theirs)


def replay(nodes, events, run_ours, end_ours, theirs: Shadow) -> list[dict]:
    """The event loop of :func:`compare`; ``run_ours(job, event_no)`` places (or really runs) our side."""
    topos = dict(nodes)
    rows: dict[str, dict] = {}
    waiting: list[Job] = []
    for i, (what, item) in enumerate(events):
        if what == "start":
            job = item
            req = job.request
            row = rows[job.name] = {"job": job.name, "kind": job.kind, "asks": job.asks(), "what": job.what,
                                    "fraction": req.kind != "devices", "start": i, "end": None}
            placed = run_ours(job, i)
            row["ours"] = side_summary(topos, placed, job)
            got = theirs.start(job)
            row["ray"] = side_summary(topos, got, job)
            if got is None:
                waiting.append(job)
            if job.kind == "task":
                row["end"] = i
                end_ours(job.name)
                theirs.end(job.name)
        elif what == "end":
            if item not in rows:
                raise ValueError(f"event {i}: end of {item!r}, which never started")
            rows[item]["end"] = i
            end_ours(item)
            theirs.end(item)
            for job in list(waiting):
                got = theirs.start(job)
                if got is not None:
                    waiting.remove(job)
                    rows[job.name]["ray"] = {**side_summary(topos, got, job), "queued_until": item}
        else:
            raise ValueError(f"event {i}: unknown kind {what!r} (start or end)")
    return list(rows.values())
