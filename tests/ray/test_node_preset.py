"""The devices a node was given (rayaccel.ray.node.preset) and the topology restricted to them.

Ray's own rules (``test_specific_gpus``, ``test_gpu_ids_cuda_visible_devices_preset``): a node started with
``CUDA_VISIBLE_DEVICES=4,5,6`` manages GPUs 4, 5 and 6 and hands out their ids as the preset writes them;
``--num-gpus`` smaller than the host takes the first devices; a bad preset is one error line, before anything
starts. Hosts are simulated topologies and FakeNVML hosts that list more devices than the node was given.
"""

from __future__ import annotations

import pytest
from hypothesis import given as hgiven, settings, strategies as st

from rayaccel import catalog
from rayaccel.discovery.nvidia import NvidiaBackend
from rayaccel.errors import ClusterError
from rayaccel.ray.node.preset import Preset, given, node_preset
from rayaccel.ray.node.start import node_env, prepare, zero_gpu_mode
from rayaccel.ray.record import NodeRecord, node_resources
from rayaccel.testing import FakeNVML

CVD = "CUDA_VISIBLE_DEVICES"


@pytest.fixture(scope="module")
def dgx1():
    return catalog.load("dgx1-v100")


@pytest.fixture(scope="module")
def nvml_host(dgx1):
    """An 8-GPU host as NVML lists it (whatever CUDA_VISIBLE_DEVICES says)."""
    return NvidiaBackend(nvml=FakeNVML(dgx1), sysfs_root="/nonexistent").discover()


@pytest.mark.parametrize("env,num_gpus,devices,ids", [
    ({CVD: "4,5,6"}, None, (4, 5, 6), ("4", "5", "6")),
    ({CVD: "6,4"}, None, (6, 4), ("6", "4")),
    ({CVD: "4,5,6"}, 2, (4, 5), ("4", "5")),
    ({CVD: " 1 , 3 "}, None, (1, 3), ("1", "3")),
    ({CVD: ""}, None, (), ()),
    ({CVD: "NoDevFiles"}, None, (), ()),
    ({}, 2, (0, 1), None),
    ({}, "2", (0, 1), None),
    ({}, 0, (), None),
], ids=["indices", "preset-order", "num-gpus-under-preset", "spaces", "empty-none", "nodevfiles", "num-gpus",
        "num-gpus-text", "num-gpus-0"])
def test_preset_gives_the_node_those_devices(nvml_host, env, num_gpus, devices, ids):
    topo, p = given(nvml_host, env, num_gpus=num_gpus)
    assert p.devices == devices and p.ray_ids == ids and p.restricted
    assert topo.indices == tuple(sorted(devices))
    assert node_resources(topo)[0] == len(devices)
    assert p.host == tuple(range(8))
    topo.validate()


@pytest.mark.parametrize("env,num_gpus", [({}, None), ({}, 8), ({}, "8")], ids=["nothing", "num-gpus-all", "kuberay"])
def test_whole_host_is_not_restricted(nvml_host, env, num_gpus):
    topo, p = given(nvml_host, env, num_gpus=num_gpus)
    assert not p.restricted and topo == nvml_host and p.ray_ids is None


def test_gpu_uuids_give_those_devices_and_ray_hands_out_the_uuids(nvml_host):
    u5, u2 = nvml_host.device(5).uuid, nvml_host.device(2).uuid
    topo, p = given(nvml_host, {CVD: f"{u5},{u2}"})
    assert p.devices == (5, 2) and p.ray_ids == (u5, u2)
    assert topo.indices == (2, 5)


def test_placeholders_of_a_rayaccel_worker_mean_no_device(nvml_host):
    topo, p = given(nvml_host, {CVD: "rayaccel-unhooked-0,rayaccel-unhooked-1"})
    assert p.devices == () and len(topo.devices) == 0


