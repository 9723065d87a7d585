"""Device health probes, run for real against FakeNVML / FakeAmdSmi on catalog machines.

Every injectable condition goes through the vendor API the probe really calls (NVML's event
set and counters; amdsmi's event reader and counters). Also: edge-triggering, lost GPUs,
handle -> topology mapping by UUID / PCI bus id, the Xid table and its source, thread-safe
injection while a poll waits, and "absent is not broken".
"""

from __future__ import annotations

import threading
import time
from dataclasses import replace

import pytest

from rayaccel import catalog
from rayaccel.testing import fakenvml
from rayaccel.testing.fakeamdsmi import AMDSMI_STATUS_NOT_SUPPORTED, FakeAmdSmi
from rayaccel.testing.fakenvml import FakeNVML
from rayaccel.health import (
    APPLICATION_XIDS, KINDS, KIND_SEVERITY, HealthEvent, HealthProbe, MultiProbe, classify_xid, probe_for, xid_detail,
)
from rayaccel.health.amd import AmdHealthProbe
from rayaccel.health.nvml import NvmlHealthProbe
from rayaccel.errors import BackendError, BackendUnavailable
from rayaccel.topology import NodeTopology

NVIDIA_MACHINES = ["hgx-h100", "dgx1-v100", "a100-mig", "dgx-a100", "l40s-4x-pcie", "gb200-nvl4"]


class Clock:
    """A settable time source, so edge re-arming can be tested without sleeping."""

    def __init__(self, t: float = 1000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def nvml_probe(name: str, **kw) -> tuple[NvmlHealthProbe, FakeNVML, NodeTopology]:
    topo = catalog.load(name)
    fake = FakeNVML(topo)
    probe = NvmlHealthProbe(topo, nvml=fake, **kw)
    assert probe.poll(0) == []  # a healthy machine reports nothing
    return probe, fake, topo


def kinds(events: list[HealthEvent]) -> list[tuple[int, str, str]]:
    return [(e.device, e.kind, e.severity) for e in events]


# ---------------------------------------------------------------- the Xid table
# Source: NVIDIA/k8s-device-plugin internal/rm/health.go, getDisabledHealthCheckXids(): the
# hard-coded ignoredXids are "Application errors: the GPU should still be healthy"; every other
# Xid marks the device unhealthy. Descriptions: NVIDIA's Xid catalog (docs.nvidia.com/deploy/xid-errors).
XID_TABLE = [
    (13, "warning", "Graphics Engine Exception"),
    (31, "warning", "GPU memory page fault"),
    (43, "warning", "GPU stopped processing"),
    (45, "warning", "Preemptive cleanup, due to previous errors"),
    (68, "warning", "Video processor exception"),
    (109, "warning", "Context Switch Timeout Error"),
    (48, "critical", "Double Bit ECC Error"),
    (63, "critical", "ECC page retirement or row remapping recording event"),
    (64, "critical", "ECC page retirement or row remapper recording failure"),
    (74, "critical", "NVLink error"),
    (79, "critical", "GPU has fallen off the bus"),
    (94, "critical", "Contained ECC error"),
    (95, "critical", "Uncontained ECC error"),
    (119, "critical", "GSP RPC timeout"),
    (999, "critical", None),
]


def test_application_xids_are_the_device_plugins():
    assert APPLICATION_XIDS == frozenset({13, 31, 43, 45, 68, 109})


@pytest.mark.parametrize("xid, severity, text", XID_TABLE, ids=[f"xid{x}" for x, _, _ in XID_TABLE])
def test_xid_classification(xid, severity, text):
    assert classify_xid(xid) == severity
    assert xid_detail(xid) == (f"Xid {xid}: {text}" if text else f"Xid {xid}")
    probe, fake, topo = nvml_probe("hgx-h100")
    fake.inject_xid(5, xid)
    (ev,) = probe.poll(0.05)
    assert (ev.device, ev.kind, ev.severity, ev.code, ev.partition) == (5, "xid", severity, xid, None)
    assert ev.detail == xid_detail(xid)


def test_application_xids_can_be_chosen():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)
    probe = NvmlHealthProbe(topo, nvml=fake, application_xids=frozenset({79}))
    fake.inject_xid(0, 79)
    fake.inject_xid(1, 13)
    assert sorted(kinds(probe.poll(0.05))) == [(0, "xid", "warning"), (1, "xid", "critical")]


