"""Shared simulated Ray clusters for the Ray-layer tests.

One 3-node SimulatedCluster (DGX-1 V100, A100 with MIG, 8-GPU two-socket PCIe)
serves the whole session: starting one costs ~2 s plus ~2 s per node. Ray runs
without token auth, in a private temp dir, and is always shut down.
"""

from __future__ import annotations

import os
import tempfile

import pytest
from raytest_helpers import wait_idle

NODES = ("dgx1-v100", "a100-mig", "pcie-8gpu-2socket")


@pytest.fixture(scope="session")
def sim_cluster():
    os.environ["RAY_AUTH_MODE"] = "disabled"
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    tmp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    here = os.path.dirname(os.path.abspath(__file__))
    # workers import the test modules (functions are pickled by reference)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    from rayaccel.ray.cluster import SimulatedCluster

    c = SimulatedCluster(list(NODES), num_cpus=4, logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        import shutil

        shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture
def cluster(sim_cluster):
    """The session cluster, checked idle before and after the test (nothing leaked)."""
    import ray

    if not ray.is_initialized():  # another module's fixture ran its own Ray in between: reconnect
        from rayaccel.ray import context

        ray.init(address=sim_cluster.address, logging_level="ERROR", log_to_driver=False)
        context.reset()
    wait_idle(sim_cluster)
    yield sim_cluster
    wait_idle(sim_cluster)
