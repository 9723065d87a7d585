"""Tiered store spill/restore bandwidth vs raw copies and vs Ray's own object spilling, in one run.

    python benchmarks/memory_tiers.py            # 1, 16, 256 MiB
    python benchmarks/memory_tiers.py --quick    # 1, 8, 32 MiB, fewer repeats

Table 1, device <-> host: the raw baseline is ``np.copyto`` into a buffer that
was already written once (the fastest memcpy, no page faults); the store's
figure is the wall time of ``store.spill(h, "host")`` (device -> host) and of
``store.get(h)`` (host -> device) on the same bytes. Without a GPU the device
tier is CPU memory, so both are memcpy; ``scripts/device_memory_check.py`` does
the same on a real GPU.

Table 2, disk: raw is a plain ``os.write`` of the same bytes in 8 MiB chunks to
a new file in the same directory and a ``readinto`` back into a warm buffer; the
store's figure is ``store.spill(h, "disk")`` (host -> disk, with the CRC-32s and
header) and ``store.get(h)`` (disk -> device, verified). Neither side fsyncs.
Ray: ``ray.init(object_store_memory=...)`` a few object sizes big, spilling to
the same directory; ``ray.put`` of 3x the store's capacity forces spilling
(spill GB/s = bytes beyond capacity / time of those puts, which also includes
the copies into plasma, so it is a lower bound) and ``ray.get`` of the spilled
objects restores them (restore GB/s = their bytes / time).

Page cache: the files just written are still in the page cache, so "disk" reads
here run at memory speed for raw, store and Ray alike; dropping caches needs
root on the host and is not done. The comparison is fair (same files, same
cache), the absolute figures are not disk figures.

Medians over ``--repeats`` after one warm-up round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from rayaccel.memory import Store  # noqa: E402

MiB = 1 << 20
CHUNK = 8 << 20


def gbps(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def measure(src: np.ndarray, d: Path, repeats: int) -> dict[str, float]:
    """Raw and store figures, interleaved in one loop so both see the same cache and dirty-page state."""
    n = src.nbytes
    dst = np.empty_like(src)
    np.copyto(dst, src)  # warm: fault the pages in
    out = np.empty_like(src)
    out[:] = 0
    path = d / "raw.bin"
    mv, omv = memoryview(src), memoryview(out)

    def write() -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            for i in range(0, n, CHUNK):
                view = mv[i:i + CHUNK]
                while view:
                    view = view[os.write(fd, view):]
        finally:
            os.close(fd)

    def read() -> None:
        with open(path, "rb", buffering=0) as f:
            for i in range(0, n, CHUNK):
                f.readinto(omv[i:i + CHUNK])

    t = {k: [] for k in ("copy", "d2h", "h2d", "write", "spill", "read", "restore")}
    with Store(device_bytes=2 * n, host_bytes=2 * n, spill_dir=d, device="cpu") as s:
        h = s.put(src.copy())
        for k in range(repeats + 1):  # memcpy vs device <-> host
            r = {"copy": timed(lambda: np.copyto(dst, src)),
                 "d2h": timed(lambda: s.spill(h, to="host")),
                 "h2d": timed(lambda: s.get(h))}  # the returned view is dropped at once
            for key, v in r.items():
                if k:
                    t[key].append(v)
        for k in range(repeats + 1):  # plain file vs host <-> disk
            path.unlink(missing_ok=True)
            s.spill(h, to="host")
            r = {"write": timed(write), "spill": timed(lambda: s.spill(h, to="disk")),
                 "read": timed(read), "restore": timed(lambda: s.get(h))}
            for key, v in r.items():
                if k:
                    t[key].append(v)
        assert s.get(h).tobytes() == src.tobytes() and out.tobytes() == src.tobytes()
        backend = s.backend
    path.unlink(missing_ok=True)
    return {**{k: gbps(n, v) for k, v in t.items()}, "backend": backend}


def ray_spilling(size: int, d: Path, repeats: int) -> tuple[float, float] | None:
    try:
        import ray
    except ImportError:
        return None
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    capacity = max(80 * MiB, 3 * size)
    count = max(3, -(-3 * capacity // size))
    spill_dir = d / "ray-spill"
    spill_dir.mkdir(exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="rayb", dir="/tmp"))
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=capacity, _temp_dir=str(tmp),
             configure_logging=False, log_to_driver=False,
             _system_config={"object_spilling_config": json.dumps(
                 {"type": "filesystem", "params": {"directory_path": str(spill_dir)}})})
    try:
        spills, restores = [], []
        for k in range(repeats + 1):
            objs = [np.random.default_rng(i).integers(0, 255, size, dtype=np.uint8) for i in range(count)]
            refs = []
            fits = int(capacity * 0.8 // size)
            t_beyond = 0.0
            for i, o in enumerate(objs):
                t = timed(lambda: refs.append(ray.put(o)))
                if i >= fits:
                    t_beyond += t
            del objs
            spilled_bytes = (count - fits) * size
            # the first objects were spilled; get them back (each restore replaces another spilled one)
            t_get = 0.0
            for r in refs[:count - fits]:
                t = time.perf_counter()
                x = ray.get(r)
                assert x.nbytes == size
                t_get += time.perf_counter() - t
                del x
            if k:
                spills.append(spilled_bytes / t_beyond / 1e9)
                restores.append(spilled_bytes / t_get / 1e9)
            del refs
        return statistics.median(spills), statistics.median(restores)
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--dir", default=None, help="directory for spill files (default: a temp dir under /tmp)")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray's object spilling")
    a = ap.parse_args(argv)
    sizes = [1 * MiB, 8 * MiB, 32 * MiB] if a.quick else [1 * MiB, 16 * MiB, 256 * MiB]
    repeats = a.repeats or (3 if a.quick else 5)
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="rayaccel-bench-", dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    rows = []
    try:
        for size in sizes:
            src = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
            st = measure(src, base, repeats)
            ray_r = None if a.no_ray else ray_spilling(size, base, max(1, repeats // 2))
            rows.append((size, st["copy"], st["write"], st["read"], st, ray_r))
    finally:
        shutil.rmtree(base, ignore_errors=True) if not a.dir else None
    backend = rows[0][4]["backend"]
    print(f"rayaccel memory tiers: medians of {repeats} runs, GB/s (1e9 B/s); device tier: {backend}; "
          f"spill dir on {base}")
    print()
    print("device <-> host (raw = np.copyto into a warm buffer)")
    hdr = f"{'size':>8} | {'raw copy':>8} | {'store D->H':>10} {'ratio':>6} | {'store H->D':>10} {'ratio':>6}"
    print(hdr)
    print("-" * len(hdr))
    for size, copy, fw, fr, st, _ in rows:
        print(f"{size // MiB:>5} MiB | {copy:8.2f} | {st['d2h']:10.2f} {st['d2h'] / copy:6.0%} | "
              f"{st['h2d']:10.2f} {st['h2d'] / copy:6.0%}")
    print()
    print("disk (raw = os.write / readinto of the same bytes, 8 MiB chunks, no fsync; page cache warm)")
    hdr = (f"{'size':>8} | {'raw write':>9} | {'store spill':>11} {'ratio':>6} | {'Ray spill':>9} | "
           f"{'raw read':>8} | {'store restore':>13} {'ratio':>6} | {'Ray restore':>11}")
    print(hdr)
    print("-" * len(hdr))
    for size, copy, fw, fr, st, ray_r in rows:
        rs, rr = (f"{ray_r[0]:9.2f}", f"{ray_r[1]:11.2f}") if ray_r else (f"{'-':>9}", f"{'-':>11}")
        print(f"{size // MiB:>5} MiB | {fw:9.2f} | {st['spill']:11.2f} {st['spill'] / fw:6.0%} | {rs} | "
              f"{fr:8.2f} | {st['restore']:13.2f} {st['restore'] / fr:6.0%} | {rr}")
    print()
    print("Ray: object_store_memory = max(80 MiB, 3 x size), 3x capacity put, spilled objects read back; "
          "its spill figure includes the put copies (a lower bound).")
    print("Page cache: reads hit cached pages for every column (drop_caches is not available to this benchmark).")


if __name__ == "__main__":
    main()
