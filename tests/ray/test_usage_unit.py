"""Per-holder usage without Ray: NVML's per-process figures (FakeNVML), the workers' usage files,
``rayaccel.report_usage``'s checks, the join to holders, the metrics and the ``top`` / ``status`` rows."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest
from rich.console import Console

from rayaccel import _proc
from rayaccel.arbiter.state import SnapshotHolder
from rayaccel.contract import DEVICES_ENV, NODE_DIR_ENV, USAGE_DIR, USAGE_SCHEMA
from rayaccel.discovery import load_topology
from rayaccel.discovery._nvml_api import NVML_ERROR_NOT_SUPPORTED
from rayaccel.errors import RequestError, StateError
from rayaccel.health.usage import NvmlUsageReader, ProcessUsage
from rayaccel.ray import usagefile
from rayaccel.ray.node.usage import HolderUsage, join, title_class
from rayaccel.ray.worker.usage import report_usage
from rayaccel.testing._fakenvml_usage import FakeNVMLUsage, ProcessInfo
from rayaccel.testing.fakenvml import FakeNVML

GiB = 1 << 30


def _holder(pid, name, kind="actor", devices=(0,), id="a1", waiting=None, drain=None, partitions=()):
    return SnapshotHolder(pid, name, kind, "01000000", id, 1.0, tuple(devices), tuple(partitions), False, waiting,
                          drain, None, None)


@pytest.fixture
def topo():
    return load_topology("dgx1-v100")


# ------------------------------------------------------------------ NVML's per-process figures
def test_reader_gives_each_process_its_memory_and_sm_utilisation(topo):
    nv = FakeNVML(topo)
    nv.set_process_usage(0, 4242, used_bytes=3 * GiB, sm_util=40)
    nv.set_process_usage(0, 4343, used_bytes=None)  # NVML cannot tell (another user's process)
    nv.set_process_usage(5, 4242, used_bytes=GiB, sm_util=0)
    r = NvmlUsageReader(topo, nvml=nv)
    got = {(p.pid, p.device): p for p in r.read()}
    assert set(got) == {(4242, 0), (4343, 0), (4242, 5)}
    assert got[(4242, 0)].used_bytes == 3 * GiB and got[(4242, 0)].utilization == 40.0
    assert got[(4343, 0)].used_bytes is None and got[(4343, 0)].utilization == 0.0  # no sample: idle
    assert got[(4242, 0)].gpu_instance is None
    nv.clear_process_usage(pid=4242)
    assert {(p.pid, p.device) for p in r.read()} == {(4343, 0)}
    r.close()


def test_reader_says_unknown_where_nvml_has_no_per_process_utilisation(topo):
    nv = FakeNVML(topo)
    nv.fail("nvmlDeviceGetProcessesUtilizationInfo", NVML_ERROR_NOT_SUPPORTED)
    nv.fail("nvmlDeviceGetProcessUtilization", NVML_ERROR_NOT_SUPPORTED)
    nv.set_process_usage(1, 77, used_bytes=GiB, sm_util=90)
    (p,) = NvmlUsageReader(topo, nvml=nv).read()
    assert (p.pid, p.device, p.used_bytes, p.utilization) == (77, 1, GiB, None)  # never a made-up 0


def test_reader_falls_back_to_the_older_utilisation_call(topo):
    nv = FakeNVML(topo)
    nv.fail("nvmlDeviceGetProcessesUtilizationInfo", NVML_ERROR_NOT_SUPPORTED)
    nv.set_process_usage(2, 78, used_bytes=GiB, sm_util=55)
    (p,) = NvmlUsageReader(topo, nvml=nv).read()
    assert p.utilization == 55.0 and "nvmlDeviceGetProcessUtilization" in nv.calls


class _OtherProcesses:
    """Another mixin answering the same call (a leak finder's processes): both lists must come back."""

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return [ProcessInfo(9001, 123), ProcessInfo(4242, 1)]


class _Both(FakeNVML, _OtherProcesses):
    pass


def test_the_process_list_mixin_is_cooperative(topo):
    assert FakeNVMLUsage in _Both.__mro__
    nv = _Both(topo)
    nv.nvmlInit()
    nv.set_process_usage(0, 4242, used_bytes=5)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(0))
    assert sorted((p.pid, p.usedGpuMemory) for p in procs) == [(4242, 5), (9001, 123)]  # its own entry wins


