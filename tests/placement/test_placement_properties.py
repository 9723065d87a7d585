"""Property tests over random topologies, busy sets and requests."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rayaccel.errors import RequestError
from rayaccel.placement import Allocation, NodeState, Rejection, Request, place, plan
from rayaccel.topology import Partition

from machines import GiB, mig_gpu, random_topology

requests = st.one_of(
    st.builds(Request, gpus=st.integers(1, 11), interconnect=st.sampled_from(["any", "direct", "nvlink"]),
              same_numa=st.booleans(), nic=st.booleans(),
              gpu_memory=st.one_of(st.none(), st.sampled_from(["8GiB", "30GiB", "64GiB"]))),
    st.builds(Request, gpus=st.just(0), exclusive=st.just(False), gpu_memory=st.sampled_from(["1GiB", "12GiB", "40GiB"])),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10**6), n=st.integers(1, 10), req=requests, busy_frac=st.floats(0, 1))
def test_answer_is_a_valid_allocation_or_a_rejection(seed, n, req, busy_frac):
    rng = random.Random(seed)
    topo = random_topology(rng, n)
    busy = frozenset(i for i in range(n) if rng.random() < busy_frac * 0.7)
    mem = {i: rng.randint(0, 20) * GiB for i in range(n) if i not in busy and rng.random() < 0.3}
    state = NodeState(topo, busy=busy, memory_used=mem)
    a = plan(state, req)
    if isinstance(a, Rejection):
        assert a.reasons and all(isinstance(r, str) and r for r in a.reasons)
        return
    assert isinstance(a, Allocation)
    assert len(a.devices) == len(set(a.devices))
    devs = {d.index: d for d in topo.devices}
    for d in a.devices:
        assert devs[d].health != "failed"
        assert d not in busy
    if req.kind == "devices":
        assert len(a.devices) == req.gpus
        assert not set(a.devices) & {d for d, b in mem.items() if b > 0}  # a 0-byte reservation holds nothing
        if req.interconnect != "any":  # "direct" and its synonym "nvlink"
            assert all(topo.link(x, y).direct for x in a.devices for y in a.devices if x < y)
        if req.same_numa:
            assert len({devs[d].numa_node for d in a.devices}) == 1
        if req.gpu_memory:
            assert all(devs[d].memory_bytes >= req.gpu_memory for d in a.devices)
    else:
        (d,) = a.devices
        assert mem.get(d, 0) + a.memory_bytes[d] <= devs[d].memory_bytes  # never oversubscribed


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10**6), jobs=st.lists(st.integers(1, 4), min_size=1, max_size=12))
def test_a_stream_of_jobs_never_double_books(seed, jobs):
    rng = random.Random(seed)
    nodes = [NodeState(random_topology(rng, rng.randint(2, 8)), node_id=f"n{i}") for i in range(3)]
    held: dict[str, set] = {n.node_id: set() for n in nodes}
    for k in jobs:
        a = place(nodes, Request(gpus=k))
        if not a:
            continue
        assert not held[a.node] & set(a.devices)
        held[a.node] |= set(a.devices)
        nodes = [n.with_busy(a.devices) if n.node_id == a.node else n for n in nodes]


@settings(max_examples=60, deadline=None)
@given(fields=st.dictionaries(st.sampled_from(["gpus", "mig", "gpu_memory", "interconnect", "exclusive", "same_numa"]),
                              st.one_of(st.integers(-2, 3), st.text(max_size=4), st.booleans(), st.none())))
def test_only_request_errors_escape(fields):
    topo = random_topology(random.Random(0), 4)
    try:
        r = plan(topo, **fields)
    except RequestError:
        return
    assert isinstance(r, (Allocation, Rejection))


def test_mig_instances_never_given_twice():
    parts = tuple(Partition(0, "1g.10gb", gi_id=i, start=i, size=1) for i in range(7))
    state = NodeState(__import__("rayaccel").NodeTopology((mig_gpu(0, parts),)))
    taken = set()
    for _ in range(8):
        a = plan(state, mig="1g.10gb")
        if not a:
            break
        key = a.partitions[0].key
        assert key not in taken
        taken.add(key)
        state = NodeState(state.topology, busy_partitions=state.busy_partitions | {key})
    assert len(taken) == 7
