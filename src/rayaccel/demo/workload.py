"""The demo's workload: ordinary Ray code, written the way Ray's documentation writes it.

Nothing here imports rayaccel: the same function runs once on a rayaccel node and
once on a plain Ray node of the same machine, and reports which GPUs each piece
of work got (``ray.get_gpu_ids()`` inside the workers). The story, on one DGX-1:

1. a Ray Serve deployment of two GPU replicas (an embedding model);
2. a plain ``@ray.remote(num_gpus=2)`` task (tensor-parallel generation) that keeps running;
3. Serve scales down to one replica (one GPU frees);
4. a Ray Train ``TorchTrainer`` with 4 GPU workers (a real gloo all-reduce runs on
   CPU; without PyTorch, Ray Train's framework-agnostic ``DataParallelTrainer``, and the
   job is labelled by the trainer that ran).
"""

from __future__ import annotations

import importlib.util
import socket
import time
from typing import Any, Callable


def _free_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def run(storage: str, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Run the workload on the connected Ray cluster; return ``{job: {"gpus": [...], ...}}``."""
    import logging

    import ray
    from ray import serve

    logging.getLogger("ray.serve").setLevel(logging.WARNING)  # the demo prints its own progress
    out: dict[str, Any] = {}

    # 1. Serve: two replicas with one GPU each.
    @serve.deployment(num_replicas=2, ray_actor_options={"num_gpus": 1})
    class Embedder:
        def __call__(self, request=None):
            return ray.get_gpu_ids()

    # Handles only: no HTTP proxy actor to start (a few seconds of a 2-core machine's time per side).
    serve.start(proxy_location="Disabled", http_options={"host": "127.0.0.1", "port": _free_port()})
    handle = serve.run(Embedder.bind(), name="embedder", route_prefix="/embed")
    seen: set[int] = set()
    deadline = time.monotonic() + 60
    while len(seen) < 2 and time.monotonic() < deadline:
        seen.update(int(i) for r in [handle.remote().result() for _ in range(4)] for i in r)
    out["serve: Embedder (2 replicas x num_gpus=1)"] = {"gpus": sorted(seen), "per_worker": 1}
    log(f"  Serve replicas on GPUs {sorted(seen)}")

    # 2. A plain task with two GPUs that keeps running (it waits for a signal).
    @ray.remote(num_cpus=0)
    class Gate:
        def __init__(self):
            self.open = False

        def release(self):
            self.open = True

        def is_open(self):
            return self.open

    gate = Gate.remote()

    @ray.remote(num_gpus=2)
    def generate(gate):
        import time

        while not ray.get(gate.is_open.remote()):
            time.sleep(0.05)
        return ray.get_gpu_ids()

    gen = generate.remote(gate)
    _wait_gpus_used(4)
    log("  generate() holds two GPUs")

    # 3. Serve scales down: one replica (one GPU) goes away.
    handle = serve.run(Embedder.options(num_replicas=1).bind(), name="embedder", route_prefix="/embed")
    _wait_gpus_used(3)
    left = {int(i) for i in handle.remote().result()}
    out["serve: Embedder (2 replicas x num_gpus=1)"]["after_scale_down"] = sorted(left)

    # 4. Ray Train: four GPU workers (labelled by the trainer that really ran).
    trainer = "TorchTrainer" if importlib.util.find_spec("torch") is not None else "DataParallelTrainer"
    out[f"train: {trainer} (4 workers, use_gpu=True)"] = _train(storage, log)
    ray.get(gate.release.remote())
    pair = [int(i) for i in ray.get(gen)]
    out["task: @ray.remote(num_gpus=2) generate()"] = {"gpus": pair, "per_worker": 2}
    log(f"  generate() ran on GPUs {pair}")
    return out  # no serve.shutdown(): the caller stops the whole cluster (a Serve shutdown took ~4 s)


def _wait_gpus_used(n: int, timeout_s: float = 60.0) -> None:
    """Wait until exactly ``n`` GPUs are in use (Ray's ledger).

    Raises:
        TimeoutError: not reached within ``timeout_s``.
    """
    import ray

    deadline = time.monotonic() + timeout_s
    used = None
    while time.monotonic() < deadline:
        used = ray.cluster_resources().get("GPU", 0) - ray.available_resources().get("GPU", 0)
        if abs(used - n) < 1e-6:
            return
        time.sleep(0.05)
    raise TimeoutError(f"the demo expected {n} GPUs in use, Ray shows {used}")


def _train(storage: str, log: Callable[[str], None]) -> dict[str, Any]:
    import ray
    from ray.train import RunConfig, ScalingConfig

    @ray.remote(num_cpus=0)
    class Box:
        def __init__(self):
            self.rows = []

        def put(self, row):
            self.rows.append(row)

        def get(self):
            return self.rows

    box = Box.options(name="demo-train-box").remote()
    have_torch = importlib.util.find_spec("torch") is not None

    def train_loop_per_worker(config):
        import ray
        import ray.train

        rank = ray.train.get_context().get_world_rank()
        total = None
        if config["torch"]:
            import torch
            import torch.distributed as dist

            t = torch.ones(1) * (rank + 1)
            dist.all_reduce(t)
            total = float(t[0])
        ray.get(ray.get_actor("demo-train-box").put.remote(
            {"rank": rank, "gpus": [int(i) for i in ray.get_gpu_ids()], "allreduce": total}))

    scaling = ScalingConfig(num_workers=4, use_gpu=True)
    run_config = RunConfig(storage_path=storage, name=f"demo-{int(time.time() * 1000)}")
    if have_torch:
        from ray.train.torch import TorchConfig, TorchTrainer

        trainer = TorchTrainer(train_loop_per_worker, train_loop_config={"torch": True}, scaling_config=scaling,
                               torch_config=TorchConfig(backend="gloo"), run_config=run_config)
    else:
        from ray.train.v2.api.data_parallel_trainer import DataParallelTrainer

        trainer = DataParallelTrainer(train_loop_per_worker, train_loop_config={"torch": False},
                                      scaling_config=scaling, run_config=run_config)
    trainer.fit()
    rows = sorted(ray.get(box.get.remote()), key=lambda r: r["rank"])
    ray.kill(box)
    gpus = [r["gpus"][0] for r in rows]
    log(f"  Train ranks on GPUs {gpus}" + (f", all-reduce sum {rows[0]['allreduce']:g}" if have_torch else ""))
    return {"gpus": gpus, "per_worker": 1, "allreduce": rows[0]["allreduce"] if rows else None,
            "torch": have_torch}