def test_every_kind_has_a_severity_and_a_meaning():
    assert set(KINDS) == set(KIND_SEVERITY)
    assert all(KIND_SEVERITY[k] in ("critical", "warning") for k in KINDS if k != "xid")


# ---------------------------------------------------------------- each condition, each machine
CONDITIONS = {
    "xid79": (lambda f, d: f.inject_xid(d, 79), "xid", "critical"),
    "xid31": (lambda f, d: f.inject_xid(d, 31), "xid", "warning"),
    "ecc": (lambda f, d: f.inject_ecc(d, 3), "ecc_uncorrectable", "critical"),
    "remap_pending": (lambda f, d: f.inject_remap(d, pending=True), "row_remap_pending", "warning"),
    "remap_failure": (lambda f, d: f.inject_remap(d, pending=False, failure=True), "row_remap_failure", "critical"),
    "retired_pending": (lambda f, d: f.inject_retired_pending(d), "retired_pages_pending", "warning"),
    "thermal": (lambda f, d: f.inject_throttle(d, thermal=True), "throttle_thermal", "warning"),
    "power": (lambda f, d: f.inject_throttle(d, thermal=False, power=True), "throttle_power", "warning"),
    "lost": (lambda f, d: f.lose(d), "gpu_lost", "critical"),
}


@pytest.mark.parametrize("machine", NVIDIA_MACHINES)
@pytest.mark.parametrize("condition", sorted(CONDITIONS))
def test_nvml_condition_reported_once(machine, condition):
    probe, fake, topo = nvml_probe(machine)
    inject, kind, severity = CONDITIONS[condition]
    victim = topo.devices[-1].index
    inject(fake, victim)
    events = probe.poll(0.05)
    assert kinds(events) == [(victim, kind, severity)]
    assert events[0].at > 0 and events[0].detail
    assert probe.poll(0) == []  # edge-triggered: a condition that lasts is not re-reported
    assert probe.poll(0) == []
    probe.close()


@pytest.mark.parametrize("machine", ["hgx-h100", "dgx1-v100", "dgx-a100", "gb200-nvl4"])
def test_nvlink_down(machine):
    probe, fake, topo = nvml_probe(machine)
    fake.inject_nvlink_down(2, link=1)
    (ev,) = probe.poll(0)
    assert (ev.device, ev.kind, ev.severity, ev.code) == (2, "nvlink_down", "warning", 1)
    assert probe.poll(0) == []
    fake.inject_nvlink_down(2, link=1, down=False)
    assert probe.poll(0) == []
    fake.inject_nvlink_down(2, link=1)  # down again: a new episode
    assert kinds(probe.poll(0)) == [(2, "nvlink_down", "warning")]


def test_pcie_machine_watches_no_nvlink():
    probe, fake, topo = nvml_probe("l40s-4x-pcie")
    assert all(not w.links for w in probe._watched.values())


# ---------------------------------------------------------------- edge-triggering
def test_ecc_counter_reports_each_increase_once():
    probe, fake, _ = nvml_probe("dgx1-v100")
    fake.inject_ecc(4)
    (ev,) = probe.poll(0)
    assert (ev.kind, ev.code) == ("ecc_uncorrectable", 1)
    assert probe.poll(0) == []
    fake.inject_ecc(4, 2)
    (ev,) = probe.poll(0)
    assert ev.code == 3 and "(+2)" in ev.detail