@pytest.mark.parametrize("env,num_gpus,words", [
    ({CVD: "9"}, None, ["CUDA_VISIBLE_DEVICES=9", "no device 9", "[0,1,2,3,4,5,6,7]"]),
    ({CVD: "GPU-nope"}, None, ["CUDA_VISIBLE_DEVICES=GPU-nope", "no device of this host has UUID GPU-nope"]),
    ({CVD: "MIG-nope"}, None, ["CUDA_VISIBLE_DEVICES=MIG-nope", "no MIG instance"]),
    ({CVD: "1,2"}, 3, ["--num-gpus=3", "2 device(s)", "--num-gpus=2 or fewer"]),
    ({CVD: "1,1"}, None, ["1 is named twice"]),
    ({CVD: "1,,2"}, None, ["an empty entry"]),
    ({}, 9, ["--num-gpus=9", "8 GPU(s)", "--num-gpus=8 or fewer"]),
    ({}, 1.5, ["--num-gpus=1.5", "whole number"]),
    ({}, -1, ["--num-gpus=-1", "whole number"]),
    ({}, "two", ["--num-gpus=two", "whole number"]),
], ids=["index-not-on-host", "uuid-unknown", "mig-unknown", "larger-than-preset", "twice", "empty-entry",
        "more-than-host", "fraction", "negative", "text"])
def test_bad_presets_are_one_error_line(nvml_host, env, num_gpus, words):
    with pytest.raises(ClusterError) as e:
        given(nvml_host, env, num_gpus=num_gpus)
    msg = str(e.value)
    assert "\n" not in msg and all(w in msg for w in words), msg


def test_mixing_a_uuid_and_an_index_is_refused(nvml_host):
    with pytest.raises(ClusterError, match=r"CUDA_VISIBLE_DEVICES=.*mixes indexs and uuids; name the devices one way"):
        given(nvml_host, {CVD: f"{nvml_host.device(1).uuid},3"})


def test_amd_reads_hip_and_refuses_rocr_alone():
    from rayaccel.discovery.rayspec import AMD

    t = catalog.load("mi300x-8x")
    if t is None:
        pytest.fail("no AMD machine")
    p = node_preset(t, AMD, {"HIP_VISIBLE_DEVICES": "2,3"})
    assert p.devices == (2, 3) and p.ray_ids == ("2", "3")
    assert node_preset(t, AMD, {CVD: "2,3"}).devices == t.indices  # CUDA's variable means nothing to Ray on AMD
    with pytest.raises(ClusterError, match="ROCR_VISIBLE_DEVICES=2: Ray reads HIP_VISIBLE_DEVICES"):
        node_preset(t, AMD, {"ROCR_VISIBLE_DEVICES": "2"})


def test_mig_uuids_keep_those_instances():
    t = catalog.load("a100-mig")
    parts = [p for p in t.partitions() if p.uuid][:2]
    if not parts:
        pytest.fail("a100-mig lists no MIG UUIDs")
    topo, p = given(t, {CVD: ",".join(q.uuid for q in parts)})
    assert {q.key for q in topo.partitions()} == {q.key for q in parts}
    assert p.ray_ids == tuple(q.uuid for q in parts)


