"""Topology -> Ray resources and labels (no Ray cluster needed)."""

from __future__ import annotations

import pytest

from rayaccel import catalog
from rayaccel.ray.resources import (MIB, NodeRecord, allocation_resources, node_labels, node_resources)


@pytest.mark.parametrize("name", ["dgx1-v100", "a100-mig", "hgx-h100", "pcie-8gpu-2socket", "mi300x-8x"], ids=str)
def test_node_resources_one_unit_per_device_and_memory_in_mib(name):
    topo = catalog.load(name)
    res = node_resources(topo, "k1")
    assert res["rayaccel_node_k1"] == 1.0
    for d in topo.devices:
        assert res[f"accel_{d.index}"] == 1.0
        assert res[f"accel_mem_{d.index}"] == d.memory_bytes // MIB
    for p in topo.partitions():
        assert res[f"accel_{p.parent}_mig{p.gi_id}"] == 1.0
    assert "GPU" not in res


@pytest.mark.parametrize("name", catalog.names(), ids=str)
def test_labels_are_valid_ray_labels(name):
    from ray._private.label_utils import validate_label_key, validate_label_value, validate_node_labels

    labels = node_labels(catalog.load(name), "abc123", simulated=True)
    validate_node_labels(labels)
    for k, v in labels.items():
        assert validate_label_key(k) is None
        validate_label_value(v)
    assert labels["rayaccel.io/node-key"] == "abc123"


def test_whole_device_request_takes_memory_and_mig_instances():
    topo = catalog.load("a100-mig")
    res = allocation_resources(topo, [0])
    assert res["accel_0"] == 1.0
    assert res["accel_mem_0"] == topo.device(0).memory_bytes // MIB
    assert all(res[f"accel_0_mig{p.gi_id}"] == 1.0 for p in topo.partitions())


def test_mig_request_takes_instance_and_its_memory():
    topo = catalog.load("a100-mig")
    p = next(p for p in topo.partitions() if p.profile == "3g.20gb")
    res = allocation_resources(topo, [], [p])
    assert res == {f"accel_0_mig{p.gi_id}": 1.0, "accel_mem_0": float(p.memory_bytes // MIB)}


def test_shared_request_rounds_memory_up():
    topo = catalog.load("dgx1-v100")
    assert allocation_resources(topo, [], (), {3: MIB + 1}) == {"accel_mem_3": 2.0}


def test_record_roundtrip():
    topo = catalog.load("dgx1-v100")
    rec = NodeRecord("k", topo, True)
    back = NodeRecord.from_json(rec.to_json())
    assert back.topology == topo and back.simulated and back.node_key == "k"


def test_ray_start_command_rejects_num_gpus_and_adds_resources():
    from rayaccel.errors import ClusterError
    from rayaccel.ray.node import ray_start_command

    topo = catalog.load("dgx1-v100")
    cmd = ray_start_command(topo, "kk", ["--head", "--port=6380", "--resources", '{"foo": 2}'], simulated=True)
    assert cmd[:4] == ["ray", "start", "--head", "--port=6380"]
    assert "--num-gpus=0" in cmd
    res = next(a for a in cmd if a.startswith("--resources="))
    assert '"foo": 2' in res and '"accel_7": 1.0' in res
    assert any(a.startswith("--labels=") and "rayaccel.io/node-key=kk" in a for a in cmd)
    with pytest.raises(ClusterError, match="num-gpus"):
        ray_start_command(topo, "kk", ["--num-gpus=8"], simulated=True)
    with pytest.raises(ClusterError, match="manages"):
        ray_start_command(topo, "kk", ["--resources", '{"accel_0": 1}'], simulated=True)


def test_import_does_not_import_ray():
    import subprocess
    import sys

    code = ("import sys; from rayaccel.ray import init, remote, gang, get_devices, shutdown;"
            "import rayaccel.ray.resources, rayaccel.ray.tasks, rayaccel.ray.worker;"
            "print('ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
