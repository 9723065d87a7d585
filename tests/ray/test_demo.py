"""`rayaccel demo`: the pure rayaccel-vs-plain-Ray comparison, and the quick demo really run on Ray."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rayaccel import catalog
from rayaccel.placement import Request
from rayaccel.ray import demo_model as dm


def _nodes(names):
    return [(n, catalog.load(n)) for n in names]


def _live(row, i):
    """Is the job of ``row`` holding its devices at event ``i``?"""
    end = row["end"]
    return row["start"] <= i and (end is None or i < end or (row["kind"] == "task" and i == end))


def assert_no_double_use(rows, nodes):
    """No whole device held twice, no MIG instance twice, memory shares within the device's memory."""
    topos = dict(nodes)
    last = max(max(r["start"], r["end"] or 0) for r in rows)
    for i in range(last + 1):
        whole, parts, mem = {}, {}, {}
        for r in rows:
            ours = r["ours"]
            if not (ours.get("placed") and _live(r, i)):
                continue
            for k, (n, devs) in enumerate(zip(ours["nodes"], ours["devices"])):
                if ours["partitions"][k]:
                    for p in ours["partitions"][k]:
                        assert (n, p) not in parts, f"event {i}: MIG {n}:{p} held by {parts[(n, p)]} and {r['job']}"
                        parts[(n, p)] = r["job"]
                elif ours["memory_bytes"][k]:
                    for d, b in ours["memory_bytes"][k].items():
                        mem[(n, int(d))] = mem.get((n, int(d)), 0) + b
                else:
                    for d in devs:
                        assert (n, d) not in whole, f"event {i}: {n} GPU {d} held by {whole[(n, d)]} and {r['job']}"
                        whole[(n, d)] = r["job"]
        for (n, d), b in mem.items():
            assert (n, d) not in whole, f"event {i}: {n} GPU {d} shared and held whole by {whole[(n, d)]}"
            assert b <= topos[n].device(d).memory_bytes


@pytest.mark.parametrize("quick", [False, True], ids=["full", "quick"])
def test_comparison_places_everything_without_double_use(quick):
    nodes = _nodes(dm.QUICK_NODES if quick else dm.DEMO_NODES)
    rows = dm.compare(nodes, dm.workload(quick))
    starts = [e[1].name for e in dm.workload(quick) if e[0] == "start"]
    assert [r["job"] for r in rows] == starts
    assert all(r["ours"]["placed"] and r["ray"]["placed"] for r in rows)
    assert_no_double_use(rows, nodes)
    t = dm.totals(rows)
    assert t["multi_gpu_jobs"] >= (1 if quick else 5)
    assert t["ray_gpus_for_fraction_jobs"] == t["fraction_jobs"]  # plain Ray: one whole GPU each
    assert t["rayaccel_gpu_share_of_fraction_jobs"] < t["fraction_jobs"]


def test_full_workload_rayaccel_beats_plain_ray():
    rows = dm.compare(_nodes(dm.DEMO_NODES), dm.workload())
    t = dm.totals(rows)
    assert t["ratio"] > 1.5
    assert t["better"] > t["worse"]
    assert t["rayaccel_best"] > t["ray_best"]
    ddp2 = next(r for r in rows if r["job"] == "ddp-2")
    # singles held DGX-1 GPUs 0 and 2, so lowest-index gives plain Ray GPUs 1 and 4: a SYS hop
    assert ddp2["ray"]["devices"] == [[1], [4]] and ddp2["ray"]["link"] == "SYS"


def test_plain_ray_hybrid_fills_head_to_half_then_spreads():
    nodes = _nodes(("dgx1-v100", "hgx-h100"))
    ray = dm.Shadow(nodes, "ray")
    got = [ray.start(dm.Job(f"s{i}", "actor", (("gpus", 1),))) for i in range(6)]
    assert [(p[0].node, p[0].devices) for p in got] == [
        ("dgx1-v100", (0,)), ("dgx1-v100", (1,)), ("dgx1-v100", (2,)), ("dgx1-v100", (3,)),
        ("hgx-h100", (0,)), ("hgx-h100", (1,))]
    ray.end("s1")
    again = ray.start(dm.Job("s6", "actor", (("gpus", 1),)))
    # back under 50% (3 of 8), the head node comes first again and its lowest free index is 1
    assert (again[0].node, again[0].devices) == ("dgx1-v100", (1,))


def test_plain_ray_takes_whole_gpu_for_mig_and_queues_when_full():
    nodes = _nodes(("a100-mig",))
    ray = dm.Shadow(nodes, "ray")
    first = ray.start(dm.Job("m0", "actor", (("mig", "1g.5gb"),)))
    assert first[0].devices == (0,) and first[0].whole_for_fraction
    assert ray.start(dm.Job("m1", "actor", (("mig", "1g.5gb"),))) is None
    rows = dm.compare(nodes, [("start", dm.Job("m0", "actor", (("mig", "1g.5gb"),))),
                              ("start", dm.Job("m1", "actor", (("mig", "1g.5gb"),))), ("end", "m0")])
    assert rows[1]["ours"]["placed"] and rows[1]["ray"]["queued_until"] == "m0"


def test_job_request_defaults_match_rayaccel_remote():
    assert dm.Job("a", "actor", (("mig", "1g.5gb"),)).request.kind == "mig"
    assert dm.Job("a", "actor", (("gpu_memory", "12GiB"),)).request == Request(gpus=0, gpu_memory="12GiB",
                                                                               exclusive=False)
    assert dm.Job("g", "gang", (("gpus", 2),), workers=2).gpus == 4


def test_replay_rejects_bad_events():
    with pytest.raises(ValueError, match="never started"):
        dm.compare(_nodes(("a100-mig",)), [("end", "x")])


def test_demo_quick_runs_on_ray(tmp_path):
    """The quick demo really runs (in its own process and cluster: the session fixture's Ray stays untouched)."""
    env = dict(os.environ)
    env.pop("RAY_TMPDIR", None)
    env.pop("RAYACCEL_TOPOLOGY", None)
    code = "from rayaccel.ray.demo import run_demo; import sys; run_demo(sys.argv[1], quick=True, log=lambda m: None)"
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "placement.png").stat().st_size > 0
    data = json.loads((tmp_path / "demo.json").read_text())
    if not data["simulated"]:
        pytest.skip("real GPUs present: the quick workload depends on the machine")
    nodes = _nodes(data["nodes"])
    rows = data["rows"]
    assert all(r["ours"]["placed"] for r in rows)
    assert_no_double_use(rows, nodes)
    multi = [r for r in rows if r["ours"].get("bandwidth_gbps") is not None]
    assert multi
    for r in multi:
        assert r["ours"]["bandwidth_gbps"] >= r["ray"]["bandwidth_gbps"], r["job"]
        assert "all-reduce ok" in r["note"]
    # what really ran on Ray is what the pure model predicts for rayaccel (so the comparison is faithful)
    model = {r["job"]: r["ours"] for r in dm.compare(nodes, dm.workload(quick=True))}
    for r in rows:
        assert r["ours"]["nodes"] == model[r["job"]]["nodes"], r["job"]
        assert r["ours"]["devices"] == model[r["job"]]["devices"], r["job"]
        assert r["ours"]["partitions"] == model[r["job"]]["partitions"], r["job"]