# ------------------------------------------------------------------- the node start
def test_record_and_table_name_the_host_and_ray_ids(nvml_host, tmp_path, monkeypatch):
    monkeypatch.setenv("RAYACCEL_STATE_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    from rayaccel.arbiter.table import decode_table
    from rayaccel.contract import TABLE_FILE

    topo, p = given(nvml_host, {CVD: "4,5,6"})
    record, d = prepare(topo, simulated=False, preset=p)
    back = NodeRecord.from_json(record.to_json())
    assert back.host == tuple(range(8)) and back.given_by == "CUDA_VISIBLE_DEVICES=4,5,6"
    assert back.topology.indices == (4, 5, 6)
    table = decode_table((d / TABLE_FILE).read_bytes())
    assert table.resources["GPU"].units == (4, 5, 6)
    assert table.resources["GPU"].uuid_of == {4: "4", 5: "5", 6: "6"}
    env = node_env(topo, record.node_key, d, base={CVD: "4,5,6"})
    assert env[CVD] == "rayaccel-unhooked-0,rayaccel-unhooked-1,rayaccel-unhooked-2"
    assert env["RAYACCEL_NODE_VISIBLE"] == "4,5,6" and "RAYACCEL_ZERO_GPU_TASKS" not in env
    assert node_env(topo, record.node_key, d, base={}, zero_gpu_tasks="see-all")["RAYACCEL_ZERO_GPU_TASKS"] == "see-all"


def test_whole_host_record_has_no_host_field(dgx1):
    assert '"host"' not in NodeRecord("0123456789ab", dgx1, True).to_json()


@pytest.mark.parametrize("bad", ['"host":"all"', '"host":[true]', '"given_by":3'])
def test_record_refuses_a_bad_host_field(dgx1, bad):
    from rayaccel.errors import TopologyError

    text = NodeRecord("0123456789ab", dgx1, True).to_json()[:-1] + "," + bad + "}"
    with pytest.raises(TopologyError):
        NodeRecord.from_json(text)


@pytest.mark.parametrize("mode", ["see-any", "", "SEE-ALL"])
def test_zero_gpu_mode_is_checked(mode):
    with pytest.raises(ClusterError, match="expected see-none or see-all"):
        zero_gpu_mode(mode)


def test_ray_start_command_takes_num_gpus_under_the_host(nvml_host):
    from rayaccel.ray.node.lifecycle import ray_start_command

    topo, _ = given(nvml_host, {}, num_gpus="3")
    cmd = ray_start_command(topo, "0123456789ab", ["--head", "--num-gpus=3"], simulated=False)
    assert "--num-gpus=3" in cmd


# ------------------------------------------------------- the restriction, property-tested
@settings(max_examples=60, deadline=None)
@hgiven(name=st.sampled_from(["dgx1-v100", "pcie-8gpu-2socket", "a100-mig", "hgx-h100"]), data=st.data())
def test_subset_keeps_exactly_the_given_devices_and_their_facts(name, data):
    t = catalog.load(name)
    keep = data.draw(st.sets(st.sampled_from(t.indices)), label="keep")
    s = t.subset(keep).validate()
    assert s.indices == tuple(sorted(keep))
    for d in s.devices:  # every fact of a kept device is the host's
        assert d == t.device(d.index)
    assert {(l.a, l.b) for l in s.links} == {(l.a, l.b) for l in t.links if l.a in keep and l.b in keep}
    for a in keep:
        for b in keep:
            if a != b:
                assert s.link(a, b) == t.link(a, b)
    assert [n.name for n in s.nics] == [n.name for n in t.nics]
    for n, m in zip(s.nics, t.nics):
        assert n.paths == tuple(p for p in m.paths if p[0] in keep) and n.numa_node == m.numa_node
    assert t.subset(t.indices) == t  # the whole host is the host
    assert s.subset(keep) == s  # idempotent


def test_catalog_has_the_named_machines():
    for name in ("dgx1-v100", "pcie-8gpu-2socket", "a100-mig", "hgx-h100"):
        assert name in catalog.names(), name


def test_preset_describes_itself(nvml_host):
    _, p = given(nvml_host, {CVD: "4,5"})
    assert p.describe() == "host devices [0,1,2,3,4,5,6,7]; this node manages [4,5] (from CUDA_VISIBLE_DEVICES=4,5)"
    assert Preset(None, (0, 1), (0, 1)).describe().endswith("manages all of them")


# ------------------------------------------------------- MIG UUIDs: the instances are the node's GPUs
def _mig_host():
    t = catalog.load("a100-mig")
    parts = [p for p in t.partitions() if p.uuid]
    if len(parts) < 3:
        pytest.fail("a100-mig lists fewer than three MIG UUIDs")
    return t, parts


def test_mig_uuids_advertise_gpus_as_plain_ray_does(tmp_path, monkeypatch):
    """Plain Ray: ``CUDA_VISIBLE_DEVICES=MIG-a,MIG-b`` is ``GPU: 2`` and a task gets ``['MIG-a']``. A rayaccel node
    advertises the same (no ``mig_<profile>`` for those instances: they are the GPUs) and maps slots to them."""
    monkeypatch.setenv("RAYACCEL_STATE_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    from rayaccel.arbiter.table import decode_table
    from rayaccel.contract import TABLE_FILE

    t, parts = _mig_host()
    a, b = parts[:2]
    assert a.gi_id < b.gi_id  # the preset names b first: slot 0 is b, as on plain Ray
    value = f"{b.uuid},{a.uuid}"
    topo, p = given(t, {CVD: value})
    assert p.mig_gpus and p.partitions == (b.key, a.key)
    num, res = node_resources(topo, mig_gpus=True)
    assert num == 2 and not any(r.startswith("mig_") for r in res)
    record, d = prepare(topo, simulated=True, preset=p)
    back = NodeRecord.from_json(record.to_json())
    assert back.mig_gpus and back.mismatch({"GPU": 2.0, **res}) is None
    assert back.mismatch({**res, "GPU": 0.0, "mig_" + a.profile: 2.0}) is not None
    table = decode_table((d / TABLE_FILE).read_bytes())
    gpu = table.resources["GPU"]
    assert gpu.kind == "mig" and gpu.units == (b.key, a.key)  # slot i: the preset's i-th instance, as on plain Ray
    assert gpu.device_of == {b.key: b.parent, a.key: a.parent}
    assert gpu.uuid_of == {b.key: b.uuid, a.key: a.uuid}
    assert not any(r.startswith("mig_") for r in table.resources)
    assert "GPU" in table.unit_resources()
    env = node_env(topo, record.node_key, d, base={CVD: value}, mig_gpus=True)
    assert env[CVD] == "rayaccel-unhooked-0,rayaccel-unhooked-1" and env["RAYACCEL_NODE_VISIBLE"] == value
    assert "mig_" not in env.get("RAY_custom_unit_instance_resources", "")


def test_mig_uuids_with_num_gpus_keep_the_first(tmp_path):
    from rayaccel.ray.node.lifecycle import ray_start_command

    t, parts = _mig_host()
    topo, p = given(t, {CVD: ",".join(q.uuid for q in parts[:3])}, num_gpus=1)
    assert p.mig_gpus and p.partitions == (parts[0].key,) and p.ray_ids == (parts[0].uuid,)
    assert {q.key for q in topo.partitions()} == {parts[0].key}
    num, res = node_resources(topo, mig_gpus=True)
    assert num == 1 and not any(r.startswith("mig_") for r in res)
    cmd = ray_start_command(topo, "0123456789ab", ["--head", "--num-gpus=1"], simulated=True, mig_gpus=True)
    assert "--num-gpus=1" in cmd and not any("mig_" in c for c in cmd if c.startswith("--resources"))


def test_a_node_without_a_mig_preset_keeps_mig_resources():
    t, parts = _mig_host()
    for env in ({}, {CVD: "0"}):
        topo, p = given(t, env)
        assert not p.mig_gpus
        num, res = node_resources(topo)
        assert num == 0 and sum(v for r, v in res.items() if r.startswith("mig_")) == len(parts)


def test_a_mig_request_never_plans_onto_a_node_whose_instances_are_its_gpus():
    from rayaccel.placement import Request
    from rayaccel.ray.driver.claim import _idle_fit
    from rayaccel.ray.driver.view import NodeView

    t, parts = _mig_host()
    topo, p = given(t, {CVD: parts[0].uuid})
    for mig_gpus, fits in ((True, False), (False, True)):
        rec = NodeRecord("0123456789ab", topo, True, host=p.host, given_by=p.source, mig_gpus=mig_gpus)
        fit = _idle_fit(NodeView("n" * 56, rec.node_key, rec, {}, {}), Request(mig=parts[0].profile))
        assert bool(fit) is fits
        if not fits:
            assert "ask num_gpus=" in fit.reasons[0]


def test_dynamic_mig_with_mig_uuids_is_one_error_line(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYACCEL_STATE_DIR", str(tmp_path))
    tmp_path.chmod(0o700)
    t, parts = _mig_host()
    topo, p = given(t, {CVD: parts[0].uuid})
    with pytest.raises(ClusterError, match=r"^--dynamic-mig with CUDA_VISIBLE_DEVICES=MIG-.*drop --dynamic-mig") as e:
        prepare(topo, simulated=True, preset=p, dynamic_mig=(0,))
    assert "\n" not in str(e.value) and not list(tmp_path.iterdir())  # nothing made
