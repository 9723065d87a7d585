"""The named machines of the placement tests are valid and match their notes (tests/machines.py)."""

from __future__ import annotations


from machines import MACHINES, dgx1v


def test_machines_are_valid():
    for name, build in MACHINES.items():
        topo = build()
        assert len(topo.devices) in (8, 16), name
        assert len(topo.links) == len(topo.devices) * (len(topo.devices) - 1) // 2


def test_dgx1v_matches_the_note():
    t = dgx1v()
    assert t.link(0, 3).label == "NV2" and t.link(0, 1).label == "NV1" and t.link(0, 5).label == "SYS"
