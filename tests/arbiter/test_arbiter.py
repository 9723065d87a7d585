"""The node arbiter without Ray: slots -> devices, gangs, shares, MIG, drains, damaged state.

Ray's own semantics are emulated the way ``resource_instance_set.cc`` grants: whole
devices take the lowest free slots, a fraction takes the best-fitting slot, a
placement group reserves its slots at creation. The property test drives random
sequences of grants, releases, groups and drains and checks the contract: the
devices in use are disjoint (a share never lands on a whole holder's device), the
slot map stays a bijection, a drained device is never handed out.
"""

from __future__ import annotations

import os
import zlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.decide import GrantRequest
from rayaccel.arbiter.placer import bundle_order
from rayaccel.arbiter.statefile import Arbiter
from rayaccel.placement.pools import gpu_pool, mig_pools


def arbiter(tmp_path, topo, alive):
    return Arbiter(tmp_path, build_table(topo, "0" * 12, True), topology=topo, alive=alive)


def gpu(slots):
    return {"GPU": tuple(slots)}


class Node:
    """A node as Ray sees it (slot ledger) with the arbiter behind it."""

    def __init__(self, tmp_path, name="dgx1-v100"):
        self.topo = catalog.load(name)
        self.alive: set[int] = set()
        self.arb = arbiter(tmp_path, self.topo, lambda p: p in self.alive)
        self.n = len(gpu_pool(self.topo))
        self.used = [0.0] * self.n  # Ray's per-slot usage
        self.held: dict[int, list[tuple[int, float]]] = {}
        self.pid = 100

    def grant(self, k=1, fraction=None, **kw):
        if fraction is not None:
            fits = [s for s in range(self.n) if self.used[s] + fraction <= 1 + 1e-9]
            if not fits:
                return None, None
            s = min(fits, key=lambda s: (1 - self.used[s] - fraction, s))
            slots = [(s, fraction)]
        else:
            free = [s for s in range(self.n) if self.used[s] == 0]
            if len(free) < k:
                return None, None
            slots = [(s, 1.0) for s in free[:k]]
        return self._arrive(slots, **kw)

    def _arrive(self, slots, **kw):
        self.pid += 1
        pid = self.pid
        for s, f in slots:
            self.used[s] += f
        self.alive.add(pid)
        self.held[pid] = slots
        g = self.arb.grant(GrantRequest(pid=pid, key=f"task:{pid}", slots=gpu(slots), **kw))
        return pid, g

    def release(self, pid):
        for s, f in self.held.pop(pid):
            self.used[s] -= f
        self.alive.discard(pid)


def link(topo, a, b):
    l = topo.link(min(a, b), max(a, b))
    return l.label if l else None


def test_four_pairs_on_a_dgx1_are_four_disjoint_nv2_pairs(tmp_path):
    node = Node(tmp_path)
    got = [node.grant(2)[1].devices for _ in range(4)]
    assert sorted(d for p in got for d in p) == list(range(8))
    assert [link(node.topo, *p) for p in got] == ["NV2"] * 4


def test_slots_in_use_never_move_and_others_rearrange(tmp_path):
    node = Node(tmp_path)
    p1, g1 = node.grant(1)
    before = node.arb.read().pools["GPU"][0]
    for _ in range(3):
        node.grant(2)
    assert node.arb.read().pools["GPU"][0] == before == g1.devices[0]


def test_placement_group_is_a_gang_in_ring_order(tmp_path):
    node = Node(tmp_path)
    for _ in range(3):
        node.grant(1)
    free = [s for s in range(8) if node.used[s] == 0]
    pg = {b: 1.0 for b in range(4)}
    devs = []
    for b, s in enumerate(free[:4]):
        _, g = node._arrive([(s, 1.0)], pg="ab12", bundle=b, pg_bundles=pg if b == 0 else None)
        devs.append(g.devices[0])
    assert sorted(devs) == [4, 5, 6, 7]  # the one all-NVLink quad left
    assert devs == sorted(devs)  # ascending is a best ring here: Train's ranks follow it