def test_ecc_already_up_at_start_is_reported_once():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)
    fake.inject_ecc(0, 5)  # before the probe starts: no event set has it registered, the counter has it
    probe = NvmlHealthProbe(topo, nvml=fake)
    assert [(e.device, e.kind, e.code) for e in probe.poll(0)] == [(0, "ecc_uncorrectable", 5)]
    assert probe.poll(0) == []


def test_ecc_event_without_counter_still_reported():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.fail("nvmlDeviceGetTotalEccErrors", fakenvml.NVML_ERROR_NOT_SUPPORTED)
    fake.inject_ecc(6)
    (ev,) = probe.poll(0.05)
    assert (ev.device, ev.kind, ev.code) == (6, "ecc_uncorrectable", None)
    assert "event" in ev.detail


def test_flag_rearms_when_it_clears():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.inject_remap(1, pending=True)
    assert kinds(probe.poll(0)) == [(1, "row_remap_pending", "warning")]
    fake.inject_remap(1, pending=False)
    assert probe.poll(0) == []
    fake.inject_remap(1, pending=True)
    assert kinds(probe.poll(0)) == [(1, "row_remap_pending", "warning")]


def test_throttle_rearms_only_after_staying_clear():
    clock = Clock()
    probe, fake, _ = nvml_probe("hgx-h100", clock=clock, throttle_rearm_s=60.0)
    fake.inject_throttle(3, thermal=False, power=True)
    assert kinds(probe.poll(0)) == [(3, "throttle_power", "warning")]
    fake.inject_throttle(3, thermal=False, power=False)
    clock.t += 10
    assert probe.poll(0) == []
    fake.inject_throttle(3, thermal=False, power=True)  # back within the re-arm window: same episode
    assert probe.poll(0) == []
    fake.inject_throttle(3, thermal=False, power=False)
    probe.poll(0)
    clock.t += 61
    assert probe.poll(0) == []  # clear for long enough: re-armed
    fake.inject_throttle(3, thermal=False, power=True)
    assert kinds(probe.poll(0)) == [(3, "throttle_power", "warning")]


def test_xid_storm_is_one_event_per_poll():
    probe, fake, _ = nvml_probe("hgx-h100")
    for _ in range(40):
        fake.inject_xid(2, 13)
    (ev,) = probe.poll(0)
    assert ev.code == 13 and "(x40)" in ev.detail


# ---------------------------------------------------------------- GPU lost
def test_lost_gpu_is_reported_once_and_not_asked_again():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.lose(3)
    assert kinds(probe.poll(0.05)) == [(3, "gpu_lost", "critical")]
    assert probe.lost == {3}
    fake.calls.clear()
    assert probe.poll(0) == []
    fake.inject_xid(3, 79)  # a lost device stays quiet
    fake.inject_ecc(4)  # the others are still watched
    assert kinds(probe.poll(0.05)) == [(4, "ecc_uncorrectable", "critical")]
    assert 3 in probe.devices


def test_gpu_lost_before_the_probe_starts():
    topo = catalog.load("dgx1-v100")
    fake = FakeNVML(topo)
    fake.lose(0)
    probe = NvmlHealthProbe(topo, nvml=fake)
    assert kinds(probe.poll(0)) == [(0, "gpu_lost", "critical")]
    fake.inject_xid(1, 79)
    assert kinds(probe.poll(0.05)) == [(1, "xid", "critical")]


def test_reset_required_is_critical():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.fail("nvmlDeviceGetRemappedRows", fakenvml.NVML_ERROR_RESET_REQUIRED, device=2)
    assert kinds(probe.poll(0)) == [(2, "gpu_reset_required", "critical")]
    assert probe.poll(0) == []


