"""The leak finder (:mod:`rayaccel.ray.node.leakscan`) over a fake ``/proc``: what is a leak, what never is.

No Ray: a tree of ``<pid>/stat``, ``environ``, ``cmdline`` (and ``cgroup``) in ``tmp_path`` stands for the node's
processes: its raylet, idle and holding workers, their children, a worker's child that outlived it, other
nodes' and other users' processes, and NVML's per-process list.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest

from rayaccel.contract import (DEVICES_ENV, HOLDER_ENV, NODE_DIR_ENV, NODE_VISIBLE_ENV, UNHOOKED_PREFIX,
                               format_holder)
from rayaccel.ray.node import leakscan
from rayaccel.ray.node.leakscan import Holder, Proc, find, scan

NODE = "/dev/shm/rayaccel-0/abcdef012345"
OTHER_NODE = "/dev/shm/rayaccel-0/999999999999"
RAYLET = 100
UID = os.getuid()
UNHOOKED = ",".join(f"{UNHOOKED_PREFIX}{i}" for i in range(8))
IDS = {str(i): i for i in range(8)}


def _proc(root, pid, ppid, env=None, cmd="python", start=None, cgroup=None):
    d = root / str(pid)
    d.mkdir()
    start = start if start is not None else 1000 + pid
    # the fields after the command: state, ppid, then 17 more, then the start time (field 22 of stat)
    rest = ["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5
    (d / "stat").write_text(f"{pid} ({cmd.split()[0][:15]}) " + " ".join(rest))
    (d / "environ").write_bytes(b"\0".join(f"{k}={v}".encode() for k, v in (env or {}).items()) + b"\0")
    (d / "cmdline").write_bytes(cmd.replace(" ", "\0").encode())
    if cgroup is not None:
        (d / "cgroup").write_text(cgroup + "\n")


def _node_env(**extra):
    return {NODE_DIR_ENV: NODE, "CUDA_VISIBLE_DEVICES": UNHOOKED, "PATH": "/usr/bin", **extra}


def _granted(devs, holder_pid, key):
    """What a process a worker started after its grant inherits."""
    return _node_env(**{DEVICES_ENV: ",".join(map(str, devs)), HOLDER_ENV: format_holder(holder_pid, key, "Trainer"),
                        "CUDA_VISIBLE_DEVICES": ",".join(map(str, devs))})


@pytest.fixture
def proc(tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    _proc(root, 1, 0, cmd="/sbin/init")
    _proc(root, RAYLET, 1, env=_node_env(), cmd="/venv/lib/ray/core/src/ray/raylet/raylet --node-ip-address")
    return root


def _find(root, holders=None, nvml=(), **kw):
    procs = scan(str(root), uid=UID, keys=leakscan.keys_for("CUDA_VISIBLE_DEVICES"), also={p.pid for p in nvml})
    return find(procs, holders or {}, node_dir=NODE, uid=UID, raylet_pid=RAYLET, visible_var="CUDA_VISIBLE_DEVICES",
                ids=IDS, nvml=nvml, cmdline=lambda p: leakscan.cmdline_of(str(root), p), **kw)


def test_a_child_that_outlived_its_worker_is_a_leak_of_its_device_and_names_its_holder(proc):
    _proc(proc, 300, 1, env=_granted([2], 200, "actor:aa11"), cmd="python -c import time; time.sleep(600)")
    (leak,) = _find(proc)
    assert (leak.device, leak.pid, leak.evidence, leak.ours) == (2, 300, "marker", True)
    assert (leak.holder_pid, leak.holder_key, leak.holder_name) == (200, "actor:aa11", "Trainer")
    assert leak.command.startswith("python -c import time")
    assert leak.start == 1300


@pytest.mark.parametrize("worker_env", [
    _node_env(),  # the raylet's placeholders
    _node_env(CUDA_VISIBLE_DEVICES="0,1,2,3", **{NODE_VISIBLE_ENV: "0,1,2,3"}),  # a preset node
    _node_env(HIP_VISIBLE_DEVICES="0,1", CUDA_VISIBLE_DEVICES="0"),  # a runtime_env's own value, an AMD preset
    _node_env(**{DEVICES_ENV: "0", HOLDER_ENV: "7:actor:x"}),  # markers the raylet inherited: every worker has them
], ids=["placeholders", "preset", "runtime-env", "inherited-markers"])
def test_idle_workers_never_count_whatever_their_environment(proc, worker_env):
    for pid in (201, 202, 203):
        _proc(proc, pid, RAYLET, env=worker_env, cmd="ray::IDLE")
    assert _find(proc) == []


def test_the_raylets_own_markers_are_ambient_for_what_it_starts_indirectly_too(proc):
    """Markers the raylet inherited (a test process that set them) reach everything below it: never a grant's."""
    (proc / str(RAYLET) / "environ").write_bytes(
        b"\0".join(f"{k}={v}".encode() for k, v in _node_env(**{DEVICES_ENV: "0", HOLDER_ENV: "7:actor:x"}).items()))
    _proc(proc, 201, RAYLET, env=_node_env(**{DEVICES_ENV: "0", HOLDER_ENV: "7:actor:x"}), cmd="ray::IDLE")
    _proc(proc, 301, 1, env=_node_env(**{DEVICES_ENV: "0", HOLDER_ENV: "7:actor:x"}), cmd="python helper.py")
    assert _find(proc) == []


