"""Spill files: chunked, checksummed, streamed, self-describing.

One object per file::

    offset 0   b"RAYACCSP"  magic (8 bytes)
    8          u16 version (2), u16 checksum algorithm id, u32 length of the JSON header (little endian)
    16         JSON header: name, kind, dtype, shape, nbytes, chunk_bytes, checksum (the algorithm's name)
    data_off   the object's bytes, written chunk by chunk straight from its buffer
    +nbytes    one digest per chunk (little endian, the algorithm's digest size each), then b"RAYACCEN"

Checksum algorithms (the id in the fixed header is the authority)::

    id 0  crc32     4-byte digest, ``zlib.crc32``            always available
    id 1  xxh3_64   8-byte digest, ``xxhash.xxh3_64``        needs the ``xxhash`` package
    id 2  xxh3_128  16-byte digest, ``xxhash.xxh3_128``      needs the ``xxhash`` package

New files use :data:`DEFAULT_ALGORITHM`, chosen at import: ``xxh3_64`` when
``xxhash`` is importable, else ``crc32``. Measured on this project's 2-core CI
machine, one thread, 256 MiB buffer: crc32 6.9 GB/s, xxh3_64 32 GB/s,
xxh3_128 32 GB/s (2 threads: 11.9 / 45 / 48 GB/s), so with xxhash the
checksum is no longer the bound against page-cache reads (~16-21 GB/s).
Both ``zlib.crc32`` and ``xxhash`` release the GIL on large buffers. Spilling
hashes each chunk on a helper thread while the next is written. Restoring
with xxh3 reads each chunk in 512 KiB pieces and hashes each piece on the
reading thread right after it lands, while it is still in the CPU cache: on
the 2-core CI machine that held 74-85% of a plain page-cache read, against
66-97% (and much more variance with the other core busy) for hashing whole
chunks on a helper thread. CRC-32 is too slow to hash inline (30% of a
page-cache read), so its chunks are hashed on helper threads (44%).
xxh3 is not a cryptographic hash; it guards against torn, truncated and
bit-flipped files, not against an adversary who can write the spill directory.

Version 1 files (written before the algorithm id existed: u32 version 1, CRC-32
digests) read as version 1 with algorithm id 0, so they still restore.

The store keeps each object's chunk digests in memory (the authority); the
trailer lets a file be checked on its own (:func:`verify_file`).

No ``fsync``: spill files are scratch space deleted at close, so durability is
not wanted (the benchmark's raw baseline uses the same policy).
"""

from __future__ import annotations

import errno
import json
import os
import struct
import threading
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..errors import CorruptObject, StoreError, StoreFull

try:  # optional speed-up; crc32 is the fallback
    import xxhash as _xxhash
except ImportError:  # pragma: no cover - depends on the environment
    _xxhash = None

MAGIC = b"RAYACCSP"
END = b"RAYACCEN"
VERSION = 2
DEFAULT_CHUNK_BYTES = 4 << 20
_FIXED = struct.Struct("<8sHHI")
_DISK_FULL = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}


@dataclass(frozen=True, slots=True)
class Algorithm:
    """A per-chunk checksum algorithm.

    Attributes:
        id: the number stored in the spill-file header. name: e.g. ``"xxh3_64"``.
        digest_bytes: size of one digest in the trailer. digest: bytes-like -> int, or
            None when the library it needs is missing. needs: what to install then.
        new: a fresh incremental hasher (``update(bytes)``, ``intdigest()``) giving the
            same digest as ``digest`` over the concatenated pieces.
        inline: restore hashes each piece right after reading it, on the reading
            thread, while it is still in the CPU cache (fast hashes); otherwise each
            chunk is hashed on a helper thread while the next is read (slow hashes).
    """

    id: int
    name: str
    digest_bytes: int
    digest: Callable[[Any], int] | None
    needs: str | None = None
    new: Callable[[], Any] | None = None
    inline: bool = False


