"""Tensors between Ray actors: the ``rayaccel`` transport vs Ray's object store, RDT ``nixl`` and ``gloo``, in one run.

    python benchmarks/tensor_transport.py            # 1, 16, 64, 256, 1024 MiB; 5 repeats
    python benchmarks/tensor_transport.py --quick    # 1, 16, 64 MiB; 3 repeats
    python benchmarks/tensor_transport.py --sizes 4,512 --repeats 7
    python benchmarks/tensor_transport.py --sync-only              # the weight-sync case alone
    python benchmarks/tensor_transport.py --sync-only --big        # models of 1 and 4 GiB, 1-8 rollouts

A SimulatedCluster of two simulated DGX-A100 nodes (both on this machine). One
producer actor on node 0 holds a float32 tensor; a consumer on node 0 ("same node")
and one on node 1 ("across nodes") each receive it from an actor method, four ways:

* ``rayaccel``: ``@ray.method(tensor_transport="rayaccel")`` (shared memory on one
  node, NIXL across nodes);
* ``object store``: the same method without a transport (Ray's default);
* ``nixl``: ``tensor_transport="nixl"`` (RDT's NIXL transport, UCX);
* ``gloo``: ``tensor_transport="gloo"`` over a gloo collective group of the three actors.

One figure is the wall time of ``ray.get(consumer.take.remote(producer.<way>.remote()))``:
the producer's method (and whatever it does with the tensor), the transfer, and the
consumer reading one byte of every 4 KiB page (so a mapped tensor is really mapped in).
The consumer returns a checksum of those bytes, checked against the producer's: every
transfer is verified. The four ways run interleaved (the order rotating each round), so a
change in the machine's load hits them alike; medians over ``--repeats`` rounds after one
warm-up each; ratios are the other way's median over the ``rayaccel`` median, same run.

The physical limit of each path, measured or modeled in the same run: ``memcpy`` is a
warm ``torch`` copy of the same bytes in this process (one node's memory bandwidth, the
bound of any one-copy path); across nodes the modeled rate of the DGX-A100's RDMA NIC
(``rayaccel.transfer.MODEL["rdma_nic_gbps"]``) -- on this machine both "nodes" share
memory, so a cross-node figure can beat it. ``cuda_ipc`` / ``nccl`` rows need a GPU.

Weight sync (one trainer to N rollouts on node 0): the trainer holds a model of
``--sync-sizes`` MiB in 32 tensors (16 weight matrices, 16 small biases) and returns them
all from one method; N rollout actors receive it at once
(``ray.get([r.load.remote(ref) for r in rollouts])``), each keeping the tensors (as a
rollout uses its new weights) and touching one byte of every 4 KiB page. Between rounds
the trainer changes every weight in place (after ``wait_tensor_freed``, as RDT asks),
untimed; then every rollout's CRC-32 of every byte it holds is checked twice: its last
round's tensors after the trainer's write (a write after ``wait_tensor_freed`` must stay
the trainer's own) and the new ones after the transfer. Ways: ``rayaccel``, Ray's object
store, ``nixl``, ``gloo`` (point to point, over a gloo group of the trainer and the
rollouts); NCCL broadcast needs a GPU. The limit is ``memcpy`` of the model's bytes in
this process, measured once per round in the same run; ``empty`` is the same round with
an object of no tensors, and ``floor`` with 32 one-float tensors (both ``rayaccel``): Ray's
calls whatever the transport. ``floor`` is the one to subtract: for a real RDT object Ray
first runs ``__ray_recv__`` on each rollout and only then its task, which an empty object
skips. Ratios are medians over ``memcpy``'s median.

Where a ``rayaccel`` round's time goes beyond ``floor``: the trainer's one copy into its
pooled segment (a background thread; consumers wait for its lock) and each rollout's reads
of the pages; a rollout's mapping of the segment is kept from its last round
(``rayaccel.ray.rdt.maps``), so no page tables are filled or torn down per round.
"""

from __future__ import annotations

import argparse
import gc
import importlib
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

MiB = 1 << 20
FULL = (1, 16, 64, 256, 1024)
QUICK = (1, 16, 64)
WAYS = ("rayaccel", "object store", "nixl", "gloo")
SYNC_SIZES = (1, 64, 256)
SYNC_BIG = (1024, 4096)
SYNC_CONSUMERS = (2, 4)
SYNC_CONSUMERS_BIG = (1, 2, 4, 8)
SYNC_TENSORS = 16  # weight matrices; as many small biases beside them