def test_gang_members_of_two_gpus_get_nv2_pairs(tmp_path):
    topo = catalog.load("dgx1-v100")
    order = bundle_order(topo, [0, 3, 1, 2], [2, 2])
    pairs = [order[:2], order[2:]]
    assert [link(topo, *p) for p in pairs] == ["NV2", "NV2"]


def test_bundles_take_the_best_split_of_the_set_not_only_a_rotation_of_its_ring():
    """Six DGX-1 devices with 1 busy: every rotation of the best ring pairs one NV1, while the same six split
    into three NV2 pairs (found by ``rayaccel plan --bundles 3x2 --busy 1``)."""
    topo = catalog.load("dgx1-v100")
    order = bundle_order(topo, [0, 3, 7, 6, 5, 4], [2, 2, 2])
    assert sorted(order) == [0, 3, 4, 5, 6, 7]
    assert [link(topo, *order[i:i + 2]) for i in (0, 2, 4)] == ["NV2", "NV2", "NV2"]


def _weakest_in_bundles(topo, order, sizes):
    worst, i = float("inf"), 0
    for k in sizes:
        part = order[i:i + k]
        i += k
        worst = min([worst, *(topo.bandwidth_gbps(a, b) for j, a in enumerate(part) for b in part[j + 1:])])
    return worst


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_bundle_order_keeps_the_devices_and_is_never_worse_than_a_rotation(data):
    topo = catalog.load(data.draw(st.sampled_from(["dgx1-v100", "pcie-8gpu-2socket", "hgx-h100"])))
    devs = data.draw(st.permutations(list(topo.indices)))[:data.draw(st.integers(2, len(topo.indices)))]
    sizes, left = [], len(devs)
    while left:
        k = data.draw(st.integers(1, left))
        sizes.append(k)
        left -= k
    order = bundle_order(topo, list(devs), sizes)
    assert sorted(order) == sorted(devs)
    rotations = [devs[r:] + devs[:r] for r in range(len(devs))] + [devs[::-1][r:] + devs[::-1][:r]
                                                                   for r in range(len(devs))]
    assert _weakest_in_bundles(topo, order, sizes) >= max(_weakest_in_bundles(topo, o, sizes) for o in rotations) - 1e-9


def test_reserved_devices_stay_free_for_late_members(tmp_path):
    node = Node(tmp_path)
    _, g0 = node._arrive([(0, 1.0)], pg="cd34", bundle=0, pg_bundles={0: 1.0, 1: 1.0})
    node.used[1] += 1  # Ray reserved slot 1 for bundle 1 at group creation
    others = [node.grant(1)[1].devices[0] for _ in range(6)]
    node.used[1] -= 1
    _, g1 = node._arrive([(1, 1.0)], pg="cd34", bundle=1)
    assert g1.devices[0] not in others and g1.devices[0] != g0.devices[0]
    assert link(node.topo, g0.devices[0], g1.devices[0]) == "NV2"


def test_grant_waits_when_only_reserved_devices_remain_then_drops_removed_group(tmp_path):
    node = Node(tmp_path)
    node._arrive([(0, 1.0)], pg="ff", bundle=0, pg_bundles={b: 1.0 for b in range(8)})
    node.release(node.pid)
    pid = node.pid + 1
    node.alive.add(pid)
    g = node.arb.grant(GrantRequest(pid=pid, key="t", slots=gpu([(1, 1.0)])))
    # the arbiter asks nobody: it names the group that blocks the grant, the caller asks Ray (outside the lock)
    assert g.waiting and "reserved" in g.waiting and g.blocked_by == {"ff"}
    g = node.arb.grant(GrantRequest(pid=pid, key="t", slots=gpu([(1, 1.0)]), gone=frozenset({"ff"})))
    assert g.waiting is None and len(g.devices) == 1 and "ff" not in node.arb.read().pgs


