"""Memory shares that hold (rayaccel.ray.worker.memcap): the cap each grant gets, the MPS variables,
and the lazy torch hook, with a fake ``torch`` package (no GPU, no Ray)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rayaccel.ray.worker import memcap
from rayaccel.ray.worker.memcap import MPS_MEM_ENV, MPS_PIPE_ENV, MPS_THREADS_ENV, Share, cap_for, mps_env, share_of

GiB = 1 << 30
H100 = {0: 80 * GiB, 1: 80 * GiB, 2: 80 * GiB, 3: 80 * GiB}


@pytest.mark.parametrize("fractions, devices, gpu_memory, want", [
    pytest.param((1.0,), (0,), None, None, id="whole-gpu-no-share"),
    pytest.param((1.0, 1.0), (0, 1), None, None, id="two-whole-gpus-no-share"),
    pytest.param((0.5,), (2,), None, ("num_gpus=0.5", 0.5, {2: 40 * GiB}), id="half-gpu"),
    pytest.param((0.25,), (1,), None, ("num_gpus=0.25", 0.25, {1: 20 * GiB}), id="quarter-gpu"),
    pytest.param((0.15,), (0,), 12 * GiB, ("gpu_memory=12.0 GiB", 0.15, {0: 12 * GiB}), id="gpu-memory-bytes-win"),
    pytest.param((), (3,), 200 * GiB, ("gpu_memory=200.0 GiB", None, {3: 80 * GiB}), id="gpu-memory-clipped"),
    pytest.param((0.5,), (), None, None, id="no-devices"),
])
def test_the_share_each_grant_is(fractions, devices, gpu_memory, want):
    s = share_of(fractions, devices, H100, gpu_memory)
    if want is None:
        assert s is None
    else:
        assert (s.label, s.fraction, s.bytes_by_device) == want


def test_a_device_of_unknown_size_has_no_bytes():
    s = share_of((0.5,), (0,), {}, None)
    assert s is not None and s.bytes_by_device == {}
    assert mps_env(s) == {MPS_THREADS_ENV: "50"}


@pytest.mark.parametrize("share, want", [
    pytest.param(Share("num_gpus=0.5", 0.5, {5: 40 * GiB}, (5,)), {MPS_MEM_ENV: "0=40960M", MPS_THREADS_ENV: "50"},
                 id="half-of-gpu5-is-ordinal-0"),
    pytest.param(Share("num_gpus=0.3", 0.3, {0: 24 * GiB, 1: 24 * GiB}, (1, 0)),
                 {MPS_MEM_ENV: "0=24576M,1=24576M", MPS_THREADS_ENV: "30"}, id="two-devices"),
    pytest.param(Share("gpu_memory=12.0 GiB", None, {0: 12 * GiB}, (0,), 12 * GiB), {MPS_MEM_ENV: "0=12288M"},
                 id="bytes-only-no-thread-share"),
    pytest.param(Share("num_gpus=0.001", 0.001, {0: 1000}, (0,)), {MPS_MEM_ENV: "0=1M", MPS_THREADS_ENV: "1"},
                 id="tiny-share-at-least-1"),
])
def test_mps_variables_of_a_share(share, want):
    assert mps_env(share) == want


S = Share("num_gpus=0.5", 0.5, {0: 40 * GiB}, (0,))


@pytest.mark.parametrize("simulated, mps, torch, mechanism, reason", [
    pytest.param(False, "/tmp/nvidia-mps", True, "mps", None, id="mps-wins"),
    pytest.param(True, "/x", False, "mps", None, id="mps-on-simulated"),
    pytest.param(False, None, True, "torch", None, id="torch"),
    pytest.param(True, None, True, None, "simulated node", id="simulated-nothing"),
    pytest.param(False, None, False, None, "nothing enforces", id="no-mps-no-torch"),
])
def test_which_mechanism_enforces_a_share(simulated, mps, torch, mechanism, reason):
    c = cap_for(S, simulated=simulated, mps=mps, torch_present=torch)
    assert c.mechanism == mechanism and c.bytes_by_device == {0: 40 * GiB} and c.share == "num_gpus=0.5"
    assert (c.reason is None) if reason is None else (reason in c.reason)


def test_mps_daemon_is_seen_by_its_control_socket(tmp_path):
    assert memcap.mps_pipe({MPS_PIPE_ENV: str(tmp_path)}) is None
    (tmp_path / "control").touch()
    assert memcap.mps_pipe({MPS_PIPE_ENV: str(tmp_path)}) == str(tmp_path)


@pytest.fixture
def fresh():
    memcap._reset_for_tests()
    yield
    memcap._reset_for_tests()


def test_mps_variables_follow_each_grant_and_keep_the_users(tmp_path, fresh):
    (tmp_path / "control").touch()
    env = {MPS_PIPE_ENV: str(tmp_path)}
    memcap.apply(S, simulated=True, env=env)
    assert env[MPS_MEM_ENV] == "0=40960M" and env[MPS_THREADS_ENV] == "50"
    memcap.apply(None, simulated=True, env=env)  # a whole-GPU grant next: the limits go
    assert MPS_MEM_ENV not in env and MPS_THREADS_ENV not in env
    memcap._reset_for_tests()
    env = {MPS_PIPE_ENV: str(tmp_path), MPS_THREADS_ENV: "20"}  # the user's value stands
    memcap.apply(S, simulated=True, env=env)
    assert env[MPS_THREADS_ENV] == "20" and env[MPS_MEM_ENV] == "0=40960M"
    memcap.apply(None, simulated=True, env=env)
    assert env == {MPS_PIPE_ENV: str(tmp_path), MPS_THREADS_ENV: "20"}


def test_no_mps_daemon_no_variables(tmp_path, fresh):
    env = {MPS_PIPE_ENV: str(tmp_path)}
    memcap.apply(S, simulated=True, env=env)
    assert env == {MPS_PIPE_ENV: str(tmp_path)}


# ------------------------------------------------------------ the lazy torch hook, with a fake torch
_FAKE_CUDA = '''
_initialized = False
_queued = []
calls = []
def is_initialized():
    return _initialized
def _lazy_call(fn, **kw):
    if _initialized:
        fn()
    else:
        _queued.append(fn)
def _lazy_init():
    global _initialized
    _initialized = True
    for fn in _queued:
        fn()
    _queued.clear()
def device_count():
    return 2
class _P:
    total_memory = 80 * 2**30
def get_device_properties(i):
    return _P()
def set_per_process_memory_fraction(f, d):
    assert isinstance(f, float)
    calls.append((round(f, 4), d))
'''
_FAKE_TORCH = '''
from . import cuda
class _C:
    observers = []
    @staticmethod
    def _cuda_attach_out_of_memory_observer(fn):
        _C.observers.append(fn)
'''


def _run(tmp_path: Path, body: str) -> str:
    pkg = tmp_path / "fake" / "torch"
    (pkg / "cuda").mkdir(parents=True, exist_ok=True)
    (pkg / "__init__.py").write_text(_FAKE_TORCH)
    (pkg / "cuda" / "__init__.py").write_text(_FAKE_CUDA)
    head = textwrap.dedent("""
        import sys
        from rayaccel.ray.worker import memcap
        from rayaccel.ray.worker.memcap import Share
        GiB = 1 << 30
        HALF = Share("num_gpus=0.5", 0.5, {3: 40 * GiB}, (3,))
    """)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")])}
    env.pop(MPS_PIPE_ENV, None)
    r = subprocess.run([sys.executable, "-c", head + textwrap.dedent(body)], env=env, capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_the_fraction_is_set_when_the_user_imports_torch_and_cuda_starts(tmp_path):
    out = _run(tmp_path, """
        memcap.apply(HALF, simulated=False)
        assert "torch" not in sys.modules and "torch.cuda" not in sys.modules  # nothing imported torch
        import torch
        assert "fake" in torch.__file__
        assert torch.cuda.calls == []  # CUDA has not started
        torch.cuda._lazy_init()
        print(torch.cuda.calls, len(torch._C.observers))
        assert memcap._S.finder is None and memcap._S.finder not in sys.meta_path
    """)
    assert out.split() == ["[(0.5,", "0)]", "1"]


def test_torch_imported_before_the_grant(tmp_path):
    out = _run(tmp_path, """
        import torch
        memcap.apply(HALF, simulated=False)
        assert torch.cuda.calls == []
        torch.cuda._lazy_init()
        print(torch.cuda.calls)
    """)
    assert out.strip() == "[(0.5, 0)]"


def test_a_reused_worker_gets_each_grants_cap_and_loses_it(tmp_path):
    out = _run(tmp_path, """
        import torch
        torch.cuda._lazy_init()
        memcap.apply(HALF, simulated=False)            # CUDA already up: set now
        memcap.apply(Share("gpu_memory=20 GiB", None, {3: 20 * GiB}, (3,), 20 * GiB), simulated=False)
        memcap.apply(None, simulated=False)            # a whole-GPU grant: back to the whole device
        memcap.apply(None, simulated=False)            # and nothing more to undo
        print(torch.cuda.calls)
    """)
    assert out.strip() == "[(0.5, 0), (0.25, 0), (1.0, 0)]"


def test_a_simulated_node_never_arms_torch(tmp_path):
    out = _run(tmp_path, """
        memcap.apply(HALF, simulated=True)
        assert memcap._S.finder is None
        import torch
        torch.cuda._lazy_init()
        print(torch.cuda.calls)
    """)
    assert out.strip() == "[]"


def test_the_oom_observer_names_the_share(tmp_path):
    r = _run(tmp_path, """
        import torch
        memcap.apply(HALF, simulated=False)
        torch.cuda._lazy_init()
        sys.stderr = sys.stdout
        torch._C.observers[0](0, 50 * GiB, 39 * GiB, 1)
        torch._C.observers[0](1, 50 * GiB, 39 * GiB, 1)  # a device without a share: silent
    """)
    assert "num_gpus=0.5" in r and "GPU 0" in r and "OutOfMemoryError" in r and r.count("rayaccel:") == 1


def test_the_hook_module_does_not_import_memcap_or_torch():
    r = subprocess.run([sys.executable, "-c", "import sys, rayaccel.ray.worker.hook; "
                        "print('rayaccel.ray.worker.memcap' in sys.modules, 'torch' in sys.modules)"],
                       capture_output=True, text=True, timeout=60, env={**os.environ, "RAYACCEL_NODE_DIR": ""})
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["False", "False"]


@pytest.mark.parametrize("simulated, gpus, mps, torch, status, words", [
    pytest.param(True, True, False, True, "n/a", "simulated node", id="simulated"),
    pytest.param(True, True, True, True, "n/a", "MPS pipe directory", id="simulated-with-a-pipe"),
    pytest.param(False, False, True, True, "n/a", "no NVIDIA or AMD GPU", id="no-gpus"),
    pytest.param(False, True, True, False, "ok", "MPS control daemon", id="mps"),
    pytest.param(False, True, False, True, "ok", "torch's per-process memory fraction", id="torch"),
    pytest.param(False, True, False, False, "warn", "nothing caps", id="nothing"),
])
def test_doctor_says_which_mechanism_a_node_has(tmp_path, simulated, gpus, mps, torch, status, words):
    from rayaccel.ray.node.doctor import share_check

    if mps:
        (tmp_path / "control").touch()
    c = share_check(simulated=simulated, gpus=gpus, env={MPS_PIPE_ENV: str(tmp_path)}, torch_present=torch)
    assert c.name == "memory shares" and c.status == status and words in c.detail, c
    assert (c.fix is None) == (status != "warn")
