"""Dynamic MIG's agent side without Ray (:mod:`rayaccel.ray.node.dynmig`): the catalog's ``a100-mig`` in a
node directory, its FakeNVML, the real arbiter, and Ray's ledger as a fake (:class:`FakeHolds`).

Holds match the units without an instance; waiting work makes instances where the layout planner puts them;
idle instances in the way go, never one with work (a holder's, or one Ray granted that no worker reported);
the arbiter hands out only instances that exist, by their UUIDs; ``--dynamic-mig`` checks its GPUs.
"""

from __future__ import annotations

import pytest

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.decide import GrantRequest
from rayaccel.arbiter.state import Snapshot, decode_snapshot, encode_snapshot
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.errors import ClusterError
from rayaccel.placement.migunits import instance_unit
from rayaccel.ray.node.dynmig import DynamicMig, dynamic_gpus, simulated_ops
from rayaccel.ray.record import NodeRecord, node_resources

A100 = "a100-mig"


class FakeHolds:
    """Ray's ledger as the agent sees it: holds placed at once, a demand and a use the test sets."""

    def __init__(self):
        self.h: dict[str, int] = {}
        self.d: dict[str, int] = {}
        self.u: dict[str, float] = {}
        self.fail_hold = False

    def held(self):
        return {r: n for r, n in self.h.items() if n}

    def hold(self, r, n=1):
        if self.fail_hold:
            return 0
        self.h[r] = self.h.get(r, 0) + n
        return n

    def release(self, r, n=1):
        k = min(n, self.h.get(r, 0))
        self.h[r] = self.h.get(r, 0) - k
        return k

    def demand(self):
        return dict(self.d)

    def used(self):
        return dict(self.u)


@pytest.fixture
def node(tmp_path):
    topo = catalog.load(A100)
    table = build_table(topo, "abcdefabcdef", True, dynamic_mig=(0,))
    arb = Arbiter(tmp_path, table, alive=lambda pid: pid > 0)
    holds = FakeHolds()
    dm = DynamicMig(topo, (0,), arb, simulated_ops(topo, str(tmp_path)), holds)
    dm.setup()
    return dm


def _grant(dm, pid, resource="mig_1g.5gb", slot=0):
    return dm.arbiter.grant(GrantRequest(pid=pid, key=f"actor:{pid}", slots={resource: ((slot, 1.0),)}))


def test_setup_publishes_the_instances_and_holds_every_unit_without_one(node):
    live = node.live()
    assert sorted(live) == ["0:1g.5gb@0", "0:1g.5gb@1", "0:3g.20gb@4"]
    assert node.holds.held() == {"mig_1g.5gb": 5, "mig_1g.10gb": 4, "mig_2g.10gb": 3, "mig_3g.20gb": 1,
                                 "mig_4g.20gb": 1, "mig_7g.40gb": 1}
    node.setup()  # idempotent: a restarted agent adopts what is held
    assert node.holds.held()["mig_1g.5gb"] == 5


def test_waiting_work_gets_a_new_instance_and_the_arbiter_names_its_uuid(node):
    grants = [_grant(node, pid, slot=s) for pid, s in ((1, 0), (2, 1))]
    assert all(g.waiting is None for g in grants)
    assert _grant(node, 3, slot=2).waiting  # no third instance yet: it waits, never a unit that does not exist
    node.holds.d = {"mig_1g.5gb": 1}
    events = node.tick()
    assert [(e["action"], e["profile"], e["ok"]) for e in events] == [("create", "1g.5gb", True)]
    assert events[0]["start"] in (2, 3) and events[0]["uuid"].startswith("MIG-")
    assert node.holds.held()["mig_1g.5gb"] == 4  # one released: Ray may grant it
    g = _grant(node, 3, slot=2)
    assert g.waiting is None and g.units["mig_1g.5gb"] == (events[0]["unit"],)
    uuids = {node.arbiter.table.resources["mig_1g.5gb"].uuid_of[u]
             for gr in (*grants, g) for u in gr.units["mig_1g.5gb"]}
    assert len(uuids) == 3 and events[0]["uuid"] in uuids
    assert node.summary()["events"][-1]["uuid"] == events[0]["uuid"]


