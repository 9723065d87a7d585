"""The ``rayaccel`` tensor transport without a cluster: registration, shared-memory segments, facts of an end."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from rayaccel.ray import _ray_private as _rp  # noqa: E402

if _rp.release_tuple() < _rp.TRANSPORT.since:  # the older path (object store, one warning): test_private_api.py
    pytest.skip(f"Ray {_rp.release()} does not carry {_rp.TRANSPORT.name} (Ray >= {_rp.TRANSPORT.since_text})",
                allow_module_level=True)

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
    monkeypatch.setenv("RAYACCEL_IB_DIR", str(tmp_path))  # a simulated node: no such NICs here
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


# ---------------------------------------------------------------- CUDA IPC, without a GPU
class _Mapped:
    """What torch's rebuild_cuda_tensor gives: memory opened on ``ordinal``; records copies."""

    def __init__(self, ordinal):
        self.ordinal, self.ops = ordinal, []

    def clone(self):
        self.ops.append("clone")
        return ("own copy", self.ordinal)

    def to(self, device, copy=False):
        self.ops.append(("to", device.index, copy))
        return ("copied to", device.index)


def _handle(seen):
    def rebuild(*args):
        m = _Mapped(args[6])
        seen.append(m)
        return m
    return rebuild, tuple([None] * 6 + [0] + [None] * 8)


@pytest.mark.parametrize("mine,producer_dev,consumer_ordinal,opened_on,result", [
    ("[4]", 4, 0, 0, "zero copy"),                   # the producer's own GPU, shared (fractional GPUs)
    ("[4, 5]", 5, 0, 1, ("copied to", 0)),           # visible here: opened on its ordinal, one copy onto ours
    ("[4]", 6, 0, 0, ("own copy", 0)),               # not visible: opened on our device, one copy
], ids=["same-gpu", "visible-peer", "hidden-peer"])
def test_cuda_ipc_opens_where_it_can_and_copies_at_most_once(monkeypatch, mine, producer_dev, consumer_ordinal,
                                                             opened_on, result):
    from rayaccel.ray.rdt import gpu

    monkeypatch.setenv("RAYACCEL_DEVICES", mine)
    seen = []
    out = gpu.from_ipc([_handle(seen)], [producer_dev], torch.device("cuda", consumer_ordinal), None)
    assert seen[0].ordinal == opened_on
    if result == "zero copy":
        assert out == [seen[0]] and seen[0].ops == []
    else:
        assert out == [result] and len(seen[0].ops) == 1


def test_cuda_ipc_into_target_buffers_is_one_copy(monkeypatch):
    from rayaccel.ray.rdt import gpu

    monkeypatch.setenv("RAYACCEL_DEVICES", "[4]")
    copied = []

    class Buf:
        def copy_(self, src):
            copied.append(src)

    seen, buf = [], Buf()
    assert gpu.from_ipc([_handle(seen)], [4], torch.device("cuda", 0), [buf]) == [buf]
    assert copied == [seen[0]]


def test_cuda_ipc_handle_of_an_unknown_layout_is_refused(monkeypatch):
    from rayaccel.ray.rdt import gpu

    monkeypatch.setenv("RAYACCEL_DEVICES", "[4]")
    with pytest.raises(RuntimeError, match="unexpected CUDA IPC handle layout"):
        gpu.from_ipc([(lambda *a: None, tuple([None] * 6 + ["cuda:0"]))], [4], torch.device("cuda", 0), None)


# ---------------------------------------------------------------- the choice, per consumer
def _meta(node, device_type, devices=(), packed=True, shm_error=None, gpudirect=None, nixl=None):
    from types import SimpleNamespace

    from rayaccel.ray.rdt.transport import Producer

    prod = Producer(node, 1, 1, None, None, devices, ("mlx5_0",), gpudirect)
    return SimpleNamespace(producer=prod, tensor_device=device_type, devices=devices, nbytes=64 << 20,
                           packed=object() if packed else None, shm_error=shm_error, nixl=nixl,
                           tensor_meta=[((4,), torch.float32)])


@pytest.fixture
def dgx1_here(monkeypatch):
    from rayaccel import catalog
    from rayaccel.ray.rdt import local

    topo = catalog.load("dgx1-v100")
    monkeypatch.setattr(local, "node_id", lambda: "node-a" + "0" * 50)
    monkeypatch.setattr(local, "topology", lambda: topo)
    monkeypatch.setattr(local, "gpudirect", lambda: None)
    monkeypatch.setattr(local, "prepare_ucx", lambda: ())
    monkeypatch.delenv("RAYACCEL_RDT_PATH", raising=False)
    return topo