class _Crc32:
    """Incremental ``zlib.crc32`` with the hasher interface of ``xxhash``."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: Any) -> None:
        self.value = zlib.crc32(data, self.value)

    def intdigest(self) -> int:
        return self.value


ALGORITHMS: dict[int, Algorithm] = {
    0: Algorithm(0, "crc32", 4, zlib.crc32, None, _Crc32),
    1: Algorithm(1, "xxh3_64", 8, _xxhash.xxh3_64_intdigest if _xxhash else None, "the xxhash package",
                 _xxhash.xxh3_64 if _xxhash else None, inline=True),
    2: Algorithm(2, "xxh3_128", 16, _xxhash.xxh3_128_intdigest if _xxhash else None, "the xxhash package",
                 _xxhash.xxh3_128 if _xxhash else None, inline=True),
}
#: restore reads fast-hash chunks in pieces of this size, each hashed while cache-hot
PIECE_BYTES = 512 << 10
_BY_NAME = {a.name: a for a in ALGORITHMS.values()}
#: algorithm of new spill files (chosen at import: xxh3_64 with xxhash, else crc32)
DEFAULT_ALGORITHM = "xxh3_64" if _xxhash is not None else "crc32"


def available_algorithms() -> tuple[str, ...]:
    """Names of the checksum algorithms usable in this process."""
    return tuple(a.name for a in ALGORITHMS.values() if a.digest is not None)


def algorithm(name: str | None) -> Algorithm:
    """The algorithm called ``name`` (None: :data:`DEFAULT_ALGORITHM`).

    Raises:
        StoreError: unknown, or its library is not installed (the message says which).
    """
    a = _BY_NAME.get(DEFAULT_ALGORITHM if name is None else name)
    if a is None:
        raise StoreError(f"unknown spill checksum {name!r}; use one of {', '.join(_BY_NAME)}")
    if a.digest is None:
        raise StoreError(f"spill checksum {a.name!r} needs {a.needs} (pip install xxhash); "
                         f"available here: {', '.join(available_algorithms())}")
    return a


_algorithm_named = algorithm


def _pack_digests(alg: Algorithm, digests: tuple[int, ...]) -> bytes:
    return b"".join(d.to_bytes(alg.digest_bytes, "little") for d in digests)


def _unpack_digests(alg: Algorithm, raw: bytes) -> tuple[int, ...]:
    n = alg.digest_bytes
    return tuple(int.from_bytes(raw[i:i + n], "little") for i in range(0, len(raw), n))


_executor: ThreadPoolExecutor | None = None
_executor_lock = threading.Lock()


def _checksummer() -> ThreadPoolExecutor:
    global _executor
    with _executor_lock:
        if _executor is None:
            _executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="rayaccel-hash")
        return _executor


@dataclass(frozen=True, slots=True)
class SpillRecord:
    """Where a spilled object lives and what its bytes must checksum to.

    Attributes:
        path: the spill file. nbytes: object size in bytes.
        data_offset: where the object's bytes start in the file.
        chunk_bytes: chunk size used for the checksums.
        digests: the checksum of each chunk, in order.
        algorithm: name of the checksum algorithm (see :data:`ALGORITHMS`).
    """

    path: Path
    nbytes: int
    data_offset: int
    chunk_bytes: int
    digests: tuple[int, ...]
    algorithm: str = "crc32"

    @property
    def crcs(self) -> tuple[int, ...]:
        """The chunk digests (the name from when they were always CRC-32s)."""
        return self.digests

    @property
    def file_bytes(self) -> int:
        """Exact size the file must have."""
        return self.data_offset + self.nbytes + _BY_NAME[self.algorithm].digest_bytes * len(self.digests) + len(END)


def _write_chunk(fd: int, view: memoryview) -> None:
    """Write all of ``view`` to ``fd`` (a seam tests patch to simulate a full disk)."""
    while view:
        n = os.write(fd, view)
        view = view[n:]


def write_spill(path: Path, data: memoryview, meta: dict[str, Any], chunk_bytes: int = DEFAULT_CHUNK_BYTES,
                algorithm: str | None = None) -> SpillRecord:
    """Stream ``data`` (a C-contiguous byte view) to a new spill file.

    The bytes are written from the object's own buffer chunk by chunk (no copy
    of the object is made); each chunk's digest is computed on a helper thread
    while the next one is written.

    Args:
        path: file to create (must not exist). data: the object's bytes.
        meta: JSON-able description stored in the header (name, kind, dtype, shape).
        chunk_bytes: chunk size, > 0.
        algorithm: checksum name (None: :data:`DEFAULT_ALGORITHM`, read at call time).

    Returns:
        The record the store keeps to verify the file on restore.

    Raises:
        StoreError: an unknown or unavailable algorithm (nothing is written).
        StoreFull: the disk is full (ENOSPC/EDQUOT); the partial file is removed.
        OSError: any other I/O failure (the partial file is removed).
    """
    alg = _algorithm_named(algorithm)
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    nbytes = data.nbytes
    header = json.dumps({**meta, "nbytes": nbytes, "chunk_bytes": chunk_bytes, "checksum": alg.name},
                        sort_keys=True).encode()
    data_offset = _FIXED.size + len(header)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    futures: list[Future] = []
    pool = _checksummer()
    try:
        try:
            _write_chunk(fd, memoryview(_FIXED.pack(MAGIC, VERSION, alg.id, len(header)) + header))
            for start in range(0, nbytes, chunk_bytes):
                chunk = data[start:start + chunk_bytes]
                futures.append(pool.submit(alg.digest, chunk))
                _write_chunk(fd, chunk)
            digests = tuple(f.result() for f in futures)
            _write_chunk(fd, memoryview(_pack_digests(alg, digests) + END))
        finally:
            for f in futures:
                f.cancel()
            os.close(fd)
    except OSError as e:
        _unlink_quietly(path)
        if e.errno in _DISK_FULL:
            raise StoreFull(
                f"disk full while spilling {meta.get('name', '?')} ({nbytes} bytes) to {path.parent}: {e.strerror}; "
                "the object stays in the tier above"
            ) from None
        raise
    except BaseException:
        _unlink_quietly(path)
        raise
    return SpillRecord(path=path, nbytes=nbytes, data_offset=data_offset, chunk_bytes=chunk_bytes,
                       digests=digests, algorithm=alg.name)


def _header_algorithm(version: int, alg_id: int, corrupt: Callable[[str], CorruptObject]) -> Algorithm:
    """The algorithm a file's fixed header names, or the CorruptObject to raise."""
    if version not in (1, VERSION) or (version == 1 and alg_id != 0):
        raise corrupt("has a damaged header")
    alg = ALGORITHMS.get(alg_id)
    if alg is None:
        known = ", ".join(f"{a.id}={a.name}" for a in ALGORITHMS.values())
        raise corrupt(f"names checksum algorithm id {alg_id}, which this version of rayaccel does not know "
                      f"(known: {known}); it was written by a newer rayaccel or is damaged")
    if alg.digest is None:
        raise corrupt(f"is checksummed with {alg.name}, which needs {alg.needs} (pip install xxhash) to verify")
    return alg


