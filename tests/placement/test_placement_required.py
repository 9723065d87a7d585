"""``required=`` and ``near=``: requests, rejections, CLI, and what explain() says decided."""

from __future__ import annotations

import itertools
import json
import random

import pytest
import typer
from typer.testing import CliRunner

from rayaccel import catalog
from rayaccel.errors import RequestError
from rayaccel.placement import Allocation, NodeState, Rejection, Request, place, plan

from machines import dgx1v, hgx_h100, random_topology, uniform


# ------------------------------------------------------------------ required
@pytest.mark.parametrize("fields,busy,want", [
    (dict(gpus=2, required=(4,)), set(), {4, 7}),               # 4's NV2 partner in its socket
    (dict(gpus=4, required=(4,)), set(), {4, 5, 6, 7}),         # 4's quad
    (dict(gpus=4, required=(0, 2, 4, 6)), set(), {0, 2, 4, 6}),  # the full set named
    (dict(gpus=1, required=(4,)), set(), {4}),
    (dict(gpus=3, required=(1, 5)), {0}, None),                 # any best set with 1 and 5: checked below
], ids=["size 2 with 4", "size 4 with 4", "full set specified", "size 1 with 4", "two required across sockets"])
def test_required_devices_are_in_the_set(fields, busy, want):
    a = plan(dgx1v(), busy=busy, **fields)
    assert isinstance(a, Allocation), a.explain()
    assert set(fields["required"]) <= set(a.devices)
    if want is not None:
        assert set(a.devices) == want, a.explain()


