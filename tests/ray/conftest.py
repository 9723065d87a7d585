"""Shared simulated Ray clusters for the Ray-layer tests.

* ``sim_cluster`` (session): a 3-node SimulatedCluster -- DGX-1 V100 (head), an A100 in
  MIG mode, an 8-GPU two-socket PCIe box -- for multi-node behaviour.
* ``dgx1`` (module, in test_unchanged_ray_code.py): an embedded ``rayaccel.init(topology="dgx1-v100")``.

Ray runs without token auth, in a private temp dir, with rayaccel's node state in a
private directory too, and is always shut down. Only one driver connection exists
at a time: a fixture that needs the session cluster reconnects to it.
"""

from __future__ import annotations

import os
import shutil
import tempfile

import pytest
from raytest_helpers import wait_idle

NODES = ("dgx1-v100", "a100-mig", "pcie-8gpu-2socket")


@pytest.fixture(scope="session")
def ray_env():
    """RAY_TMPDIR, rayaccel's state dir and PYTHONPATH (workers import the test modules) for the session."""
    saved = {k: os.environ.get(k) for k in ("RAY_TMPDIR", "RAYACCEL_STATE_DIR", "PYTHONPATH", "RAY_AUTH_MODE",
                                            "RAY_USAGE_STATS_ENABLED")}
    tmp = tempfile.mkdtemp(prefix="rt-", dir="/tmp")
    state = tempfile.mkdtemp(prefix="ra-state-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
    os.chmod(state, 0o700)
    here = os.path.dirname(os.path.abspath(__file__))
    os.environ.update(RAY_AUTH_MODE="disabled", RAY_USAGE_STATS_ENABLED="0", RAY_TMPDIR=tmp,
                      RAYACCEL_STATE_DIR=state,
                      PYTHONPATH=os.pathsep.join(p for p in (here, saved["PYTHONPATH"]) if p))
    try:
        yield {"tmp": tmp, "state": state}
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(state, ignore_errors=True)


@pytest.fixture(scope="session")
def sim_cluster(ray_env):
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    c = SimulatedCluster(list(NODES), num_cpus=4, metrics_export_port=port, logging_level="ERROR",
                         log_to_driver=False)
    c.metrics_port = port
    try:
        yield c
    finally:
        c.shutdown()


@pytest.fixture
def cluster(sim_cluster):
    """The session cluster, checked idle before and after the test (nothing leaked)."""
    import ray

    if not ray.is_initialized():  # another module's cluster ran in between: reconnect
        sim_cluster.connect(logging_level="ERROR", log_to_driver=False)
    wait_idle(sim_cluster)
    yield sim_cluster
    wait_idle(sim_cluster)
