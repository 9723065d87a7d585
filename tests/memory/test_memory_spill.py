"""Spill files: chunking, checksums, corruption and truncation, a full disk."""

from __future__ import annotations

import errno
import json
import os
import struct
import subprocess
import sys
import uuid
import zlib
from pathlib import Path

import numpy as np
import pytest

from rayaccel.errors import CorruptObject, StoreError, StoreFull
from rayaccel.memory import Store, verify_file
from rayaccel.memory import spill as spill_mod

MiB = 1 << 20


def arr(seed: int, nbytes: int = MiB) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 255, nbytes, dtype=np.uint8)


@pytest.fixture
def store(tmp_path):
    with Store(device_bytes=2 * MiB, host_bytes=2 * MiB, spill_dir=tmp_path, device="cpu", chunk_bytes=256 << 10) as s:
        yield s


def spilled(store, seed=0, nbytes=MiB, name=None):
    h = store.put(arr(seed, nbytes), name=name)
    store.spill(h, to="disk")
    (path,) = [p for p in store.spill_dir.iterdir() if p.name.startswith(f"{h.key}-")]
    return h, path


ALGS = [pytest.param(name, id=name, marks=pytest.mark.skipif(
    name not in spill_mod.available_algorithms(), reason=f"{name} needs the xxhash package"))
    for name in ("crc32", "xxh3_64", "xxh3_128")]
DIGEST_BYTES = {"crc32": 4, "xxh3_64": 8, "xxh3_128": 16}
ALG_IDS = {"crc32": 0, "xxh3_64": 1, "xxh3_128": 2}


@pytest.fixture(params=ALGS)
def alg_store(request, tmp_path):
    with Store(device_bytes=2 * MiB, host_bytes=2 * MiB, spill_dir=tmp_path, device="cpu", chunk_bytes=256 << 10,
               checksum=request.param) as s:
        yield s


def test_default_algorithm_is_xxh3_when_xxhash_is_installed(store):
    try:
        import xxhash  # noqa: F401
    except ImportError:
        assert spill_mod.DEFAULT_ALGORITHM == "crc32" and store.checksum == "crc32"
    else:
        assert spill_mod.DEFAULT_ALGORITHM == "xxh3_64" and store.checksum == "xxh3_64"


def test_file_is_chunked_and_verifiable(alg_store):
    alg = alg_store.checksum
    h, path = spilled(alg_store, nbytes=MiB + 123)
    meta = verify_file(path)
    assert meta["nbytes"] == MiB + 123 and meta["chunk_bytes"] == 256 << 10 and meta["name"] == h.name
    assert meta["checksum"] == alg
    raw = path.read_bytes()
    version, alg_id, hlen = (int.from_bytes(raw[a:b], "little") for a, b in ((8, 10), (10, 12), (12, 16)))
    assert (version, alg_id) == (2, ALG_IDS[alg])
    assert raw[:8] == b"RAYACCSP" and raw[-8:] == b"RAYACCEN"
    assert len(raw) == 16 + hlen + MiB + 123 + DIGEST_BYTES[alg] * 5 + 8  # 5 chunks of 256 KiB, one digest each
    assert raw[16 + hlen:16 + hlen + MiB + 123] == arr(0, MiB + 123).tobytes()