# ------------------------------------------------------------------ usage files
def test_a_usage_file_round_trips_and_goes_with_its_process(tmp_path):
    usagefile.forget()
    try:
        usagefile.report(str(tmp_path), 3, 2 * GiB, 12.5, {"id": "ab", "actor_class": "Trainer", "actor_name": "t0"})
        usagefile.spilled(str(tmp_path), 4096, 3, {})
        files, problems = usagefile.read_all(str(tmp_path))
        assert problems == []
        u = files[os.getpid()]
        assert u.devices == {3: (2 * GiB, 12.5)} and u.spilled_bytes == 4096 and u.spilled_device == 3
        assert (u.id, u.actor_class, u.actor_name) == ("ab", "Trainer", "t0")
        assert oct(os.stat(usagefile.path(str(tmp_path))).st_mode & 0o777) == "0o600"
    finally:
        usagefile.forget()
    # a dead process's file, and one whose pid now names another process, are removed
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    for pid, start in ((dead.pid, 1), (os.getpid(), (_proc.start_time(os.getpid()) or 0) + 1)):
        (tmp_path / USAGE_DIR / f"{pid}.json").write_text(json.dumps(
            {"schema": USAGE_SCHEMA, "pid": pid, "start": start, "devices": {"0": {"used_bytes": 1}}}))
    files, _ = usagefile.read_all(str(tmp_path))
    assert files == {} and os.listdir(tmp_path / USAGE_DIR) == []


@pytest.mark.parametrize("bad, field", [
    ({"devices": {"0": {"used_bytes": -1}}}, "devices.0.used_bytes"),
    ({"devices": {"0": {"utilization": 150}}}, "devices.0.utilization"),
    ({"devices": {"x": {}}}, "devices"),
    ({"spilled_bytes": "lots"}, "spilled_bytes"),
    ({"actor_class": 3}, "actor_class"),
    ({"pid": True}, "pid"),
    ({"schema": "rayaccel.usage/9"}, "rayaccel.usage/9"),
])
def test_a_bad_usage_file_is_refused_naming_the_field(tmp_path, bad, field):
    data = {"schema": USAGE_SCHEMA, "pid": os.getpid(), "devices": {}, **bad}
    with pytest.raises(StateError, match=field.replace(".", r"\.")):
        usagefile.decode(json.dumps(data), "f")
    (tmp_path / USAGE_DIR).mkdir()
    (tmp_path / USAGE_DIR / f"{os.getpid()}.json").write_text(json.dumps(data))
    files, problems = usagefile.read_all(str(tmp_path))
    assert files == {} and len(problems) == 1 and field in problems[0]


# ------------------------------------------------------------------ report_usage
@pytest.fixture
def worker_env(tmp_path, monkeypatch):
    monkeypatch.setenv(NODE_DIR_ENV, str(tmp_path))
    monkeypatch.setenv(DEVICES_ENV, "2,5")
    usagefile.forget()
    yield tmp_path
    usagefile.forget()


@pytest.mark.parametrize("kwargs, match", [
    ({"used_bytes": "3GiB"}, "holds devices \\[2, 5\\]; name one with device="),
    ({"used_bytes": "3GiB", "device": 0}, "device=0: this worker holds devices \\[2, 5\\]"),
    ({"used_bytes": "3GiB", "device": True}, "device=True"),
    ({"utilization": 101, "device": 2}, "utilization=101: give a percentage from 0 to 100"),
    ({"utilization": "busy", "device": 2}, "utilization='busy'"),
    ({"used_bytes": "three", "device": 2}, "used_bytes"),
    ({"used_bytes": -5, "device": 2}, "used_bytes"),
    ({"device": 2}, "give used_bytes, utilization or both"),
])
def test_report_usage_bad_input_is_one_request_error(worker_env, kwargs, match):
    with pytest.raises(RequestError, match=match):
        report_usage(**kwargs)
    assert not (worker_env / USAGE_DIR).exists()  # nothing half-written


def test_report_usage_outside_a_worker_says_so(monkeypatch):
    monkeypatch.delenv(NODE_DIR_ENV, raising=False)
    with pytest.raises(RequestError, match="inside a Ray task or actor that holds devices of a rayaccel node"):
        report_usage(used_bytes=1)


def test_report_usage_writes_what_the_agent_reads(worker_env):
    report_usage(used_bytes="3GiB", utilization=40, device=5)
    report_usage(used_bytes=GiB, device=2)
    files, _ = usagefile.read_all(str(worker_env))
    assert files[os.getpid()].devices == {5: (3 * GiB, 40.0), 2: (GiB, None)}


# ------------------------------------------------------------------ the join
def test_join_names_each_holder_per_device_and_counts_its_children():
    holders = [_holder(100, "t0", "actor", (0, 1), id="a1"), _holder(200, "train", "task", (2,), id="t2"),
               _holder(300, "Waiter", waiting="no set"), _holder(400, "rayaccel-drain-x-3", drain=3)]
    procs = [ProcessUsage(100, 0, 2 * GiB, 30.0, None), ProcessUsage(101, 0, GiB, 50.0, None),  # 101: 100's child
             ProcessUsage(100, 1, GiB, None, None), ProcessUsage(200, 2, 5 * GiB, 99.0, None),
             ProcessUsage(555, 3, GiB, 10.0, None), ProcessUsage(400, 3, GiB, 1.0, None)]  # a stranger, a placeholder
    parents = {101: 100, 555: 1}
    titles = {100: "ray::Trainer.step", 200: "ray::train"}
    rows = join(holders, procs, {}, parent=parents.get, cmdline=lambda p: titles.get(p, ""))
    by = {(r.pid, r.device): r for r in rows}
    assert set(by) == {(100, 0), (100, 1), (200, 2)}
    a = by[(100, 0)]
    assert (a.kind, a.actor_class, a.actor_name, a.task_function) == ("actor", "Trainer", "t0", "")
    assert (a.used_bytes, a.utilization, a.pids, a.source) == (3 * GiB, 80.0, (100, 101), "nvml")
    assert by[(100, 1)].utilization is None  # unknown stays unknown
    t = by[(200, 2)]
    assert (t.kind, t.actor_class, t.task_function, t.used_bytes) == ("task", "", "train", 5 * GiB)


def test_join_uses_reports_where_nvml_is_silent_and_drops_an_earlier_tasks_figures():
    holders = [_holder(100, "Trainer", "actor", (0,), id="a1"), _holder(200, "f", "task", (1,), id="t-new")]
    files = {
        100: usagefile.WorkerUsage(100, 1.0, "a1", {0: (GiB, 20.0)}, 4096, 0, "Trainer", "", ""),
        200: usagefile.WorkerUsage(200, 1.0, "t-old", {1: (GiB, 20.0)}, None, None, "", "", "g"),
    }
    rows = join(holders, [], files, parent=lambda p: None, cmdline=lambda p: "")
    assert [(r.pid, r.device, r.used_bytes, r.utilization, r.spilled_bytes, r.source, r.actor_class, r.actor_name)
            for r in rows] == [(100, 0, GiB, 20.0, 4096, "reported", "Trainer", "")]
    # NVML's figure wins over the report for the same process and device; the spilled bytes stay
    rows = join(holders, [ProcessUsage(100, 0, 7, 1.0, None)], files, parent=lambda p: None, cmdline=lambda p: "")
    assert [(r.used_bytes, r.spilled_bytes, r.source) for r in rows] == [(7, 4096, "nvml")]


def test_join_names_the_mig_instance_from_the_gpu_instance():
    holders = [_holder(100, "M", "actor", (), partitions=("0:mig1",))]
    (r,) = join(holders, [ProcessUsage(100, 0, GiB, None, 1)], {}, parent=lambda p: None, cmdline=lambda p: "")
    assert r.partition == "0:mig1" and r.actor_class == "M"


@pytest.mark.parametrize("title, cls", [("ray::Trainer", "Trainer"), ("ray::Trainer.step", "Trainer"),
                                        ("ray::IDLE", ""), ("python x.py", ""), ("", "")])
def test_title_class(title, cls):
    assert title_class(title) == cls


# ------------------------------------------------------------------ metrics, status and top
class _Gauge:
    def __init__(self):
        self.values = {}

    def set(self, v, tags):
        self.values[tuple(sorted(tags.items()))] = v


def _row(pid, dev, cls="", name="", fn="", used=None, util=None, spilled=None, kind="actor"):
    return HolderUsage(pid, dev, None, kind, name or cls or fn, "id", "job", cls, name, fn, used, util, spilled,
                       "nvml", (pid,))


def test_the_exporter_sums_same_tags_skips_unknowns_and_zeroes_gone_series():
    from rayaccel.ray.node.metrics import Exporter

    exp = Exporter.__new__(Exporter)
    exp.agent = type("A", (), {"node_key": "n1"})()
    exp.used, exp.util, exp.spilled = _Gauge(), _Gauge(), _Gauge()
    exp._usage_keys = {"used": set(), "util": set(), "spilled": set()}
    exp.export_usage([_row(1, 0, "Policy", used=GiB, util=70.0), _row(2, 0, "Policy", used=GiB, util=60.0),
                      _row(3, 1, fn="train", kind="task", used=None, util=5.0, spilled=10)])
    key = (("actor_class", "Policy"), ("actor_name", ""), ("device", "0"), ("node", "n1"), ("task_function", ""))
    task = (("actor_class", ""), ("actor_name", ""), ("device", "1"), ("node", "n1"), ("task_function", "train"))
    assert exp.used.values == {key: 2.0 * GiB}  # the task's unknown memory is not exported as 0
    assert exp.util.values == {key: 100.0, task: 5.0}
    assert exp.spilled.values == {task: 10.0}
    exp.export_usage([])
    assert exp.used.values == {key: 0.0} and exp.util.values == {key: 0.0, task: 0.0}


def test_top_and_status_show_a_row_per_holder_and_device():
    from rayaccel.cli.views import status_tables, top_frame

    row = _row(100, 2, "Trainer", "t0", used=3 * GiB, util=41.0, spilled=GiB)._asdict()
    task = _row(200, 3, fn="train", kind="task", used=None, util=None)._asdict()
    node = {"node_id": "f" * 40, "node_key": "abcdefabcdef", "name": "n", "simulated": True, "free": 0,
            "devices": [], "holders": [], "usage": [row, task], "labels": {}}
    for frame in (top_frame({"nodes": [node], "bad": []}, topologies={}),
                  *status_tables({"nodes": [node], "bad": []})):
        buf = io.StringIO()
        Console(file=buf, width=200).print(frame)
        out = buf.getvalue()
        if "per-holder usage" in out:
            break
    assert "actor Trainer 't0'" in out and "3.0 GiB" in out and "41%" in out and "1.0 GiB" in out
    assert "task train" in out and "?" in out


def test_on_a_gpu_in_mig_mode_each_process_names_its_gpu_instance():
    topo = load_topology("a100-mig")
    nv = FakeNVML(topo)
    nv.set_process_usage(0, 10, used_bytes=GiB, gpu_instance=7)
    nv.set_process_usage(0, 11, used_bytes=2 * GiB, gpu_instance=2)
    got = {p.pid: p.gpu_instance for p in NvmlUsageReader(topo, nvml=nv).read()}
    assert got == {10: 7, 11: 2}
    nv.nvmlInit()
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(nv.nvmlDeviceGetHandleByIndex(0), 0)  # a MIG device: its own only
    gi = nv.nvmlDeviceGetGpuInstanceId(mig)
    assert gi in (7, 8, 2)
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(mig)] == [pid for pid, g in ((10, 7), (11, 2))
                                                                              if g == gi]
    rows = join([_holder(10, "M", partitions=("0:mig7",))], NvmlUsageReader(topo, nvml=nv).read(), {},
                parent=lambda p: None, cmdline=lambda p: "")
    assert [(r.pid, r.partition, r.used_bytes) for r in rows] == [(10, "0:mig7", GiB)]


def test_spilled_bytes_are_written_only_when_they_change(worker_env):
    from rayaccel.ray.usagefile import note_spilled

    note_spilled(1000)
    p = usagefile.path(str(worker_env))
    first = os.stat(p).st_mtime_ns
    os.utime(p, ns=(1, 1))
    note_spilled(1000)  # unchanged: not rewritten
    assert os.stat(p).st_mtime_ns == 1 and first != 1
    note_spilled(0)
    u = usagefile.read_all(str(worker_env))[0][os.getpid()]
    assert (u.spilled_bytes, u.spilled_device) == (0, 2)  # the worker's first device


def test_the_agents_watch_joins_nvml_and_the_files_to_the_last_snapshot(worker_env, topo):
    from types import SimpleNamespace

    from rayaccel.arbiter.state import Snapshot
    from rayaccel.ray.node.usage import UsageWatch

    me = os.getpid()
    nv = FakeNVML(topo)
    nv.set_process_usage(5, me, used_bytes=GiB, sm_util=12)
    usagefile.report(str(worker_env), 2, 2 * GiB, None, {"id": "a1", "actor_class": "Trainer", "actor_name": ""})
    (worker_env / USAGE_DIR / "77.json").write_text("{not json")
    agent = SimpleNamespace(dir=str(worker_env), last=Snapshot(at=1.0, holders=(_holder(me, "Trainer", devices=(2, 5)),)))
    w = UsageWatch(NvmlUsageReader(topo, nvml=nv))
    w(agent)
    got = {(r.device, r.used_bytes, r.utilization, r.source, r.actor_class) for r in agent.usage_rows}
    assert got == {(2, 2 * GiB, None, "reported", "Trainer"), (5, GiB, 12.0, "nvml", "Trainer")}
    assert len(w.problems) == 1 and "77.json" in w.problems[0] and "not JSON" in w.problems[0]
