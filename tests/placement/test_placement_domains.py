"""Gangs across NVLink domains and network levels: the cross-node model, the choice, its explanation.

Trays are the catalog's ``gb200-nvl4`` (4 GB200s, every pair NV18 at 50 GB/s per lane, one
ConnectX-7 per GPU) standing in for one compute tray of a GB200 NVL72 rack until the
catalog has ``gb200-nvl72-tray``; a rack is 18 of them in one NVLink domain.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel import catalog
from rayaccel.errors import RequestError
from rayaccel.placement import GangAllocation, NodeState, place_gang
from rayaccel.placement.domains import NIC_GBPS, NodePlace, level_order, ring_allreduce
from rayaccel.placement.gang import GangPlacement

from machines import dgx1v, hgx_h100

TRAY = catalog.load("gb200-nvl4")
ALL = frozenset(range(4))


def _trays(n, prefix, busy=()):
    return [NodeState(TRAY, busy=ALL if i in busy else frozenset(), node_id=f"{prefix}{i}") for i in range(n)]


def _racks(busy_a=(), busy_b=(), trays=18, same_block=False):
    nodes = _trays(trays, "a", busy_a) + _trays(trays, "b", busy_b)
    places = ([NodePlace("rack-a", {"block": "b0", "spine": "s0"})] * trays
              + [NodePlace("rack-b", {"block": "b0" if same_block else "b1", "spine": "s0"})] * trays)
    return nodes, places


def _domains(g, places, nodes):
    at = {n.node_id: p for n, p in zip(nodes, places)}
    return {at[w.node].domain for w in g.workers}


# ------------------------------------------------------------------ the model
def test_same_domain_across_nodes_is_nvlink_else_network():
    a, b = NodePlace("rack-a"), NodePlace("rack-b")
    nv = ring_allreduce([(TRAY, a, [0, 1, 2, 3]), (TRAY, a, [0, 1, 2, 3])])
    net = ring_allreduce([(TRAY, a, [0, 1, 2, 3]), (TRAY, b, [0, 1, 2, 3])])
    assert (nv.allreduce_bandwidth_gbps, nv.bottleneck) == (900.0, "NVLink across nodes")
    assert (net.allreduce_bandwidth_gbps, net.bottleneck) == (NIC_GBPS["rdma"], "network")
    island = ring_allreduce([(TRAY, NodePlace(), [0]), (TRAY, NodePlace(), [0])])
    assert island.bottleneck == "network"


def test_model_rates_from_the_place_and_the_nics():
    fast = NodePlace("d", network_gbps=100.0, fabric_gbps=450.0)
    assert ring_allreduce([(TRAY, fast, [0]), (TRAY, fast, [1])]).allreduce_bandwidth_gbps == 450.0
    no_domain = NodePlace(network_gbps=100.0)
    assert ring_allreduce([(TRAY, no_domain, [0]), (TRAY, no_domain, [1])]).allreduce_bandwidth_gbps == 100.0
    h = hgx_h100()  # NV18 at the default 25 GB/s lanes, PIX NICs: inside 450, across a domain 450
    m = ring_allreduce([(h, NodePlace("x"), range(8)), (h, NodePlace("x"), range(8))])
    assert m.allreduce_bandwidth_gbps == 450.0
    assert ring_allreduce([(TRAY, NodePlace(), [2])]).bottleneck == "one device"


def test_level_order_is_finest_first_whatever_the_names():
    places = [NodePlace(levels={"l1": "spine", "l2": f"leaf{i // 2}"}) for i in range(6)]
    assert level_order(places) == ("l2", "l1")
    assert level_order([NodePlace()]) == ()


@pytest.mark.parametrize("bad, field", [
    (dict(domain=""), "domain"), (dict(domain=3), "domain"), (dict(domain="x" * 300), "domain"),
    (dict(levels={"block": ""}), "levels[block]"), (dict(levels=[("a", "1", "2")]), "levels"),
    (dict(levels=[("a", "1"), ("a", "2")]), "levels"), (dict(levels=5), "levels"),
    (dict(network_gbps=0), "network_gbps"), (dict(network_gbps=math.inf), "network_gbps"),
    (dict(fabric_gbps=True), "fabric_gbps"), (dict(fabric_gbps="fast"), "fabric_gbps"),
], ids=lambda x: str(x)[:30])
def test_bad_places_name_the_field(bad, field):
    with pytest.raises(RequestError) as e:
        NodePlace(**bad)
    assert e.value.field == field


def test_places_must_match_the_nodes():
    nodes = _trays(2, "t")
    with pytest.raises(RequestError, match="1 places for 2 nodes"):
        place_gang(nodes, 2, 4, places=[NodePlace("a")])
    with pytest.raises(RequestError, match=r"places\[1\] is a dict"):
        place_gang(nodes, 2, 4, places=[NodePlace("a"), {"domain": "a"}])
    with pytest.raises(RequestError, match="sequence of NodePlace"):
        place_gang(nodes, 2, 4, places="rack-a")


# ------------------------------------------------------------------ the choice
def test_interleaved_trays_one_busy_take_the_other_domain():
    """Issue 14's case: trays 0 and 2 in one domain, 1 and 3 in the other; any one tray busy."""
    for busy in range(4):
        nodes = _trays(4, "tray", busy=(busy,))
        places = [NodePlace("dom-a" if i % 2 == 0 else "dom-b") for i in range(4)]
        g = place_gang(nodes, 2, 4, places=places)
        other = "dom-b" if busy % 2 == 0 else "dom-a"
        assert g.scope == "domain" and g.domain == other
        assert {w.node for w in g.workers} == {f"tray{i}" for i in range(4) if i % 2 != busy % 2}
        assert g.allreduce_bandwidth_gbps == 900.0
        assert f"decided by: NVLink domain {other}" in g.explain()


