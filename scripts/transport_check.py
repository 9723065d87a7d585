#!/usr/bin/env python3
"""The ``rayaccel`` tensor transport on this machine's real devices, against torch copies and Ray's own transports.

Usage (run by ``scripts/device_check.py``, or alone)::

    python scripts/transport_check.py [--sizes 64,256,1024] [--repeats 5]

On a rayaccel node of this machine (``rayaccel.init()``: real discovery, the worker
hook), one producer actor and consumers receive tensors through
``tensor_transport="rayaccel"``, each transfer checked bit for bit:

* CPU tensors, one node: the shared-memory path (always; no GPU needed);
* two actors sharing GPU 0 (``num_gpus=0.5`` each): CUDA IPC, zero copy;
* GPU 0 -> GPU 1 (with two GPUs): CUDA IPC with one peer copy, or staged through host
  memory when the handle cannot be opened (the line says which and why);
* GPU NIXL: the consumer forced onto NIXL (``RAYACCEL_RDT_PATH=nixl``) on this node,
  the path a consumer on another node takes (GPUDirect RDMA where the NIC allows);
* weight sync: a trainer's model (the size, in 32 tensors) to two rollouts at once,
  the trainer's weights changed in place between rounds (after ``wait_tensor_freed``),
  each round checked on both rollouts -- on CPU (shared memory, against a host copy of
  the same bytes) and on GPU 0 shared by all three (CUDA IPC, no copy, against a
  ``clone`` of the same bytes). NCCL broadcast needs one GPU per rank: not run here.

Each row gives the median time, GB/s and the path the consumer reports, beside Ray's
``cuda_ipc`` / ``nixl`` / object store for the same tensor and the physical limit:
a torch device copy of the same bytes (``clone`` on one GPU, ``to("cuda:1")`` across).
Without a GPU the GPU rows print ``skip: no GPU`` and only the CPU row runs.
Always exits 0; the last line is a one-line summary.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MiB = 1 << 20


def _median_s(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _row(label: str, nbytes: int, s: float | None, note: str = "") -> str:
    if s is None:
        return f"  {label:44} {'-':>10} {'':>9}  {note}"
    return f"  {label:44} {s * 1e3:9.2f}ms {nbytes / s / 1e9:7.2f}GB/s  {note}"


def run(sizes: tuple[int, ...] = (64, 256), repeats: int = 5) -> str:
    """Run the checks; print rows; return the summary line."""
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
        import torch
    except ImportError as e:
        print(f"skip: the transport check needs ray and torch ({e})")
        return "transport: skipped (no torch)"
    import rayaccel
    import rayaccel.ray  # noqa: F401 - registers tensor_transport="rayaccel" in this driver

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    where = "a plain Ray node (no GPU: no rayaccel node to make)"
    try:
        if not gpus:
            raise RuntimeError("no GPU")
        rayaccel.init(num_cpus=max(4, os.cpu_count() or 4), logging_level="ERROR", log_to_driver=False)
        where = "a rayaccel node of this machine"
    except Exception as e:  # noqa: BLE001 - a device script reports and goes on with plain Ray
        if gpus:
            print(f"note: rayaccel.init() failed ({type(e).__name__}: {e}); plain ray.init() instead")
            where = "a plain Ray node"
        ray.init(num_cpus=4, num_gpus=gpus, logging_level="ERROR", log_to_driver=False)
    print(f"\n== tensor transport: {gpus} GPU(s), on {where} ==")
    ok = bad = 0
    try:
        ok, bad = _checks(ray, torch, gpus, sizes, repeats)
    finally:
        rayaccel.shutdown()
    return f"transport: {ok} transfers checked bit-identical, {bad} wrong" + ("" if gpus else "; GPU paths skipped (no GPU)")


def _checks(ray, torch, gpus: int, sizes, repeats: int) -> tuple[int, int]:
    @ray.remote(enable_tensor_transport=True)
    class Producer:
        def make(self, nbytes: int, device: str) -> int:
            self.t = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device)
            return int(torch.sum(self.t, dtype=torch.int64))

        @ray.method(tensor_transport="rayaccel")
        def rayaccel(self):
            return self.t

        @ray.method(tensor_transport="nixl")
        def nixl(self):
            return self.t

        @ray.method(tensor_transport="cuda_ipc")
        def cuda_ipc(self):
            return self.t

        def store(self):
            return self.t

        def make_model(self, nbytes: int, device: str) -> None:
            part = max(1, nbytes // 16 - 4096)
            self.model = [torch.randint(0, 255, (n,), dtype=torch.uint8, device=device)
                          for _ in range(16) for n in (part, 4096)]

        def step(self) -> int:
            from ray.experimental import wait_tensor_freed

            for t in self.model:
                wait_tensor_freed(t, timeout=120)
                t.add_(1)
            return sum(int(torch.sum(t, dtype=torch.int64)) for t in self.model)

        @ray.method(tensor_transport="rayaccel")
        def weights(self):
            return self.model

    @ray.remote(enable_tensor_transport=True)
    class Consumer:
        def __init__(self):
            self.seen = {}

        def take(self, t) -> tuple:
            from rayaccel.ray import rdt
            s = int(torch.sum(t, dtype=torch.int64))
            if t.is_cuda:
                torch.cuda.synchronize()
            now = {k: v["objects"] for k, v in rdt.stats().items()}
            moved = [k for k, v in now.items() if v > self.seen.get(k, 0)]
            self.seen = now
            return s, str(t.device), moved[0] if moved else "not the rayaccel transport"

        def load(self, ts) -> tuple:
            from rayaccel.ray import rdt

            self.kept = ts  # a rollout keeps its weights until the next sync
            if ts[0].is_cuda:
                torch.cuda.synchronize()
            else:  # one byte of every page: a mapped tensor is really mapped in
                sum(int(t[::4096].sum()) for t in ts)
            now = {k: v["objects"] for k, v in rdt.stats().items()}
            moved = [k for k, v in now.items() if v > self.seen.get(k, 0)]
            self.seen = now
            return str(ts[0].device), moved[0] if moved else "not the rayaccel transport"

        def kept_sum(self) -> int:
            s = sum(int(torch.sum(t, dtype=torch.int64)) for t in self.kept)
            if self.kept[0].is_cuda:
                torch.cuda.synchronize()
            return s

    counts = [0, 0]

    def check(label, prod, cons, method, nbytes, want, limit=None):
        def once():
            got = ray.get(cons.take.remote(getattr(prod, method).remote()))
            counts[0 if got[0] == want else 1] += 1
            once.last = got
        try:
            s = _median_s(once, repeats)
        except Exception as e:  # noqa: BLE001
            print(_row(label, nbytes, None, f"!! {type(e).__name__}: {str(e).splitlines()[-1][:150]}"))
            return
        note = f"on {once.last[1]}, path {once.last[2]}" + ("" if once.last[0] == want else "  !! WRONG BYTES")
        if limit:
            note += f"  ({limit / s:.2f}x of the torch copy)" if s else ""
        print(_row(label, nbytes, s, note))

    def torch_copy(nbytes, src, dst) -> float:
        x = torch.ones(nbytes, dtype=torch.uint8, device=src)

        def f():
            x.to(dst, copy=True)
            if "cuda" in (src + dst):
                torch.cuda.synchronize()
        return _median_s(f, repeats)

    def sync(label, device, opts, nbytes, limit):
        """One trainer to two rollouts, the trainer's weights changed before each round; every round checked."""
        tr = Producer.options(**opts).remote()
        rs = [Consumer.options(**opts).remote() for _ in range(2)]
        ray.get(tr.make_model.remote(nbytes, device))
        times, where = [], ""
        try:
            for r in range(repeats + 1):
                want = ray.get(tr.step.remote())
                t0 = time.perf_counter()
                ref = tr.weights.remote()
                got = ray.get([c.load.remote(ref) for c in rs])
                dt = time.perf_counter() - t0
                del ref
                sums = ray.get([c.kept_sum.remote() for c in rs])
                counts[0 if sums == [want, want] else 1] += 1
                where = f"on {got[0][0]}, path {got[0][1]}" + ("" if sums == [want, want] else "  !! WRONG BYTES")
                if r:
                    times.append(dt)
        except Exception as e:  # noqa: BLE001
            print(_row(label, nbytes, None, f"!! {type(e).__name__}: {str(e).splitlines()[-1][:150]}"))
            return
        finally:
            for a in (tr, *rs):
                ray.kill(a)
        s = statistics.median(times)
        print(_row(label, nbytes, s, f"{where}  ({s / limit:.2f}x the copy)"))

    for mib in sizes:
        n = mib * MiB
        print(f"-- {mib} MiB")
        # CPU tensors on one node: shared memory
        p = Producer.options(num_cpus=0).remote()
        c = Consumer.options(num_cpus=0).remote()
        want = ray.get(p.make.remote(n, "cpu"))
        lim = torch_copy(n, "cpu", "cpu")
        print(_row("torch copy, host memory (the limit)", n, lim))
        check("rayaccel, CPU tensor, same node", p, c, "rayaccel", n, want, lim)
        check("object store, CPU tensor, same node", p, c, "store", n, want, lim)
        check("nixl, CPU tensor, same node", p, c, "nixl", n, want, lim)
        ray.kill(p), ray.kill(c)
        sync("rayaccel, weight sync to 2 rollouts, CPU", "cpu", {"num_cpus": 0}, n, lim)
        if not gpus:
            print("  skip: no GPU (torch.cuda.is_available() is False): CUDA IPC and GPU NIXL rows need one")
            continue
        # one GPU, two actors: CUDA IPC, zero copy
        p = Producer.options(num_gpus=0.5, num_cpus=0).remote()
        c = Consumer.options(num_gpus=0.5, num_cpus=0).remote()
        want = ray.get(p.make.remote(n, "cuda"))
        lim = torch_copy(n, "cuda:0", "cuda:0")
        print(_row("torch clone on one GPU (the limit)", n, lim))
        check("rayaccel, same GPU (CUDA IPC)", p, c, "rayaccel", n, want, lim)
        check("ray cuda_ipc, same GPU", p, c, "cuda_ipc", n, want, lim)
        check("object store, same GPU", p, c, "store", n, want, lim)
        sync("rayaccel, weight sync to 2 rollouts, GPU 0", "cuda", {"num_cpus": 0, "num_gpus": 0.3}, n, lim)
        # the cross-node path on this node: NIXL with GPU memory
        cn = Consumer.options(num_gpus=0.5, num_cpus=0,
                              runtime_env={"env_vars": {"RAYACCEL_RDT_PATH": "nixl"}}).remote()
        check("rayaccel forced to NIXL, GPU memory", p, cn, "rayaccel", n, want, lim)
        check("ray nixl, GPU memory", p, cn, "nixl", n, want, lim)
        ray.kill(p), ray.kill(c), ray.kill(cn)
        if gpus >= 2:
            p = Producer.options(num_gpus=1, num_cpus=0).remote()
            c = Consumer.options(num_gpus=1, num_cpus=0).remote()
            want = ray.get(p.make.remote(n, "cuda"))
            peer = torch.cuda.can_device_access_peer(0, 1)
            lim = torch_copy(n, "cuda:0", "cuda:1")
            print(_row(f"torch GPU0 -> GPU1 (peer access {peer}; the limit)", n, lim))
            check("rayaccel, GPU -> another GPU", p, c, "rayaccel", n, want, lim)
            check("object store, GPU -> another GPU", p, c, "store", n, want, lim)
            ray.kill(p), ray.kill(c)
        else:
            print("  skip: one GPU: the GPU -> another GPU row needs two")
    return counts[0], counts[1]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="64,256", help="MiB, comma-separated (default 64,256)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    try:
        sizes = tuple(int(s) for s in args.sizes.split(",") if s.strip())
        assert sizes and all(0 < s <= 8192 for s in sizes) and 0 < args.repeats <= 100
    except (ValueError, AssertionError):
        print(f"error: --sizes {args.sizes!r} / --repeats {args.repeats}: expected MiB 1..8192, comma-separated, "
              "and 1..100 repeats", file=sys.stderr)
        return 2
    print(f"\nSUMMARY: {run(sizes, args.repeats)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
