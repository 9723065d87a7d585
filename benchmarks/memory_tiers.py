"""Tiered store spill/restore bandwidth vs raw copies and vs Ray's own object spilling, in one run.

    python benchmarks/memory_tiers.py            # 1, 16, 256 MiB; cold page cache when root can drop it
    python benchmarks/memory_tiers.py --quick    # 1, 8, 32 MiB, fewer repeats
    python benchmarks/memory_tiers.py --no-cold  # warm page cache only

Table 1, device <-> host: the raw baseline is ``np.copyto`` into a buffer that
was already written once (the fastest memcpy, no page faults); the store's
figure is the wall time of ``store.spill(h, "host")`` (device -> host) and of
``store.get(h)`` (host -> device) on the same bytes. Without a GPU the device
tier is CPU memory, so both are memcpy; ``scripts/device_memory_check.py`` does
the same on a real GPU.

Tables 2 and 3, disk: raw is a plain ``os.write`` of the same bytes in 8 MiB
chunks to a new file in the same directory and a ``readinto`` back into a warm
buffer, in 8 MiB and in 512 KiB chunks (the baseline is the faster: from a
cold cache small reads pipeline with the kernel's readahead and beat 8 MiB
ones, ~2.1 vs ~1.7 GB/s here); the store's figure is ``store.spill(h, "disk")`` (host -> disk, with the
per-chunk checksums and header) and ``store.get(h)`` (disk -> device, verified).
Neither side fsyncs.

* warm (table 2): the files just written are still in the page cache, so reads
  run at memory speed for raw, store and Ray alike (a test of the CPU cost of
  the store's checksums and copies, not of the disk).
* cold (table 3, ``--cold``, on by default when ``sync; echo 3 >
  /proc/sys/vm/drop_caches`` works, i.e. as root on Linux): ``sync`` before
  every timed write (so no write starts behind another's dirty pages) and
  ``sync`` + drop caches before every timed read, for raw, store and Ray's
  restore alike, so reads come from the device. Writes still land in the page
  cache (no fsync on either side).

Ray: ``ray.init(object_store_memory=...)`` a few object sizes big, spilling to
the same directory; ``ray.put`` of 3x the store's capacity forces spilling
(spill GB/s = bytes beyond capacity / time of those puts, which also includes
the copies into plasma, so it is a lower bound) and ``ray.get`` of the spilled
objects restores them (restore GB/s = their bytes / time); in cold mode one
round drops the page cache before the gets, another does not.

Medians over ``--repeats`` after one warm-up round. The header line also gives
the checksum throughput of crc32 and xxh3 on one core of this machine.
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
SMALL_CHUNK = 512 << 10  # cold reads of small pieces pipeline with kernel readahead


def gbps(nbytes: int, seconds: list[float]) -> float:
    return nbytes / statistics.median(seconds) / 1e9


def timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


DROP_CACHES = Path("/proc/sys/vm/drop_caches")


def drop_caches() -> None:
    """Write back dirty pages and drop the page cache (needs root). Raises OSError when not allowed."""
    os.sync()
    DROP_CACHES.write_text("3\n")


def can_drop_caches() -> str | None:
    """None when :func:`drop_caches` works here, else why not."""
    try:
        drop_caches()
    except OSError as e:
        return f"cannot drop the page cache ({DROP_CACHES}: {e.strerror}; needs root on Linux)"
    return None


def checksum_gbps() -> dict[str, float]:
    """One-thread throughput of each available spill checksum on a 64 MiB buffer (median of 5)."""
    from rayaccel.memory import spill

    buf = memoryview(np.random.default_rng(0).integers(0, 255, 64 * MiB, dtype=np.uint8))
    out = {}
    for alg in spill.ALGORITHMS.values():
        if alg.digest is not None:
            alg.digest(buf)
            out[alg.name] = gbps(buf.nbytes, [timed(lambda: alg.digest(buf)) for _ in range(5)])
    return out


def measure(src: np.ndarray, d: Path, repeats: int, cold: bool, checksum: str | None) -> dict[str, float]:
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

    def read(chunk: int = CHUNK) -> None:
        with open(path, "rb", buffering=0) as f:
            for i in range(0, n, chunk):
                f.readinto(omv[i:i + chunk])

    keys = ("copy", "d2h", "h2d", "write", "spill", "read", "read_small", "restore",
            "cold_write", "cold_spill", "cold_read", "cold_read_small", "cold_restore")
    t = {k: [] for k in keys}
    with Store(device_bytes=2 * n, host_bytes=2 * n, spill_dir=d, device="cpu", checksum=checksum) as s:
        h = s.put(src.copy())
        for k in range(repeats + 1):  # memcpy vs device <-> host
            r = {"copy": timed(lambda: np.copyto(dst, src)),
                 "d2h": timed(lambda: s.spill(h, to="host")),
                 "h2d": timed(lambda: s.get(h))}  # the returned view is dropped at once
            for key, v in r.items():
                if k:
                    t[key].append(v)
        for mode in ("warm", "cold") if cold else ("warm",):
            pre = "cold_" if mode == "cold" else ""
            settle = os.sync if mode == "cold" else (lambda: None)
            before_read = drop_caches if mode == "cold" else (lambda: None)
            for k in range(repeats + 1):  # plain file vs host <-> disk
                path.unlink(missing_ok=True)
                s.spill(h, to="host")
                r = {}
                settle()
                r["write"] = timed(write)
                settle()
                r["spill"] = timed(lambda: s.spill(h, to="disk"))
                fns = {"read": read, "read_small": lambda: read(SMALL_CHUNK), "restore": lambda: s.get(h)}
                for key in list(fns)[::1 if k % 2 else -1]:  # alternate which goes first
                    before_read()
                    r[key] = timed(fns[key])
                for key, v in r.items():
                    if k:
                        t[pre + key].append(v)
        assert s.get(h).tobytes() == src.tobytes() and out.tobytes() == src.tobytes()
        backend, alg = s.backend, s.checksum
    path.unlink(missing_ok=True)
    res = {k: gbps(n, v) for k, v in t.items() if v}
    for pre in ("", "cold_"):  # the raw baseline is the faster of the two plain reads
        if pre + "read" in res:
            res[pre + "read"] = max(res[pre + "read"], res.pop(pre + "read_small"))
    return {**res, "backend": backend, "checksum": alg}


def ray_spilling(size: int, d: Path, repeats: int, cold: bool) -> dict[str, float] | None:
    """Ray's object spilling of the same sizes: ``spill``, ``restore`` (warm) and ``cold_restore`` GB/s."""
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
        res: dict[str, list[float]] = {"spill": [], "restore": [], "cold_restore": []}
        rounds = [(k, m) for k in range(repeats + 1) for m in (("warm", "cold") if cold else ("warm",))]
        for k, mode in rounds:
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
            if mode == "cold":
                time.sleep(0.5)  # let the IO workers finish writing before the cache is dropped
                drop_caches()
            # the first objects were spilled; get them back (each restore replaces another spilled one)
            t_get = 0.0
            for r in refs[:count - fits]:
                t = time.perf_counter()
                x = ray.get(r)
                assert x.nbytes == size
                t_get += time.perf_counter() - t
                del x
            if k:
                res["spill"].append(spilled_bytes / t_beyond / 1e9)
                res["cold_restore" if mode == "cold" else "restore"].append(spilled_bytes / t_get / 1e9)
            refs.clear()
        return {key: statistics.median(v) for key, v in res.items() if v}
    finally:
        ray.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def _ratio(store: float, raw: float) -> str:
    r = store / raw
    return f"{r:6.0%}{'*' if r < 0.7 else ' '}"


