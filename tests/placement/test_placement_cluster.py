"""Cluster placer, gangs and baselines."""

from __future__ import annotations

import pytest

from rayaccel.errors import RequestError
from rayaccel.placement import GangAllocation, NodeState, Request, place, place_gang, plan
from rayaccel.placement.baselines import besteffort, first_free, random_policy

from machines import dgx1v, hgx_h100, pcie8


def _cluster():
    return [NodeState(pcie8(), node_id="pcie-0"), NodeState(dgx1v(), node_id="dgx1-0"),
            NodeState(hgx_h100(), busy=frozenset({0, 1, 2}), node_id="h100-0"),
            NodeState(hgx_h100(), busy=frozenset({0}), node_id="h100-1")]


def test_place_picks_the_best_interconnect_then_packs():
    nodes = _cluster()
    a = place(nodes, Request(gpus=4))
    assert a.node in ("h100-0", "h100-1") and a.score.weakest == "NV18"
    assert a.node == "h100-0"  # tie on score: the fuller node (pack)
    assert place(nodes, gpus=2).score.weakest == "NV18"


def test_place_rejects_with_reasons():
    r = place(_cluster(), gpus=9)
    assert not r and "no node of 4 can place it" in r.reasons[0]
    assert any("9 asked" in x for x in r.reasons)


def test_gang_pack_fills_nodes():
    nodes = [NodeState(hgx_h100(), node_id=f"n{i}") for i in range(3)]
    g = place_gang(nodes, workers=4, gpus_per_worker=4, strategy="pack")
    assert isinstance(g, GangAllocation)
    assert g.nodes.count(g.nodes[0]) == 2 and len(set(g.nodes)) == 2
    for w in g.workers:
        assert w.score.numa_nodes == 1


def test_gang_spread_uses_one_node_per_worker():
    nodes = [NodeState(hgx_h100(), node_id=f"n{i}") for i in range(3)]
    g = place_gang(nodes, workers=3, gpus_per_worker=2, strategy="spread")
    assert len(set(g.nodes)) == 3
    g4 = place_gang(nodes, workers=4, gpus_per_worker=2, strategy="spread")
    assert len(set(g4.nodes)) == 3


def test_gang_strict_pack_one_node_or_rejection():
    nodes = [NodeState(hgx_h100(), busy=frozenset({0}), node_id="a"), NodeState(hgx_h100(), node_id="b")]
    g = place_gang(nodes, workers=2, gpus_per_worker=4, strategy="strict-pack")
    assert set(g.nodes) == {"b"}
    devs = [d for w in g.workers for d in w.devices]
    assert len(devs) == len(set(devs)) == 8
    r = place_gang(nodes, workers=3, gpus_per_worker=4, strategy="strict-pack")
    assert not r and "no one node has 12 free devices" in r.reasons[0]
    r2 = place_gang([NodeState(dgx1v(), node_id="d")], workers=2, gpus_per_worker=4, strategy="strict-pack",
                    interconnect="nvlink")
    assert not r2 and "NVLink domain" in r2.reasons[0]


def test_gang_bad_strategy():
    with pytest.raises(RequestError, match="strategy"):
        place_gang(_cluster(), 2, 2, strategy="scatter")


# ---------------------------------------------------------------- baselines
@pytest.mark.parametrize("busy,k,expected", [
    (set(), 2, [{0, 3}, {1, 2}, {4, 7}, {5, 6}]),
    (set(), 4, [{0, 1, 2, 3}, {4, 5, 6, 7}]),
    ({2, 3, 5, 6, 7}, 2, [{0, 4}]),
], ids=["besteffort DGX-1V size 2", "besteffort DGX-1V size 4", "besteffort prefer dual NVLink cross socket"])
def test_besteffort_matches_go_gpuallocator_tests(busy, k, expected):
    a = besteffort(NodeState(dgx1v(), busy=frozenset(busy)), Request(gpus=k))
    assert set(a.devices) in expected


def test_besteffort_is_nvswitch_blind_and_takes_first_for_one():
    from rayaccel.placement._index import index_of
    from rayaccel.placement.baselines import pair_scores

    S = pair_scores(index_of(hgx_h100()))
    assert max(max(r) for r in S) < 100  # no NVLink seen on NVSwitch
    assert besteffort(NodeState(dgx1v(), busy=frozenset({0})), Request(gpus=1)).devices == (1,)


