"""Regression tests for bugs found in the pre-release review of the Ray layer."""

from __future__ import annotations

import asyncio
import glob
import os
import time
from collections import deque

import pytest

import rayaccel.ray as rr
from rayaccel.errors import ClusterError, RayaccelError, RequestError, Unsatisfiable
from raytest_helpers import wait_idle


def _pid():
    return os.getpid()


class _Plain:
    def ping(self):
        return 1


# ----------------------------------------------------------------- max_calls
def test_max_calls_reaches_ray_remote_not_options(cluster):
    """Ray rejects max_calls in .options(); pin() sets it on real hardware and users may pass it."""
    import ray

    task = rr.remote(gpus=8, num_cpus=0, max_calls=1)(_pid)
    refs = [task.remote() for _ in range(3)]  # two 8-GPU nodes: the third goes through the dispatcher
    pids = ray.get(refs, timeout=120)
    assert len(pids) == 3 and all(isinstance(p, int) for p in pids)


def test_real_hardware_pin_sets_max_calls_and_submitter_accepts_it():
    import ray

    from rayaccel import load_topology, plan
    from rayaccel.ray.resources import NodeRecord
    from rayaccel.ray.tasks import build_request, pin, submitter
    from rayaccel.ray.view import NodeView

    topo = load_topology("dgx1-v100")
    node = NodeView("ab" * 28, "k", NodeRecord("k", topo, simulated=False), {})
    req = build_request({"gpus": 2})
    spec, opts, res = pin(req, plan(topo, req), node, "t", {}, task=True)
    assert opts["max_calls"] == 1
    submitter(ray.remote(_pid), opts)  # used to raise ValueError: max_calls not supported in .options()


# ------------------------------------------------------- decoration-time checks
@pytest.mark.parametrize("kind, opts, field", [
    ("task", {"gpu": 2}, "gpu"),
    ("task", {"num_cpus": -1}, "num_cpus"),
    ("task", {"resources": ["x"]}, "resources"),
    ("actor", {"max_calls": 1}, "max_calls"),
], ids=["typo-gpu", "negative-num-cpus", "resources-not-a-dict", "max-calls-on-actor"])
def test_bad_ray_options_raise_request_error_naming_them(kind, opts, field):
    with pytest.raises(RequestError, match=field) as e:
        rr.remote(**opts)(_pid if kind == "task" else _Plain)
    assert e.value.field == field


def test_gang_rejects_bad_arguments_by_name():
    with pytest.raises(RequestError, match="timeout"):
        rr.gang(2, 1, timeout=5)  # typo of timeout_s: used to be a bare TypeError from Request
    with pytest.raises(RequestError, match="timeout_s"):
        rr.gang(2, 1, timeout_s=0)
    with pytest.raises(RequestError, match="backend"):
        rr.gang(2, 1, backend="mpi")


def test_init_rejects_unknown_keyword_by_name():
    from rayaccel.ray.node import _check_init_kwargs

    with pytest.raises(ClusterError, match="num_cpu"):
        _check_init_kwargs({"num_cpu": 2})
    _check_init_kwargs({"num_cpus": 2, "_system_config": {}, "object_spilling_directory": "/tmp"})


def test_simulated_cluster_with_a_bad_topology_leaves_no_temp_dir(monkeypatch):
    from rayaccel.ray.cluster import SimulatedCluster

    monkeypatch.delenv("RAY_TMPDIR", raising=False)
    before = set(glob.glob("/tmp/rayaccel-*"))
    with pytest.raises(RayaccelError):
        SimulatedCluster(["no-such-machine-xyz"], connect=False)
    assert "RAY_TMPDIR" not in os.environ
    assert set(glob.glob("/tmp/rayaccel-*")) <= before


# ------------------------------------------------------------------- gangs
def test_gang_frees_its_placement_group_when_a_worker_cannot_be_created(cluster, monkeypatch):
    from ray.util import placement_group_table

    from rayaccel.ray import gangs

    real = gangs._worker_cls()

    class Failing:
        def options(self, **kw):
            inner = real.options(**kw)

            class Sub:
                @staticmethod
                def remote(spec, rank):
                    if rank == 1:
                        raise RuntimeError("worker 1 cannot be created")
                    return inner.remote(spec, rank)

            return Sub()

    monkeypatch.setattr(gangs, "_worker_cls", lambda: Failing())
    with pytest.raises(RuntimeError, match="worker 1"):
        rr.gang(workers=2, gpus_per_worker=1)
    live = [pg for pg in placement_group_table().values() if pg["state"] not in ("REMOVED",)]
    assert live == [], live
    wait_idle(cluster)


def test_gang_submit_after_shutdown_is_a_clear_error(cluster):
    g = rr.gang(workers=1, gpus_per_worker=1)
    g.shutdown()
    with pytest.raises(ClusterError, match="shut down"):
        g.submit(_pid)


# ------------------------------------------------------------------ claims
def test_back_dated_claims_do_not_hide_younger_ones():
    """The dispatcher adds other drivers' claims with their age; reading must not stop at an old one."""
    from rayaccel.ray.view import Claims

    c = Claims(grace_s=1.0)
    c.add("n", {"accel_0": 1.0})
    c.add("n", {"accel_1": 1.0}, age_s=0.95)  # forwarded hint, inserted later but older
    time.sleep(0.1)
    recent = c.recent()
    assert recent["n"].get("accel_0") == 1.0  # used to be missing: the loop broke at accel_1
    assert "accel_1" not in recent["n"]
    assert [y[2] for y in c.young()] == [{"accel_0": 1.0}]


def test_untracked_claims_do_not_pile_up_without_depth_reads():
    from rayaccel.ray.view import Claims

    c = Claims(grace_s=1.0)
    for i in range(100):
        c.add("n", {f"accel_{i % 8}": 1.0}, age_s=5.0)  # already expired (like old hints)
    c.add("n", {"accel_0": 1.0})
    assert len(c._entries) <= 2


# -------------------------------------------------------------- dispatcher
def test_dispatcher_loop_survives_a_failing_pass():
    """A GCS hiccup in one pass used to kill the loop and leave queued calls hanging forever."""
    from rayaccel.placement import Request
    from rayaccel.ray.dispatch import DispatcherCore, _Item

    core = DispatcherCore(poll_s=0.01)
    calls = []

    class FlakyView:
        def nodes(self, fresh=False):
            calls.append(1)
            if len(calls) == 1:
                raise RuntimeError("GCS hiccup")
            return []  # no nodes: the queued request is answered Unsatisfiable

    core.view = FlakyView()

    async def main():
        core.kick = asyncio.Event()
        item = _Item(1, Request(gpus=1), "t", None, {}, (), {}, asyncio.get_running_loop().create_future())
        core.queue[item.request] = deque([item])
        await asyncio.wait_for(core._loop(), 30)
        return item

    try:
        item = asyncio.run(main())
    finally:
        core.pool.shutdown()
    assert isinstance(item.future.exception(), Unsatisfiable)
    assert core.stats["pass_errors"] == 1 and len(calls) == 2


def test_completions_from_before_reset_do_not_skew_the_outstanding_count():
    from rayaccel.ray import dispatch

    gen = dispatch._GEN
    dispatch.reset()
    dispatch._done(None, gen)  # a call submitted before the reset completes afterwards
    assert dispatch._OUTSTANDING == 0 and not dispatch.queued_here()
