"""The peers' own test cases (``tests/peers/*.json``), as topologies, requests and comparisons.

Each JSON file holds one peer's test nodes and table cases, transcribed as data
with the source file and test name of every case (see its ``what``). This
module turns a node into a :class:`NodeTopology`, runs rayaccel on a case, and
compares rayaccel's set with the peer's expected one on

* the weakest link (rayaccel's :attr:`Link.rank`),
* the peer's own link weights (go-gpuallocator's pair scores, HAMi's pair
  scores, the ROCm device plugin's pair weights, where lower is better),
* the modeled ring all-reduce (:func:`rayaccel.placement.allreduce_bandwidth_gbps`).

For a single device, where a set has no pairs, the comparison is on what the
choice leaves for later jobs: the best 2- and 4-device sets of the remainder
on the same three measures, and the peer's summed weights over the remaining
pairs (HAMi's remaining-pair score).

Used by ``tests/placement/test_placement_peers.py`` and ``benchmarks/placement_peers.py``.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from pathlib import Path

from rayaccel.errors import RequestError
from rayaccel.placement import NodeState, Request, allreduce_bandwidth_gbps, plan
from rayaccel.topology import NO_LINK_RANK, Device, NodeTopology, make_link

DIR = Path(__file__).parent.parent / "peers"

#: NVML P2P link type (go-gpuallocator / HAMi names) -> ``nvidia-smi topo -m`` class.
P2P_CLASS = {"P2PLinkSingleSwitch": "PIX", "P2PLinkMultiSwitch": "PXB", "P2PLinkHostBridge": "PHB",
             "P2PLinkSameCPU": "NODE", "P2PLinkCrossCPU": "SYS", "P2PLinkSameBoard": "PIX"}
#: go-gpuallocator's ``calculateGPUPairScore`` weights (gpuallocator/besteffort_policy.go).
GO_P2P_SCORE = {"P2PLinkCrossCPU": 10, "P2PLinkSameCPU": 20, "P2PLinkHostBridge": 30, "P2PLinkMultiSwitch": 40,
                "P2PLinkSingleSwitch": 50, "P2PLinkSameBoard": 60}
GO_NVLINK_SCORE = 100  # per NVLink lane


def suites() -> list[dict]:
    """Every peer suite, loaded from ``tests/peers/*.json`` (sorted by file name)."""
    out = []
    for p in sorted(DIR.glob("*.json")):
        doc = json.loads(p.read_text())
        doc["_file"] = p.name
        out.append(doc)
    return out


def cases() -> list[tuple[dict, dict]]:
    """(suite, case) for every case of every suite."""
    return [(s, c) for s in suites() for c in s["cases"]]


def case_id(suite: dict, case: dict) -> str:
    return f"{suite['source']}:{case['test']}"


# ------------------------------------------------------------------ nodes
def topology(suite: dict, name: str) -> NodeTopology:
    """The node ``name`` of ``suite`` as a rayaccel topology."""
    spec = suite["nodes"][name]
    n = spec["devices"]
    kind = suite["kind"]
    if kind == "nvml-links":  # go-gpuallocator / HAMi Device.Links records
        nv = {(a, b): c for a, b, c in spec.get("nvlink", [])}
        p2p = {(a, b): t for a, b, t in spec.get("p2p", [])}
        numa = _numa_from_cpu_records(n, p2p)
        links = []
        for a, b in itertools.combinations(range(n), 2):
            cls = P2P_CLASS.get(p2p.get((a, b))) if (a, b) in p2p else None
            if (a, b) in nv:
                links.append(make_link(a, b, "nvlink", nv[(a, b)], cls))
            elif cls is not None:
                links.append(make_link(a, b, "pcie", None, cls))
        devs = tuple(Device(i, model=spec.get("model"), numa_node=numa[i]) for i in range(n))
    elif kind == "pair-scores":  # HAMi DevicePairScore: each score stands for one link type
        as_link = spec["as_link"]
        links = []
        for a, b, score in spec["scores"]:
            rec = as_link[str(score)]
            if rec is not None:
                k, count, pcie = rec
                links.append(make_link(a, b, k, count, pcie))
        devs = tuple(Device(i) for i in range(n))
    elif kind == "kfd-links":  # ROCm KFD io_links / p2p_links: type 11 xGMI, type 2 PCIe
        links = []
        for a, b, typ, cls in spec["links"]:
            links.append(make_link(a, b, "xgmi" if typ == 11 else "pcie", None, cls))
        devs = tuple(Device(i, vendor="amd", model=spec.get("model"), numa_node=spec["numa"][i]) for i in range(n))
    else:
        raise ValueError(f"unknown suite kind {kind!r}")
    return NodeTopology(devs, tuple(links), name=f"{suite['source']}:{name}").validate()


def _numa_from_cpu_records(n: int, p2p: dict) -> list[int | None]:
    """Sockets from the P2P records (pairs not CrossCPU share a CPU); None when there are no records."""
    if not p2p:
        return [None] * n
    group = list(range(n))

    def find(x: int) -> int:
        while group[x] != x:
            x = group[x]
        return x

    for (a, b), t in p2p.items():
        if t != "P2PLinkCrossCPU":
            group[find(a)] = find(b)
    roots = {r: i for i, r in enumerate(sorted({find(x) for x in range(n)}))}
    return [roots[find(x)] for x in range(n)]


# ---------------------------------------------------------------- weights
def peer_pair(suite: dict, name: str):
    """The peer's own pair weight as a function ``w(a, b)``, and whether higher is better."""
    spec = suite["nodes"][name]
    kind = suite["kind"]
    if kind == "nvml-links":
        nv = {(a, b): c for a, b, c in spec.get("nvlink", [])}
        p2p = {(a, b): t for a, b, t in spec.get("p2p", [])}

        def w(a, b):
            a, b = min(a, b), max(a, b)
            return GO_NVLINK_SCORE * nv.get((a, b), 0) + GO_P2P_SCORE.get(p2p.get((a, b)), 0)
        return w, True
    if kind == "pair-scores":
        scores = {(a, b): s for a, b, s in spec["scores"]}
        return (lambda a, b: scores.get((min(a, b), max(a, b)), 0)), True
    wt = suite["pair_weight"]
    numa = spec["numa"]
    types = {(a, b): typ for a, b, typ, _ in spec["links"]}

    def rocm(a, b):
        typ = types[(min(a, b), max(a, b))]
        link = wt["xgmi"] if typ == 11 else (wt["pcie"] if typ == 2 else wt["other"])
        return wt["different_device"] + link + (wt["same_numa"] if numa[a] == numa[b] else wt["different_numa"])
    return rocm, False


# ----------------------------------------------------------------- running
@dataclass
class Outcome:
    """rayaccel's answer to one case: the set (None when it refused), how it refused, and its explain()."""

    devices: tuple[int, ...] | None
    refused: str | None  # "rejection: ..." or "request error: ..." when rayaccel gives no set
    explain: str


def run(suite: dict, case: dict) -> Outcome:
    """rayaccel on ``case``: the devices outside ``available`` are busy."""
    topo = topology(suite, case["node"])
    busy = frozenset(d for d in topo.indices if d not in case["available"])
    try:
        req = Request(gpus=case["size"], required=tuple(case["required"]))
        a = plan(NodeState(topo, busy=busy), req)
    except RequestError as e:
        return Outcome(None, f"request error: {e}", str(e))
    if not a:
        return Outcome(None, "rejection: " + "; ".join(a.reasons), a.explain())
    return Outcome(tuple(sorted(a.devices)), None, a.explain())


def measures(suite: dict, case: dict, devices) -> dict[str, tuple]:
    """The measures of a chosen set (each a tuple; larger is better), see the module docstring."""
    topo = topology(suite, case["node"])
    w, higher = peer_pair(suite, case["node"])
    sign = 1 if higher else -1
    s = sorted(devices)
    if len(s) >= 2:
        return {"weakest link": (_weakest(topo, s),),
                "peer weights": (sign * sum(w(a, b) for a, b in itertools.combinations(s, 2)),),
                "all-reduce GB/s": (allreduce_bandwidth_gbps(topo, s),)}
    rest = [d for d in case["available"] if d not in s]
    out = {}
    for k in (2, 4):
        if len(rest) < k:
            continue
        subsets = list(itertools.combinations(rest, k))
        out[f"rest: best {k}-set weakest link"] = (max(_weakest(topo, x) for x in subsets),)
        out[f"rest: best {k}-set peer weights"] = (max(sign * sum(w(a, b) for a, b in itertools.combinations(x, 2))
                                                       for x in subsets),)
        out[f"rest: best {k}-set all-reduce GB/s"] = (max(allreduce_bandwidth_gbps(topo, x) for x in subsets),)
    out["rest: peer weights over remaining pairs"] = (sign * sum(w(a, b) for a, b in itertools.combinations(rest, 2)),)
    return out


def _weakest(topo: NodeTopology, s) -> tuple:
    return min((topo.rank(a, b) for a, b in itertools.combinations(s, 2)), default=NO_LINK_RANK)


def compare(suite: dict, case: dict, ours) -> dict[str, int]:
    """Per measure: +1 rayaccel better, 0 equal, -1 worse than the peer's expected set."""
    mine, theirs = measures(suite, case, ours), measures(suite, case, case["expected"])
    return {k: (mine[k] > theirs[k]) - (mine[k] < theirs[k]) for k in theirs}


def verdict(suite: dict, case: dict, outcome: Outcome) -> str:
    """``identical``, ``both refuse``, ``differs``, ``answers`` (peer refuses, rayaccel answers) or ``refuses``."""
    expected = case["expected"]
    if outcome.devices is None:
        return "both refuse" if expected == [] else "refuses"
    if expected == []:
        return "answers"
    if case.get("any") and len(outcome.devices) == case["size"]:
        return "identical"
    return "identical" if set(outcome.devices) == set(expected) else "differs"


def summary() -> dict[str, dict[str, int]]:
    """Per suite: cases, identical, both refuse, differs (better), answers (peer refuses), worse, refuses,
    required cases and required answered."""
    out: dict[str, dict[str, int]] = {}
    for suite, case in cases():
        c = out.setdefault(suite["source"], dict.fromkeys(
            ("cases", "identical", "both refuse", "differs (better)", "answers (peer refuses)", "worse", "refuses",
             "required cases", "required answered"), 0))
        o = run(suite, case)
        v = verdict(suite, case, o)
        c["cases"] += 1
        if v == "differs":
            worse = any(x < 0 for x in compare(suite, case, o.devices).values())
            c["worse" if worse else "differs (better)"] += 1
        elif v == "answers":
            c["answers (peer refuses)"] += 1
        else:
            c[v] += 1
        if case["required"]:
            c["required cases"] += 1
            ok = (o.devices is not None and set(case["required"]) <= set(o.devices)) or \
                (o.devices is None and "required" in (o.refused or ""))
            c["required answered"] += ok
    return out