def test_device_nvml_no_longer_finds():
    topo = catalog.load("hgx-h100")
    other = NodeTopology(devices=tuple(replace(d, uuid=f"GPU-gone-{d.index}") if d.index == 7 else d
                                       for d in topo.devices), links=topo.links)
    fake = FakeNVML(topo)
    # device 7 of the probe's topology has a UUID NVML lacks; its bus id still matches, so it is found
    probe = NvmlHealthProbe(other, nvml=fake)
    assert probe.poll(0) == [] and 7 in probe._watched
    gone = NodeTopology(devices=tuple(replace(d, uuid="GPU-gone", pci_bus_id="0000:99:00.0") if d.index == 7 else d
                                      for d in topo.devices), links=topo.links)
    probe = NvmlHealthProbe(gone, nvml=fake)
    (ev,) = probe.poll(0)
    assert (ev.device, ev.kind) == (7, "gpu_lost") and "does not find" in ev.detail


# ---------------------------------------------------------------- mapping handles to topology indices
def test_devices_are_matched_by_uuid_not_nvml_index():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)  # NVML index i = topology device i
    n = len(topo.devices)
    # the probe's topology numbers the same GPUs the other way round
    flipped = NodeTopology(devices=tuple(replace(d, index=n - 1 - d.index) for d in topo.devices))
    probe = NvmlHealthProbe(flipped, nvml=fake)
    fake.inject_xid(0, 79)  # NVML's device 0 ...
    fake.inject_remap(1, failure=True, pending=False)
    assert sorted(kinds(probe.poll(0.05))) == [(n - 2, "row_remap_failure", "critical"), (n - 1, "xid", "critical")]


def test_devices_are_matched_by_pci_bus_id_without_uuid():
    topo = catalog.load("dgx1-v100")
    no_uuid = NodeTopology(devices=tuple(replace(d, uuid=None) for d in topo.devices), links=topo.links)
    fake = FakeNVML(no_uuid)
    flipped = NodeTopology(devices=tuple(replace(d, index=7 - d.index) for d in no_uuid.devices))
    probe = NvmlHealthProbe(flipped, nvml=fake)
    fake.inject_xid(2, 94)
    assert kinds(probe.poll(0.05)) == [(5, "xid", "critical")]


def test_mig_xid_names_the_instance():
    probe, fake, topo = nvml_probe("a100-mig")
    part = topo.devices[0].partitions[0]
    fake.inject_xid(0, 31, gi=part.gi_id, ci=0)
    (ev,) = probe.poll(0.05)
    assert (ev.device, ev.partition, ev.severity) == (0, part.key, "warning")
    assert part.key in ev.detail


# ---------------------------------------------------------------- waiting, threads, errors
def test_poll_returns_when_an_event_arrives_from_another_thread():
    probe, fake, _ = nvml_probe("hgx-h100")
    timer = threading.Timer(0.1, fake.inject_xid, args=(4, 79))
    timer.start()
    t0 = time.monotonic()
    events = probe.poll(5.0)
    timer.join()
    assert kinds(events) == [(4, "xid", "critical")]
    assert time.monotonic() - t0 < 2.0


def test_poll_waits_its_timeout_when_nothing_happens():
    probe, _, _ = nvml_probe("hgx-h100")
    t0 = time.monotonic()
    assert probe.poll(0.2) == []
    assert 0.15 <= time.monotonic() - t0 < 2.0


def test_concurrent_injection_loses_nothing():
    probe, fake, _ = nvml_probe("hgx-h100")

    def grew(events):  # "<n> uncorrectable ECC errors since the driver loaded (+k)" -> k
        # an event whose count a previous poll read already (the fake adds, then queues) says no "+k"
        return sum(int(e.detail.rsplit("+", 1)[1].rstrip(")")) for e in events if e.code is not None and "(+" in e.detail)

    def inject():
        for k in range(200):
            fake.inject_ecc(k % 8)

    threads = [threading.Thread(target=inject) for _ in range(4)]
    for t in threads:
        t.start()
    seen = 0
    while any(t.is_alive() for t in threads):
        seen += grew(probe.poll(0.01))
    for t in threads:
        t.join()
    seen += grew(probe.poll(0))
    assert seen == 800


