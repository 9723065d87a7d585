"""The placement map without Ray (issue 21 item 1): :mod:`rayaccel.arbiter.groupmap`.

``dry_run`` is what a node's arbiter would reserve for a group on a machine: it must be what a real
:class:`~rayaccel.arbiter.statefile.Arbiter` reserves (through ``decide.reserve_group`` and the worker's
``TableChooser``), busy devices included; its entries have the live map's shape.
"""

from __future__ import annotations

import pytest

from rayaccel import catalog
from rayaccel.arbiter import decide, groupmap
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.choose import TableChooser
from rayaccel.arbiter.decide import GrantRequest
from rayaccel.arbiter.groupmap import (BundlePlacement, PlacementMap, bundle_units, dry_run, rank_sites,
                                       weakest_link)
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.errors import RequestError
from rayaccel.placement.ranks import rank_order

KEY = "0123456789ab"
DGX1 = catalog.load("dgx1-v100")


@pytest.mark.parametrize("sizes,busy_gpus", [
    ([2] * 4, 0), ([1] * 8, 0), ([4, 4], 0), ([2] * 3, 2), ([1] * 5, 3), ([2, 1, 1], 4),
], ids=["4x2", "8x1", "2x4", "3x2 beside a pair", "5x1 beside three", "2,1,1 beside a quad"])
def test_the_dry_run_is_what_a_real_arbiter_reserves(tmp_path, sizes, busy_gpus):
    arb = Arbiter(tmp_path, build_table(DGX1, KEY, True), topology=DGX1, alive=lambda p: p == 7)
    busy: tuple = ()
    if busy_gpus:  # other work holds devices the arbiter chose for it
        busy = arb.grant(GrantRequest(pid=7, key="task:other",
                                      slots={"GPU": tuple((s, 1.0) for s in range(busy_gpus))})).devices
    res = arb.reserve_group("aa", "GPU", {b: float(k) for b, k in enumerate(sizes)})
    m, why = dry_run(DGX1, [{"GPU": k} for k in sizes], busy)
    assert why is None and res is not None
    want = bundle_units(arb.table, "GPU", res)
    assert {b.bundle: list(b.indices) for b in m.bundles} == {b: f["devices"] for b, f in want.items()}
    assert {b.bundle: list(b.nics) for b in m.bundles} == {b: f["nics"] for b, f in want.items()}
    assert {b.bundle: list(b.cpus) for b in m.bundles} == {b: f["cpus"] for b, f in want.items()}
    assert not {d for b in m.bundles for d in b.indices} & set(busy)


def test_the_dry_run_goes_through_the_arbiters_reservation(monkeypatch):
    calls = []
    real_reserve, real_gang = decide.reserve_group, TableChooser.gang
    monkeypatch.setattr(decide, "reserve_group", lambda *a, **k: calls.append("reserve_group") or real_reserve(*a, **k))
    monkeypatch.setattr(TableChooser, "gang", lambda self, *a: calls.append("gang") or real_gang(self, *a))
    dry_run(DGX1, [{"GPU": 2}] * 2)
    assert calls == ["reserve_group", "gang"]


def test_entries_have_the_live_maps_shape_and_say_why_a_bundle_has_no_device():
    m, _ = dry_run(DGX1, [{"GPU": 2, "CPU": 4}, {"CPU": 1}])
    live = BundlePlacement(0, "n", "10.0.0.1", KEY).to_dict()
    d = m.to_dict()
    assert d["schema"] == groupmap.MAP_SCHEMA and d["pg_id"] is None
    assert all(set(b) == set(live) for b in d["bundles"])
    b0, b1 = m.bundles
    assert b0.resources == {"GPU": 2.0, "CPU": 4.0} and len(b0.devices) == 2 and b0.link == "NV2"
    assert b0.devices[0].uuid == DGX1.device(b0.indices[0]).uuid and b0.devices[0].model.startswith("Tesla V100")
    assert b1.devices == () and b1.why == groupmap.NO_GPU


def test_rank_sites_order_nodes_by_ip_then_bundles():
    bp = [BundlePlacement(0, "b", "10.0.0.10", None), BundlePlacement(1, "a", "10.0.0.9", None),
          BundlePlacement(2, "b", "10.0.0.10", None), BundlePlacement(3, "c", None, None)]
    assert [s.bundle for s in rank_sites(PlacementMap("x", "", "PACK", tuple(bp)))] == [1, 0, 2, 3]


def test_tp4_groups_of_one_device_bundles_are_all_nvlink_quads():
    m, _ = dry_run(DGX1, [{"GPU": 1}] * 8)
    ro = rank_order(rank_sites(m), 4, {DGX1.name: DGX1})
    for g in ro.groups:
        devs = [d for b in g.bundles for d in m[b].indices]
        assert len(devs) == 4 and g.scope == "nvlink island"
        assert all(DGX1.link(a, b) is not None and DGX1.link(a, b).direct for a in devs for b in devs if a < b)


def test_weakest_link():
    assert weakest_link(DGX1, [0]) is None
    assert weakest_link(DGX1, [0, 3]) == "NV2"
    assert weakest_link(DGX1, [0, 3, 1]) == "NV1"
    assert weakest_link(DGX1, [0, 5]) == "SYS"


@pytest.mark.parametrize("bundles,busy,text", [
    ([], (), "no bundles"),
    ([{"GPU": 0.5}], (), "whole devices"),
    ([{"GPU": -1}], (), "a number from 0 to"),
    ([{"GPU": True}], (), "a number from 0 to"),
    ([{"GPU": float("inf")}], (), "a number from 0 to"),
    ([{"GPU": 1, "CPU": 10**400}], (), "bundle 0: CPU is"),
    ([{"TPU": 1}], (), "resource 'TPU'"),
    ([{"CPU": 1}], (), "no bundle holds a GPU"),
    ([{"GPU": 9}], (), "bundle 0 asks 9 GPU(s); dgx1-v100 has 8"),
    ([{"GPU": 2}] * 4, (0,), "the group asks 8 GPUs; dgx1-v100 has 7 free"),
    (["GPU"], (), "not an object"),
], ids=["none", "fraction", "negative", "bool", "inf", "huge", "other resource", "no GPU", "too big", "too many",
        "not a dict"])
def test_bad_bundles_are_one_request_error(bundles, busy, text):
    with pytest.raises(RequestError) as e:
        dry_run(DGX1, bundles, busy)
    assert e.value.field == "bundles" and text in str(e.value)


def test_a_machine_of_another_family_or_without_whole_gpus_is_refused():
    from rayaccel.discovery.rayspec import spec_for

    trn = catalog.load("trn1-32xlarge")
    with pytest.raises(RequestError, match="'neuron_cores', not GPUs"):
        dry_run(trn, [{"GPU": 1}], spec=spec_for(trn))
    with pytest.raises(RequestError, match="no whole GPU"):
        dry_run(catalog.load("a100-mig"), [{"GPU": 1}])