def _ray(r: dict | None, key: str, width: int) -> str:
    return f"{r[key]:{width}.2f}" if r and key in r else f"{'-':>{width}}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer repeats")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--dir", default=None, help="directory for spill files (default: a temp dir under /tmp)")
    ap.add_argument("--no-ray", action="store_true", help="skip Ray's object spilling")
    ap.add_argument("--cold", dest="cold", action="store_true", default=None,
                    help="also measure with the page cache dropped before every read (default: on when possible)")
    ap.add_argument("--no-cold", dest="cold", action="store_false", help="warm page cache only")
    ap.add_argument("--checksum", default=None, help="spill checksum of the store (default: the library's)")
    a = ap.parse_args(argv)
    sizes = [1 * MiB, 8 * MiB, 32 * MiB] if a.quick else [1 * MiB, 16 * MiB, 256 * MiB]
    repeats = a.repeats or (3 if a.quick else 5)
    why_not = can_drop_caches() if a.cold is not False else None
    if a.cold and why_not:
        raise SystemExit(f"--cold: {why_not}")
    cold = a.cold is not False and why_not is None
    base = Path(a.dir) if a.dir else Path(tempfile.mkdtemp(prefix="rayaccel-bench-", dir="/tmp"))
    base.mkdir(parents=True, exist_ok=True)
    sums = checksum_gbps()
    rows = []
    try:
        for size in sizes:
            src = np.random.default_rng(size).integers(0, 255, size, dtype=np.uint8)
            st = measure(src, base, repeats, cold, a.checksum)
            ray_r = None if a.no_ray else ray_spilling(size, base, max(1, repeats // 2), cold)
            rows.append((size, st, ray_r))
    finally:
        shutil.rmtree(base, ignore_errors=True) if not a.dir else None
    st0 = rows[0][1]
    print(f"rayaccel memory tiers: medians of {repeats} runs, GB/s (1e9 B/s); device tier: {st0['backend']}; "
          f"spill checksum: {st0['checksum']}; spill dir on {base}")
    print("checksum throughput, one core, 64 MiB: " + ", ".join(f"{k} {v:.1f} GB/s" for k, v in sums.items()))
    print("* = below the 70% target")
    print()
    print("device <-> host (raw = np.copyto into a warm buffer)")
    hdr = f"{'size':>8} | {'raw copy':>8} | {'store D->H':>10} {'ratio':>7} | {'store H->D':>10} {'ratio':>7}"
    print(hdr)
    print("-" * len(hdr))
    for size, st, _ in rows:
        print(f"{size // MiB:>5} MiB | {st['copy']:8.2f} | {st['d2h']:10.2f} {_ratio(st['d2h'], st['copy'])} | "
              f"{st['h2d']:10.2f} {_ratio(st['h2d'], st['copy'])}")
    for pre, title in (("", "WARM page cache: files just written, reads hit cached pages for every column"),
                       ("cold_", "COLD page cache: sync before each write, sync + drop_caches before each read "
                                 "(raw, store and Ray alike)")):
        if pre and not cold:
            continue
        print()
        print(f"disk, {title}")
        print("(raw write = os.write in 8 MiB chunks; raw read = readinto in 8 MiB or 512 KiB chunks, "
              "whichever was faster; no fsync)")
        hdr = (f"{'size':>8} | {'raw write':>9} | {'store spill':>11} {'ratio':>7} | {'Ray spill':>9} | "
               f"{'raw read':>8} | {'store restore':>13} {'ratio':>7} | {'Ray restore':>11}")
        print(hdr)
        print("-" * len(hdr))
        for size, st, ray_r in rows:
            print(f"{size // MiB:>5} MiB | {st[pre + 'write']:9.2f} | {st[pre + 'spill']:11.2f} "
                  f"{_ratio(st[pre + 'spill'], st[pre + 'write'])} | {_ray(ray_r, 'spill', 9)} | "
                  f"{st[pre + 'read']:8.2f} | {st[pre + 'restore']:13.2f} "
                  f"{_ratio(st[pre + 'restore'], st[pre + 'read'])} | {_ray(ray_r, pre + 'restore', 11)}")
    print()
    print("Ray: object_store_memory = max(80 MiB, 3 x size), 3x capacity put, spilled objects read back; "
          "its spill figure includes the put copies (a lower bound).")
    if not cold:
        print("Page cache: only warm figures; " + (why_not or "--no-cold given") + ".")


if __name__ == "__main__":
    main()