def test_unsupported_counters_are_skipped():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)
    for fn in ("nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetRetiredPagesPendingStatus",
               "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetSupportedEventTypes", "nvmlEventSetCreate"):
        fake.fail(fn, fakenvml.NVML_ERROR_NOT_SUPPORTED)
    probe = NvmlHealthProbe(topo, nvml=fake)
    fake.inject_remap(0, failure=True)
    assert probe.poll(0.01) == []


def test_one_devices_error_is_a_warning_not_a_crash():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.fail("nvmlDeviceGetRemappedRows", fakenvml.NVML_ERROR_UNKNOWN, device=1)
    (ev,) = probe.poll(0)
    assert (ev.device, ev.kind, ev.severity, ev.code) == (1, "probe_error", "warning", fakenvml.NVML_ERROR_UNKNOWN)
    assert "nvmlDeviceGetRemappedRows" in ev.detail
    assert probe.poll(0) == []  # once, until it works again
    fake._faults.clear()
    assert probe.poll(0) == []
    fake.fail("nvmlDeviceGetRemappedRows", fakenvml.NVML_ERROR_UNKNOWN, device=1)
    assert kinds(probe.poll(0)) == [(1, "probe_error", "warning")]


def test_a_broken_library_raises():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.fail("nvmlEventSetWait_v2", fakenvml.NVML_ERROR_UNKNOWN)
    with pytest.raises(BackendError, match="nvmlEventSetWait"):
        probe.poll(0)
    fake._faults.clear()
    fake.fail("nvmlDeviceGetTotalEccErrors", fakenvml.NVML_ERROR_UNINITIALIZED)
    with pytest.raises(BackendError, match="nvmlDeviceGetTotalEccErrors"):
        probe.poll(0)


def test_wait_reporting_a_lost_gpu_is_not_an_error():
    probe, fake, _ = nvml_probe("hgx-h100")
    fake.lose(2)  # the next wait raises GPU_IS_LOST once
    assert kinds(probe.poll(0)) == [(2, "gpu_lost", "critical")]


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "1", None, True])
def test_bad_timeout(bad):
    probe, _, _ = nvml_probe("hgx-h100")
    with pytest.raises(ValueError, match="timeout_s"):
        probe.poll(bad)


def test_close_is_idempotent_and_releases_nvml():
    probe, fake, _ = nvml_probe("hgx-h100")
    assert fake.initialized == 1 and len(fake._sets) == 1
    probe.close()
    probe.close()
    assert fake.initialized == 0 and fake._sets == []
    with pytest.raises(BackendError, match="closed"):
        probe.poll(0)


def test_init_without_driver_is_unavailable():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)
    fake.fail("nvmlInit", fakenvml.NVML_ERROR_DRIVER_NOT_LOADED)
    with pytest.raises(BackendUnavailable, match="no NVIDIA driver"):
        NvmlHealthProbe(topo, nvml=fake)


def test_real_pynvml_without_a_driver_is_unavailable_not_zero_gpus():
    pytest.importorskip("pynvml")
    try:
        probe = probe_for(catalog.load("hgx-h100"))
    except BackendUnavailable as e:
        assert e.hint
    else:  # a machine with an NVIDIA driver: the real probe works (and sees no fault)
        probe.close()


# ---------------------------------------------------------------- HealthEvent and probe_for
def test_health_event_validates():
    ev = HealthEvent(1, "xid", "critical", "Xid 79: GPU has fallen off the bus", 79, 5.0)
    assert ev.critical and ev.to_dict()["code"] == 79 and ev.to_dict()["partition"] is None
    with pytest.raises(ValueError, match="kind"):
        HealthEvent(1, "melted", "critical", "")
    with pytest.raises(ValueError, match="severity"):
        HealthEvent(1, "xid", "fatal", "")
    with pytest.raises(ValueError, match="device"):
        HealthEvent(-1, "xid", "critical", "")