@pytest.mark.parametrize("where", ["first-chunk", "middle-chunk", "last-byte"])
def test_flipped_bit_raises_corrupt_object_naming_the_object(alg_store, where):
    store = alg_store
    h, path = spilled(store, name="weights-7")
    data_offset = path.stat().st_size - MiB - DIGEST_BYTES[store.checksum] * 4 - 8
    pos = {"first-chunk": data_offset, "middle-chunk": data_offset + MiB // 2 + 17, "last-byte": data_offset + MiB - 1}[where]
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(CorruptObject, match=f"weights-7.*fails its {store.checksum} checksum") as info:
        store.get(h)
    assert info.value.key == h.key
    # the object is reported lost, never returned wrong
    with pytest.raises(CorruptObject, match="weights-7"):
        store.get(h)
    st = store.stats()
    assert st["lost"] == 1 and st["disk_bytes"] == 0 and st["objects"] == 0
    assert not path.exists()
    store.delete(h)  # a lost object can still be deleted


@pytest.mark.parametrize("keep", [0, 10, MiB // 2, -1], ids=["empty", "header-only", "half", "one-byte-short"])
def test_truncated_file_raises_corrupt_object(store, keep):
    h, path = spilled(store, name="kv-cache")
    size = path.stat().st_size
    os.truncate(path, keep if keep >= 0 else size - 1)
    with pytest.raises(CorruptObject, match="kv-cache.*truncated"):
        store.get(h)


def test_missing_file_raises_corrupt_object(store):
    h, path = spilled(store, name="gone")
    path.unlink()
    with pytest.raises(CorruptObject, match="gone.*missing"):
        store.get(h)


def test_damaged_header_and_trailer(store):
    h, path = spilled(store, seed=1, name="hdr")
    with open(path, "r+b") as f:
        f.write(b"XXXX")
    with pytest.raises(CorruptObject, match="hdr.*header"):
        store.get(h)
    h2, path2 = spilled(store, seed=2, name="trl")
    with open(path2, "r+b") as f:
        f.seek(-3, os.SEEK_END)
        f.write(b"zzz")
    with pytest.raises(CorruptObject, match="trl.*trailer"):
        store.get(h2)


def test_corrupt_standalone_file(store):
    _, path = spilled(store)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00\x01\x02")
    with pytest.raises(CorruptObject):
        verify_file(path)


def test_disk_budget_full_keeps_objects_above(tmp_path):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, disk_bytes=MiB, device="cpu") as s:
        hs = [s.put(arr(i)) for i in range(3)]  # device, host, disk all full
        with pytest.raises(StoreFull):
            s.put(arr(9))
        with pytest.raises(StoreFull):
            s.spill(hs[2], to="disk")
        assert [s.tier(h) for h in hs] == ["disk", "host", "device"]
        for i, h in enumerate(hs):
            assert np.array_equal(s.get(h), arr(i))


def test_enospc_during_write_loses_nothing(store, monkeypatch):
    h = store.put(arr(3))
    store.spill(h, to="host")
    calls = {"n": 0}
    real = spill_mod._write_chunk

    def flaky(fd, view):
        calls["n"] += 1
        if calls["n"] == 3:  # header, first chunk, then the disk fills up
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, view)

    monkeypatch.setattr(spill_mod, "_write_chunk", flaky)
    with pytest.raises(StoreFull, match="disk full.*stays in the tier above"):
        store.spill(h, to="disk")
    assert store.tier(h) == "host" and list(store.spill_dir.iterdir()) == []
    assert np.array_equal(store.get(h), arr(3))


def test_other_io_errors_propagate_and_remove_partial_file(store, monkeypatch):
    h = store.put(arr(4))

    def broken(fd, view):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(spill_mod, "_write_chunk", broken)
    with pytest.raises(OSError, match="Input/output"):
        store.spill(h, to="disk")
    assert store.tier(h) == "device" and list(store.spill_dir.iterdir()) == []


@pytest.fixture
def tiny_tmpfs(tmp_path):
    mnt = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mnt)], capture_output=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({r.stderr.decode().strip()}); covered by the ENOSPC and budget tests")
    yield mnt
    subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_real_full_disk_on_a_2mib_tmpfs(tiny_tmpfs):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tiny_tmpfs, device="cpu") as s:
        hs = [s.put(arr(i, 700 << 10)) for i in range(4)]  # 2 spill files of 700 KiB fit
        with pytest.raises(StoreFull, match="disk full|no tier"):
            for i in range(4, 8):
                hs.append(s.put(arr(i, 700 << 10)))
        for i, h in enumerate(hs):
            assert np.array_equal(s.get(h), arr(i, 700 << 10))
        leftovers = [p for p in s.spill_dir.iterdir()]
        assert all(p.stat().st_size > 700 << 10 for p in leftovers)  # no partial file left behind