def test_a_live_holder_and_its_descendants_are_not_leaks(proc):
    _proc(proc, 200, RAYLET, env=_node_env(), cmd="ray::Trainer")
    _proc(proc, 300, 200, env=_granted([3], 200, "actor:bb"), cmd="python dataloader")
    _proc(proc, 301, 300, env=_granted([3], 200, "actor:bb"), cmd="python dataloader-worker")
    holders = {200: Holder(200, "actor:bb", frozenset({3}))}
    assert _find(proc, holders) == []


def test_a_daemonised_child_of_a_live_holder_is_its_holders_by_its_marker(proc):
    """Reparented to init (its parent chain broken), it still names its holder, who lives and holds the device."""
    _proc(proc, 200, RAYLET, env=_node_env(), cmd="ray::Engine")
    _proc(proc, 300, 1, env=_granted([5], 200, "actor:cc"), cmd="python engine-core")
    assert _find(proc, {200: Holder(200, "actor:cc", frozenset({5}))}) == []


@pytest.mark.parametrize("parent", [200, 1], ids=["child", "daemonised"])
def test_a_live_workers_own_processes_are_its_business_until_it_ends(proc, parent):
    """A reused worker's earlier task left a helper (``multiprocessing``'s resource tracker, a server) that inherited
    the grant's markers; the worker now holds another device, or nothing. Once the worker ends, it is a leak."""
    _proc(proc, 200, RAYLET, env=_node_env(), cmd="ray::IDLE")
    _proc(proc, 300, parent, env=_granted([0], 200, "task:01"), cmd="python -c from multiprocessing.resource_tracker")
    assert _find(proc, {200: Holder(200, "task:02", frozenset({1}))}) == []
    assert _find(proc) == []
    import shutil

    shutil.rmtree(proc / "200")  # the worker ended (its child is reparented to init)
    (proc / "300" / "stat").write_text("300 (python) S 1 " + " ".join(["0"] * 17 + ["1300"] + ["0"] * 5))
    (leak,) = _find(proc)
    assert (leak.device, leak.pid, leak.ours, leak.holder_pid, leak.holder_key) == (0, 300, True, 200, "task:01")


