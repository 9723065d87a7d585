"""Node allocator: named machines, exact optimality vs brute force, rejections, requests."""

from __future__ import annotations

import itertools
import random

import pytest

from rayaccel.errors import RequestError
from rayaccel.placement import Allocation, NodeState, Rejection, Request, allreduce_bandwidth_gbps, plan
from rayaccel.topology import Device, NodeTopology

from machines import dgx1v, dgx2, hgx_h100, pcie8, random_topology

DGX1V_PAIRS = [{0, 3}, {1, 2}, {4, 7}, {5, 6}]
QUADS = [{0, 1, 2, 3}, {4, 5, 6, 7}]

CASES = [
    ("DGX-1V, 2 GPUs: an NV2 pair", dgx1v, dict(gpus=2), set(), DGX1V_PAIRS),
    ("DGX-1V, 4 GPUs: one quad", dgx1v, dict(gpus=4), set(), QUADS),
    ("DGX-1V, 2 GPUs from free {0,1,4}: NV2 across sockets", dgx1v, dict(gpus=2), {2, 3, 5, 6, 7}, [{0, 4}]),
    ("DGX-1V, 2 GPUs, 4 busy: 7's NV2 partner is gone, another NV2 pair", dgx1v, dict(gpus=2), {4}, [{0, 3}, {1, 2}, {5, 6}]),
    ("8x PCIe two sockets, 4 GPUs: one socket", pcie8, dict(gpus=4), set(), QUADS),
    ("8x PCIe two sockets, 2 GPUs: a PIX pair", pcie8, dict(gpus=2), set(), [{0, 1}, {2, 3}, {4, 5}, {6, 7}]),
    ("8x PCIe two sockets, 1 GPU with 0 busy: 0's PIX partner", pcie8, dict(gpus=1), {0}, [{1}]),
    ("8x PCIe two sockets, 2 GPUs with 0,2 busy: a PIX pair beats PXB 1-3", pcie8, dict(gpus=2), {0, 2}, [{4, 5}, {6, 7}]),
    ("HGX H100, 4 GPUs: one NUMA node", hgx_h100, dict(gpus=4), set(), QUADS),
    ("HGX H100, 4 GPUs near a NIC, 0-2 busy: NUMA 1", hgx_h100, dict(gpus=4, nic=True), {0, 1, 2}, [{4, 5, 6, 7}]),
    ("DGX-2, 8 GPUs: one NUMA node", dgx2, dict(gpus=8), set(), [set(range(8)), set(range(8, 16))]),
    ("DGX-1V, 3 GPUs, nvlink, same NUMA", dgx1v, dict(gpus=3, interconnect="nvlink", same_numa=True), set(),
     [s for s in map(set, itertools.combinations(range(8), 3)) if s <= {0, 1, 2, 3} or s <= {4, 5, 6, 7}]),
]


@pytest.mark.parametrize("name,build,fields,busy,expected", CASES, ids=[c[0] for c in CASES])
def test_named_machines(name, build, fields, busy, expected):
    a = plan(build(), busy=busy, **fields)
    assert isinstance(a, Allocation), a.explain()
    assert set(a.devices) in expected, a.explain()
    assert not set(a.devices) & busy


def test_kwargs_and_request_forms_agree():
    t = dgx1v()
    assert plan(t, gpus=4, busy={0, 3}).devices == plan(t, Request(gpus=4), busy={0, 3}).devices
    assert plan(NodeState(t, busy=frozenset({0, 3})), gpus=4).devices == plan(t, gpus=4, busy={0, 3}).devices


def test_ring_order_puts_best_links_next_to_each_other():
    t = dgx1v()
    a = plan(t, gpus=4)
    ring = list(a.devices)
    bws = [t.bandwidth_gbps(ring[i], ring[(i + 1) % 4]) for i in range(4)]
    assert min(bws) == 25.0 and sorted(bws) == [25.0, 50.0, 50.0, 50.0]
    assert a.score.allreduce_bandwidth_gbps == allreduce_bandwidth_gbps(t, a.devices) == 25.0