def read_spill(record: SpillRecord, out: memoryview, name: str, key: object = None) -> None:
    """Read a spilled object into ``out`` (a writable byte view of ``record.nbytes``), verifying it.

    Reads with ``readinto`` straight into ``out`` (no intermediate copy). Fast
    hashes (xxh3) read each chunk in :data:`PIECE_BYTES` pieces and hash each
    piece right after reading it, while it is in the CPU cache; CRC-32 hashes
    each chunk on a helper thread while the next one is read (measured fastest
    for each, see ``benchmarks/memory_tiers.py`` and the module docstring).

    Raises:
        CorruptObject: the file is missing, truncated, has a bad header, names an
            unknown (or here unusable) checksum algorithm, or a chunk fails its
            checksum (message names the object and the file). ``out`` then holds
            garbage and must be discarded.
    """
    out = out.cast("B") if out.format != "B" or out.ndim != 1 else out
    if out.nbytes != record.nbytes:
        raise ValueError(f"output buffer has {out.nbytes} bytes, object has {record.nbytes}")
    path = record.path

    def corrupt(why: str) -> CorruptObject:
        return CorruptObject(f"object {name}: spill file {path} {why}; the object is lost", key=key)

    try:
        f = open(path, "rb", buffering=0)
    except FileNotFoundError:
        raise corrupt("is missing") from None
    futures: list[Future] = []
    pool = _checksummer()
    with f:
        size = os.fstat(f.fileno()).st_size
        fixed = f.read(_FIXED.size)
        magic, version, alg_id, hlen = _FIXED.unpack(fixed) if len(fixed) == _FIXED.size else (b"", 0, 0, 0)
        if size != record.file_bytes:
            what = "is truncated" if size < record.file_bytes else "has trailing bytes"
            raise corrupt(f"{what}: {size} bytes, expected {record.file_bytes}")
        if magic != MAGIC or _FIXED.size + hlen != record.data_offset:
            raise corrupt("has a damaged header")
        alg = _header_algorithm(version, alg_id, corrupt)
        if alg.name != record.algorithm:
            raise corrupt(f"has a damaged header (algorithm {alg.name}, the store wrote {record.algorithm})")
        f.seek(record.data_offset)

        def fill(view: memoryview, at: int) -> None:
            got = 0
            while got < view.nbytes:
                n = f.readinto(view[got:])
                if not n:
                    raise corrupt(f"ended early at byte {at + got}")
                got += n

        chunks = range(0, record.nbytes, record.chunk_bytes)
        if alg.inline:  # read a piece, hash it while it is in cache, next piece
            digests = []
            for start in chunks:
                h = alg.new()
                for lo in range(start, min(start + record.chunk_bytes, record.nbytes), PIECE_BYTES):
                    piece = out[lo:min(lo + PIECE_BYTES, start + record.chunk_bytes)]
                    fill(piece, lo)
                    h.update(piece)
                digests.append(h.intdigest())
        else:  # hash chunk k on a helper thread while chunk k+1 is read
            try:
                for start in chunks:
                    chunk = out[start:start + record.chunk_bytes]
                    fill(chunk, start)
                    futures.append(pool.submit(alg.digest, chunk))
                digests = [fut.result() for fut in futures]
            finally:
                for fut in futures:
                    fut.cancel()
        trailer = f.read(alg.digest_bytes * len(record.digests) + len(END))
    for i, (got_digest, want) in enumerate(zip(digests, record.digests)):
        if got_digest != want:
            lo = i * record.chunk_bytes
            raise corrupt(f"fails its {alg.name} checksum in bytes {lo}-{min(lo + record.chunk_bytes, record.nbytes)}")
    if trailer[-len(END):] != END or _unpack_digests(alg, trailer[:-len(END)]) != record.digests:
        raise corrupt("has a damaged checksum trailer")