@pytest.mark.parametrize("producer_dev,mine,kind,path", [
    (2, "[2]", "ipc", "cuda-ipc"),          # one GPU, shared
    (0, "[3]", "ipc", "cuda-ipc"),          # NV2 peers
    (0, "[1]", "ipc", "cuda-ipc"),          # NV1 peers
    (0, "[5]", "host", "shared-memory"),    # SYS: staged through a segment
], ids=["same-gpu", "nv2", "nv1", "sys"])
def test_gpu_tensors_on_one_node(dgx1_here, monkeypatch, producer_dev, mine, kind, path):
    from rayaccel.ray.rdt import choose

    monkeypatch.setenv("RAYACCEL_DEVICES", mine)
    p, k = choose.decide(_meta("node-a" + "0" * 50, "cuda", (producer_dev,)), torch.device("cuda", 0), "object x")
    assert (k, p.path) == (kind, path)


@pytest.mark.parametrize("packed,shm_error,kind,path", [
    (True, None, "map", "shared-memory"), (False, None, "segment", "shared-memory"),
    (False, "/dev/shm does not exist", "store", "object-store"),
], ids=["eager", "lazy", "no-shm"])
def test_cpu_tensors_on_one_node(dgx1_here, monkeypatch, packed, shm_error, kind, path):
    from rayaccel.ray.rdt import choose

    monkeypatch.setenv("RAYACCEL_DEVICES", "[0]")
    p, k = choose.decide(_meta("node-a" + "0" * 50, "cpu", packed=packed, shm_error=shm_error), torch.device("cpu"),
                         "object x")
    assert (k, p.path) == (kind, path) and (shm_error is None or shm_error in p.reason)


def test_another_node_is_nixl_with_both_ends_nics(dgx1_here, monkeypatch):
    from rayaccel.ray.rdt import choose, local

    monkeypatch.setenv("RAYACCEL_DEVICES", "[6]")
    monkeypatch.setattr(local, "nixl", lambda: (True, ""))
    p, k = choose.decide(_meta("node-b" + "0" * 50, "cpu"), torch.device("cpu"), "object x")
    assert k == "nixl" and p.path == "nixl" and p.nics == (("mlx5_0",), ("mlx5_3",))


def test_another_node_without_nixl_names_the_install(dgx1_here, monkeypatch):
    from rayaccel.errors import TransportUnavailable
    from rayaccel.ray.rdt import choose, local

    monkeypatch.setattr(local, "nixl", lambda: (False, "NIXL is not installed (x): pip install 'rayaccel[nixl]'"))
    with pytest.raises(TransportUnavailable, match=r"the nodes differ, so it travels by NIXL.*rayaccel\[nixl\]"):
        choose.decide(_meta("node-b" + "0" * 50, "cpu"), torch.device("cpu"), "object x")


@pytest.mark.parametrize("forced,kind", [("object-store", "store"), ("nixl", "nixl"), ("shared-memory", "map")])
def test_the_diagnostic_override(dgx1_here, monkeypatch, forced, kind):
    from rayaccel.ray.rdt import choose, local

    monkeypatch.setattr(local, "nixl", lambda: (True, ""))
    monkeypatch.setenv("RAYACCEL_RDT_PATH", forced)
    p, k = choose.decide(_meta("node-a" + "0" * 50, "cpu"), torch.device("cpu"), "object x")
    assert k == kind and (forced == "shared-memory" or p.reason.startswith(f"forced by RAYACCEL_RDT_PATH={forced}"))


# ---------------------------------------------------------------- the producer's pool of segments
def _weights(seed: int) -> list:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(-2**31, 2**31 - 1, (n,), dtype=torch.int32, generator=g) for n in (4096, 17, 70000)]


def _shapes(ts):
    return [(t.shape, t.dtype) for t in ts]


def test_a_freed_segment_is_refilled_bit_identical_as_the_weights_change():
    from rayaccel.ray.rdt.pool import Pool

    pool, ws = Pool(), _weights(1)
    try:
        names = set()
        for step in range(4):
            packed, _ = pool.write(ws)
            names.add(packed.name)
            got = shm.read(packed, _shapes(ws), "x")
            assert all(torch.equal(a, b) for a, b in zip(ws, got))
            del got  # the consumer is done: its lock goes with its tensors
            pool.release(packed)
            for w in ws:  # the trainer's step, after Ray freed the object
                w.add_(step + 1)
        st = pool.stats()
        assert len(names) == 1 and (st.made, st.refilled, st.busy) == (1, 3, 0)
    finally:
        pool.close()
    assert not (SHM_DIR / names.pop()).exists()


