"""The ``rayaccel`` tensor transport without a cluster: registration, shared-memory segments, facts of an end."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rayaccel.errors import TransportError  # noqa: E402
from rayaccel.memory.owners import SHM_DIR  # noqa: E402
from rayaccel.ray.rdt import shm  # noqa: E402


def _run(code: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYACCEL_")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- registration
def test_importing_rayaccel_ray_does_not_import_ray_and_registers_when_ray_comes():
    got = _run("""
import json, sys
import rayaccel, rayaccel.ray
before = "ray" in sys.modules
import ray
from ray.experimental.rdt import util
wrapped = getattr(util._ensure_default_transports_registered, "__rayaccel_wrapped__", False)
torch_before_use = "torch" in sys.modules
name = util.normalize_and_validate_tensor_transport("rayaccel")
import inspect
src_ok = "def register_tensor_transport" in inspect.getsource(util)
print(json.dumps({"ray_before": before, "wrapped": wrapped, "name": name, "torch_early": torch_before_use,
                  "src": src_ok, "finders": sum(type(f).__name__ == "_WhenImported" for f in sys.meta_path)}))
""")
    assert got == {"ray_before": False, "wrapped": True, "name": "RAYACCEL", "torch_early": False, "src": True,
                   "finders": 0}


def test_install_after_ray_is_immediate_and_idempotent():
    got = _run("""
import json
import ray
from rayaccel.ray import rdt
again = rdt.install()
from ray.experimental.rdt import util
print(json.dumps({"again": again, "known": "RAYACCEL" in util.transport_manager_info,
                  "after_use": util.normalize_and_validate_tensor_transport("RAYACCEL"),
                  "one_sided": util.is_one_sided_transport("RAYACCEL"),
                  "cpu": util.device_match_transport("cpu", "RAYACCEL"),
                  "cuda": util.device_match_transport("cuda", "RAYACCEL"),
                  "custom": util.has_custom_transports}))
""")
    # rayaccel.ray's import installed it already, so the explicit call is a no-op
    assert got == {"again": False, "known": False, "after_use": "RAYACCEL", "one_sided": True, "cpu": True,
                   "cuda": True, "custom": True}


def test_ray_method_decorator_accepts_the_name():
    got = _run("""
import json
import ray, rayaccel.ray

@ray.remote(enable_tensor_transport=True)
class A:
    @ray.method(tensor_transport="rayaccel")
    def f(self):
        return 1
print(json.dumps({"t": A.f.__ray_tensor_transport__ if hasattr(A.f, "__ray_tensor_transport__") else
                  A.__ray_metadata__.method_meta.method_name_to_tensor_transport.get("f")}))
""")
    assert got["t"] == "RAYACCEL"


def test_without_rayaccel_ray_rejects_the_name():
    """What a driver that never imports rayaccel gets: Ray's own error at the decorator."""
    code = """
import ray
try:
    ray.method(tensor_transport="rayaccel")(lambda self: 1)
except ValueError as e:
    print("ValueError", e)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert "Invalid tensor transport: RAYACCEL" in out.stdout


# ---------------------------------------------------------------- segments
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.int8, torch.uint8, torch.int64, torch.bool,
          torch.complex64, torch.float64]


def _tensors():
    g = torch.Generator().manual_seed(0)
    out = [(torch.rand(7, 5, generator=g) * 100).to(d) for d in DTYPES]
    base = torch.arange(48, dtype=torch.float32).reshape(6, 8)
    out += [base[:, ::3], base.t(), base[:, 5], torch.tensor(3.5), torch.empty(0, 4),
            torch.empty((2, 0), dtype=torch.int16), base.unsqueeze(0).expand(2, 6, 8)]
    return out


def test_segment_round_trip_bit_identical():
    ts = _tensors()
    packed, made = shm.write(ts)
    try:
        assert all(o % shm.ALIGN == 0 for o in packed.offsets) and packed.owner[0] == os.getpid()
        got = shm.read(packed, [(t.shape, t.dtype) for t in ts], "object x")
        for a, b, c in zip(ts, got, made):
            assert a.shape == b.shape and a.dtype == b.dtype
            assert torch.equal(a.contiguous(), b) and b.is_contiguous()
            # a strided tensor's contiguous copy is handed back (for NIXL), a contiguous one is not copied
            assert (c is None) == a.is_contiguous() and (c is None or torch.equal(c, b))
        assert (SHM_DIR / packed.name).stat().st_mode & 0o777 == 0o600
    finally:
        shm.unlink(packed)
    assert not (SHM_DIR / packed.name).exists()


def test_consumers_write_only_their_own_pages():
    t = torch.arange(4096, dtype=torch.int32)
    packed, _ = shm.write([t])
    try:
        meta = [(t.shape, t.dtype)]
        a, = shm.read(packed, meta, "x")
        b, = shm.read(packed, meta, "x")
        a[0] = -1
        c, = shm.read(packed, meta, "x")
        assert b[0] == 0 and c[0] == 0 and t[0] == 0
        assert a.data_ptr() != b.data_ptr()
    finally:
        shm.unlink(packed)


def test_a_mapping_outlives_the_unlink():
    t = torch.arange(1000, dtype=torch.float64)
    packed, _ = shm.write([t])
    got, = shm.read(packed, [(t.shape, t.dtype)], "x")
    shm.unlink(packed)
    shm.unlink(packed)  # idempotent
    assert torch.equal(got, t)


def test_a_freed_segment_is_one_clear_error():
    t = torch.ones(10)
    packed, _ = shm.write([t])
    shm.unlink(packed)
    with pytest.raises(TransportError, match="gone .the producer freed the object"):
        shm.read(packed, [(t.shape, t.dtype)], "object abc")


def test_a_dead_producers_segment_is_named_as_such():
    t = torch.ones(10)
    packed, _ = shm.write([t])
    shm.unlink(packed)
    dead = shm.Packed(packed.name, packed.nbytes, packed.offsets, packed.sizes, (packed.owner[0], 1))
    assert not shm.alive(dead) and shm.alive(packed)
    with pytest.raises(TransportError, match="died"):
        shm.read(dead, [(t.shape, t.dtype)], "object abc")


def test_a_short_or_foreign_file_is_refused():
    t = torch.ones(1024)
    packed, _ = shm.write([t])
    try:
        os.truncate(SHM_DIR / packed.name, 16)
        with pytest.raises(TransportError, match="not the producer's segment"):
            shm.read(packed, [(t.shape, t.dtype)], "object abc")
    finally:
        shm.unlink(packed)


def test_full_shm_is_an_oserror_and_leaves_nothing(monkeypatch):
    def full(*args):
        raise OSError(errno.ENOSPC, "No space left on device")

    before = {p.name for p in SHM_DIR.iterdir()}
    monkeypatch.setattr(os, "pwrite", full)
    with pytest.raises(OSError) as e:
        shm.write([torch.ones(100)])
    assert e.value.errno == errno.ENOSPC
    assert {p.name for p in SHM_DIR.iterdir()} - before == set()


def test_segments_of_a_killed_producer_are_swept():
    """A SIGKILLed producer leaves its segment; the sweeper (run by producers) removes it."""
    code = """
