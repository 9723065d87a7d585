"""A placement group's devices reserved when asked (issue 21 item 1), before any member arrives.

``reserve_group`` is the driver-side form of a first member's arrival: the same candidates, the
same choice, idempotent; members that arrive later -- whole, or sharing the bundle's device with
fractional ``num_gpus`` (issue 21 item 3) -- get exactly the units reserved for their bundle.
"""

from __future__ import annotations

import pytest

from rayaccel import catalog
from rayaccel.arbiter.build import build_table
from rayaccel.arbiter.choose import TableChooser
from rayaccel.arbiter.decide import GrantRequest, decide, reserve_group
from rayaccel.arbiter.state import fresh_state

KEY = "0123456789ab"


@pytest.fixture(scope="module")
def dgx1():
    topo = catalog.load("dgx1-v100")
    table = build_table(topo, KEY, True)
    return topo, table, TableChooser(table, lambda: topo)


def _decide(st, req, table, chooser, alive=lambda p: True):
    return decide(st, req, table, chooser=chooser, alive=alive, now=1.0)


def test_reserving_first_gives_what_the_first_member_would_have_got(dgx1):
    topo, table, chooser = dgx1
    bundles = {b: 2.0 for b in range(4)}
    st0 = fresh_state(table.pools())
    # the member's way: its grant reserves the group
    by_member, g = _decide(st0, GrantRequest(pid=5, key="actor:a", slots={"GPU": ((0, 1.0), (1, 1.0))}, pg="aa",
                                             bundle=0, pg_bundles=bundles), table, chooser)
    # the driver's way: reserved before any member
    st1, res = reserve_group(st0, "aa", "GPU", bundles, table, chooser=chooser, alive=lambda p: True, now=1.0)
    assert res is not None and dict(res.bundles) == dict(by_member.pgs["aa"].bundles)
    for us in res.bundles.values():
        a, b = us
        link = topo.link(a, b)
        assert link is not None and link.kind == "nvlink" and link.count == 2, (us, link)  # NV2 pairs
    # idempotent: asked again, the same units
    st2, again = reserve_group(st1, "aa", "GPU", bundles, table, chooser=chooser, alive=lambda p: True, now=2.0)
    assert st2 is st1 and again == res
    # a member arriving later, on any of Ray's slots, gets its bundle's units
    _, g2 = _decide(st1, GrantRequest(pid=6, key="actor:b", slots={"GPU": ((6, 1.0), (7, 1.0))}, pg="aa", bundle=2),
                    table, chooser)
    assert g2.devices == res.bundles[2]


def test_other_work_never_takes_a_reserved_device(dgx1):
    _, table, chooser = dgx1
    st, res = reserve_group(fresh_state(table.pools()), "bb", "GPU", {0: 4.0}, table, chooser=chooser,
                            alive=lambda p: True, now=1.0)
    reserved = set(res.bundles[0])
    st, g = _decide(st, GrantRequest(pid=9, key="task:x", slots={"GPU": ((0, 1.0), (1, 1.0), (2, 1.0), (3, 1.0))}),
                    table, chooser)
    assert g.waiting is None and not reserved & set(g.devices)


def test_colocated_shares_sit_on_their_bundles_device_across_a_restart(dgx1):
    """Trainer and rollout at 0.5 + 0.5 in each {"GPU": 1} bundle: both on the reserved device; a restarted
    trainer (a new process, its sharer alive or not) comes back to the same device."""
    _, table, chooser = dgx1
    bundles = {b: 1.0 for b in range(4)}
    st, res = reserve_group(fresh_state(table.pools()), "cc", "GPU", bundles, table, chooser=chooser,
                            alive=lambda p: True, now=1.0)
    alive = {p for p in range(100, 108)}
    seen = {}
    for b in range(4):
        slot = 7 - b  # Ray's slots need not match the devices
        for role, pid in (("trainer", 100 + 2 * b), ("rollout", 101 + 2 * b)):
            st, g = _decide(st, GrantRequest(pid=pid, key=f"actor:{role}{b}", slots={"GPU": ((slot, 0.5),)},
                                             pg="cc", bundle=b), table, chooser, alive=lambda p: p in alive)
            seen[(b, role)] = g.devices
    for b in range(4):
        assert seen[(b, "trainer")] == seen[(b, "rollout")] == res.bundles[b]
    # bundle 0's trainer dies and restarts (rollout alive): same device
    alive.discard(100)
    st, g = _decide(st, GrantRequest(pid=200, key="actor:trainer0", slots={"GPU": ((7, 0.5),)}, pg="cc", bundle=0),
                    table, chooser, alive=lambda p: p in alive or p == 200)
    assert g.devices == res.bundles[0]
    # both of bundle 1's workers die, then both restart: the reservation brings them back to its device
    alive -= {102, 103}
    alive |= {300, 301}
    for pid in (300, 301):
        st, g = _decide(st, GrantRequest(pid=pid, key=f"actor:{pid}", slots={"GPU": ((6, 0.5),)}, pg="cc", bundle=1),
                        table, chooser, alive=lambda p: p in alive)
        assert g.devices == res.bundles[1]


def test_no_whole_unit_bundle_or_no_room_reserves_nothing(dgx1):
    _, table, chooser = dgx1
    st0 = fresh_state(table.pools())
    st, res = reserve_group(st0, "dd", "GPU", {0: 0.5}, table, chooser=chooser, alive=lambda p: True, now=1.0)
    assert res is None and st is st0
    st, res = reserve_group(st0, "dd", "GPU", {0: 9.0}, table, chooser=chooser, alive=lambda p: True, now=1.0)
    assert res is None and st is st0


def test_a_bundles_unused_device_stays_its_own_while_a_member_holds_part_of_it(dgx1):
    """Two 1-GPU members of one {"GPU": 2} bundle: the first takes one reserved device; work outside the
    group never takes the other, so the second member gets it."""
    _, table, chooser = dgx1
    st, res = reserve_group(fresh_state(table.pools()), "ee", "GPU", {0: 2.0}, table, chooser=chooser,
                            alive=lambda p: True, now=1.0)
    pair = res.bundles[0]
    st, g1 = _decide(st, GrantRequest(pid=1, key="actor:a", slots={"GPU": ((0, 1.0),)}, pg="ee", bundle=0), table,
                     chooser)
    assert g1.devices == pair[:1]
    # other work asking for every other device waits: the pair's other device is not free for it
    _, g = _decide(st, GrantRequest(pid=2, key="task:x", slots={"GPU": tuple((s, 1.0) for s in range(1, 8))}),
                   table, chooser)
    assert g.waiting is not None and g.blocked_by == {"ee"}
    st, g = _decide(st, GrantRequest(pid=2, key="task:x", slots={"GPU": tuple((s, 1.0) for s in range(2, 8))}),
                    table, chooser)
    assert g.waiting is None and pair[1] not in g.devices
    st, g2 = _decide(st, GrantRequest(pid=3, key="actor:b", slots={"GPU": ((1, 1.0),)}, pg="ee", bundle=0), table,
                     chooser)
    assert g2.devices == pair[1:]