def test_visible_devices_count_only_when_they_name_this_nodes_devices_and_differ_from_the_ambient_value(proc):
    _proc(proc, 300, 1, env=_node_env(CUDA_VISIBLE_DEVICES="4"), cmd="python a")  # a grant's value, no marker
    _proc(proc, 301, 1, env=_node_env(CUDA_VISIBLE_DEVICES=UNHOOKED), cmd="python b")  # the raylet's placeholders
    _proc(proc, 302, 1, env=_node_env(CUDA_VISIBLE_DEVICES="0,1", **{NODE_VISIBLE_ENV: "0,1"}), cmd="python c")
    _proc(proc, 303, 1, env=_node_env(CUDA_VISIBLE_DEVICES="4,GPU-unknown"), cmd="python d")  # not all known
    _proc(proc, 304, 1, env=_node_env(CUDA_VISIBLE_DEVICES=""), cmd="python e")  # a zero-GPU task's child
    assert [(lk.pid, lk.device, lk.evidence) for lk in _find(proc)] == [(300, 4, "visible-devices")]


def test_another_nodes_processes_on_this_machine_are_not_this_nodes(proc):
    env = _granted([1], 200, "actor:dd")
    env[NODE_DIR_ENV] = OTHER_NODE
    _proc(proc, 300, 1, env=env, cmd="python other-node-child")
    assert _find(proc) == []


def test_nvml_lists_a_stranger_it_is_reported_not_ours(proc):
    """NVML's process on a device: a process of this user outside Ray is a leak of the device, not ours to end."""
    _proc(proc, 400, 1, env={"PATH": "/usr/bin"}, cmd="python my_notebook.py")
    nv = [SimpleNamespace(pid=400, device=6, used_bytes=3 << 30)]
    (leak,) = _find(proc, nvml=nv)
    assert (leak.device, leak.pid, leak.evidence, leak.used_bytes, leak.ours) == (6, 400, "nvml", 3 << 30, False)
    assert "no marker of this node" in leak.why


def test_nvml_never_counts_a_worker_its_processes_an_unseen_pid_or_a_holder_of_the_device(proc):
    _proc(proc, 201, RAYLET, env=_node_env(), cmd="ray::IDLE")  # an idle worker keeping a CUDA context
    _proc(proc, 202, 201, env={"PATH": "/bin"}, cmd="python sub")  # and a process of its own, markers cleared
    _proc(proc, 200, RAYLET, env=_node_env(), cmd="ray::Trainer")
    _proc(proc, 300, 200, env=_granted([3], 200, "actor:ee"), cmd="python child")
    nv = [SimpleNamespace(pid=201, device=0, used_bytes=1), SimpleNamespace(pid=300, device=3, used_bytes=1),
          SimpleNamespace(pid=202, device=7, used_bytes=1),
          SimpleNamespace(pid=99999, device=4, used_bytes=1)]  # 99999: another pid namespace's
    assert _find(proc, {200: Holder(200, "actor:ee", frozenset({3}))}, nvml=nv) == []


def test_nvml_adds_its_memory_to_a_marked_leak(proc):
    _proc(proc, 300, 1, env=_granted([2], 200, "actor:ff"), cmd="python child")
    (leak,) = _find(proc, nvml=[SimpleNamespace(pid=300, device=2, used_bytes=5 << 20)])
    assert (leak.evidence, leak.used_bytes) == ("marker", 5 << 20)


def test_another_users_process_is_reported_never_ours():
    """Another user's environment is not readable: only NVML names it; it is never reclaimable."""
    procs = {RAYLET: Proc(RAYLET, 1, UID, 1, {NODE_DIR_ENV: NODE}),
             500: Proc(500, 1, UID + 1, 9, None)}
    (leak,) = find(procs, {}, node_dir=NODE, uid=UID, raylet_pid=RAYLET,
                   nvml=[SimpleNamespace(pid=500, device=1, used_bytes=None)])
    assert (leak.pid, leak.ours, leak.uid) == (500, False, UID + 1)
    assert f"uid {UID + 1}" in leak.why