def test_best_fit_across_domains_keeps_the_emptier_domain_whole():
    nodes, places = _racks(busy_a=range(10))          # rack-a: 8 trays free, rack-b: 18
    g = place_gang(nodes, 3, 4, places=places)
    assert _domains(g, places, nodes) == {"rack-a"}
    assert "chosen over rack-b: the tighter fit (5 left, not 15: keeps the emptier domain whole)" in g.explain()
    g9 = place_gang(nodes, 9, 4, places=places)       # does not fit rack-a's 8
    assert _domains(g9, places, nodes) == {"rack-b"}
    one = place_gang(nodes, 1, 4, places=places)      # one tray: in the fuller rack
    assert one.scope == "node" and one.domain == "rack-a"


def test_a_gang_bigger_than_any_domain_goes_to_the_lowest_common_level():
    nodes, places = _racks(busy_a=range(10))
    g = place_gang(nodes, 20, 4, places=places)       # blocks b0 (8) and b1 (18) too small: the spine
    assert g.scope == "level" and g.level == ("spine", "s0")
    assert g.bottleneck == "network" and g.allreduce_bandwidth_gbps == NIC_GBPS["rdma"]
    # the fragment of rack-a is used up first, the remainder goes to rack-b
    used = {w.node for w in g.workers}
    assert {f"a{i}" for i in range(10, 18)} <= used and len(used & {f"b{i}" for i in range(18)}) == 12
    text = g.explain()
    assert "no NVLink domain has room for 20 workers (most: rack-b with 18)" in text
    assert "decided by: network level spine=s0" in text


def test_blocks_before_the_spine():
    # four racks of 6 trays; blocks b0 = racks 0+1, b1 = racks 2+3; block b0 has 2 busy trays
    nodes, places = [], []
    for r in range(4):
        nodes += _trays(6, f"r{r}-", busy=(0, 1) if r == 0 else ())
        places += [NodePlace(f"rack{r}", {"block": f"b{r // 2}", "spine": "s"})] * 6
    g = place_gang(nodes, 10, 4, places=places)       # b0 has 10 free trays (tight), b1 has 12
    assert g.level == ("block", "b0")
    assert {w.node.split("-")[0] for w in g.workers} == {"r0", "r1"}
    g11 = place_gang(nodes, 11, 4, places=places)
    assert g11.level == ("block", "b1")
    g23 = place_gang(nodes, 23, 4, places=places)     # no block holds 23: the spine (22 free) cannot either
    assert not g23
    g22 = place_gang(nodes, 22, 4, places=places)
    assert g22.level == ("spine", "s")


def test_without_levels_a_too_big_gang_spans_the_cluster():
    nodes = _trays(3, "a") + _trays(3, "b")
    places = [NodePlace("a")] * 3 + [NodePlace("b")] * 3
    g = place_gang(nodes, 5, 4, places=places)
    assert g.scope == "cluster" and "no network levels known" in g.explain()


def test_nodes_without_places_keep_the_per_node_placement():
    nodes = [NodeState(hgx_h100(), node_id=f"n{i}") for i in range(3)]
    g = place_gang(nodes, 4, 4)
    assert isinstance(g, GangAllocation) and isinstance(g, GangPlacement)
    assert g.scope == "nodes" and g.nodes.count(g.nodes[0]) == 2
    assert g.bottleneck == "network" and g.allreduce_bandwidth_gbps == NIC_GBPS["rdma"]
    assert place_gang(nodes, 2, 4).scope == "node"


def test_strict_pack_ties_go_to_the_fuller_domain():
    nodes = [NodeState(dgx1v(), node_id="x0"), NodeState(dgx1v(), node_id="y0"),
             NodeState(dgx1v(), busy=frozenset(range(8)), node_id="y1")]
    places = [NodePlace("x"), NodePlace("y"), NodePlace("y")]
    assert place_gang(nodes, 2, 4, strategy="strict-pack").nodes == ("x0", "x0")
    g = place_gang(nodes, 2, 4, strategy="strict-pack", places=places)
    assert g.nodes == ("y0", "y0")


def test_spread_within_one_domain():
    nodes, places = _racks(busy_a=range(15))          # rack-a: 3 trays free
    g = place_gang(nodes, 3, 2, strategy="spread", places=places)
    assert _domains(g, places, nodes) == {"rack-a"} and len(set(g.nodes)) == 3


