"""The NIC next to the GPU (issue 14): a plain ``num_gpus=1`` actor on each GPU of a simulated DGX A100
sees ``UCX_NET_DEVICES`` naming only the RDMA NICs on its GPU's PCIe switch (``near_nics``), and a
value the user set is kept. The hook sets it at the grant from the node table (each device's
``near_nics``), and ``get_devices()`` names the same NICs. UCX is told only of NICs the host lists
in sysfs (a simulated node's NICs are not this machine's, and UCX fails on them): the tests that
expect the variable give the workers a sysfs directory that lists them (``RAYACCEL_IB_DIR``)."""

from __future__ import annotations

import pytest

from rayaccel import catalog
from rayaccel.topology import near_nics

pytestmark = pytest.mark.ray  # a module cluster: the Ray tier, not the unit tier



@pytest.fixture(scope="module")
def a100(sim_cluster):
    """A DGX A100 node (8 GPUs NV12, each GPU pair behind a PCIe switch with two mlx5) in the session cluster."""
    import ray

    if not ray.is_initialized():  # another module's cluster ran in between: reconnect
        sim_cluster.connect(logging_level="ERROR", log_to_driver=False)
    nid = sim_cluster.add_node("dgx-a100")
    try:
        yield nid
    finally:
        sim_cluster.remove_node(nid)


def _probe():
    import ray

    @ray.remote(num_gpus=1, num_cpus=0)
    class Probe:
        def where(self):
            import os

            import rayaccel

            a = rayaccel.get_devices()
            return a.indices, os.environ.get("UCX_NET_DEVICES"), a.nics

    return Probe


def _on(node_id: str):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(node_id, soft=False)


@pytest.fixture(scope="module")
def host_ib(tmp_path_factory):
    """A sysfs ``class/infiniband`` that lists the DGX A100's ten mlx5 devices (as on the real machine)."""
    d = tmp_path_factory.mktemp("infiniband")
    for n in catalog.load("dgx-a100").nics:
        (d / n.name).mkdir()
    return str(d)


def test_each_gpu_sees_only_the_nics_on_its_pcie_switch(cluster, a100, host_ib):
    import ray

    topo = catalog.load("dgx-a100")
    probe = _probe()
    actors = [probe.options(scheduling_strategy=_on(a100), runtime_env={"env_vars": {"RAYACCEL_IB_DIR": host_ib}}).remote()
              for _ in range(8)]
    try:
        seen = ray.get([a.where.remote() for a in actors], timeout=120)
    finally:
        for a in actors:
            ray.kill(a)
    assert sorted(d for devs, _, _ in seen for d in devs) == list(range(8))
    for devs, ucx, nics in seen:
        (dev,) = devs
        pair = dev // 2 * 2
        assert ucx == f"mlx5_{pair}:1,mlx5_{pair + 1}:1" == ",".join(near_nics(topo, [dev])), (dev, ucx)
        assert nics == tuple(ucx.split(","))  # get_devices() names the same NICs


def test_a_value_the_user_set_is_kept(cluster, a100):
    import ray

    probe = _probe()
    a = probe.options(scheduling_strategy=_on(a100),
                      runtime_env={"env_vars": {"UCX_NET_DEVICES": "mlx5_9:1"}}).remote()
    try:
        (dev,), ucx, _ = ray.get(a.where.remote(), timeout=120)
    finally:
        ray.kill(a)
    assert 0 <= dev < 8 and ucx == "mlx5_9:1"


def test_nics_the_host_does_not_have_are_named_but_not_given_to_ucx(cluster, a100, tmp_path):
    import ray

    probe = _probe()
    a = probe.options(scheduling_strategy=_on(a100), runtime_env={"env_vars": {"RAYACCEL_IB_DIR": str(tmp_path)}}).remote()
    try:
        (dev,), ucx, nics = ray.get(a.where.remote(), timeout=120)
    finally:
        ray.kill(a)
    pair = dev // 2 * 2
    assert ucx is None and nics == (f"mlx5_{pair}:1", f"mlx5_{pair + 1}:1")