def test_idle_instances_in_the_way_are_destroyed_for_another_profile(node):
    node.holds.d = {"mig_7g.40gb": 1}
    events = node.tick()
    assert [e["action"] for e in events] == ["destroy", "destroy", "destroy", "create"], events
    assert all(e["ok"] for e in events)
    assert sorted(node.live()) == ["0:7g.40gb@0"]
    held = node.holds.held()
    assert held["mig_1g.5gb"] == 7 and held["mig_3g.20gb"] == 2 and "mig_7g.40gb" not in held


@pytest.mark.parametrize("busy_by", ["holder", "ray-grant-not-reported"])
def test_an_instance_with_work_is_never_destroyed(node, busy_by):
    if busy_by == "holder":
        assert _grant(node, 1).waiting is None
    else:
        node.holds.u = {"mig_1g.5gb": 1.0}  # Ray granted one that no worker has reported yet
    node.holds.d = {"mig_7g.40gb": 1}
    events = node.tick()
    assert not [e for e in events if e["action"] == "destroy"], events
    assert {"0:1g.5gb@0", "0:1g.5gb@1"} <= set(node.live())


def test_a_destroy_that_cannot_hold_its_unit_first_leaves_the_instance(node):
    node.holds.fail_hold = True
    node.holds.d = {"mig_7g.40gb": 1}
    events = node.tick()
    assert events and not events[0]["ok"] and "could not hold" in events[0]["error"]
    assert len(node.live()) == 3


def test_no_demand_no_steps(node):
    assert node.tick() == [] and node.summary()["events"] == []


# ------------------------------------------------------------------ the option and what crosses processes

def test_rays_demand_counts_tasks_actors_and_waiting_groups_never_the_holds(monkeypatch):
    """What Ray's pending demand makes wait: task/actor shapes and waiting placement groups' bundles, in units;
    a hold (this agent's or another node's, by name) never counts, nor a bundle without a MIG resource."""
    from rayaccel.contract import DYNMIG_PREFIX
    from rayaccel.ray import _ray_private as rp
    from rayaccel.ray.node.dynmig import RayHolds

    monkeypatch.setattr(rp, "group_nodes", lambda pg=None: {
        "aa": {"name": f"{DYNMIG_PREFIX}othernode-mig_1g.5gb-1234", "state": "PENDING", "nodes": []},
        "bb": {"name": "users-group", "state": "PENDING", "nodes": []}})
    monkeypatch.setattr(rp, "pending_demand", lambda addr, timeout_s=5: [
        ({"mig_1g.5gb": 1.0, "CPU": 1.0}, 2, None), ({"CPU": 4.0}, 5, None),
        ({"mig_1g.5gb": 1.0}, 3, "aa"), ({"mig_2g.10gb": 1.0}, 2, "bb")])
    h = RayHolds.__new__(RayHolds)
    h.gcs_address = "127.0.0.1:1"
    assert h.demand() == {"mig_1g.5gb": 2, "mig_2g.10gb": 2}

@pytest.mark.parametrize("value,want", [
    (None, ()), ("", ()), ("off", ()), ("0", (0,)), ("all", (0,)), ([0], (0,)), (" 0 ", (0,)),
], ids=["none", "empty", "off", "index", "all", "list", "spaces"])
def test_dynamic_gpus_accepts(value, want):
    assert dynamic_gpus(value, catalog.load(A100)) == want


@pytest.mark.parametrize("topo,value,match", [
    (A100, "1", "no GPU 1"), (A100, "0,0", "named twice"), (A100, "-1", "expected GPU indices"),
    (A100, "x", "expected GPU indices"), (A100, [True], "expected GPU indices"), (A100, 3.5, "got float"),
    ("dgx1-v100", "0", "not in MIG mode"), ("dgx1-v100", "all", "no GPU of this node is in MIG mode"),
], ids=["unknown", "twice", "negative", "text", "bool", "float", "not-mig", "all-none"])
def test_dynamic_gpus_refuses_with_one_line(topo, value, match):
    with pytest.raises(ClusterError, match=match) as e:
        dynamic_gpus(value, catalog.load(topo))
    assert "\n" not in str(e.value)