def verify_file(path: Path) -> dict[str, Any]:
    """Check a spill file on its own (against its trailer); return its header.

    Works for every format version and checksum algorithm this module knows.

    Raises:
        CorruptObject: truncated, damaged header or trailer, an unknown checksum
            algorithm id, or a bad chunk.
    """
    path = Path(path)

    def corrupt(why: str) -> CorruptObject:
        return CorruptObject(f"spill file {path} {why}")

    with open(path, "rb") as f:
        fixed = f.read(_FIXED.size)
        if len(fixed) != _FIXED.size or _FIXED.unpack(fixed)[0] != MAGIC:
            raise corrupt("has a damaged header")
        _, version, alg_id, hlen = _FIXED.unpack(fixed)
        alg = _header_algorithm(version, alg_id, corrupt)
        try:
            meta = json.loads(f.read(hlen))
            nbytes, chunk = int(meta["nbytes"]), int(meta["chunk_bytes"])
        except (ValueError, KeyError, TypeError):
            raise corrupt("has a damaged header") from None
        nchunks = -(-nbytes // chunk) if nbytes else 0
        f.seek(_FIXED.size + hlen + nbytes)
        trailer = f.read(alg.digest_bytes * nchunks + len(END))
    if len(trailer) != alg.digest_bytes * nchunks + len(END):
        raise CorruptObject(f"spill file {path} is truncated", key=meta.get("name"))
    digests = _unpack_digests(alg, trailer[:-len(END)])
    record = SpillRecord(path, nbytes, _FIXED.size + hlen, chunk, digests, alg.name)
    buf = bytearray(nbytes)
    read_spill(record, memoryview(buf), str(meta.get("name")), meta.get("name"))
    return meta


_pending: set[Future] = set()


def remove_later(path: Path) -> None:
    """Unlink a spill file on a helper thread (freeing its page-cache pages is off the caller's path)."""
    fut = _checksummer().submit(_unlink_quietly, path)
    _pending.add(fut)
    fut.add_done_callback(_pending.discard)


def drain() -> None:
    """Wait until every file passed to :func:`remove_later` is gone."""
    for fut in list(_pending):
        fut.result()


def _unlink_quietly(path: Path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