def test_explain_names_score_and_runners_up():
    a = plan(dgx1v(), gpus=2)
    text = a.explain()
    assert "weakest link NV2" in text and "runner-up" in text and "criterion 4" in text


# ------------------------------------------------------------------ rejections
REJECTIONS = [
    ("only 3 devices free", dgx1v, dict(gpus=4), {0, 1, 2, 3, 4}, "only 3 devices free"),
    ("more than the node has", pcie8, dict(gpus=9), set(), "the node has 8 devices, 9 asked"),
    ("nvlink impossible on DGX-1V with 1,5 busy", dgx1v, dict(gpus=4, interconnect="nvlink"), {1, 5},
     "no 4 free devices are all NVLink-connected: the best has SYS between"),
    ("nvlink on a PCIe box", pcie8, dict(gpus=2, interconnect="nvlink"), set(),
     "no 2 free devices are all NVLink-connected: the best has PIX between 0 and 1"),
    ("same NUMA with 0,1,4 busy", hgx_h100, dict(gpus=4, same_numa=True), {0, 1, 4}, "no NUMA node has 4 free devices"),
    ("NIC on a box whose NIC is PHB/SYS", pcie8, dict(gpus=1, nic=True), set(), "no free device has a GPUDirect-capable"),
    ("memory too small", pcie8, dict(gpus=1, gpu_memory="64GiB"), set(), "device 0 has 48.0 GiB, 64.0 GiB asked"),
]


@pytest.mark.parametrize("name,build,fields,busy,text", REJECTIONS, ids=[r[0] for r in REJECTIONS])
def test_rejections_have_human_reasons(name, build, fields, busy, text):
    r = plan(build(), busy=busy, **fields)
    assert isinstance(r, Rejection) and not r
    assert any(text in reason for reason in r.reasons), r.reasons
    assert text in r.explain()


def test_failed_devices_are_never_chosen():
    t = dgx1v()
    devs = tuple(Device(d.index, model=d.model, memory_bytes=d.memory_bytes, numa_node=d.numa_node,
                        health="failed" if d.index == 3 else "ok") for d in t.devices)
    t2 = NodeTopology(devs, t.links, t.nics, name="dgx1v-3-failed")
    for k in range(1, 8):
        a = plan(t2, gpus=k)
        assert 3 not in a.devices
    r = plan(t2, gpus=8)
    assert any("failed: 3" in x for x in r.reasons)


@pytest.mark.parametrize("fields,field", [
    (dict(gpus=-1), "gpus"), (dict(gpus=0), "gpus"), (dict(gpus="2"), "gpus"), (dict(interconnect="ib"), "interconnect"),
    (dict(gpu_memory="lots"), "gpu_memory"), (dict(mig="3g.40gb", gpus=2), "gpus"), (dict(exclusive=False), "gpu_memory"),
    (dict(gpus=2, gpu_memory="1GiB", exclusive=False), "gpus"), (dict(same_numa="yes"), "same_numa"),
    (dict(mig="1g.10gb", interconnect="nvlink"), "interconnect"), (dict(colour="red"), "colour"),
], ids=lambda x: str(x))
def test_invalid_requests_name_the_field(fields, field):
    with pytest.raises(RequestError) as e:
        plan(pcie8(), **fields)
    assert e.value.field == field


@pytest.mark.parametrize("machine", ["dgx1-v100", "mi300x-8x", "trn1-32xlarge"], ids=["NVLink", "xGMI", "NeuronLink"])
def test_direct_is_the_general_name_and_nvlink_its_synonym(machine):
    from rayaccel import catalog

    topo = catalog.load(machine)
    for k, busy in ((2, set()), (4, {1}), (3, {0, 5})):
        a = plan(topo, gpus=k, interconnect="direct", busy=busy)
        b = plan(topo, gpus=k, interconnect="nvlink", busy=busy)
        assert bool(a) == bool(b)
        if a:
            assert a.devices == b.devices and a.why == b.why
            assert all(topo.link(x, y).direct for x in a.devices for y in a.devices if x < y)
        else:
            assert a.reasons == b.reasons
    r = Request(gpus=2, interconnect="direct")
    assert r.direct and Request(gpus=2, interconnect="nvlink").direct and not Request(gpus=2).direct
    assert r.describe() == "2 GPUs, direct"
    with pytest.raises(RequestError) as e:
        Request(gpus=2, interconnect="xgmi")
    assert e.value.field == "interconnect" and "any, direct, nvlink" in str(e.value)


