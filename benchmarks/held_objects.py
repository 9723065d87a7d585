"""A producer's transport objects beyond its device budget: spill and return, vs holding them all (issue 20, item 4).

    python benchmarks/held_objects.py            # 12 objects of 64 MiB, budget 4 of them, host tier 4 of them
    python benchmarks/held_objects.py --quick    # 12 objects of 8 MiB (a few seconds)

What a producer of the ``rayaccel`` transport does when it runs ahead of its consumers: it
returns ``--objects`` objects, then a consumer reads each once (oldest first, as a queue of
rollouts or activations is drained). Side by side, in one run:

* **held** (the baseline, Ray's behaviour): every object stays in device memory until it is
  read and freed -- peak device bytes = all of them;
* **budget** (:class:`rayaccel.memory.held.HeldObjects`, what the transport does under
  ``RAYACCEL_RDT_DEVICE_BYTES``): at most the budget on the device; the least recently used
  objects go to (pinned) host memory, then disk, and come back, verified, when read.

Columns: peak device bytes, the produce and read-back wall times (medians over ``--repeats``),
bytes spilled, and the store's own throughput per direction (its ``bandwidth_gbps``) --
device->host, host->disk, disk->device, host->device. Without a GPU the device tier is CPU
memory (CPU tensors stand in for device ones), so device<->host are memcpy and the disk
figures come from the page cache; the ratio column is budget time / held time.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402

from rayaccel.memory.held import HeldObjects  # noqa: E402

MIB = 1 << 20


def _objects(n: int, nbytes: int) -> list:
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, 255, (nbytes,), dtype=torch.uint8, generator=g).view(torch.int32) for _ in range(n)]


def run_held(objs: list) -> dict:
    t0 = time.perf_counter()
    held = {i: o.clone() for i, o in enumerate(objs)}
    produce = time.perf_counter() - t0
    peak = sum(o.numel() * o.element_size() for o in held.values())
    t0 = time.perf_counter()
    for i in range(len(objs)):
        x = held.pop(i)
        assert torch.equal(x, objs[i])
    return {"peak": peak, "produce": produce, "read": time.perf_counter() - t0, "spilled": 0, "gbps": {}}


def run_budget(objs: list, budget: int, host: int, spill_dir: str) -> dict:
    h = HeldObjects(budget, host, spill_dir=spill_dir, device=None, swap=lambda oid, ts: None)
    try:
        peak = 0
        t0 = time.perf_counter()
        for i, o in enumerate(objs):
            h.add(str(i), [o.clone()])
            peak = max(peak, h.stats()["device_bytes"])
        produce = time.perf_counter() - t0
        spilled = h.stats()["spilled_bytes"]
        t0 = time.perf_counter()
        for i in range(len(objs)):
            with h.reading(str(i)) as got:
                assert torch.equal(got[0].cpu(), objs[i])  # bit-identical
            h.drop(str(i))
            peak = max(peak, h.stats()["device_bytes"])
        read = time.perf_counter() - t0
        return {"peak": peak, "produce": produce, "read": read, "spilled": spilled,
                "gbps": dict(h.stats().get("bandwidth_gbps", {})), "backend": h.stats()["backend"]}
    finally:
        h.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 MiB objects, 2 repeats")
    ap.add_argument("--objects", type=int, default=12)
    ap.add_argument("--mib", type=int, default=None, help="object size, MiB (default 64; --quick 8)")
    ap.add_argument("--repeats", type=int, default=None)
    a = ap.parse_args(argv)
    mib = a.mib or (8 if a.quick else 64)
    repeats = a.repeats or (2 if a.quick else 5)
    if a.objects < 5 or mib < 1 or repeats < 1:
        print("error: --objects must be >= 5, --mib >= 1 and --repeats >= 1", file=sys.stderr)
        return 2
    nbytes = mib * MIB
    objs = _objects(a.objects, nbytes)
    budget, host = 4 * nbytes, 4 * nbytes
    rows: dict[str, list] = {"held": [], "budget": []}
    with tempfile.TemporaryDirectory(prefix="held-bench-") as d:
        for _ in range(repeats):
            rows["held"].append(run_held(objs))
            rows["budget"].append(run_budget(objs, budget, host, d))
    med = {k: {f: statistics.median(r[f] for r in v) for f in ("peak", "produce", "read", "spilled")}
           for k, v in rows.items()}
    gbps: dict[str, list] = {}
    for r in rows["budget"]:
        for k, v in r["gbps"].items():
            if v is not None:
                gbps.setdefault(k, []).append(v)
    print(f"{a.objects} objects of {mib} MiB; budget {budget // MIB} MiB device, {host // MIB} MiB host, rest disk; "
          f"store backend {rows['budget'][0]['backend']}; medians of {repeats}")
    print(f"{'mode':<8} {'peak device MiB':>16} {'produce s':>10} {'read s':>8} {'spilled MiB':>12} {'read ratio':>10}")
    for k in ("held", "budget"):
        m = med[k]
        ratio = m["read"] / med["held"]["read"] if med["held"]["read"] else float("nan")
        print(f"{k:<8} {m['peak'] / MIB:>16.0f} {m['produce']:>10.3f} {m['read']:>8.3f} {m['spilled'] / MIB:>12.0f} "
              f"{ratio:>10.2f}")
    print("store throughput (budget mode), GB/s: " + ", ".join(
        f"{k} {statistics.median(v):.2f}" for k, v in sorted(gbps.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