def test_spill_files_removed_at_close_and_by_finalizer(tmp_path):
    s = Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu")
    h = s.put(arr(0))
    s.spill(h, to="disk")
    d = s.spill_dir
    del s, h
    import gc

    gc.collect()
    assert not d.exists()


def test_large_objects_stream_in_chunks(tmp_path, monkeypatch):
    sizes = []
    real = spill_mod._write_chunk
    monkeypatch.setattr(spill_mod, "_write_chunk", lambda fd, v: (sizes.append(v.nbytes), real(fd, v)))
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", chunk_bytes=64 << 10) as s:
        h = s.put(arr(0, 4 * MiB))  # too big for memory tiers: streamed straight to disk
        assert s.tier(h) == "disk"
        assert max(sizes) <= 64 << 10 and sum(sizes) > 4 * MiB
        assert np.array_equal(s.get(h), arr(0, 4 * MiB))


def _legacy_v1_file(path: Path, data: bytes, chunk: int) -> None:
    """A spill file as the first version wrote it: u32 version 1, CRC-32 digests, no algorithm id."""
    header = json.dumps({"name": "old", "kind": "numpy", "dtype": "|u1", "shape": [len(data)],
                         "nbytes": len(data), "chunk_bytes": chunk}, sort_keys=True).encode()
    crcs = [zlib.crc32(data[i:i + chunk]) for i in range(0, len(data), chunk)]
    path.write_bytes(struct.pack("<8sII", b"RAYACCSP", 1, len(header)) + header + data
                     + struct.pack(f"<{len(crcs)}I", *crcs) + b"RAYACCEN")


def test_version_1_crc32_file_still_verifies_and_reads(tmp_path):
    data = arr(5, 300_000).tobytes()
    path = tmp_path / "old.spill"
    _legacy_v1_file(path, data, 64 << 10)
    assert verify_file(path)["name"] == "old"
    hlen = int.from_bytes(path.read_bytes()[12:16], "little")
    record = spill_mod.SpillRecord(path, len(data), 16 + hlen, 64 << 10,
                                   tuple(zlib.crc32(data[i:i + (64 << 10)]) for i in range(0, len(data), 64 << 10)))
    out = bytearray(len(data))
    spill_mod.read_spill(record, memoryview(out), "old")
    assert bytes(out) == data and record.algorithm == "crc32" and record.crcs == record.digests


def test_crc32_file_restores_in_a_store_whose_default_is_another(tmp_path, monkeypatch):
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", chunk_bytes=256 << 10) as s:
        monkeypatch.setattr(s, "checksum", "crc32")  # files written now use CRC-32
        h = s.put(arr(6))
        s.spill(h, to="disk")
        (path,) = s.spill_dir.iterdir()
        assert int.from_bytes(path.read_bytes()[10:12], "little") == 0  # algorithm id 0 = crc32
        monkeypatch.setattr(s, "checksum", spill_mod.DEFAULT_ALGORITHM)
        h2 = s.put(arr(7))
        s.spill(h2, to="disk")
        assert np.array_equal(s.get(h), arr(6)) and np.array_equal(s.get(h2), arr(7))
        assert s.stats()["restores"] == 2


@pytest.mark.parametrize("alg_id", [3, 99, 0xFFFF])
def test_unknown_algorithm_id_raises_corrupt_object(store, alg_id):
    h, path = spilled(store, name="mystery")
    with open(path, "r+b") as f:
        f.seek(10)
        f.write(alg_id.to_bytes(2, "little"))
    with pytest.raises(CorruptObject, match=f"algorithm id {alg_id}.*does not know.*0=crc32"):
        verify_file(path)
    with pytest.raises(CorruptObject, match=f"mystery.*algorithm id {alg_id}, which this version") as info:
        store.get(h)
    assert info.value.key == h.key and store.stats()["lost"] == 1


