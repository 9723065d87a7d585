"""Memory shares that hold, on a simulated node: a ``num_gpus=0.5`` actor's get_devices() names its cap,
and the MPS variables appear in its worker when an MPS control daemon's pipe directory is there (faked)."""

from __future__ import annotations

import pytest
from raytest_helpers import node_named, wait_idle

MPS_VARS = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


class Probe:
    def look(self):
        import os

        import rayaccel

        a = rayaccel.get_devices()
        c = a.memory_cap
        return {"devices": a.indices, "memory": {d.index: d.memory_bytes for d in a.devices},
                "cap": None if c is None else (c.share, c.bytes_by_device, c.mechanism, c.reason),
                "env": {v: os.environ.get(v) for v in MPS_VARS}, "torch": "torch" in __import__("sys").modules}


def _actor(node_id, gpus, env=None):
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    opts = {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False), "num_gpus": gpus,
            "num_cpus": 0}
    if env:
        opts["runtime_env"] = {"env_vars": env}
    return ray.remote(Probe).options(**opts).remote()


@pytest.mark.timeout(180)
def test_a_half_gpu_actor_names_its_cap_and_gets_mps_limits(cluster, tmp_path):
    import ray

    node = node_named(cluster, "dgx1-v100").node_id
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").touch()  # what a running nvidia-cuda-mps-control leaves there: its control socket
    half_mps = _actor(node, 0.5, {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    half = _actor(node, 0.5, {"CUDA_MPS_PIPE_DIRECTORY": str(tmp_path / "none")})
    whole = _actor(node, 1, {"CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    try:
        a, b, w = ray.get([half_mps.look.remote(), half.look.remote(), whole.look.remote()], timeout=120)
    finally:
        for x in (half_mps, half, whole):
            ray.kill(x)
    (dev,) = a["devices"]
    cap_bytes = a["memory"][dev] // 2
    assert a["cap"] == ("num_gpus=0.5", {dev: cap_bytes}, "mps", None), a
    assert a["env"] == {"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={cap_bytes >> 20}M",
                        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "50"}, a
    share, by_dev, mechanism, reason = b["cap"]
    assert (share, mechanism) == ("num_gpus=0.5", None) and "simulated node" in reason, b
    assert b["env"] == dict.fromkeys(MPS_VARS), b
    assert w["cap"] is None and w["env"] == dict.fromkeys(MPS_VARS), w  # a whole GPU: no cap, no limits
    assert not (a["torch"] or b["torch"] or w["torch"])  # nothing imported torch for the user
    wait_idle(cluster)


@pytest.mark.timeout(180)
def test_a_gpu_memory_share_names_its_bytes(cluster):
    import ray

    import rayaccel

    @rayaccel.remote(gpu_memory="8GiB")
    class Server(Probe):
        pass

    s = Server.remote()
    try:
        got = ray.get(s.look.remote(), timeout=120)
    finally:
        ray.kill(s)
    (dev,) = got["devices"]
    share, by_dev, mechanism, reason = got["cap"]
    assert (share, by_dev, mechanism) == ("gpu_memory=8.0 GiB", {dev: 8 << 30}, None), got
    assert "simulated node" in reason
    wait_idle(cluster)