def test_besteffort_odd_sizes_do_not_panic():
    st = NodeState(dgx1v(), busy=frozenset({6, 7, 5}))  # 5 free, size 3 (go-gpuallocator PR #80)
    a = besteffort(st, Request(gpus=3))
    assert len(a.devices) == 3


def test_first_free_and_random():
    st = NodeState(dgx1v(), busy=frozenset({0, 2}))
    assert first_free(st, Request(gpus=3)).devices == (1, 3, 4)
    a = random_policy(st, Request(gpus=3))
    assert len(set(a.devices)) == 3 and not {0, 2} & set(a.devices)
    assert not first_free(st, Request(gpus=7))


def test_multi_gpu_job_packs_onto_a_partly_used_node_that_offers_its_types_best():
    """A 2-GPU job takes a same-switch pair on a partly used PCIe box (its type's best) before opening an idle H100."""
    used = NodeState(pcie8(), busy=frozenset({0}), node_id="pcie-used")
    idle = NodeState(hgx_h100(), node_id="h100-idle")
    assert plan(used, gpus=2).score.weakest_rank == plan(pcie8(), gpus=2).score.weakest_rank
    assert place([idle, used], Request(gpus=2)).node == "pcie-used"


def test_multi_gpu_job_on_equally_packed_nodes_takes_the_better_wired_one():
    nodes = [NodeState(pcie8(), busy=frozenset({0, 1}), node_id="pcie"),
             NodeState(hgx_h100(), busy=frozenset({0, 1}), node_id="h100")]
    a = place(nodes, Request(gpus=2))
    assert a.node == "h100" and a.score.weakest == "NV18"


def test_single_gpu_jobs_fill_partly_used_nodes_first_fit():
    """1-GPU jobs: partly used nodes first, then the earlier node (not the fullest): a stable prefix fills up."""
    nodes = [NodeState(hgx_h100(), node_id="idle"), NodeState(hgx_h100(), busy=frozenset({0, 1}), node_id="a"),
             NodeState(hgx_h100(), busy=frozenset({0, 1, 4, 5}), node_id="b")]
    assert place(nodes, Request(gpus=1)).node == "a"
    assert place(nodes[:1], Request(gpus=1)).node == "idle"


def test_single_gpu_jobs_take_a_straggler_before_breaking_a_pair():
    """Node b's device 3 has no free NUMA-0 partner left: a 1-GPU job takes it rather than split a pair on a."""
    nodes = [NodeState(hgx_h100(), node_id="idle"), NodeState(hgx_h100(), busy=frozenset({0}), node_id="a"),
             NodeState(hgx_h100(), busy=frozenset({0, 1, 2}), node_id="b")]
    a = place(nodes, Request(gpus=1))
    assert a.node == "b" and a.devices == (3,)


def test_incremental_ranking_equals_ranking_every_node_afresh():
    """place() re-ranks only the nodes whose state object changed since its last call on that request."""
    import random

    from rayaccel.placement import cluster
    from machines import dgx2

    rng = random.Random(3)
    topos = [dgx1v(), pcie8(), hgx_h100(), dgx2()]

    def state(i, t):
        return NodeState(t, busy=frozenset(d.index for d in t.devices if rng.random() < 0.5), node_id=f"n{i}")

    nodes = [state(i, topos[i % 4]) for i in range(40)]
    for step in range(150):
        for _ in range(rng.randint(0, 3)):
            i = rng.randrange(len(nodes))
            nodes[i] = state(i, nodes[i].topology)
        if step % 37 == 5:  # a different node list length, and a reordered one
            nodes = nodes[1:] + nodes[:1] if step % 2 else nodes + [state(len(nodes), topos[0])]
        req = Request(gpus=rng.choice((1, 2, 4, 8)))
        got = place(nodes, req)
        cluster._LIVE.clear()
        want = place(nodes, req)
        assert (got.node, getattr(got, "devices", None)) == (want.node, getattr(want, "devices", None)), step


def test_place_rejects_a_node_list_with_something_else_in_it():
    nodes = [NodeState(dgx1v(), node_id="a")]
    place(nodes, Request(gpus=1))
    with pytest.raises(RequestError, match=r"nodes\[1\] is a str"):
        place(nodes + ["b"], Request(gpus=1))
    nodes2 = nodes + [NodeState(dgx1v(), node_id="b")]
    place(nodes2, Request(gpus=1))
    nodes2[1] = "b"
    with pytest.raises(RequestError, match=r"nodes\[1\] is a str"):
        place(nodes2, Request(gpus=1))
