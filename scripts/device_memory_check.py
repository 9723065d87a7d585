"""Measure rayaccel's tiered store on a real GPU: spill/restore bandwidth vs raw torch copies.

    python scripts/device_memory_check.py            # 64 MiB, 256 MiB, 1 GiB
    python scripts/device_memory_check.py --quick    # 16, 64 MiB

Self-contained (torch + rayaccel, no Ray). On a machine with CUDA it measures:

* device -> pinned host: ``store.spill(h, "host")`` vs ``pinned.copy_(dev)`` + synchronize;
* pinned host -> device: ``store.get(h)`` vs ``dev.copy_(pinned)`` + synchronize;
* host -> disk and disk -> device: ``store.spill(h, "disk")`` / ``store.get(h)`` vs a
  plain chunked ``os.write`` / ``readinto`` of the same bytes (no fsync either side).

Without a GPU it runs the same on the simulated device tier (CPU memory) and says so.
Medians of --repeats after a warm-up.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from rayaccel.memory import Store  # noqa: E402

MiB = 1 << 20
CHUNK = 8 << 20


def med_gbps(n: int, ts: list[float]) -> float:
    return n / statistics.median(ts) / 1e9


def timed(fn, sync) -> float:
    sync()
    t = time.perf_counter()
    fn()
    sync()
    return time.perf_counter() - t


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--dir", default=None, help="spill directory (default: a temp dir)")
    a = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = "cuda:0" if cuda else "cpu"
    sync = (lambda: torch.cuda.synchronize()) if cuda else (lambda: None)
    sizes = [16 * MiB, 64 * MiB] if a.quick else [64 * MiB, 256 * MiB, 1024 * MiB]
    d = Path(a.dir or tempfile.mkdtemp(prefix="rayaccel-devcheck-"))
    if cuda:
        print(f"GPU: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print("no CUDA device: falling back to the simulated device tier (CPU memory); figures are memcpy, not PCIe")
    rows = []
    for n in sizes:
        src = torch.randint(0, 255, (n,), dtype=torch.uint8, device=dev)
        pinned = torch.empty(n, dtype=torch.uint8, pin_memory=cuda)
        back = torch.empty(n, dtype=torch.uint8, device=dev)
        pinned.copy_(src), back.copy_(pinned)
        raw_d2h = [timed(lambda: pinned.copy_(src, non_blocking=True), sync) for _ in range(a.repeats)]  # noqa: F821 - del at the end of the loop
        raw_h2d = [timed(lambda: back.copy_(pinned, non_blocking=True), sync) for _ in range(a.repeats)]  # noqa: F821 - del at the end of the loop
        host = pinned.numpy()
        path = d / "raw.bin"
        mv = memoryview(host)
        out = np.empty(n, np.uint8)
        out[:] = 0
        omv = memoryview(out)

        def write():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            for i in range(0, n, CHUNK):
                v = mv[i:i + CHUNK]
                while v:
                    v = v[os.write(fd, v):]
            os.close(fd)

        def read():
            with open(path, "rb", buffering=0) as f:
                for i in range(0, n, CHUNK):
                    f.readinto(omv[i:i + CHUNK])

        raw_w, raw_r = [], []
        for _ in range(a.repeats):
            path.unlink(missing_ok=True)
            raw_w.append(timed(write, sync))
            raw_r.append(timed(read, sync))
        path.unlink(missing_ok=True)
        s_d2h, s_h2d, s_w, s_r = [], [], [], []
        with Store(device_bytes=2 * n, host_bytes=2 * n, spill_dir=d, device=None if cuda else "cpu") as s:
            h = s.put(src.clone())
            for k in range(a.repeats + 1):
                t1 = timed(lambda: s.spill(h, to="host"), sync)
                t2 = timed(lambda: s.get(h), sync)
                if k:
                    s_d2h.append(t1), s_h2d.append(t2)
            for k in range(a.repeats + 1):
                s.spill(h, to="host")
                t3 = timed(lambda: s.spill(h, to="disk"), sync)
                t4 = timed(lambda: s.get(h), sync)
                if k:
                    s_w.append(t3), s_r.append(t4)
            assert torch.equal(s.get(h).to(dev), src), "store returned different bytes"
            backend = s.backend
        rows.append((n, [med_gbps(n, x) for x in (raw_d2h, s_d2h, raw_h2d, s_h2d, raw_w, s_w, raw_r, s_r)]))
        del src, pinned, back
    print(f"store backend: {backend}; medians of {a.repeats}, GB/s; spill dir {d}")
    hdr = (f"{'size':>9} | {'raw D2H':>8} {'store':>7} {'ratio':>6} | {'raw H2D':>8} {'store':>7} {'ratio':>6} | "
           f"{'raw write':>9} {'spill':>7} {'ratio':>6} | {'raw read':>8} {'restore':>7} {'ratio':>6}")
    print(hdr)
    print("-" * len(hdr))
    for n, v in rows:
        cells = []
        for i in range(0, 8, 2):
            cells.append(f"{v[i]:8.2f} {v[i + 1]:7.2f} {v[i + 1] / v[i]:6.0%}")
        print(f"{n // MiB:>5} MiB | " + " | ".join(cells))
    print("disk columns: page cache warm on both sides (no drop_caches); restore = disk -> pinned -> device on GPU")


if __name__ == "__main__":
    main()
