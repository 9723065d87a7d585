"""Dynamic MIG decisions (placement.dynmig): units per placement, steps that serve waiting requests,
never destroying an instance with work; property tests apply the steps to FakeNVML (NVML's rules)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel import catalog
from rayaccel.discovery.nvidia_mig import NvmlMigOps
from rayaccel.errors import RequestError
from rayaccel.placement.dynmig import check_dynamic, instance_unit, parse_unit, plan_steps, unit_key
from rayaccel.placement.pools import mig_pools
from rayaccel.testing import FakeNVML
from rayaccel.topology import NodeTopology

A100 = catalog.load("a100-mig")


def test_units_one_per_profile_and_placement() -> None:
    pools = mig_pools(A100, dynamic=[0])
    assert pools["mig_1g.5gb"] == tuple(f"0:1g.5gb@{s}" for s in range(7))
    assert pools["mig_3g.20gb"] == ("0:3g.20gb@0", "0:3g.20gb@4")
    assert pools["mig_7g.40gb"] == ("0:7g.40gb@0",)
    assert not any("+" in r for r in pools)  # +me profiles are not offered
    assert mig_pools(A100) == {"mig_1g.5gb": ("0:mig7", "0:mig8"), "mig_3g.20gb": ("0:mig2",)}
    assert parse_unit(unit_key(3, "2g.10gb", 4)) == (3, "2g.10gb", 4) and parse_unit("0:mig7") is None
    assert {instance_unit(p) for p in A100.devices[0].partitions} <= set(pools["mig_1g.5gb"] + pools["mig_3g.20gb"])


def test_a_third_1g_is_created_in_free_space_and_nothing_busy_moves() -> None:
    busy = {"0:1g.5gb@0", "0:1g.5gb@1"}
    plan = plan_steps(A100.devices, {"1g.5gb": 1}, busy)
    assert [s.action for s in plan.steps] == ["create"]
    assert plan.steps[0].profile == "1g.5gb" and plan.steps[0].start in (2, 3)


def test_free_instance_is_reused_not_created() -> None:
    plan = plan_steps(A100.devices, {"1g.5gb": 1}, {"0:1g.5gb@0"})
    assert plan.steps == () and plan.reused == 1


def test_idle_instances_in_the_way_go_busy_ones_never() -> None:
    plan = plan_steps(A100.devices, {"4g.20gb": 1}, {"0:3g.20gb@4"})
    assert [(s.action, s.start) for s in plan.steps] == [("destroy", 0), ("destroy", 1), ("create", 0)]
    plan = plan_steps(A100.devices, {"4g.20gb": 1}, {"0:1g.5gb@1"})
    assert plan.steps == () and plan.unserved and plan.unserved[0][0] == "4g.20gb"


def test_destroys_only_what_is_in_the_way() -> None:
    # 2g.10gb fits at slices 2-3 without touching the idle 1g instances
    plan = plan_steps(A100.devices, {"2g.10gb": 1}, set())
    assert [s.action for s in plan.steps] == ["create"] and plan.steps[0].start == 2


def test_bad_demand_and_gpu_checks() -> None:
    with pytest.raises(RequestError):
        plan_steps(A100.devices, {"1g.5gb": -1})
    plain = catalog.load("dgx-a100").devices[0]
    assert "not in MIG mode" in check_dynamic(plain)
    assert check_dynamic(A100.devices[0]) is None


def _empty_gpu(machine: str) -> NodeTopology:
    d = catalog.load(machine).devices[0]
    return NodeTopology(name="one", devices=(dataclasses.replace(d, mig_mode=True, partitions=()),))


PROFILES = {"dgx-a100": ["1g.5gb", "1g.10gb", "2g.10gb", "3g.20gb", "4g.20gb", "7g.40gb"],
            "hgx-h100": ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]}


@pytest.mark.parametrize("machine", sorted(PROFILES))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.tuples(st.dictionaries(st.integers(0, 5), st.integers(1, 3), max_size=3),
                                 st.lists(st.integers(0, 6), max_size=3)), min_size=1, max_size=6))
def test_steps_apply_on_nvml_and_never_touch_busy(machine: str, rounds: list) -> None:
    """Round after round of demand (and work ending): every planned step is one NVML accepts and no
    instance with work is destroyed."""
    topo = _empty_gpu(machine)
    fake = FakeNVML(topo)
    ops = NvmlMigOps(fake)
    prof = {p.name: p for p in topo.devices[0].mig_profiles}
    busy: set[str] = set()
    for want, ends in rounds:
        demand = {PROFILES[machine][k]: n for k, n in want.items()}
        parts = tuple(ops.instances(0))
        for i in ends:  # some work ends
            if parts:
                busy.discard(instance_unit(parts[i % len(parts)]))
        gpu = dataclasses.replace(topo.devices[0], partitions=parts)
        plan = plan_steps([gpu], demand, busy)
        by_unit = {instance_unit(p): p for p in parts}
        for s in plan.steps:
            if s.action == "destroy":
                assert s.unit not in busy
                ops.destroy(0, by_unit[s.unit].gi_id)
            else:
                new = ops.create(0, prof[s.profile], s.start)  # raises if NVML's rules refuse
                busy.add(instance_unit(new))
        # reused instances get work too
        free = [instance_unit(p) for p in ops.instances(0) if instance_unit(p) not in busy]
        for name, n in demand.items():
            for u in [u for u in free if parse_unit(u)[1] == name][:n]:
                busy.add(u)
        live = {instance_unit(p) for p in ops.instances(0)}
        assert busy <= live  # nothing with work disappeared