def test_the_record_names_the_gpus_and_the_node_advertises_every_possible_instance():
    topo = catalog.load(A100)
    rec = NodeRecord("abcdefabcdef", topo, True, dynamic_mig=(0,))
    back = NodeRecord.from_json(rec.to_json())
    assert back.dynamic_mig == (0,)
    _, res = node_resources(topo, back.dynamic_mig)
    assert res["mig_1g.5gb"] == 7 and res["mig_7g.40gb"] == 1
    assert rec.mismatch({"GPU": 0, **res}) is None
    assert NodeRecord.from_json(NodeRecord("abcdefabcdef", topo, True).to_json()).dynamic_mig == ()


def test_the_snapshot_carries_the_steps(node):
    node.holds.d = {"mig_1g.5gb": 3}
    node.tick()
    snap = Snapshot(at=1.0, node_key="abcdefabcdef", dynmig=node.summary())
    back = decode_snapshot(encode_snapshot(snap), "test")
    assert back.dynmig["events"][0]["action"] == "create" and back.dynmig["instances"] == node.live()
    with pytest.raises(Exception, match="dynmig"):
        decode_snapshot(encode_snapshot(snap._replace(dynmig={"events": "x"})), "test")


# ------------------------------------------------------------------ property: any demand, any work
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

PROFILES = ("1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.tuples(st.dictionaries(st.sampled_from(PROFILES), st.integers(0, 4), max_size=3),
                                 st.integers(0, 3)), min_size=1, max_size=5))
def test_any_demand_keeps_nvml_placement_rules_the_ledger_and_work(tmp_path_factory, rounds):
    """Whatever waits and whatever runs: instances sit at their profile's placements without overlapping (within
    7 compute slices), what the arbiter may hand out is exactly what exists, Ray's holds are the units without an
    instance, and an instance that has work is still there after every period."""
    topo = catalog.load(A100)
    d = tmp_path_factory.mktemp("dyn")
    arb = Arbiter(d, build_table(topo, "abcdefabcdef", True, dynamic_mig=(0,)), alive=lambda pid: pid > 0)
    dm = DynamicMig(topo, (0,), arb, simulated_ops(topo, str(d)), FakeHolds())
    dm.setup()
    pid = 0
    next_slot: dict[str, int] = {}
    steps = 0
    for demand, take in rounds:
        for _ in range(take):  # some work starts on whatever exists (Ray grants a free slot)
            live = sorted(dm.live())
            if not live:
                break
            r = "mig_" + live[pid % len(live)].split(":")[1].split("@")[0]
            pid += 1
            slot = next_slot.get(r, 0)  # Ray's next free slot of the resource (a slot without an instance waits)
            next_slot[r] = slot + 1
            arb.grant(GrantRequest(pid=pid, key=f"actor:{pid}", slots={r: ((slot, 1.0),)}))
        st_ = arb.read()
        working = dm.busy(st_)[0] & set(dm.live())
        dm.holds.d = {f"mig_{p}": n for p, n in demand.items()}
        dm._quiet_until = 0.0
        steps += len(dm.tick())
        parts = dm.ops.instances(0)
        assert {instance_unit(p) for p in parts} == set(dm.live())  # NVML and the published list agree
        spans = []
        for p in parts:
            prof = topo.device(0).profile(p.profile)
            assert p.start in prof.placements
            spans.append(set(range(p.start, p.start + prof.slots)))
        assert all(not (a & b) for i, a in enumerate(spans) for b in spans[i + 1:]), parts
        assert sum(int(p.profile.split("g.")[0]) for p in parts) <= 7
        assert working <= set(dm.live()), "an instance with work was destroyed"
        want = {r: n for r, n in dm.want_held().items() if n}
        assert dm.holds.held() == want
        for r, t in arb.table.resources.items():  # the arbiter's UUIDs are exactly the instances
            if r.startswith("mig_"):
                assert set(t.uuid_of) == {u for u in t.units if u in dm.live()}