def test_a_consumer_keeping_last_rounds_weights_keeps_their_bytes():
    """The trainer's write after wait_tensor_freed is its own: a segment still mapped is never refilled."""
    from rayaccel.ray.rdt.pool import Pool

    pool, ws = Pool(), _weights(2)
    try:
        p1, _ = pool.write(ws)
        kept = shm.read(p1, _shapes(ws), "round 1")
        want = [w.clone() for w in ws]
        pool.release(p1)  # Ray freed round 1; the rollout still holds its tensors
        for w in ws:
            w.mul_(3)  # the trainer writes its own weights
        assert all(torch.equal(a, b) for a, b in zip(kept, want))
        p2, _ = pool.write(ws)  # round 2 cannot refill round 1's segment: it is mapped
        assert p2.name != p1.name and pool.stats().busy == 1
        got = shm.read(p2, _shapes(ws), "round 2")
        assert all(torch.equal(a, b) for a, b in zip(got, ws))
        assert all(torch.equal(a, b) for a, b in zip(kept, want))
        del kept  # round 1 dropped: round 3 refills its segment (two segments alternate)
        pool.release(p2)
        p3, _ = pool.write(ws)
        assert p3.name == p1.name
        assert all(torch.equal(a, b) for a, b in zip(got, ws))  # round 2's reader still sees round 2
        pool.release(p3)
    finally:
        pool.close()


def test_a_consumer_reads_a_refilled_segment_through_its_kept_mapping_and_its_writes_stay_its_own():
    """Weight sync: the rollout's mapping of a refilled segment is kept (no page tables to fill again);
    pages it wrote into are dropped when its tensors go, so the producer's next bytes show."""
    from rayaccel.ray.rdt.maps import Mappings
    from rayaccel.ray.rdt.pool import Pool

    pool, ws, mine = Pool(), _weights(5), Mappings()
    old, shm.MAPPINGS = shm.MAPPINGS, mine
    try:
        for step in range(4):
            packed, _ = pool.write(ws)
            got = shm.read(packed, _shapes(ws), f"round {step}")
            assert all(torch.equal(a, b) for a, b in zip(ws, got))
            for g in got:
                g[::997] = -step - 1  # the rollout writes into its own weights: a copy-on-write page each
            assert all(not torch.equal(a, b) for a, b in zip(ws, got))
            del got, g  # its lock goes with its tensors; the mapping stays, idle
            pool.release(packed)
            for w in ws:
                w.add_(step + 1)
        st = pool.stats()
        assert (st.made, st.refilled, st.busy) == (1, 3, 0)  # an idle kept mapping holds no lock
        assert (mine.mapped, mine.reused, len(mine)) == (1, 3, 1)
        pool.close()  # the producer removes its segment: the kept mapping of it goes at the next check
        mine._evict()
        assert len(mine) == 0
    finally:
        shm.MAPPINGS = old
        pool.close()


def test_two_live_reads_of_one_segment_never_share_pages():
    from rayaccel.ray.rdt.maps import Mappings

    t = torch.arange(8192, dtype=torch.int32)
    packed, _ = shm.write([t])
    old, shm.MAPPINGS = shm.MAPPINGS, Mappings()
    try:
        meta = [(t.shape, t.dtype)]
        a, = shm.read(packed, meta, "x")
        del a
        a, = shm.read(packed, meta, "x")  # the kept mapping, reused
        b, = shm.read(packed, meta, "x")  # a's still lives: one of its own
        a[5000] = -1
        assert b[5000] == 5000 and shm.MAPPINGS.reused == 1 and shm.MAPPINGS.mapped == 2
    finally:
        shm.MAPPINGS = old
        shm.unlink(packed)


def test_without_pagemap_a_consumer_maps_each_read_as_before(monkeypatch):
    from rayaccel.ray.rdt import maps

    monkeypatch.setattr(maps, "_PAGEMAP", False)  # e.g. no /proc: a written page could not be found
    t = torch.arange(8192, dtype=torch.int32)
    packed, _ = shm.write([t])
    monkeypatch.setattr(shm, "MAPPINGS", maps.Mappings())
    try:
        for _ in range(2):
            a, = shm.read(packed, [(t.shape, t.dtype)], "x")
            assert torch.equal(a, t)
            del a
        assert (shm.MAPPINGS.mapped, shm.MAPPINGS.reused, len(shm.MAPPINGS)) == (2, 0, 0)
    finally:
        shm.unlink(packed)


def test_stale_metadata_of_a_refilled_segment_is_one_clear_error():
    from rayaccel.ray.rdt.pool import Pool

    pool, ws = Pool(), _weights(3)
    try:
        p1, _ = pool.write(ws)
        pool.release(p1)
        p2, _ = pool.write(ws)
        assert p2.name == p1.name and p2.generation != p1.generation
        with pytest.raises(TransportError, match="refilled for a later object"):
            shm.read(p1, _shapes(ws), "object old")
        pool.release(p2)
    finally:
        pool.close()