def test_required_set_is_the_best_set_that_holds_them_vs_brute_force():
    rng = random.Random(5)
    for _ in range(40):
        topo = random_topology(rng, rng.randint(3, 9))
        ok = [d.index for d in topo.devices if d.health != "failed"]
        busy = set(rng.sample(ok, rng.randint(0, len(ok) // 3)))
        free = [i for i in ok if i not in busy]
        if len(free) < 2:
            continue
        k = rng.randint(1, len(free))
        req = tuple(sorted(rng.sample(free, rng.randint(1, k))))
        a = plan(topo, gpus=k, busy=busy, required=req)
        best = max(((min((topo.rank(x, y) for x, y in itertools.combinations(s, 2)), default=(99, 0.0)),
                     round(sum(topo.bandwidth_gbps(x, y) for x, y in itertools.combinations(s, 2)), 3))
                    for s in itertools.combinations(free, k) if set(req) <= set(s)))
        assert set(req) <= set(a.devices) and a.score.key()[:2] == best


@pytest.mark.parametrize("fields,busy,text", [
    (dict(gpus=2, required=(4,)), {4}, "required device 4 is busy"),
    (dict(gpus=4, required=(0, 1, 2, 3)), {0}, "required device 0 is busy"),
    (dict(gpus=4, required=(0, 5), interconnect="nvlink"), set(),
     "no 4 free devices that include required devices 0, 5 are all NVLink-connected: the best has SYS between 0 and 5"),
    (dict(gpus=3, required=(0, 4), same_numa=True), set(), "no NUMA node has 3 free devices that include required devices 0, 4"),
], ids=["busy", "one of four busy", "nvlink impossible with them", "same NUMA impossible with them"])
def test_required_rejections_say_why(fields, busy, text):
    r = plan(dgx1v(), busy=busy, **fields)
    assert isinstance(r, Rejection)
    assert any(text in x for x in r.reasons), r.reasons


def test_required_failed_device_is_a_rejection():
    from rayaccel.topology import Device, NodeTopology

    t = dgx1v()
    devs = tuple(Device(d.index, model=d.model, memory_bytes=d.memory_bytes, numa_node=d.numa_node,
                        health="failed" if d.index == 3 else "ok") for d in t.devices)
    r = plan(NodeTopology(devs, t.links, t.nics, name="dgx1v-3-failed"), gpus=2, required=(3,))
    assert not r and r.reasons == ("required device 3 is failed",)


@pytest.mark.parametrize("fields,field,text", [
    (dict(gpus=1, required=(4, 5)), "required", "2 devices required but gpus=1"),
    (dict(gpus=4, required=(1, 1)), "required", "device 1 named twice"),
    (dict(gpus=2, required=("4",)), "required", "expected device indices"),
    (dict(gpus=2, required=4), "required", "expected device indices"),
    (dict(gpus=2, required=(-1,)), "required", "expected device indices"),
    (dict(mig="3g.40gb", required=(0,)), "required", "only applies to whole-device requests"),
    (dict(gpus=2, near=(3, 3)), "near", "device 3 named twice"),
    (dict(gpus=2, near_node="n1"), "near_node", "near is empty"),
    (dict(gpus=2, near=(1,), near_node=""), "near_node", "expected a node id"),
], ids=lambda x: str(x))
def test_bad_required_and_near_raise_request_errors_naming_the_field(fields, field, text):
    with pytest.raises(RequestError) as e:
        Request(**fields)
    assert e.value.field == field and text in str(e.value)


@pytest.mark.parametrize("name", ["required", "near"])
def test_a_device_the_node_lacks_is_a_request_error(name):
    with pytest.raises(RequestError) as e:
        plan(dgx1v(), gpus=2, **{name: (9,)})
    assert e.value.field == name and "no device 9" in str(e.value) and "0-7" in str(e.value)


def test_plan_with_required_and_no_gpus_asks_for_the_required_devices():
    assert sorted(plan(dgx1v(), required=(4, 5)).devices) == [4, 5]
    with pytest.raises(RequestError, match="2 devices required but gpus=1"):
        Request(required=(4, 5))  # a Request states gpus itself
    with pytest.raises(RequestError, match="named twice"):
        plan(dgx1v(), required=(4, 4))


def test_request_stays_hashable_and_normalises_indices():
    a, b = Request(gpus=2, required=[5, 4]), Request(gpus=2, required=(4, 5))
    assert a == b and hash(a) == hash(b) and a.required == (4, 5)
    assert Request(gpus=2, near={3}).near == (3,)
    assert "with 4, 5" in a.describe() and "near 3 on n1" in Request(gpus=1, near=(3,), near_node="n1").describe()


def test_required_on_a_large_node_seeds_the_search():
    topo = uniform(72, 18, "nvl72", "GB200", 186, 2)
    a = plan(topo, gpus=4, required=(10, 40), busy={11})
    assert {10, 40} <= set(a.devices) and a.score.optimal and a.score.weakest == "NV18"


# ---------------------------------------------------------------------- near
def test_near_puts_the_work_on_the_data_when_the_interconnect_ties():
    a = plan(dgx1v(), gpus=1, near=(5,))
    assert a.devices == (5,) and a.decided_by == "near"
    a2 = plan(dgx1v(), gpus=2, near=(5,))  # NV2 pairs tie; 5's own NV2 pair wins over the lowest indices
    assert 5 in a2.devices and a2.score.weakest == "NV2" and a2.decided_by == "near"


def test_near_on_a_busy_device_lands_next_to_it():
    a = plan(dgx1v(), gpus=1, busy={5}, near=(5,))
    assert dgx1v().link(5, a.devices[0]).label == "NV2"  # 1 (NV2) or 6 (NV2): peer copy at 50 GB/s


def test_near_never_costs_interconnect():
    """A soft preference: the set keeps criteria 1-2; near only chooses among the ties."""
    t = dgx1v()
    for d in range(8):
        for k in (2, 3, 4):
            assert plan(t, gpus=k, near=(d,)).score.key()[:2] == plan(t, gpus=k).score.key()[:2]


def test_place_prefers_the_node_holding_the_data():
    nodes = [NodeState(hgx_h100(), node_id=f"n{i}") for i in range(4)]
    a = place(nodes, Request(gpus=2, near=(6,), near_node="n2"))
    assert a.node == "n2" and 6 in a.devices
    b = place(nodes, Request(gpus=1, near=(6,), near_node="n3"))
    assert b.node == "n3" and b.devices == (6,)
    # the holding node lacks its type's best interconnect for 4 GPUs (no free NVLink quad): one that has it wins
    dgx = [NodeState(dgx1v(), node_id="d0"), NodeState(dgx1v(), busy=frozenset({0, 4}), node_id="d1")]
    c = place(dgx, Request(gpus=4, near=(6,), near_node="d1"))
    assert c.node == "d0" and c.score.weakest == "NV1"
    assert place(dgx, Request(gpus=2, near=(6,), near_node="d1")).node == "d1"


def test_place_with_required_skips_nodes_without_the_device():
    nodes = [NodeState(catalog.load("l40s-4x-pcie"), node_id="small"), NodeState(hgx_h100(), node_id="big")]
    a = place(nodes, Request(gpus=2, required=(6,)))
    assert a.node == "big" and 6 in a.devices
    with pytest.raises(RequestError, match="no node has device 9"):
        place(nodes, Request(gpus=1, required=(9,)))


# ------------------------------------------------------------------- explain
@pytest.mark.parametrize("build,fields,busy,decided,text", [
    (hgx_h100, dict(gpus=4), set(), "tie: lowest indices", "tie: lowest indices (2 sets equal on every criterion)"),
    (dgx1v, dict(gpus=2), set(), "criterion 4", "criterion 4 (fragmentation): every set keeps the same free groups"),
    (dgx1v, dict(gpus=4, required=(4,)), set(), "criterion 1", "criterion 1 (weakest link): NV1 vs SYS"),
    (dgx1v, dict(gpus=2), {0, 1, 2, 3, 5, 6}, "only set", "the only set"),
    (dgx1v, dict(gpus=1), {0}, "criterion 4", "criterion 4 (fragmentation): leaves a free 4-device group"),
    (lambda: catalog.load("mi300x-8x"), dict(gpus=4), {0}, "criterion 3", "criterion 3 (NUMA nodes): 1 vs 2"),
    (hgx_h100, dict(gpus=4), {0}, "criterion 3", "criterion 3 (NUMA nodes): 1 vs 2"),
    (hgx_h100, dict(gpus=2, near=(5,)), set(), "near", "near (data locality)"),
], ids=["symmetric quads tie", "packing decides", "weakest link decides", "only set", "fragmentation", "NUMA",
        "NUMA on NVSwitch", "near"])
def test_explain_names_the_criterion_that_decided(build, fields, busy, decided, text):
    a = plan(build(), busy=busy, **fields)
    assert a.decided_by == decided, a.explain()
    assert f"decided by: {text}" in a.explain()


def test_explain_names_later_criteria_that_chose_among_what_the_decider_left():
    """near 3 on a DGX-1: two NV2 pairs hold device 3; near drops the rest, criterion 4 picks between them."""
    a = plan(dgx1v(), gpus=2, near=(3,))
    assert a.decided_by == "near" and 3 in a.devices
    lines = a.explain().splitlines()
    first = next(i for i, w in enumerate(lines) if "decided by: near" in w)
    assert any(w.strip().startswith("then: criterion 4") for w in lines[first + 1:]), a.explain()


def test_pcie_path_under_nvlink_breaks_a_tie_when_nothing_else_does():
    """Three NV1 GPUs: 0-1 also share a PCIe switch (go-gpuallocator scores that pair 150, the others 130)."""
    from rayaccel.topology import Device, NodeTopology, make_link

    t = NodeTopology(tuple(Device(i, numa_node=0) for i in range(3)),
                     (make_link(0, 1, "nvlink", 1, "PHB"), make_link(0, 2, "nvlink", 1, "PHB"),
                      make_link(1, 2, "nvlink", 1, "PIX")), name="three-nv1").validate()
    a = plan(t, gpus=2)
    assert set(a.devices) == {1, 2} and a.decided_by == "criterion 5", a.explain()
    assert ("criterion 5 (PCIe path under the links: same switch > same root complex > same socket): score 5 vs 3"
            in a.explain())


def test_fragmentation_comes_before_the_pcie_paths():
    """DGX-1 (catalog), 2 busy: 6-7 shares a PCIe switch, but 0-3 keeps the 4-7 NVLink quad whole."""
    a = plan(catalog.load("dgx1-v100"), gpus=2, busy={2})
    assert set(a.devices) == {0, 3} and a.decided_by == "criterion 4", a.explain()


# ----------------------------------------------------------------------- CLI
@pytest.fixture
def app():
    from rayaccel.cli import bench, plan as plan_cli

    a = typer.Typer()
    plan_cli.register(a)
    bench.register(a)  # two commands, so that "plan" is a subcommand
    return a


@pytest.mark.parametrize("args,code,text", [
    (["--gpus", "4", "--required", "4,5"], 0, "chose devices"),
    (["--required", "4,5"], 0, "2 GPUs, with 4, 5"),
    (["--gpus", "2", "--required", "4", "--busy", "4"], 1, "required device 4 is busy"),
    (["--gpus", "2", "--required", "4,4"], 2, "--required: device 4 named twice"),
    (["--gpus", "2", "--required", "x"], 2, "--required: cannot read 'x'"),
    (["--gpus", "2", "--near", "5"], 0, "decided by: near"),
    (["--gpus", "2", "--near", "5-4"], 2, "--near: range '5-4' runs backwards"),
], ids=["required", "required sets the count", "required busy", "required twice", "bad required", "near", "bad near"])
def test_plan_cli_required_and_near(app, args, code, text):
    res = CliRunner().invoke(app, ["plan", "--topology", "dgx1-v100", *args])
    assert res.exit_code == code, res.output
    assert text in res.output


def test_plan_cli_required_errors_are_one_line(app):
    from rayaccel.cli import app as real_app

    res = CliRunner().invoke(real_app, ["plan", "--topology", "dgx1-v100", "--gpus", "1", "--required", "4,5"])
    assert res.exit_code == 2 and "required: 2 devices required but gpus=1" in res.output
    assert "Traceback" not in res.output
    res = CliRunner().invoke(real_app, ["plan", "--topology", "dgx1-v100", "--gpus", "2", "--required", "9", "--json"])
    assert res.exit_code == 2 and "no device 9" in res.output
    res = CliRunner().invoke(real_app, ["plan", "--topology", "dgx1-v100", "--gpus", "2", "--required", "4", "--json"])
    out = json.loads(res.output)
    assert out["ok"] and 4 in out["devices"]
