"""No device is ever held twice, and devices come back after failures.

Several drivers at once -- this one (``rayaccel.remote`` work and a Ray Train run) and
two separate plain-Ray driver processes (``.options(num_gpus=k)`` tasks and
placement-group actors) -- submit mixed work to the session cluster. Every piece
records, from inside its worker, which (node, device) it held from when to when;
no two records of one device may overlap.
"""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
from raytest_helpers import node_named, overlaps, wait_for

import rayaccel

pytestmark = pytest.mark.ray

_RECORD = textwrap.dedent('''
    def hold(out_dir, who, seconds):
        import json, os, time, ray
        node = ray.get_runtime_context().get_node_id()
        ids = [int(i) for i in ray.get_gpu_ids()]
        t0 = time.time()
        time.sleep(seconds)
        t1 = time.time()
        with open(os.path.join(out_dir, f"{os.getpid()}.jsonl"), "a") as f:
            for d in ids:
                f.write(json.dumps([node, d, t0, t1, who]) + "\\n")
        return ids
''')
exec(_RECORD)  # the same recorder in this driver's tasks (defines hold)  # noqa: S102
hold = globals()["hold"]

DRIVER = textwrap.dedent('''
    import random, sys, ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy
    ray.init(address=sys.argv[1], logging_level="ERROR", log_to_driver=False)
    out, seed, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
''') + _RECORD + textwrap.dedent('''
    task = ray.remote(num_cpus=0)(hold)
    rng = random.Random(seed)
    refs = []
    for i in range(n):
        k = rng.choice([1, 1, 1, 2, 2, 4])
        refs.append(task.options(num_gpus=k).remote(out, f"d{seed}-{i}", rng.choice([0.0, 0.005, 0.02])))
    @ray.remote(num_cpus=0, num_gpus=1)
    class Member:
        def run(self, out, who):
            return hold(out, who, 0.05)
    for j in range(4):
        pg = placement_group([{"GPU": 1}] * 2)
        ray.get(pg.ready(), timeout=120)
        ms = [Member.options(scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=b))
              .remote() for b in range(2)]
        ray.get([m.run.remote(out, f"d{seed}-pg{j}") for m in ms], timeout=120)
        for m in ms:
            ray.kill(m)
        remove_placement_group(pg)
    ray.get(refs, timeout=600)
    print("done", len(refs))
''')


def test_mixed_drivers_never_hold_a_device_twice(cluster, tmp_path):
    import ray

    out = str(tmp_path)
    env = {k: v for k, v in os.environ.items()}
    drivers = [subprocess.Popen([sys.executable, "-c", DRIVER, cluster.address, out, str(seed), "250"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
               for seed in (1, 2)]
    try:
        mine = rayaccel.remote(gpus=1)(hold)
        pair = rayaccel.remote(gpus=2, interconnect="nvlink")(hold)
        refs = []
        for i in range(300):
            f = pair if i % 5 == 0 else mine
            refs.append(f.remote(out, f"me-{i}", 0.005 if i % 3 else 0.0))
        _train(out, cluster)
        ray.get(refs, timeout=600)
        for d in drivers:
            so, se = d.communicate(timeout=600)
            assert d.returncode == 0, se[-3000:]
            assert "done 250" in so.splitlines()
    finally:
        for d in drivers:
            if d.poll() is None:
                d.kill()
    records = []
    for path in glob.glob(os.path.join(out, "*.jsonl")):
        with open(path) as f:
            records += [json.loads(line) for line in f if line.strip()]
    assert len(records) > 1000
    bad = overlaps(records)
    assert not bad, bad[:5]


def _train(out, cluster):
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    def loop(config):
        hold(config["out"], "train", 0.2)

    TorchTrainer(loop, train_loop_config={"out": out}, torch_config=TorchConfig(backend="gloo"),
                 scaling_config=ScalingConfig(num_workers=2, use_gpu=True),
                 run_config=RunConfig(storage_path=os.path.join(out, "train"))).fit()


def _free_on(node_key):
    from rayaccel.ray.node import agent

    return set(agent.handle(node_key).ask("snapshot").free)


def test_devices_come_back_after_sigkill_and_actor_kill(cluster):
    import ray

    dgx = node_named(cluster, "dgx1-v100")

    @ray.remote(num_gpus=2, label_selector={"rayaccel.io/topology": "dgx1-v100"})
    class Holder:
        def where(self):
            return os.getpid(), [int(i) for i in ray.get_gpu_ids()]

    a, b = Holder.remote(), Holder.remote()
    (pa, da), (_, db) = ray.get([a.where.remote(), b.where.remote()])
    assert not set(da) & _free_on(dgx.node_key)
    os.kill(pa, signal.SIGKILL)
    t0 = time.monotonic()
    wait_for(lambda: set(da) <= _free_on(dgx.node_key), 5, "SIGKILLed holder's devices free")
    ray.kill(b)
    wait_for(lambda: set(db) <= _free_on(dgx.node_key), 5, "killed actor's devices free")
    assert time.monotonic() - t0 < 10
    ray.kill(a)


def test_work_on_a_removed_node_is_retried_on_a_live_one(cluster, tmp_path):
    import ray

    from rayaccel._proc import state

    nid = cluster.add_node("hgx-h100")
    started, go = tmp_path / "started", tmp_path / "node-removed"
    started.mkdir()

    @rayaccel.remote(gpus=4, interconnect="nvlink", max_retries=3)
    def long(started, go):
        import os
        import time

        node = ray.get_runtime_context().get_node_id()
        with open(os.path.join(started, node), "w") as f:
            f.write(str(os.getpid()))
        while not os.path.exists(go):  # holds its devices until its node and this worker are gone
            time.sleep(0.05)
        return node

    from rayaccel.ray.driver.view import view

    view().invalidate()
    ref = long.remote(str(started), str(go))  # the H100 box is the best (NV18 everywhere): it lands there first
    try:
        first = wait_for(lambda: sorted(p for p in started.iterdir() if p.read_text()), 120, "the task to start")
        assert [p.name for p in first] == [nid], f"started on {[p.name for p in first]}, not the new node {nid}"
        pid = int(first[0].read_text())
        cluster.remove_node(nid)
        # a worker outliving its raylet for a moment could still answer its owner: let the retry return only once
        # the first worker is gone
        wait_for(lambda: state(pid) in (None, "Z", "X"), 60, "the removed node's worker to exit")
    finally:
        go.touch()
        if nid in cluster.node_ids:  # failed before removing it: the tests after must not see an H100 box
            cluster.remove_node(nid)
    assert ray.get(ref, timeout=120) == node_named(cluster, "dgx1-v100").node_id  # not pinned to the dead node