import os, signal, torch
from rayaccel.ray.rdt import shm
p, made = shm.write([torch.ones(64)])
print(p.name, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    name = out.stdout.strip()
    assert name.startswith("rayaccel_") and "_rdt_" in name and (SHM_DIR / name).exists()
    from rayaccel.memory import sweep

    removed = sweep(None)
    assert str(SHM_DIR / name) in removed and not (SHM_DIR / name).exists()


# ---------------------------------------------------------------- facts of an end
def test_devices_from_the_hook_or_cuda_visible_devices(monkeypatch):
    from rayaccel.ray.rdt import local

    monkeypatch.delenv("RAYACCEL_NODE_DIR", raising=False)
    local._record.cache_clear()
    monkeypatch.setenv("RAYACCEL_DEVICES", "[5, 2]")
    assert local.devices() == (5, 2) and local.physical(1) == 2 and local.ordinal(5) == 0 and local.ordinal(3) is None
    monkeypatch.delenv("RAYACCEL_DEVICES")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    assert local.devices() == (3, 1)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "rayaccel-unhooked-0")
    assert local.devices() == ()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert local.devices() == () and local.physical(0) is None


def test_ucx_net_devices_only_for_nics_this_machine_has(monkeypatch, tmp_path):
    from rayaccel import catalog
    from rayaccel.ray.rdt import local

    topo = catalog.load("dgx-a100")
    monkeypatch.setattr(local, "topology", lambda: topo)
    monkeypatch.setattr(local, "_UCX_DONE", False)
    monkeypatch.setenv("RAYACCEL_DEVICES", "[0]")
    monkeypatch.setenv("UCX_NET_DEVICES", "")  # empty is unset; and monkeypatch now restores what was there
    monkeypatch.setattr(local, "IB_DIR", tmp_path)  # a simulated node: no such NICs here
    assert local.near_nics() == ("mlx5_0", "mlx5_1")
    assert local.prepare_ucx() == () and not os.environ["UCX_NET_DEVICES"]
    monkeypatch.setattr(local, "_UCX_DONE", False)
    (tmp_path / "mlx5_1").mkdir()
    assert local.prepare_ucx() == ("mlx5_1",) and os.environ["UCX_NET_DEVICES"] == "mlx5_1:1"
    monkeypatch.setenv("UCX_NET_DEVICES", "mlx5_9:1")  # the user's (or the hook's) choice is kept
    assert local.prepare_ucx() == ("mlx5_9",)


def test_nixl_check_names_what_to_install(monkeypatch):
    from rayaccel.ray.rdt import local

    local.nixl.cache_clear()
    monkeypatch.setitem(sys.modules, "nixl", None)
    monkeypatch.setitem(sys.modules, "nixl._api", None)
    try:
        ok, why = local.nixl()
        assert not ok and "pip install 'rayaccel[nixl]'" in why
    finally:
        local.nixl.cache_clear()


# ---------------------------------------------------------------- the diagnostic override
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402


@settings(max_examples=200, deadline=None)
@given(value=st.one_of(st.text(max_size=40), st.sampled_from(["nixl", "shared-memory", "cuda-ipc", "object-store"])),
       same=st.booleans(), device=st.sampled_from(["cpu", "cuda"]))
def test_rayaccel_rdt_path_is_valid_or_one_clear_line(value, same, device):
    from rayaccel.ray.rdt.choose import FORCE_ENV, _check_forced
    from rayaccel.transfer import TENSOR_PATHS

    try:
        _check_forced(value, same, device, "object x")
    except TransportError as e:
        msg = str(e)
        assert msg.startswith(f"{FORCE_ENV}=") and "\n" not in msg.replace(repr(value), "")
        assert value not in TENSOR_PATHS or not same or (value == "cuda-ipc" and device == "cpu")
    else:
        assert value in TENSOR_PATHS
        assert same or value in ("nixl", "object-store")
        assert not (value == "cuda-ipc" and device == "cpu")