def parse_sizes(text: str) -> tuple[int, ...]:
    try:
        sizes = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        sizes = ()
    if not sizes or any(s < 1 or s > 4096 for s in sizes):
        raise SystemExit(f"error: --sizes {text!r}: expected MiB as integers 1..4096, comma-separated (e.g. 1,64)")
    return sizes


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1, 16, 64 MiB and 3 repeats")
    ap.add_argument("--sizes", help="tensor sizes in MiB, comma-separated (default 1,16,64,256,1024)")
    ap.add_argument("--repeats", type=int, default=None, help="timed repeats per cell (default 5; 3 with --quick)")
    ap.add_argument("--sync-only", action="store_true", help="only the weight-sync case")
    ap.add_argument("--no-sync", action="store_true", help="skip the weight-sync case")
    ap.add_argument("--sync-sizes", help="weight-sync model sizes in MiB (default 1,64,256; --quick 1,64)")
    ap.add_argument("--consumers", help="weight-sync rollout counts, comma-separated (default 2,4; --quick 2)")
    ap.add_argument("--big", action="store_true", help="weight sync of 1 and 4 GiB models to 1, 2, 4, 8 rollouts")
    args = ap.parse_args()
    if args.big:
        sync_sizes, counts = SYNC_BIG, SYNC_CONSUMERS_BIG
    else:
        sync_sizes, counts = ((1, 64), (2,)) if args.quick else (SYNC_SIZES, SYNC_CONSUMERS)
    sync_sizes = parse_sizes(args.sync_sizes) if args.sync_sizes else sync_sizes
    counts = _parse_counts(args.consumers) if args.consumers else counts
    sizes = parse_sizes(args.sizes) if args.sizes else (QUICK if args.quick else FULL)
    repeats = args.repeats if args.repeats is not None else (3 if args.quick else 5)
    if repeats < 1 or repeats > 100:
        raise SystemExit(f"error: --repeats {repeats}: expected 1..100")
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

    import ray
    import torch
    from ray.experimental.collective import create_collective_group
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    importlib.import_module("rayaccel.ray")  # makes tensor_transport="rayaccel" known in this driver
    from rayaccel.ray.driver.cluster import SimulatedCluster
    from rayaccel.transfer import MODEL

    store_bytes = max(256 * MiB, int(max(sizes) * MiB * 2.2),
                      0 if args.no_sync else int(max(sync_sizes) * MiB * (max(counts) + 2)))

    @ray.remote(enable_tensor_transport=True, num_gpus=1)
    class Producer:
        def make(self, nbytes: int) -> int:
            self.t = None
            gc.collect()
            g = torch.Generator().manual_seed(nbytes)
            self.t = torch.randint(0, 2**31 - 1, (nbytes // 4,), dtype=torch.int32, generator=g).view(torch.float32)
            return int(self.t.view(torch.uint8)[::4096].sum())

        def store(self):
            return self.t

        @ray.method(tensor_transport="rayaccel")
        def rayaccel(self):
            return self.t

        @ray.method(tensor_transport="nixl")
        def nixl(self):
            return self.t

        @ray.method(tensor_transport="gloo")
        def gloo(self):
            return self.t

    @ray.remote(enable_tensor_transport=True, num_gpus=1)
    class Consumer:
        def take(self, t) -> int:
            return int(t.view(torch.uint8)[::4096].sum())

    cluster = SimulatedCluster(["dgx-a100", "dgx-a100"], num_cpus=4, object_store_memory=store_bytes,
                               logging_level="ERROR", log_to_driver=False)
    try:
        n0, n1 = cluster.node_ids
        pin = lambda n: NodeAffinitySchedulingStrategy(n, soft=False)  # noqa: E731
        if not args.no_sync:
            _weight_sync(ray, torch, create_collective_group, pin(n0), sync_sizes, counts, max(repeats, 5))
        if args.sync_only:
            return 0
        prod = Producer.options(scheduling_strategy=pin(n0)).remote()
        near = Consumer.options(scheduling_strategy=pin(n0)).remote()
        far = Consumer.options(scheduling_strategy=pin(n1)).remote()
        create_collective_group([prod, near, far], backend="torch_gloo")
        method = {"rayaccel": prod.rayaccel, "object store": prod.store, "nixl": prod.nixl, "gloo": prod.gloo}
        results: dict[tuple, list[float]] = {}
        limits: dict[int, float] = {}
        print(f"# 2 simulated DGX-A100 nodes on one machine ({os.cpu_count()} CPUs); {repeats} repeats per cell, "
              f"medians; ratio = way / rayaccel (same run)", flush=True)
        for mib in sizes:
            n = mib * MiB
            expect = ray.get(prod.make.remote(n))
            limits[mib] = _memcpy_s(torch, n, repeats)
            for where, cons in (("same node", near), ("across nodes", far)):
                def once(way: str) -> float:
                    t0 = time.perf_counter()
                    got = ray.get(cons.take.remote(method[way].remote()))
                    dt = time.perf_counter() - t0
                    if got != expect:
                        raise SystemExit(f"error: {way} {where} {mib} MiB delivered different bytes "
                                         f"(checksum {got} != {expect})")
                    return dt

                for way in WAYS:  # warm-up: agents, groups, first registrations
                    once(way)
                for r in range(repeats):  # interleaved, the order rotating: load drifts hit every way alike
                    for way in WAYS[r % len(WAYS):] + WAYS[:r % len(WAYS)]:
                        results.setdefault((mib, where, way), []).append(once(way))
                print(f"  {mib:5d} MiB {where:12s} " + "  ".join(
                    f"{w} {statistics.median(results[(mib, where, w)]) * 1e3:.1f} ms" for w in WAYS), flush=True)
        _table(sizes, results, limits, MODEL["rdma_nic_gbps"], torch.cuda.is_available())
    finally:
        cluster.shutdown()
    return 0


def _parse_counts(text: str) -> tuple[int, ...]:
    try:
        counts = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        counts = ()
    if not counts or any(c < 1 or c > 8 for c in counts):
        raise SystemExit(f"error: --consumers {text!r}: expected rollout counts 1..8, comma-separated (e.g. 2,4)")
    return counts


SYNC_WAYS = ("rayaccel", "object store", "nixl", "gloo")


def _weight_sync(ray, torch, create_collective_group, here, sizes, counts, repeats: int) -> None:
    """One trainer to N rollouts on one node; prints a table (see the module's docstring)."""
    import zlib

    from ray.experimental import wait_tensor_freed

    def crc(ts) -> int:
        c = 0
        for t in ts:
            c = zlib.crc32(memoryview(t.detach().contiguous().view(torch.uint8).numpy()), c)
        return c

    @ray.remote(enable_tensor_transport=True, num_gpus=0, num_cpus=0)
    class Trainer:
        def make(self, nbytes: int) -> int:
            self.w = []
            self.tiny = [torch.zeros(1) for _ in range(2 * SYNC_TENSORS)]
            gc.collect()
            if nbytes <= 0:
                return 0
            g = torch.Generator().manual_seed(nbytes)
            small = 4096
            big = (nbytes - SYNC_TENSORS * small) // SYNC_TENSORS // 4 * 4
            for i in range(SYNC_TENSORS):
                self.w.append(torch.randint(0, 2**31 - 1, (big // 4,), dtype=torch.int32, generator=g)
                              .view(torch.float32))
                self.w.append(torch.randint(0, 2**31 - 1, (small // 4,), dtype=torch.int32, generator=g)
                              .view(torch.float32))
            return sum(t.numel() * 4 for t in self.w)

        def step(self) -> int:
            """An optimizer step: every weight changes in place, once Ray is done with the last round's."""
            for t in self.w:
                wait_tensor_freed(t, timeout=120)
                t.view(torch.int32).add_(1)
            return crc(self.w)

        def store(self):
            return self.w

        @ray.method(tensor_transport="rayaccel")
        def rayaccel(self):
            return self.w

        @ray.method(tensor_transport="rayaccel")
        def empty(self):
            return []

        @ray.method(tensor_transport="rayaccel")
        def floor(self):
            return self.tiny

        @ray.method(tensor_transport="nixl")
        def nixl(self):
            return self.w

        @ray.method(tensor_transport="gloo")
        def gloo(self):
            return self.w

    @ray.remote(enable_tensor_transport=True, num_gpus=0, num_cpus=0)
    class Rollout:
        def load(self, ts) -> int:
            self.w = ts  # kept, as a rollout keeps its weights until the next sync
            return sum(int(t.view(torch.uint8)[::4096].sum()) for t in ts)

        def check(self) -> int:
            return crc(self.w)

        def drop(self) -> None:
            self.w = []

    trainer = Trainer.options(scheduling_strategy=here).remote()
    rollouts = [Rollout.options(scheduling_strategy=here).remote() for _ in range(max(counts))]
    create_collective_group([trainer, *rollouts], backend="torch_gloo")
    method = {"rayaccel": trainer.rayaccel, "object store": trainer.store, "nixl": trainer.nixl,
              "gloo": trainer.gloo, "empty": trainer.empty, "floor": trainer.floor}
    print(f"# weight sync: one trainer to N rollouts on one node ({os.cpu_count()} CPUs); {repeats} rounds per "
          "cell after one warm-up, the trainer's weights changed before each; medians", flush=True)
    med: dict[tuple, float] = {}
    for mib in sizes:
        nbytes = ray.get(trainer.make.remote(mib * MiB))
        src = torch.ones(nbytes // 4, dtype=torch.float32)
        dst = torch.empty_like(src)
        dst.copy_(src)
        for k in counts:
            group = rollouts[:k]
            ray.get([r.drop.remote() for r in rollouts])
            times: dict[str, list[float]] = {}
            held: dict[int, int] = {}  # what the rollouts hold now (their last round's crc)

            def once(way: str, timed: bool = True) -> None:
                nonlocal held
                want = ray.get(trainer.step.remote())
                if held:  # the trainer's write after wait_tensor_freed stayed its own
                    got = ray.get([r.check.remote() for r in group])
                    if got != [held["crc"]] * k:
                        raise SystemExit(f"error: weight sync {mib} MiB x{k}: a rollout's last weights changed when "
                                         f"the trainer wrote its own ({way})")
                t0 = time.perf_counter()
                ref = method[way].remote()
                ray.get([r.load.remote(ref) for r in group])
                dt = time.perf_counter() - t0
                del ref
                if way not in ("empty", "floor"):
                    got = ray.get([r.check.remote() for r in group])
                    if got != [want] * k:
                        raise SystemExit(f"error: weight sync {way} {mib} MiB x{k}: a rollout holds other bytes "
                                         f"(crc {got} != {want})")
                    held = {"crc": want}
                else:
                    ray.get([r.drop.remote() for r in group])
                    held = {}
                if timed:
                    times.setdefault(way, []).append(dt)
                    t0 = time.perf_counter()
                    dst.copy_(src)
                    times.setdefault("memcpy", []).append(time.perf_counter() - t0)

            ways = SYNC_WAYS + ("empty", "floor")
            for way in ways:
                once(way, timed=False)
            for r in range(repeats):
                for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                    once(way)
            for way, ts in times.items():
                med[(mib, k, way)] = statistics.median(ts)
            print(f"  {mib:5d} MiB x{k} " + "  ".join(f"{w} {med[(mib, k, w)] * 1e3:.1f} ms"
                                                     for w in ("memcpy",) + ways), flush=True)
    ray.get(trainer.make.remote(0))
    for a in (trainer, *rollouts):
        ray.kill(a)
    print()
    print("| model | rollouts | memcpy (the limit) | rayaccel (x memcpy) | object store | nixl | gloo | nccl broadcast "
          "| empty object | 32 one-float tensors (Ray's floor) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for mib in sizes:
        for k in counts:
            mc = med[(mib, k, "memcpy")]
            cell = lambda w: f"{med[(mib, k, w)] * 1e3:.1f} ms ({med[(mib, k, w)] / mc:.2f}x)"  # noqa: E731
            nccl = "not run (GPU: scripts/transport_check.py)" if torch.cuda.is_available() else "n/a: no GPU"
            print(f"| {mib} MiB | {k} | {mc * 1e3:.1f} ms ({mib * MiB / mc / 1e9:.1f} GB/s) | {cell('rayaccel')} | "
                  f"{cell('object store')} | {cell('nixl')} | {cell('gloo')} | {nccl} | {cell('empty')} | "
                  f"{cell('floor')} |")
    print()


def _memcpy_s(torch, n: int, repeats: int) -> float:
    src = torch.ones(n // 4, dtype=torch.float32)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _table(sizes, results, limits, rdma_gbps: float, gpu: bool) -> None:
    med = {k: statistics.median(v) for k, v in results.items()}
    print()
    print("| size | where | rayaccel | object store (ratio) | nixl (ratio) | gloo (ratio) | cuda_ipc / nccl | physical limit |")
    print("|---|---|---|---|---|---|---|---|")
    for mib in sizes:
        for where in ("same node", "across nodes"):
            r = med[(mib, where, "rayaccel")]
            cells = [f"{med[(mib, where, w)] * 1e3:.1f} ms ({med[(mib, where, w)] / r:.2f}x)" for w in WAYS[1:]]
            gbps = mib * MiB / r / 1e9
            if where == "same node":
                limit = f"memcpy {limits[mib] * 1e3:.1f} ms ({mib * MiB / limits[mib] / 1e9:.1f} GB/s)"
            else:
                limit = f"RDMA NIC (modeled) {mib * MiB / (rdma_gbps * 1e9) * 1e3:.1f} ms ({rdma_gbps:.0f} GB/s)"
            gpu_cell = "not run (GPU present: scripts/device_check.py)" if gpu else "n/a: no GPU"
            print(f"| {mib} MiB | {where} | {r * 1e3:.1f} ms ({gbps:.2f} GB/s) | {' | '.join(cells)} | {gpu_cell} | "
                  f"{limit} |")


if __name__ == "__main__":
    sys.exit(main())