def test_probe_for_simulated_nvidia_runs_over_a_fake():
    topo = catalog.load("dgx-a100")
    probe = probe_for(topo, simulated=True)
    assert isinstance(probe, NvmlHealthProbe) and isinstance(probe, HealthProbe)
    assert isinstance(probe.nvml, FakeNVML)
    probe.nvml.inject_xid(6, 79)
    assert kinds(probe.poll(0.05)) == [(6, "xid", "critical")]


def test_probe_for_given_fake_nvml():
    topo = catalog.load("hgx-h100")
    fake = FakeNVML(topo)
    probe = probe_for(topo, nvml=fake)
    assert probe.nvml is fake


def test_probe_for_amd_and_none():
    probe = probe_for(catalog.load("mi300x-8x"), simulated=True)
    assert isinstance(probe, AmdHealthProbe) and isinstance(probe.amdsmi, FakeAmdSmi)
    assert probe_for(catalog.load("trn1-32xlarge"), simulated=True) is None
    assert probe_for(NodeTopology(), simulated=True) is None


def test_probe_for_mixed_vendors():
    nv, amd = catalog.load("l40s-4x-pcie"), catalog.load("mi300x-8x")
    devices = nv.devices + tuple(replace(d, index=d.index + 4) for d in amd.devices)
    probe = probe_for(NodeTopology(devices=devices), simulated=True)
    assert isinstance(probe, MultiProbe)
    nvp, amdp = probe.probes
    nvp.nvml.inject_xid(1, 79)
    amdp.amdsmi.inject_hang(4 + 2)
    assert sorted(kinds(probe.poll(0.05))) == [(1, "xid", "critical"), (6, "gpu_hang", "critical")]
    probe.close()


def test_the_lead_watchers_injection_names_exist():
    """The node agent injects with ``getattr(fake, f"inject_{kind}")(device, **kw)`` or ``fake.lose(device)``."""
    for fake in (FakeNVML(catalog.load("hgx-h100")), FakeAmdSmi(catalog.load("mi300x-8x"))):
        for name in ("inject_ecc", "inject_remap", "inject_retired_pending", "inject_throttle", "lose"):
            assert callable(getattr(fake, name))
    assert callable(FakeNVML.inject_xid) and callable(FakeNVML.inject_nvlink_down)
    with pytest.raises(ValueError, match="no device 42"):
        FakeNVML(catalog.load("hgx-h100")).inject_xid(42, 79)
    with pytest.raises(ValueError, match="xid"):
        FakeNVML(catalog.load("hgx-h100")).inject_xid(0, 0)


# ---------------------------------------------------------------- AMD
def amd_probe(**kw) -> tuple[AmdHealthProbe, FakeAmdSmi, NodeTopology]:
    topo = catalog.load("mi300x-8x")
    fake = FakeAmdSmi(topo)
    probe = AmdHealthProbe(topo, amdsmi=fake, **kw)
    assert probe.poll(0) == []
    return probe, fake, topo


AMD_CONDITIONS = {
    "hang": (lambda f, d: f.inject_hang(d), [("gpu_hang", "critical")]),
    "reset": (lambda f, d: f.inject_reset(d), [("gpu_reset", "warning")]),
    "vmfault": (lambda f, d: f.inject_event(d, "VMFAULT", "page 0x42"), [("vm_fault", "warning")]),
    "thermal_event": (lambda f, d: f.inject_event(d, "THERMAL_THROTTLE"), [("throttle_thermal", "warning")]),
    "ecc": (lambda f, d: f.inject_ecc(d, 2), [("ecc_uncorrectable", "critical")]),
    "pages_pending": (lambda f, d: f.inject_retired_pending(d), [("retired_pages_pending", "warning")]),
    "pages_failure": (lambda f, d: f.inject_remap(d, pending=False, failure=True), [("retired_pages_failure", "critical")]),
    "thermal": (lambda f, d: f.inject_throttle(d, thermal=True), [("throttle_thermal", "warning")]),
    "power": (lambda f, d: f.inject_throttle(d, thermal=False, power=True), [("throttle_power", "warning")]),
    "lost": (lambda f, d: f.lose(d), [("gpu_lost", "critical")]),
}