def test_shares_pack_and_never_land_on_a_whole_holders_device(tmp_path):
    node = Node(tmp_path)
    _, a = node.grant(fraction=0.25)
    _, b = node.grant(fraction=0.25)
    assert a.devices == b.devices  # Ray best-fits the second share onto the same slot
    whole = [node.grant(1)[1].devices[0] for _ in range(7)]
    assert a.devices[0] not in whole


def test_drained_device_is_never_granted_and_placeholder_moves_onto_it(tmp_path):
    node = Node(tmp_path)
    p, g = node.grant(1)
    dev = g.devices[0]
    node.arb.drain(dev, "Xid 79", by="health")
    # the placeholder (held in Ray's ledger) arrives while the device is still busy
    _, ph = node.grant(1, drain=dev)
    assert ph.waiting is None
    node.release(p)
    got = [node.grant(1)[1] for _ in range(6)]
    assert all(dev not in x.devices for x in got)
    st = node.arb.read()
    ph_slot = st.holders[node.pid - 6].slots["GPU"][0][0]
    assert st.pools["GPU"][ph_slot] == dev
    assert node.arb.snapshot().drained[dev].reason == "Xid 79"
    assert node.arb.undrain(dev) and not node.arb.undrain(dev)


def test_constrained_request_waits_until_a_matching_set_is_free(tmp_path):
    from rayaccel.placement import Request

    node = Node(tmp_path)
    req = Request(gpus=4, interconnect="nvlink")
    holders = [node.grant(1)[0] for _ in range(2)]  # one device of each NVLink quad
    _, g = node.grant(1)
    node.release(holders[0])
    p, g = node.grant(4, request=req)
    if g.waiting is None:  # the singles left a quad whole
        assert sorted(g.devices) in ([0, 1, 2, 3], [4, 5, 6, 7])
        return
    for h in [holders[1], node.pid - 1]:
        if h in node.held:
            node.release(h)
    g = node.arb.grant(GrantRequest(pid=p, key=f"task:{p}", slots=gpu(node.held[p]), request=req))
    assert g.waiting is None and sorted(g.devices) in ([0, 1, 2, 3], [4, 5, 6, 7])


def test_mig_slots_map_to_instances_and_avoid_drained_parents(tmp_path):
    topo = catalog.load("a100-mig")
    pools = mig_pools(topo)
    res, units = next(iter(pools.items()))
    alive = {1, 2}
    arb = arbiter(tmp_path, topo, lambda p: p in alive)
    g = arb.grant(GrantRequest(pid=1, key="a", slots={res: ((0, 1.0),)}))
    assert g.partitions and g.partitions[0] in units
    parent = int(g.partitions[0].split(":")[0])
    arb.drain(parent, "test")
    g2 = arb.grant(GrantRequest(pid=2, key="b", slots={res: ((1 if len(units) > 1 else 0, 1.0),)}))
    assert g2.waiting


def test_damaged_state_file_is_rebuilt_and_reported(tmp_path):
    node = Node(tmp_path)
    node.grant(1)
    (tmp_path / "arbiter.state").write_text("{corrupt")
    _, g = node.grant(1)
    assert g.waiting is None
    st = node.arb.read()
    assert st.resets == 1 and "arbiter.state" in st.reset_reason


def test_state_file_is_private(tmp_path):
    node = Node(tmp_path)
    node.grant(1)
    assert os.stat(tmp_path / "arbiter.state").st_mode & 0o077 == 0
    raw = (tmp_path / "arbiter.state").read_bytes()
    assert raw[:4] == b"RAS2" and int.from_bytes(raw[4:8], "big") == zlib.crc32(raw[8:])


