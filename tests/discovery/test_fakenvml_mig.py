"""FakeNVML's MIG re-partitioning holds NVML's placement rules (A100 and H100 profile tables), and
NvmlMigOps creates and destroys instances through it; property tests over random create/destroy runs."""

from __future__ import annotations

import ctypes
import dataclasses

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel import catalog
from rayaccel.discovery.nvidia_mig import MigOpError, NvmlMigOps
from rayaccel.testing import FakeNVML
from rayaccel.topology import NodeTopology

MACHINES = {"a100": "dgx-a100", "h100": "hgx-h100"}


def _mig_gpu(name: str, with_parts: bool = False) -> NodeTopology:
    """One GPU of the named machine, in MIG mode with no instance."""
    t = catalog.load(MACHINES[name]) if name in MACHINES else catalog.load(name)
    d = dataclasses.replace(t.devices[0], mig_mode=True, partitions=t.devices[0].partitions if with_parts else ())
    return NodeTopology(name="one", devices=(d,))


def _spans(ops: NvmlMigOps) -> list[tuple[str, int, int]]:
    return [(p.profile, p.start, p.start + p.size) for p in ops.instances(0)]


def _valid(topo: NodeTopology, spans: list[tuple[str, int, int]]) -> None:
    """NVML's rules: placements from the table, no overlap, compute <= 7, per-profile max."""
    d = topo.devices[0]
    used: set[int] = set()
    comp = 0
    for name, a, b in spans:
        prof = d.profile(name)
        assert prof is not None and a in prof.placements and b - a == prof.slots, (name, a, b)
        assert not used & set(range(a, b)), spans
        used |= set(range(a, b))
        comp += int(name.split("g.")[0])
        assert sum(1 for n, _, _ in spans if n == name) <= prof.max_instances
    assert comp <= 7 and max(used, default=0) < 8


@pytest.mark.parametrize("machine", ["a100", "h100"])
def test_create_at_placement_then_destroy(machine: str) -> None:
    topo = _mig_gpu(machine)
    fake = FakeNVML(topo)
    ops = NvmlMigOps(fake)
    d = topo.devices[0]
    one = d.mig_profiles[0]
    three = next(p for p in d.mig_profiles if p.name.startswith("3g."))
    a = ops.create(0, three, 4)
    assert a.uuid.startswith("MIG-") and (a.start, a.size, a.profile) == (4, 4, three.name)
    b = ops.create(0, one, 0)
    with pytest.raises(MigOpError, match="Insufficient Resources"):
        ops.create(0, one, 4)  # taken by the 3g instance
    with pytest.raises(MigOpError, match="Invalid Argument"):
        ops.create(0, three, 2)  # not a placement of the profile
    assert sorted(_spans(ops)) == sorted([(three.name, 4, 8), (one.name, 0, 1)])
    fake.mig_in_use.add(b.uuid)
    with pytest.raises(MigOpError, match="In Use"):
        ops.destroy(0, b.gi_id)
    fake.mig_in_use.clear()
    ops.destroy(0, b.gi_id)
    assert _spans(ops) == [(three.name, 4, 8)]
    h = fake.nvmlDeviceGetHandleByIndex(0)
    assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(h, one.id) == 4  # slices 0-3 free
    assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(h, three.id) == 1


def test_not_in_mig_mode_is_refused() -> None:
    t = catalog.load("dgx-a100")
    ops = NvmlMigOps(FakeNVML(t))
    with pytest.raises(MigOpError, match="Not Supported"):
        ops.create(0, t.devices[0].mig_profiles[0], 0)


def test_catalog_a100_mig_instances_keep_their_places() -> None:
    t = catalog.load("a100-mig")
    ops = NvmlMigOps(FakeNVML(t))
    assert sorted(_spans(ops)) == [("1g.5gb", 0, 1), ("1g.5gb", 1, 2), ("3g.20gb", 4, 8)]
    new = ops.create(0, t.devices[0].profile("1g.5gb"), 2)
    assert new.uuid not in {p.uuid for p in t.devices[0].partitions}
    with pytest.raises(MigOpError):
        ops.create(0, t.devices[0].profile("2g.10gb"), 2)  # slice 2 is taken now


def test_create_without_placement_takes_a_free_one() -> None:
    topo = _mig_gpu("a100")
    fake = FakeNVML(topo)
    fake.nvmlInit()
    h = fake.nvmlDeviceGetHandleByIndex(0)
    for _ in range(7):
        fake.nvmlDeviceCreateGpuInstance(h, 19)
    with pytest.raises(fake.NVMLError):
        fake.nvmlDeviceCreateGpuInstance(h, 19)
    assert fake.nvmlDeviceGetGpuInstanceRemainingCapacity(h, 19) == 0


ops_strategy = st.lists(st.tuples(st.sampled_from(["create", "destroy"]), st.integers(0, 6), st.integers(0, 7)),
                        max_size=25)


@pytest.mark.parametrize("machine", ["a100", "h100"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=ops_strategy)
def test_random_create_destroy_keeps_nvml_rules(machine: str, steps: list) -> None:
    """Any run of creates and destroys leaves a layout NVML allows, and a create succeeds exactly
    when the rules allow it (the remaining capacity agrees)."""
    topo = _mig_gpu(machine)
    fake = FakeNVML(topo)
    ops = NvmlMigOps(fake)
    profiles = [p for p in topo.devices[0].mig_profiles if "+" not in p.name]
    h = fake.nvmlDeviceGetHandleByIndex(0)
    for action, which, start in steps:
        spans = _spans(ops)
        if action == "create":
            prof = profiles[which % len(profiles)]
            allowed = (start in prof.placements and not any(set(range(start, start + prof.slots)) & set(range(a, b))
                                                            for _, a, b in spans)
                       and sum(int(n.split("g.")[0]) for n, _, _ in spans) + int(prof.name.split("g.")[0]) <= 7
                       and sum(1 for n, _, _ in spans if n == prof.name) < prof.max_instances)
            cap = fake.nvmlDeviceGetGpuInstanceRemainingCapacity(h, prof.id)
            try:
                ops.create(0, prof, start)
                assert allowed and cap >= 1
            except MigOpError:
                assert not allowed
        elif spans:
            victim = ops.instances(0)[which % len(spans)]
            ops.destroy(0, victim.gi_id)
            assert victim.uuid not in {p.uuid for p in ops.instances(0)}
        _valid(topo, _spans(ops))
    assert isinstance(ctypes.sizeof(fake.c_nvmlComputeInstanceProfileInfo_t), int)