def test_to_dict_names_the_scope():
    nodes, places = _racks(busy_a=range(10))
    d = place_gang(nodes, 20, 4, places=places).to_dict()
    assert d["scope"] == "level" and d["level"] == ["spine", "s0"] and len(d["workers"]) == 20


# ------------------------------------------------------------------ properties
@st.composite
def clusters(draw):
    """2-4 domains of 1-6 trays, random busy devices, blocks of random domains, one spine."""
    n_dom = draw(st.integers(2, 4))
    nodes, places = [], []
    for d in range(n_dom):
        block = draw(st.integers(0, 1))
        for t in range(draw(st.integers(1, 6))):
            busy = draw(st.frozensets(st.integers(0, 3)))
            nodes.append(NodeState(TRAY, busy=busy, node_id=f"d{d}t{t}"))
            places.append(NodePlace(f"d{d}", {"block": f"b{block}", "spine": "s"}))
    return nodes, places


def _room(nodes, places, k, where=lambda p: True):
    return sum((4 - len(n.busy)) // k for n, p in zip(nodes, places) if where(p))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=clusters(), workers=st.integers(1, 12), k=st.sampled_from([1, 2, 4]),
       strategy=st.sampled_from(["pack", "spread"]))
def test_gangs_are_valid_and_stay_in_the_closest_scope_with_room(c, workers, k, strategy):
    nodes, places = c
    g = place_gang(nodes, workers, k, strategy=strategy, places=places)
    total = _room(nodes, places, k)
    if not g:
        assert total < workers
        return
    by_id = {n.node_id: (n, p) for n, p in zip(nodes, places)}
    held: set = set()
    for w in g.workers:  # every worker: k free devices, none given twice
        node, _ = by_id[w.node]
        assert len(w.devices) == k and not set(w.devices) & node.busy
        assert not {(w.node, d) for d in w.devices} & held
        held |= {(w.node, d) for d in w.devices}
    doms = {p.domain for p in places}
    fits_domain = [d for d in doms if _room(nodes, places, k, lambda p, d=d: p.domain == d) >= workers]
    used = {by_id[w.node][1].domain for w in g.workers}
    if fits_domain:  # some domain has room: the gang stays in one
        assert len(used) == 1 and g.scope in ("node", "domain")
        assert g.allreduce_bandwidth_gbps >= 900.0 or len({w.node for w in g.workers}) == 1
    else:
        assert g.scope in ("level", "cluster") and len(used) > 1
        blocks_with_room = [b for b in ("b0", "b1")
                            if _room(nodes, places, k, lambda p, b=b: p.level("block") == b) >= workers]
        if blocks_with_room:
            assert g.level[0] == "block" and g.level[1] in blocks_with_room
            assert {by_id[w.node][1].level("block") for w in g.workers} == {g.level[1]}
        else:
            assert g.level == ("spine", "s")
    if g.scope == "domain" and strategy == "pack":  # the tightest fit among the domains with room
        rooms = {d: _room(nodes, places, k, lambda p, d=d: p.domain == d) for d in fits_domain}
        assert rooms[g.domain] == min(rooms.values())
    if g.scope == "domain" and strategy == "spread":  # the domain that spreads over the most nodes
        spans = {d: sum(1 for n, p in zip(nodes, places) if p.domain == d and 4 - len(n.busy) >= k)
                 for d in fits_domain}
        assert len(set(g.nodes)) == min(workers, max(spans.values()))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(c=clusters(), workers=st.integers(1, 10))
def test_the_domain_choice_never_models_worse_than_ignoring_domains(c, workers):
    """Choosing by domain is never slower in the model than the per-node placement of the same gang."""
    nodes, places = c
    g = place_gang(nodes, workers, 4, places=places)
    blind = place_gang(nodes, workers, 4)
    assert bool(g) == bool(blind)
    if g:
        at = {n.node_id: (n, p) for n, p in zip(nodes, places)}
        blocks: dict = {}
        for w in blind.workers:
            blocks.setdefault(w.node, []).extend(w.devices)
        blind_model = ring_allreduce([(at[n][0].topology, at[n][1], d) for n, d in blocks.items()])
        assert g.allreduce_bandwidth_gbps >= blind_model.allreduce_bandwidth_gbps


# ------------------------------------------------------------------ single-node work
def test_single_node_work_goes_to_the_fullest_domain():
    from rayaccel.placement import place

    # rack-b listed first and idle; rack-a half used: a one-tray task belongs in rack-a
    nodes = _trays(4, "b") + _trays(4, "a", busy=(0, 1))
    places = [NodePlace("rack-b")] * 4 + [NodePlace("rack-a")] * 4
    assert place(nodes, gpus=4).node == "b0"  # without places: the first node
    assert place(nodes, gpus=4, places=places).node == "a2"
    assert place(nodes, gpus=4, places=[None] * 8).node == "b0"
    # the node rank still comes first: a partly used tray beats any whole one
    nodes[1] = NodeState(TRAY, busy=frozenset({0, 1}), node_id="b1")
    assert place(nodes, gpus=2, places=places).node == "b1"
    with pytest.raises(RequestError, match="places for"):
        place(nodes, gpus=4, places=places[:3])