def test_moving_on_releases_the_previous_grant(tmp_path):
    node = Node(tmp_path)
    pid, g = node.grant(1)
    node.arb.grant(GrantRequest(pid=pid, key="task:other"))  # the same worker runs a CPU task now
    assert pid not in node.arb.read().holders


ops = st.lists(st.tuples(st.sampled_from(["whole", "share", "pg", "release", "drain", "undrain"]),
                         st.integers(0, 7), st.integers(1, 4)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq=ops, machine=st.sampled_from(["dgx1-v100", "pcie-8gpu-2socket", "hgx-h100"]))
def test_property_no_device_is_ever_held_twice(tmp_path_factory, seq, machine):
    node = Node(tmp_path_factory.mktemp("arb"), machine)
    drained: set[int] = set()
    active: dict[int, tuple] = {}  # pid -> (devices, fraction)
    for op, a, b in seq:
        if op == "whole":
            pid, g = node.grant(b)
        elif op == "share":
            pid, g = node.grant(fraction=round(0.1 * b, 2))
        elif op == "pg":
            free = [s for s in range(node.n) if node.used[s] == 0][:b]
            if len(free) < b:
                continue
            pgid = f"{a:02x}{b:02x}{len(active):04x}"
            g = None
            for i, s in enumerate(free):
                pid, g = node._arrive([(s, 1.0)], pg=pgid, bundle=i,
                                      pg_bundles={j: 1.0 for j in range(b)} if i == 0 else None)
                if g.waiting is None:
                    active[pid] = (g.devices, 1.0)
            continue
        elif op == "release":
            if active:
                pid = sorted(active)[a % len(active)]
                active.pop(pid)
                node.release(pid)
            continue
        elif op == "drain":
            node.arb.drain(a, "prop")
            drained.add(a)
            continue
        else:
            node.arb.undrain(a)
            drained.discard(a)
            continue
        if pid is None:
            continue
        if g.waiting is None:
            assert not set(g.devices) & drained, (g.devices, drained)
            active[pid] = (g.devices, node.held[pid][0][1])
        # invariants
        pool = node.arb.read().pools["GPU"]
        assert sorted(pool) == sorted(gpu_pool(node.topo))
        whole: dict[int, int] = {}
        shared: dict[int, int] = {}
        for p, (devs, f) in active.items():
            for d in devs:
                target = whole if f >= 1 else shared
                assert d not in whole, f"device {d} held twice"
                if f >= 1:
                    assert d not in shared, f"device {d} shared and held whole"
                target[d] = p


@pytest.mark.parametrize("machine", ["dgx1-v100", "pcie-8gpu-2socket"])
def test_a_gang_member_restarted_off_a_drained_device_lands_next_to_its_peers(tmp_path, machine):
    """Its reserved device drained (a failed GPU), the member's new device is the free one nearest its peers."""
    from rayaccel.transfer import Endpoint, locality_cost

    def cost(d, peers):
        return locality_cost(Endpoint("n", d, node.topo), [(Endpoint("n", p, node.topo), 1 << 30) for p in peers])

    node = Node(tmp_path, machine)
    pg = {b: 1.0 for b in range(3)}
    got = {}
    for b in range(3):
        pid, g = node._arrive([(b, 1.0)], pg="ab12", bundle=b, pg_bundles=pg if b == 0 else None)
        got[b] = (pid, g.devices[0])
    failed = got[1][1]
    node.arb.drain(failed, "Xid 79", by="health")
    node.release(got[1][0])  # the member is ended (on-failed-gpu=end-workers); Ray restarts it
    _, g = node._arrive([(1, 1.0)], pg="ab12", bundle=1)
    new = g.devices[0]
    peers = (got[0][1], got[2][1])
    free = [d for d in range(8) if d not in (*peers, failed)]
    assert new in free
    best = min(cost(d, peers) for d in free)
    assert cost(new, peers) == best, (new, free)
    assert node.arb.read().pgs["ab12"].bundles[1] == (new,)  # the group keeps it: a later restart gets it again
