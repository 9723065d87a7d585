"""Dynamic MIG on a live cluster (issue 20, Deliver item 2): the catalog's ``a100-mig`` machine with
``dynamic_mig=[0]``.

Its GPU 0 holds two ``1g.5gb`` instances (slices 0 and 1) and a ``3g.20gb`` (slice 4). The node advertises
every instance the GPU could hold (``mig_1g.5gb`` = 7, ...) and its agent holds the ones that do not exist in
Ray's ledger, so three plain actors with ``resources={"mig_1g.5gb": 1}`` get the two that exist and the third
waits until the agent makes one more (on slices 2-3: the ``3g.20gb`` has no work but is not in the way) --
then all three run at once on three distinct MIG UUIDs, and the step is in the snapshot (``status``) and the
node's decision log. One module-scoped cluster.
"""

from __future__ import annotations

import json
import os

import pytest
from raytest_helpers import wait_for

pytestmark = pytest.mark.ray

NODE = "a100-mig"


@pytest.fixture(scope="module")
def a100(ray_env):
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():  # the session cluster's driver connection: this module brings its own cluster
        ray.shutdown()
    c = SimulatedCluster([NODE], num_cpus=4, dynamic_mig=[0], logging_level="ERROR", log_to_driver=False)
    try:
        yield c
    finally:
        c.shutdown()


def _node(c):
    from rayaccel.ray.driver.status import cluster_status

    return next(n for n in cluster_status()["nodes"] if n["node_key"] == c.nodes[0].node_key)


def test_three_1g_actors_run_at_once_on_three_distinct_instances(a100):
    import ray

    node = a100.nodes[0]
    before = {p.uuid for p in node.topology.partitions()}
    # Ray's ledger: every possible 1g.5gb instance is advertised, only the existing ones are free
    assert ray.cluster_resources().get("mig_1g.5gb") == 7.0
    wait_for(lambda: ray.available_resources().get("mig_1g.5gb") == 2.0, 30, "the non-existing 1g.5gb units held")

    @ray.remote(num_cpus=0, resources={"mig_1g.5gb": 1})
    class Infer:
        def where(self):
            return os.environ.get("CUDA_VISIBLE_DEVICES"), [str(i) for i in ray.get_gpu_ids()]

    actors = [Infer.remote() for _ in range(3)]
    try:
        got = ray.get([a.where.remote() for a in actors], timeout=90)
        cvds = [cvd for cvd, _ in got]
        assert all(cvd and cvd.startswith("MIG-") for cvd in cvds), got
        assert len(set(cvds)) == 3, got  # three distinct instances, all at once (the actors are alive together)
        assert all(ids == [cvd] for cvd, ids in got), got
        new = set(cvds) - before
        assert len(new) == 1, (cvds, before)  # the two that existed, and one made for the third actor
        row = _node(a100)
        dm = row["dynamic_mig"]
        assert row["devices"][0]["state"] == "mig" and len(row["devices"][0]["mig_held"]) == 3, row["devices"]
        creates = [e for e in dm["events"] if e["action"] == "create" and e["ok"]]
        assert [e["uuid"] for e in creates] == list(new), dm
        assert creates[0]["profile"] == "1g.5gb" and creates[0]["start"] in (2, 3), creates
        assert not [e for e in dm["events"] if e["action"] == "destroy"], dm  # the idle 3g.20gb was not in the way
        assert set(dm["instances"].values()) == before | new
        with open(os.path.join(str(node.directory), "decisions.log"), "rb") as f:
            steps = [json.loads(line) for line in f if line.startswith(b"{")]
        assert any(s["dynmig"]["uuid"] in new for s in steps), steps
    finally:
        for a in actors:
            ray.kill(a)


def test_a_placement_group_waiting_for_an_instance_gets_one_made(a100):
    """A placement group's bundle asking for a ``mig_1g.5gb`` that no free instance serves is waiting work too."""
    import ray
    from ray.util import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    @ray.remote(num_cpus=0, resources={"mig_1g.5gb": 1})
    class Infer:
        def where(self):
            return os.environ.get("CUDA_VISIBLE_DEVICES")

    first = [Infer.remote() for _ in range(3)]  # every 1g.5gb instance the GPU has by now is taken
    pg = None
    try:
        assert len(set(ray.get([a.where.remote() for a in first], timeout=90))) == 3
        pg = placement_group([{"mig_1g.5gb": 1}])
        assert pg.wait(60), "the group's bundle never got an instance"
        inside = Infer.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)).remote()
        mine = ray.get(inside.where.remote(), timeout=60)
        others = set(ray.get([a.where.remote() for a in first], timeout=30))
        assert mine.startswith("MIG-") and mine not in others, (mine, others)
        ray.kill(inside)
    finally:
        for a in first:
            ray.kill(a)
        if pg is not None:
            remove_placement_group(pg)


def test_a_gpu_list_naming_a_gpu_not_in_mig_mode_is_one_error_line(ray_env):
    from rayaccel.errors import ClusterError
    from rayaccel.ray.driver.cluster import managed_node_args

    with pytest.raises(ClusterError, match="not in MIG mode"):
        managed_node_args("dgx1-v100", {"num_cpus": 1}, dynamic_mig="0")