def test_a_process_in_a_gone_workers_own_cgroup_is_its_leak(proc):
    cg = "0::/ray/worker-200"
    _proc(proc, 300, 1, env={"PATH": "/bin"}, cmd="python escaped", cgroup=cg)
    procs = scan(str(proc), uid=UID, keys=leakscan.keys_for(None), cgroups=True)
    (leak,) = find(procs, {}, node_dir=NODE, uid=UID, raylet_pid=RAYLET,
                   worker_cgroups={cg: (200, "actor:gg", frozenset({4}))})
    assert (leak.device, leak.evidence, leak.holder_pid, leak.holder_key, leak.ours) == (4, "cgroup", 200, "actor:gg",
                                                                                       True)


def test_init_and_the_kernels_threads_in_a_workers_cgroup_are_never_leaks(proc):
    """On a host without cgroups every process sits in the root one: kthreadd's children must never count."""
    cg = "0::/ray/worker-200"
    for pid, ppid, name in ((2, 0, "kthreadd"), (3, 2, "rcu_gp"), (40, 2, "kworker/0:1")):  # init: the fixture's
        _proc(proc, pid, ppid, env={}, cmd=name, cgroup=cg)
    (proc / "1" / "cgroup").write_text(cg + "\n")
    procs = scan(str(proc), uid=UID, keys=leakscan.keys_for(None), cgroups=True)
    assert find(procs, {}, node_dir=NODE, uid=UID, raylet_pid=RAYLET,
                worker_cgroups={cg: (200, "actor:gg", frozenset({4}))}) == []


@pytest.mark.parametrize("cg, root", [("0::/", True), ("", True), (None, True), ("1:name=systemd:/;0::/", True),
                                      ("0::/ray/worker-200", False), ("1:cpu:/;0::/user.slice/a", False)])
def test_a_root_cgroup_is_no_workers_own(cg, root):
    assert leakscan.is_root_cgroup(cg) is root


def test_the_raylet_is_found_from_the_holders_when_not_given(proc):
    _proc(proc, 200, RAYLET, env=_node_env(), cmd="ray::A")
    _proc(proc, 201, RAYLET, env=_node_env(CUDA_VISIBLE_DEVICES="3"), cmd="ray::IDLE")  # runtime_env's value
    procs = scan(str(proc), uid=UID, keys=leakscan.keys_for("CUDA_VISIBLE_DEVICES"))
    assert find(procs, {200: Holder(200, "actor:a", frozenset({1}))}, node_dir=NODE, uid=UID,
                visible_var="CUDA_VISIBLE_DEVICES", ids=IDS) == []


@pytest.mark.parametrize("text, parsed", [
    (format_holder(42, "actor:ab12", "Trainer"), (42, "actor:ab12", "Trainer")),
    (format_holder(42, "task:cd", "f:with:colons"), (42, "task:cd", "f:with:colons")),
    ("42:task:cd", (42, "task:cd", "")),
    ("", None), ("x:task:cd", None), ("42:task", None), ("42::cd", None), ("4" * 11 + ":a:b", None),
])
def test_the_holder_marker_round_trips_and_refuses_garbage(text, parsed):
    from rayaccel.contract import parse_holder

    assert parse_holder(text) == parsed


def test_scan_reads_only_this_users_environments_and_what_it_is_asked(proc):
    _proc(proc, 300, 1, env=_granted([2], 200, "actor:aa"), cmd="python x")
    procs = scan(str(proc), uid=UID, keys=(DEVICES_ENV,))
    assert procs[300].env == {DEVICES_ENV: "2"} and procs[300].ppid == 1 and procs[300].start == 1300
    assert scan(str(proc), uid=UID + 1, keys=(DEVICES_ENV,)) == {}  # nobody else's
    assert set(scan(str(proc), uid=UID + 1, keys=(), also={300})) == {300}
    assert scan(str(proc / "missing"), uid=UID, keys=()) == {}
