"""Rank order that follows the fabric (issue 21 item 2), the pure part: no Ray.

Frameworks give rank r to the r-th bundle of a list and cut ranks into tensor-parallel groups of k
consecutive ranks; ``rank_order`` returns the list so each group sits on the best-linked devices its
node offers (an all-NVLink quad of a DGX-1), nodes of one NVLink domain next to each other.
"""

from __future__ import annotations

import itertools

import pytest

from rayaccel import catalog
from rayaccel.errors import RequestError
from rayaccel.placement import allreduce_bandwidth_gbps
from rayaccel.placement.domains import NodePlace
from rayaccel.placement.ranks import BundleSite, rank_order

DGX1 = catalog.load("dgx1-v100")
QUADS = ({0, 1, 2, 3}, {4, 5, 6, 7})  # the DGX-1's two quads whose every pair is NVLink


def _sites(node, devices_per_bundle, first=0):
    return [BundleSite(first + i, node, tuple(ds)) for i, ds in enumerate(devices_per_bundle)]


def _devs(sites, bundles):
    by = {s.bundle: s for s in sites}
    return {d for b in bundles for d in by[b].devices}


@pytest.mark.parametrize("device_order", [list(range(8)), [3, 6, 0, 5, 7, 1, 4, 2], [7, 6, 5, 4, 3, 2, 1, 0]],
                         ids=["ascending", "shuffled", "descending"])
def test_tp4_groups_land_on_all_nvlink_quads(device_order):
    sites = _sites("n1", [(d,) for d in device_order])
    ro = rank_order(sites, 4, {"n1": DGX1})
    assert sorted(ro.order) == list(range(8))
    got = [_devs(sites, g.bundles) for g in ro.groups]
    assert sorted(got, key=min) == list(QUADS)
    for g in ro.groups:
        assert g.scope == "nvlink island" and g.nodes == ("n1",)
        assert g.allreduce_bandwidth_gbps == allreduce_bandwidth_gbps(DGX1, _devs(sites, g.bundles)) == 25.0
    # the ranks are the groups, consecutive
    assert ro.order == tuple(b for g in ro.groups for b in g.bundles)


def test_consecutive_ranks_sit_on_the_strongest_links():
    """TP 2 on a DGX-1: every pair of consecutive ranks is an NV2 pair (two NVLink lanes)."""
    sites = _sites("n1", [(d,) for d in range(8)])
    ro = rank_order(sites, 2, {"n1": DGX1})
    for g in ro.groups:
        a, b = (sites[x].devices[0] for x in g.bundles)
        link = DGX1.link(a, b)
        assert link.kind == "nvlink" and link.count == 2, (a, b)
        assert g.allreduce_bandwidth_gbps == 50.0


def test_first_free_order_is_worse_and_the_order_fixes_it():
    """Sorting by GPU id (what probe-based frameworks do) cuts DGX-1 TP-2 pairs across single lanes (0-1)."""
    sites = _sites("n1", [(d,) for d in range(8)])
    naive = [allreduce_bandwidth_gbps(DGX1, [2 * i, 2 * i + 1]) for i in range(4)]
    ro = rank_order(sites, 2, {"n1": DGX1})
    assert min(naive) == 25.0 and min(g.allreduce_bandwidth_gbps for g in ro.groups) == 50.0


def test_two_gpu_bundles_pair_into_quads():
    sites = _sites("n1", [(0, 3), (4, 7), (1, 2), (5, 6)])
    ro = rank_order(sites, 2, {"n1": DGX1})
    assert sorted((_devs(sites, g.bundles) for g in ro.groups), key=min) == list(QUADS)


def test_nodes_stay_whole_and_one_domain_stays_together():
    places = {"a": NodePlace(domain="d1"), "b": NodePlace(domain="d2"), "c": NodePlace(domain="d1")}
    sites = [*_sites("a", [(d,) for d in range(4)]), *_sites("b", [(d,) for d in range(4)], 4),
             *_sites("c", [(d,) for d in range(4)], 8)]
    ro = rank_order(sites, 4, {n: DGX1 for n in "abc"}, places)
    assert [g.nodes for g in ro.groups] == [("a",), ("c",), ("b",)]  # a's domain brings c next to it
    # TP 8 over 12 bundles is not a divisor; TP 6 crosses nodes: the domain first
    ro6 = rank_order(sites, 6, {n: DGX1 for n in "abc"}, places)
    assert ro6.groups[0].nodes == ("a", "c") and ro6.groups[0].scope == "nvlink domain"
    assert ro6.groups[1].nodes == ("c", "b") and ro6.groups[1].scope == "network"


def test_leftover_bundles_of_a_node_join_the_next_node():
    sites = [*_sites("a", [(d,) for d in range(6)]), *_sites("b", [(d,) for d in range(2)], 6)]
    ro = rank_order(sites, 4, {"a": DGX1, "b": DGX1})
    assert ro.groups[0].nodes == ("a",) and ro.groups[0].scope == "nvlink island"
    assert set(ro.groups[1].nodes) == {"a", "b"} and ro.groups[1].scope == "network"


def test_colocated_bundles_without_devices_keep_index_order():
    """A node rayaccel does not manage (no topology): bundles in index order, nothing invented."""
    sites = _sites("plain", [(), (), (), ()])
    ro = rank_order(sites, 2, {})
    assert ro.order == (0, 1, 2, 3) and all(g.bottleneck == "no devices known" for g in ro.groups)


def test_group_size_one_follows_the_nodes_ring():
    sites = _sites("n1", [(d,) for d in range(8)])
    ro = rank_order(sites, 1, {"n1": DGX1})
    devs = [sites[b].devices[0] for b in ro.order]
    steps = [DGX1.link(devs[i], devs[(i + 1) % 8]) for i in range(8)]
    assert all(l is not None and l.kind == "nvlink" for l in steps)  # the ring never crosses PCIe


def test_exhaustive_and_greedy_agree_on_a_full_node():
    from rayaccel.placement import ranks

    sites = _sites("n1", [(d,) for d in range(8)])
    exact = rank_order(sites, 4, {"n1": DGX1})
    old = ranks.EXACT_BUNDLES
    ranks.EXACT_BUNDLES = 0
    try:
        greedy = rank_order(sites, 4, {"n1": DGX1})
    finally:
        ranks.EXACT_BUNDLES = old
    assert {frozenset(_devs(sites, g.bundles)) for g in exact.groups} == \
        {frozenset(_devs(sites, g.bundles)) for g in greedy.groups}


@pytest.mark.parametrize("k, why", [(0, "positive"), (3, "does not divide"), (True, "positive")],
                         ids=["zero", "not-a-divisor", "bool"])
def test_bad_group_size_is_one_clear_error(k, why):
    with pytest.raises(RequestError, match=why):
        rank_order(_sites("n1", [(d,) for d in range(8)]), k, {"n1": DGX1})


def test_a_device_the_node_lacks_is_named():
    with pytest.raises(RequestError, match="no device 9"):
        rank_order([BundleSite(0, "n1", (9,))], 1, {"n1": DGX1})


def test_all_partitions_enumerated():
    from rayaccel.placement.ranks import _partitions

    pool = _sites("n", [(d,) for d in range(6)])
    parts = list(_partitions(pool, 2))
    assert len(parts) == 15  # 5 * 3 * 1
    assert len({frozenset(frozenset(s.bundle for s in g) for g in p) for p in parts}) == 15
    assert len(list(_partitions(pool, 3))) == 10 == len(list(itertools.combinations(range(5), 2)))