@pytest.mark.parametrize("condition", sorted(AMD_CONDITIONS))
def test_amd_condition_reported_once(condition):
    probe, fake, _ = amd_probe()
    inject, expected = AMD_CONDITIONS[condition]
    inject(fake, 5)
    assert [(e.kind, e.severity) for e in probe.poll(0.05) if e.device == 5] == expected
    assert probe.poll(0) == []
    probe.close()
    assert fake.initialized == 0


def test_amd_ecc_increase_and_edge():
    probe, fake, _ = amd_probe()
    fake.inject_ecc(0)
    assert [e.code for e in probe.poll(0)] == [1]
    assert probe.poll(0) == []
    fake.inject_ecc(0, 4)
    assert [e.code for e in probe.poll(0)] == [5]


def test_amd_throttle_falls_back_to_metrics():
    probe, fake, _ = amd_probe()
    fake.fail("amdsmi_get_violation_status", AMDSMI_STATUS_NOT_SUPPORTED)
    fake.inject_throttle(3, thermal=True)
    assert kinds(probe.poll(0)) == [(3, "throttle_hw", "warning")]


def test_amd_event_read_waits_and_wakes():
    probe, fake, _ = amd_probe()
    timer = threading.Timer(0.1, fake.inject_hang, args=(2,))
    timer.start()
    t0 = time.monotonic()
    events = probe.poll(5.0)
    timer.join()
    assert kinds(events) == [(2, "gpu_hang", "critical")] and time.monotonic() - t0 < 2.0


def test_amd_matching_by_uuid():
    topo = catalog.load("mi300x-8x")
    fake = FakeAmdSmi(topo)
    flipped = NodeTopology(devices=tuple(replace(d, index=7 - d.index) for d in topo.devices))
    probe = AmdHealthProbe(flipped, amdsmi=fake)
    fake.inject_hang(0)
    fake.inject_ecc(1)
    assert sorted(kinds(probe.poll(0.05))) == [(6, "ecc_uncorrectable", "critical"), (7, "gpu_hang", "critical")]


def test_amd_device_error_is_a_warning():
    probe, fake, _ = amd_probe()
    fake.fail("amdsmi_get_gpu_total_ecc_count", 43)  # AMDSMI_STATUS_UNEXPECTED_DATA, for every device
    events = probe.poll(0)
    assert {(e.kind, e.code) for e in events} == {("probe_error", 43)} and len(events) == 8
    assert probe.poll(0) == []


def test_amd_init_failure_is_unavailable():
    fake = FakeAmdSmi(catalog.load("mi300x-8x"))
    fake.fail("amdsmi_init", 34)
    with pytest.raises(BackendUnavailable, match="amdsmi_init"):
        AmdHealthProbe(fake.topology, amdsmi=fake)


def test_amd_without_event_reader_still_reads_counters():
    topo = catalog.load("mi300x-8x")
    fake = FakeAmdSmi(topo)
    fake.fail("amdsmi_init_gpu_event_notification", AMDSMI_STATUS_NOT_SUPPORTED)
    probe = AmdHealthProbe(topo, amdsmi=fake)
    assert probe._readers == []
    fake.inject_ecc(7)
    t0 = time.monotonic()
    assert kinds(probe.poll(0.1)) == [(7, "ecc_uncorrectable", "critical")]
    assert time.monotonic() - t0 >= 0.09  # still waits its timeout, so a caller's loop does not spin