def test_a_segment_of_another_format_is_refused():
    packed, _ = shm.write([torch.ones(16)])
    try:
        with open(SHM_DIR / packed.name, "r+b") as f:
            f.write(b"RAYACCL0")
        with pytest.raises(TransportError, match="format"):
            shm.read(packed, [((16,), torch.float32)], "object x")
    finally:
        shm.unlink(packed)


def test_the_pool_is_bounded_and_gives_idle_segments_back():
    from rayaccel.ray.rdt.pool import Pool

    pool = Pool(keep_per_size=2, idle_s=3600)
    try:
        ws = _weights(4)
        packs = [pool.write(ws)[0] for _ in range(4)]  # four live objects: four segments
        for p in packs:
            pool.release(p)
        st = pool.stats()
        assert st.made == 4 and st.removed == 2 and sum(st.free.values()) == 2
        assert sum(1 for p in packs if (SHM_DIR / p.name).exists()) == 2
        assert pool.trim(idle_s=0) == 2 and pool.stats().free == {}
        assert not any((SHM_DIR / p.name).exists() for p in packs)
    finally:
        pool.close()


# ---------------------------------------------------------------- NIXL registrations
class _FakeNixl:
    """Ray's NIXL manager's registration count per storage address (what its _tensor_desc_cache keeps)."""

    def __init__(self):
        self.count: dict[int, int] = {}
        self.registered = self.deregistered = 0

    def register_nixl_memory(self, t):
        ptr = t.untyped_storage().data_ptr()
        self.registered += ptr not in self.count
        self.count[ptr] = self.count.get(ptr, 0) + 1

    def deregister_nixl_memory(self, t):
        ptr = t.untyped_storage().data_ptr()
        self.count[ptr] -= 1
        if not self.count[ptr]:
            del self.count[ptr]
            self.deregistered += 1


def test_a_registration_is_held_while_the_storage_lives_and_given_back_when_it_is_freed():
    import gc

    from rayaccel.ray.rdt.registrations import Registrations

    mgr, regs = _FakeNixl(), Registrations()
    w = torch.ones(1 << 16)
    for _ in range(5):  # five steps: Ray registers with each object and drops it when freed
        regs.sweep(mgr)
        mgr.register_nixl_memory(w)
        regs.hold(mgr, [w, w[10:]])  # a view of the same storage is the same registration
        mgr.deregister_nixl_memory(w)
    assert mgr.registered == 1 and mgr.deregistered == 0 and len(regs) == 1
    ptr = w.untyped_storage().data_ptr()
    del w
    gc.collect()
    assert regs.sweep(mgr) == 1 and mgr.count == {} and mgr.deregistered == 1 and len(regs) == 0
    assert ptr not in mgr.count


def test_a_background_refill_is_waited_for_and_a_failed_one_is_one_clear_error(monkeypatch):
    """The copy overlaps with Ray handing the metadata out: a consumer waits for the producer's lock."""
    import threading

    from rayaccel.ray.rdt.pool import Pool

    pool, ws = Pool(), [torch.arange(1 << 20, dtype=torch.int32) for _ in range(3)]
    try:
        p1, _ = pool.write(ws)
        pool.release(p1)
        for w in ws:
            w.add_(7)
        go = threading.Event()
        real = shm.fill

        def slow_fill(*a):
            go.wait(10)
            return real(*a)

        monkeypatch.setattr(shm, "fill", slow_fill)
        p2, made = pool.write(ws, background=True)
        assert p2.name == p1.name and made == [None] * 3
        threading.Timer(0.3, go.set).start()
        got = shm.read(p2, _shapes(ws), "object y")  # waits for the fill, then maps it
        assert all(torch.equal(a, b) for a, b in zip(got, ws))
        del got
        pool.release(p2)

        def broken(*a):
            raise RuntimeError("boom")

        monkeypatch.setattr(shm, "fill", broken)
        p3, _ = pool.write(ws, background=True)
        with pytest.raises(TransportError, match="could not fill"):
            shm.read(p3, _shapes(ws), "object z")
        pool.release(p3)
    finally:
        monkeypatch.undo()
        pool.close()


def test_the_node_id_follows_a_driver_that_connects_again(monkeypatch):
    """A driver that shuts Ray down and connects to another cluster is on another node: a cached id
    made a consumer on its producer's node take NIXL (the other-node path) and fail (CI, test_rdt_pressure)."""
    import ray

    from rayaccel.ray.rdt import local

    ids = iter(["aa" * 28, "bb" * 28])

    class Ctx:
        def __init__(self):
            self.id = next(ids)

        def get_node_id(self):
            return self.id

    monkeypatch.setattr(ray, "get_runtime_context", Ctx)
    assert local.node_id() == "aa" * 28
    assert local.node_id() == "bb" * 28