def test_version_1_header_with_an_algorithm_id_is_damaged(store):
    h, path = spilled(store, name="v1bad")
    with open(path, "r+b") as f:
        f.seek(8)
        f.write((1).to_bytes(2, "little") + (1).to_bytes(2, "little"))  # v1 never had an algorithm id
    with pytest.raises(CorruptObject, match="v1bad.*damaged header"):
        store.get(h)


def test_unknown_or_unavailable_checksum_name_is_rejected(tmp_path, monkeypatch):
    with pytest.raises(StoreError, match="unknown spill checksum 'md5'.*crc32"):
        Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", checksum="md5")
    missing = spill_mod.Algorithm(1, "xxh3_64", 8, None, "the xxhash package")
    monkeypatch.setitem(spill_mod.ALGORITHMS, 1, missing)
    monkeypatch.setitem(spill_mod._BY_NAME, "xxh3_64", missing)
    with pytest.raises(StoreError, match="xxh3_64.*needs the xxhash package.*pip install xxhash"):
        Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", checksum="xxh3_64")


def test_file_needing_a_missing_library_says_what_to_install(tmp_path, monkeypatch):
    if "xxh3_64" not in spill_mod.available_algorithms():
        pytest.skip("needs xxhash to write the file")
    with Store(device_bytes=MiB, host_bytes=MiB, spill_dir=tmp_path, device="cpu", checksum="xxh3_64") as s:
        h, path = spilled(s, name="needs-xx")
        missing = spill_mod.Algorithm(1, "xxh3_64", 8, None, "the xxhash package")
        monkeypatch.setitem(spill_mod.ALGORITHMS, 1, missing)
        monkeypatch.setitem(spill_mod._BY_NAME, "xxh3_64", missing)
        with pytest.raises(CorruptObject, match="needs-xx.*xxh3_64.*needs the xxhash package"):
            s.get(h)


@pytest.mark.parametrize("alg", ALGS)
@pytest.mark.parametrize("chunk", [1000, 512 << 10, MiB + 3, 4 * MiB], ids=["tiny", "one-piece", "odd", "default"])
def test_round_trip_and_corruption_for_any_chunk_and_piece_split(tmp_path, alg, chunk):
    data = arr(8, 3 * MiB + 7)
    path = tmp_path / "x.spill"
    record = spill_mod.write_spill(path, memoryview(data), {"name": "rt"}, chunk, alg)
    out = np.zeros_like(data)
    spill_mod.read_spill(record, memoryview(out), "rt")
    assert np.array_equal(out, data) and verify_file(path)["checksum"] == alg
    bad = min(2 * chunk + (700 << 10) if chunk > 1000 else 5 * chunk + 3, data.nbytes - 1)  # past the first piece
    with open(path, "r+b") as f:
        f.seek(record.data_offset + bad)
        b = f.read(1)
        f.seek(record.data_offset + bad)
        f.write(bytes([b[0] ^ 1]))
    lo = bad // chunk * chunk
    with pytest.raises(CorruptObject, match=f"rt.*fails its {alg} checksum in bytes {lo}-"):
        spill_mod.read_spill(record, memoryview(out), "rt")


def test_without_xxhash_the_default_falls_back_to_crc32(tmp_path):
    code = ("import sys; sys.modules['xxhash'] = None\n"  # makes `import xxhash` fail
            "import numpy as np\n"
            "from rayaccel.memory import Store, spill\n"
            "assert spill.DEFAULT_ALGORITHM == 'crc32' and spill.available_algorithms() == ('crc32',)\n"
            f"with Store(device_bytes=1 << 20, host_bytes=1 << 20, spill_dir={str(tmp_path)!r}, device='cpu') as s:\n"
            "    x = np.arange(1 << 20, dtype=np.uint8); h = s.put(x); s.spill(h, to='disk')\n"
            "    assert s.checksum == 'crc32' and np.array_equal(s.get(h), x)\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr
