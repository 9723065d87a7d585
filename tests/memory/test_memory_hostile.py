"""Other users and stale leftovers (issue 10, M3/M4): spill roots are private to the user,
checked on open and never followed through a link; another user's or an unremovable
segment in /dev/shm is skipped, never fatal; deleting a shared object prints nothing."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import pytest

from rayaccel.errors import StoreError
from rayaccel.memory import Store, sweep
from rayaccel.memory.owners import SHM_DIR

MiB = 1 << 20
ME = os.geteuid()
OTHER = 54321  # a uid that is not ours
DEAD_PID = (1 << 22) + 4321  # above any pid_max: never alive
SRC = str(Path(__import__("rayaccel").__file__).resolve().parents[1])  # the rayaccel under test
as_root = pytest.mark.skipif(ME != 0, reason="making a file another user's needs root (chown)")


@pytest.fixture
def temp_dir(tmp_path, monkeypatch):
    """The system temp dir, as Store() sees it, is a fresh folder (the real /tmp is left alone)."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def _store(**kw) -> Store:
    return Store(device_bytes=MiB, host_bytes=MiB, device="cpu", **kw)


def test_default_spill_root_is_per_user_and_private(temp_dir):
    with _store() as s:
        root = s.spill_dir.parent
        assert root == temp_dir / f"rayaccel-spill-{ME}"
        assert stat.S_IMODE(root.stat().st_mode) == 0o700
        assert stat.S_IMODE(s.spill_dir.stat().st_mode) == 0o700


@pytest.mark.parametrize("make", ["file", "fifo"])
def test_a_plain_file_at_the_root_is_a_clear_error(temp_dir, make):
    for name in ("rayaccel-spill", f"rayaccel-spill-{ME}"):  # the old shared name and the new per-user one
        p = temp_dir / name
        p.write_text("not a directory") if make == "file" else os.mkfifo(p)
    with pytest.raises(StoreError, match=r"spill root .*rayaccel-spill-\d+ exists and is not a directory: remove it, "
                                         r"or set RAYACCEL_SPILL_DIR"):
        _store()


def test_a_symlinked_root_is_never_followed(temp_dir, tmp_path_factory):
    elsewhere = tmp_path_factory.mktemp("attacker")
    for name in ("rayaccel-spill", f"rayaccel-spill-{ME}"):
        (temp_dir / name).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(StoreError, match="is a symbolic link; rayaccel does not follow links"):
        _store()
    assert not any(elsewhere.iterdir())


@as_root
def test_a_root_owned_by_another_user_is_refused(temp_dir):
    for name in ("rayaccel-spill", f"rayaccel-spill-{ME}"):
        (temp_dir / name).mkdir(mode=0o777)
        os.chown(temp_dir / name, OTHER, OTHER)
    with pytest.raises(StoreError, match=rf"belongs to uid {OTHER}.*not to you .*could read, delete or replace"):
        _store()


def test_an_open_root_of_ours_is_made_private(temp_dir):
    root = temp_dir / f"rayaccel-spill-{ME}"
    root.mkdir()
    os.chmod(root, 0o777)
    with _store():
        assert stat.S_IMODE(root.stat().st_mode) == 0o700


def test_private_dir_errors_name_the_path(tmp_path):
    from rayaccel.memory.owners import private_dir

    f = tmp_path / "f"
    f.write_text("x")
    with pytest.raises(StoreError, match=f"{f} exists and is not a directory"):
        private_dir(f)
    with pytest.raises(StoreError, match="cannot be created"):
        private_dir(f / "sub")


def test_an_explicit_spill_dir_that_is_a_file(tmp_path):
    f = tmp_path / "scratch"
    f.write_text("x")
    with pytest.raises(StoreError, match="spill_dir .*scratch exists and is not a directory"):
        _store(spill_dir=f)


# ---------------------------------------------------------------- M4: segments in /dev/shm
needs_shm = pytest.mark.skipif(not SHM_DIR.is_dir(), reason="no /dev/shm")


@needs_shm
def test_an_unremovable_stale_segment_is_skipped_not_fatal(tmp_path, monkeypatch):
    stale = [SHM_DIR / f"rayaccel_{DEAD_PID}-1_deadbeef", SHM_DIR / f"rayaccel_{DEAD_PID}-1_u{ME}_deadbeef"]
    for p in stale:
        p.write_bytes(b"x")
    real_unlink = Path.unlink

    def unlink(self, missing_ok=False):
        if self in stale:
            raise PermissionError(1, "Operation not permitted", str(self))
        return real_unlink(self, missing_ok)

    monkeypatch.setattr(Path, "unlink", unlink)
    try:
        with _store(spill_dir=tmp_path) as s:  # the old code raised PermissionError here
            s.put(np.zeros(4))
    finally:
        monkeypatch.setattr(Path, "unlink", real_unlink)
        for p in stale:
            p.unlink(missing_ok=True)


@needs_shm
@as_root
def test_another_users_segments_and_spill_dirs_are_left_alone(tmp_path):
    theirs_shm = [SHM_DIR / f"rayaccel_{DEAD_PID}-1_cafe01", SHM_DIR / f"rayaccel_{DEAD_PID}-1_u{OTHER}_cafe02"]
    for p in theirs_shm:
        p.write_bytes(b"x")
        os.chown(p, OTHER, OTHER)
    theirs_dir = tmp_path / f"rayaccel-{DEAD_PID}-1-cafe03"
    theirs_dir.mkdir()
    (theirs_dir / "1-1.spill").write_bytes(b"x")
    os.chown(theirs_dir, OTHER, OTHER)
    mine_dir = tmp_path / f"rayaccel-{DEAD_PID}-1-cafe04"
    mine_dir.mkdir()
    try:
        removed = sweep(tmp_path)
        assert str(mine_dir) in removed and not mine_dir.exists()
        assert theirs_dir.exists() and all(p.exists() for p in theirs_shm)
        with _store(spill_dir=tmp_path):
            assert theirs_dir.exists() and all(p.exists() for p in theirs_shm)
    finally:
        for p in theirs_shm:
            p.unlink(missing_ok=True)


@needs_shm
def test_segment_names_carry_the_uid(tmp_path):
    with _store(spill_dir=tmp_path, share=True) as s:
        h = s.put(np.arange(10))
        seg = s.export(h).segment
        assert f"_u{ME}_" in seg and (SHM_DIR / seg).exists()
        s.delete(h)
        assert not (SHM_DIR / seg).exists()


@needs_shm
def test_deleting_a_shared_object_prints_no_resource_tracker_traceback(tmp_path):
    code = textwrap.dedent(f"""
        import numpy as np
        from rayaccel.memory import Store
        s = Store("1MiB", "1MiB", spill_dir={str(tmp_path)!r}, device="cpu", share=True)
        for k in range(3):
            h = s.put(np.arange(100 + k))
            s.export(h)
            s.delete(h)
        h = s.put(np.arange(7))
        s.export(h)
        s.close()
        print("ok")
    """)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       env={**os.environ, "PYTHONPATH": SRC})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr
    assert "Traceback" not in p.stderr and "KeyError" not in p.stderr, p.stderr
    assert "leaked" not in p.stderr, p.stderr
