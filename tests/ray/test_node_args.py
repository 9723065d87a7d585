"""The caller's ``resources=`` and ``labels=`` on a rayaccel node: kept beside rayaccel's, or refused in one line.

Ray's own tests start nodes with ``ray.init(num_gpus=1, resources={"test_resource": 1})`` and
``Cluster.add_node(labels={"gpu_type": "A100"})``; a rayaccel node keeps both (``rayaccel.init``,
``managed_node_args`` for ``Cluster.add_node``). What it refuses, before anything starts: ``GPU`` as a
custom resource (give ``num_gpus=``), ``mig_*`` resources (the MIG layout's), a resource rayaccel advertises
given another value, ``rayaccel.io/`` labels (rayaccel's own).
"""

from __future__ import annotations

import pytest

from rayaccel.errors import ClusterError
from rayaccel.ray.driver.init import check_caller_args, with_caller_resources


@pytest.mark.parametrize("resources,labels,words", [
    ({"GPU": 2}, None, "give num_gpus="),
    ({"mig_1g.10gb": 1}, None, "MIG layout"),
    ({"x": -1}, None, "number >= 0"),
    ({"x": True}, None, "number >= 0"),
    ([("x", 1)], None, "dict of resource name"),
    (None, {"rayaccel.io/node-key": "abc"}, "rayaccel's own label"),
    (None, {"team": 3}, "expected strings"),
    (None, "team=a", "dict of label name"),
], ids=["gpu", "mig", "negative", "bool", "not-a-dict", "rayaccel-label", "label-value", "label-text"])
def test_bad_caller_args_are_one_error_line(resources, labels, words):
    with pytest.raises(ClusterError, match=words) as e:
        check_caller_args(resources, labels)
    assert "\n" not in str(e.value)


def test_a_resource_rayaccel_advertises_may_be_repeated_but_not_changed():
    ours = {"accelerator_type:V100": 1.0}
    assert with_caller_resources(ours, {"accelerator_type:V100": 1, "x": 2}) == {"accelerator_type:V100": 1,
                                                                                 "x": 2}
    with pytest.raises(ClusterError, match="advertises 1 from the node's devices"):
        with_caller_resources(ours, {"accelerator_type:V100": 3})


def test_managed_node_args_keep_the_callers_and_set_rayaccels(ray_env):
    from rayaccel.contract import NODE_KEY_LABEL
    from rayaccel.ray.driver.cluster import managed_node_args
    from rayaccel.ray.node import nodedir

    args, record, d = managed_node_args("dgx1-v100", {"num_cpus": 1, "num_gpus": 2, "resources": {"worker1": 1},
                                                      "labels": {"ray.io/market-type": "spot"},
                                                      "env_vars": {"MY_VAR": "1"}})
    try:
        assert args["num_cpus"] == 1 and args["num_gpus"] == 2
        assert args["resources"]["worker1"] == 1 and args["resources"]["accelerator_type:V100"] == 1
        assert args["labels"]["ray.io/market-type"] == "spot" and args["labels"][NODE_KEY_LABEL] == record.node_key
        assert args["env_vars"]["MY_VAR"] == "1" and args["env_vars"]["RAYACCEL_NODE_DIR"] == str(d)
        assert record.topology.indices == (0, 1) and record.given_by == "--num-gpus=2"
    finally:
        nodedir.remove(d)
    with pytest.raises(ClusterError, match="rayaccel's own label"):
        managed_node_args("dgx1-v100", {"labels": {"rayaccel.io/simulated": "false"}})


@pytest.mark.ray
def test_init_keeps_the_callers_resources_and_labels(ray_env):
    import ray

    import rayaccel

    if ray.is_initialized():
        ray.shutdown()  # the session's cluster connection (an earlier module's); the cluster fixture connects again
    with pytest.raises(ClusterError, match="give num_gpus="):
        rayaccel.init(topology="dgx1-v100", resources={"GPU": 8})
    assert not ray.is_initialized()  # nothing half-started
    rayaccel.init(topology="dgx1-v100", num_cpus=1, num_gpus=2, resources={"test_resource": 1},
                  labels={"gpu_type": "V100"}, logging_level="ERROR", log_to_driver=False)
    try:
        assert ray.cluster_resources()["test_resource"] == 1 and ray.cluster_resources()["GPU"] == 2
        labels = ray.get_runtime_context().get_node_labels()
        assert labels["gpu_type"] == "V100" and labels["rayaccel.io/topology"] == "dgx1-v100"

        @ray.remote(num_gpus=1, resources={"test_resource": 1})
        def f():
            return ray.get_gpu_ids()

        assert len(ray.get(f.remote())) == 1
    finally:
        rayaccel.shutdown()
