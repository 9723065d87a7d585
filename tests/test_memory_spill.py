"""Spill files: chunking, checksums, corruption and truncation, a full disk."""

from __future__ import annotations

import errno
import os
import subprocess
import uuid
from pathlib import Path

import numpy as np
import pytest

from rayaccel.errors import CorruptObject, StoreFull
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


def test_file_is_chunked_and_verifiable(store):
    h, path = spilled(store, nbytes=MiB + 123)
    meta = verify_file(path)
    assert meta["nbytes"] == MiB + 123 and meta["chunk_bytes"] == 256 << 10 and meta["name"] == h.name
    raw = path.read_bytes()
    hlen = int.from_bytes(raw[12:16], "little")
    assert raw[:8] == b"RAYACCSP" and raw[-8:] == b"RAYACCEN"
    assert len(raw) == 16 + hlen + MiB + 123 + 4 * 5 + 8  # 5 chunks of 256 KiB, one CRC each
    assert raw[16 + hlen:16 + hlen + MiB + 123] == arr(0, MiB + 123).tobytes()


@pytest.mark.parametrize("where", ["first-chunk", "middle-chunk", "last-byte"])
def test_flipped_bit_raises_corrupt_object_naming_the_object(store, where):
    h, path = spilled(store, name="weights-7")
    data_offset = path.stat().st_size - MiB - 4 * 4 - 8
    pos = {"first-chunk": data_offset, "middle-chunk": data_offset + MiB // 2 + 17, "last-byte": data_offset + MiB - 1}[where]
    with open(path, "r+b") as f:
        f.seek(pos)
        b = f.read(1)
        f.seek(pos)
        f.write(bytes([b[0] ^ 0x10]))
    with pytest.raises(CorruptObject, match="weights-7.*checksum") as info:
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