def test_unknown_busy_device_is_a_clear_error():
    with pytest.raises(RequestError, match="no device 9"):
        plan(pcie8(), gpus=1, busy={9})


# --------------------------------------------------------- exact optimality
def _brute(topo: NodeTopology, free: list[int], k: int):
    best = None
    for s in itertools.combinations(free, k):
        pairs = list(itertools.combinations(s, 2))
        weakest = min((topo.rank(a, b) for a, b in pairs), default=(99, 0.0))
        total = round(sum(topo.bandwidth_gbps(a, b) for a, b in pairs), 3)
        key = (weakest, total)
        best = key if best is None or key > best else best
    return best


@pytest.mark.parametrize("build", [dgx1v, pcie8, hgx_h100], ids=["DGX-1V", "8x PCIe", "HGX H100"])
def test_exactly_optimal_on_criteria_1_2_vs_brute_force(build):
    topo = build()
    rng = random.Random(1)
    for trial in range(25):
        busy = set(rng.sample(range(8), rng.randint(0, 6))) if trial else set()
        free = [i for i in range(8) if i not in busy]
        for k in range(1, len(free) + 1):
            a = plan(topo, gpus=k, busy=busy)
            assert a.score.key()[:2] == _brute(topo, free, k), (busy, k, a.explain())


def test_exactly_optimal_on_random_12_device_nodes():
    rng = random.Random(7)
    for _ in range(6):
        topo = random_topology(rng, 12)
        ok = [d.index for d in topo.devices if d.health != "failed"]
        busy = set(rng.sample(ok, rng.randint(0, 4)))
        free = [i for i in ok if i not in busy]
        for k in (2, 3, 5, 7):
            if k > len(free):
                continue
            a = plan(topo, gpus=k, busy=busy)
            assert a.score.key()[:2] == _brute(topo, free, k)


def test_nvl72_is_exact_by_symmetry():
    from machines import uniform

    topo = uniform(72, 18, "nvl72", "GB200", 186, 2)
    a = plan(topo, gpus=8, busy={0, 5, 17})
    assert a.score.optimal and a.score.weakest == "NV18"
    assert a.score.numa_nodes == 4  # 4 whole NUMA pairs


def test_large_uniform_domains_are_exact_vs_brute_force():
    """Above 16 devices an all-to-all NVLink domain takes the uniform search: same (weakest, bandwidth, NUMA)."""
    from rayaccel.placement._index import index_of
    from machines import uniform

    rng = random.Random(4)
    for n, split in ((18, 2), (20, 3), (24, 4)):
        topo = uniform(n, 18, f"uniform-{n}", "GB200", 186, split)
        ix = index_of(topo)
        for _ in range(6):
            busy = set(rng.sample(range(n), rng.randint(0, n // 2)))
            free = [i for i in range(n) if i not in busy]
            for k in (1, 2, 3, 5):
                required = tuple(rng.sample(free, 1)) if k > 1 and rng.random() < 0.5 else ()
                a = plan(topo, gpus=k, busy=busy, required=required)
                want = max((-len({ix.numa[ix.pos[d]] for d in s}), s) for s in itertools.combinations(free, k)
                           if set(required) <= set(s))
                assert a.score.optimal and a.score.weakest == ("NV18" if k > 1 else None), (busy, k)
                assert -a.score.numa_nodes == want[0] and set(required) <= set(a.devices), (busy, k, required)
