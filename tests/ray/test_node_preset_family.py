"""A node of another family than GPUs given part of its host: Neuron, TPU, Gaudi, Ascend, a plugin's.

Plain Ray 2.60 (``ray/_private/accelerators``: ``neuron.py``, ``tpu.py``, ``hpu.py``, ``npu.py``;
``resource_and_label_spec.py``; ``worker.py`` ``get_accelerator_ids_for_accelerator_resource``): the
family's variable set for the node (``NEURON_RT_VISIBLE_CORES=4,5,6,7``) is split on commas, each entry an
id; the node counts ``min(detected, len(ids))`` or ``--resources {resource: n}`` (more than the ids is
Ray's error); slot ``i`` is handed out as the ``i``-th id, its text. ``--resources n`` alone: the ids
``0..n-1``. A rayaccel node restricts its topology to the devices of those units and its table's ids to
the preset's (:mod:`rayaccel.ray.node.preset`). Hosts are the catalog's simulated machines.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
from hypothesis import given as hgiven, settings, strategies as st

from rayaccel import catalog
from rayaccel.arbiter.table import decode_table
from rayaccel.contract import TABLE_FILE
from rayaccel.discovery.rayspec import RaySpec
from rayaccel.errors import ClusterError
from rayaccel.placement.units import choose_units, node_units, visible_env
from rayaccel.ray.node.preset import given, node_preset, table_ids
from rayaccel.ray.node.start import node_env, prepare
from rayaccel.ray.record import NodeRecord, node_resources, node_spec
from rayaccel.topology import Device, NodeTopology

NRT, TPU, HPU, NPU = "NEURON_RT_VISIBLE_CORES", "TPU_VISIBLE_CHIPS", "HABANA_VISIBLE_MODULES", "ASCEND_RT_VISIBLE_DEVICES"


@pytest.fixture(autouse=True)
def _state_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RAYACCEL_STATE_DIR", str(tmp_path))
    tmp_path.chmod(0o700)


# --------------------------------------------------------------------- what the node manages
@pytest.mark.parametrize("machine,env,res,devices,units,ids", [
    ("trn1-32xlarge", {NRT: "4,5,6,7"}, None, (2, 3), (4, 5, 6, 7), ("4", "5", "6", "7")),
    ("trn1-32xlarge", {NRT: "7,4"}, None, (3, 2), (7, 4), ("7", "4")),
    ("trn1-32xlarge", {NRT: "4,5,6,7"}, {"neuron_cores": 2}, (2,), (4, 5), ("4", "5")),
    ("trn1-32xlarge", {}, {"neuron_cores": 4}, (0, 1), (0, 1, 2, 3), None),
    ("inf2-48xlarge", {NRT: "22,23"}, None, (11,), (22, 23), ("22", "23")),
    ("tpu-v6e-8", {TPU: "4,5,6,7"}, None, (4, 5, 6, 7), (4, 5, 6, 7), ("4", "5", "6", "7")),
    ("tpu-v4-8", {}, {"TPU": 2}, (0, 1), (0, 1), None),
    ("gaudi2-hls2-8x", {HPU: "2,3"}, None, (2, 3), (2, 3), ("2", "3")),
    ("gaudi3-hls3-8x", {HPU: "6,1,0"}, {"HPU": 2}, (6, 1), (6, 1), ("6", "1")),
    ("atlas-800-910a-8x", {NPU: "5,6"}, None, (5, 6), (5, 6), ("5", "6")),
], ids=["neuron", "neuron-order", "neuron-count-of-preset", "neuron-count", "inf2", "tpu", "tpu-count", "gaudi",
        "gaudi3-count-of-preset", "ascend"])
def test_a_family_preset_gives_the_node_those_units(machine, env, res, devices, units, ids):
    host = catalog.load(machine)
    topo, p = given(host, env, resources=res)
    assert (p.devices, p.units, p.ray_ids) == (devices, units, ids)
    assert p.host == host.indices and p.partial
    assert topo.indices == tuple(sorted(devices))  # their links, NUMA, NICs: NodeTopology.subset
    spec = node_spec(topo)
    assert node_resources(topo)[1][spec.resource] == len(units)  # what the node advertises to Ray
    named = table_ids(topo, spec, p)  # the node's units, named as Ray hands them out
    if ids is None:
        assert named is None and [u.id for u in node_units(topo, spec)] == sorted(units)  # Ray's 0..n-1
    else:
        assert sorted(named.values(), key=int) == sorted(ids, key=int)


@pytest.mark.parametrize("value,cores,split", [
    ("5,6,7,8", (5, 6, 7, 8), ((1, 3), (2, 1))),  # trn2: 4 cores a device; 5-7 of device 1, 8 of device 2
    ("9", (9,), ((2, 1),)),
    ("8,9,10,11", (8, 9, 10, 11), ()),
])
def test_a_preset_splitting_a_device_keeps_those_cores_of_it(value, cores, split):
    host = catalog.load("trn2-48xlarge")
    topo, p = given(host, {NRT: value})
    assert p.units == cores and p.split == split
    for d, n in split:
        assert topo.device(d).cores == n  # the node's cores on that device
    spec = node_spec(topo)
    named = table_ids(topo, spec, p)
    assert [named[u.id] for u in node_units(topo, spec)] == [str(c) for c in cores]
    assert {u.device for u in node_units(topo, spec)} == set(p.devices)


def test_count_alone_splits_the_last_device_as_ray_numbers_it():
    topo, p = given(catalog.load("trn2-48xlarge"), {}, resources={"neuron_cores": 6})
    assert p.units == tuple(range(6)) and p.split == ((1, 2),) and p.ray_ids is None
    assert [u.id for u in node_units(topo, node_spec(topo))] == list(range(6))  # the host's own ids 0..5


@pytest.mark.parametrize("machine,env,res", [
    ("trn1-32xlarge", {NRT: ",".join(map(str, range(32)))}, None),
    ("tpu-v6e-8", {}, {"TPU": 8}),
    ("gaudi2-hls2-8x", {}, None),
])
def test_the_whole_host_is_the_whole_host(machine, env, res):
    host = catalog.load(machine)
    topo, p = given(host, env, resources=res)
    assert topo == host and not p.partial


@pytest.mark.parametrize("value", ["", "NoDevFiles"])
def test_ascend_none_values_give_no_device(value):
    topo, p = given(catalog.load("atlas-800-910a-8x"), {NPU: value})
    assert p.devices == () and topo.devices == () and node_resources(topo) == (0, {})


def test_placeholders_of_a_rayaccel_worker_mean_no_unit():
    topo, p = given(catalog.load("trn1-32xlarge"), {NRT: "rayaccel-unhooked-0,rayaccel-unhooked-1"})
    assert p.units == () and topo.devices == ()


def test_a_plugin_family_is_restricted_by_its_own_variable():
    spec = RaySpec(vendor="acme", resource="ACME", unit="device", visible_env=("ACME_VISIBLE_DEVICES",),
                   accelerator_type="model")
    host = NodeTopology(devices=tuple(Device(i, vendor="acme", model="Acme X1") for i in range(4)))
    p = node_preset(host, spec, {"ACME_VISIBLE_DEVICES": "3,1"})
    assert (p.devices, p.units, p.ray_ids) == ((3, 1), (3, 1), ("3", "1"))
    p = node_preset(host, spec, {}, resources={"ACME": 1})
    assert (p.devices, p.source) == ((0,), "--resources ACME=1")


# --------------------------------------------------------------------- bad presets
@pytest.mark.parametrize("machine,env,res,words", [
    ("trn1-32xlarge", {NRT: "4,5,99"}, None, "NEURON_RT_VISIBLE_CORES=4,5,99: this host has no core 99; its "
                                             "neuron_cores ids are 0-31"),
    ("trn1-32xlarge", {NRT: "4,5,4"}, None, "NEURON_RT_VISIBLE_CORES=4,5,4: core 4 is named twice; name each core once"),
    ("trn1-32xlarge", {NRT: "4-7"}, None, "NEURON_RT_VISIBLE_CORES=4-7: Ray reads 4-7 as one id, not a range "
                                          r"\(plain Ray counts it as 1 neuron_cores\); name each core: "
                                          "NEURON_RT_VISIBLE_CORES=4,5,6,7"),
    ("trn1-32xlarge", {NRT: "0,nc1"}, None, "NEURON_RT_VISIBLE_CORES=0,nc1: nc1 is not a core id"),
    ("trn1-32xlarge", {NRT: "0,,1"}, None, "NEURON_RT_VISIBLE_CORES=0,,1: an empty entry"),
    ("trn1-32xlarge", {NRT: "4,5"}, {"neuron_cores": 3}, "--resources neuron_cores=3: NEURON_RT_VISIBLE_CORES=4,5 "
                                                         "gives this node 2 neuron_cores; give neuron_cores=2 or fewer"),
    ("trn1-32xlarge", {}, {"neuron_cores": 40}, "--resources neuron_cores=40: this host has 32 neuron_cores "
                                                r"\(0-31\); give neuron_cores=32 or fewer"),
    ("trn1-32xlarge", {}, {"neuron_cores": 1.5}, "--resources neuron_cores=1.5: expected a whole number"),
    ("tpu-v6e-8", {TPU: "8"}, None, "TPU_VISIBLE_CHIPS=8: this host has no chip 8; its TPU ids are 0-7"),
    ("gaudi2-hls2-8x", {HPU: "1,1"}, None, "HABANA_VISIBLE_MODULES=1,1: device 1 is named twice"),
    ("atlas-800-910a-8x", {NPU: "5,6"}, {"NPU": 3}, "--resources NPU=3: ASCEND_RT_VISIBLE_DEVICES=5,6 gives"),
])
def test_bad_family_presets_are_one_error_line(machine, env, res, words):
    with pytest.raises(ClusterError, match=words) as e:
        given(catalog.load(machine), env, resources=res)
    assert "\n" not in str(e.value)


# --------------------------------------------------------------------- the node start
def test_record_table_and_environment_of_a_neuron_preset():
    topo, p = given(catalog.load("trn1-32xlarge"), {NRT: "4,5,6,7"})
    record, d = prepare(topo, simulated=True, preset=p)
    back = NodeRecord.from_json(record.to_json())
    assert back.host == tuple(range(16)) and back.given_by == "NEURON_RT_VISIBLE_CORES=4,5,6,7"
    assert back.topology.indices == (2, 3)
    t = decode_table((d / TABLE_FILE).read_bytes()).resources["neuron_cores"]
    assert t.units == (0, 1, 2, 3) and t.device_of == {0: 2, 1: 2, 2: 3, 3: 3}
    assert t.uuid_of == {0: "4", 1: "5", 2: "6", 3: "7"}  # the host's cores, as the preset names them
    env = node_env(topo, record.node_key, d, base={NRT: "4,5,6,7"})
    assert env[NRT] == ",".join(f"rayaccel-unhooked-{i}" for i in range(4))
    assert p.describe() == ("host devices [0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15] (neuron_cores 0-31); this node "
                            "manages [2,3] (neuron_cores 4,5,6,7) (from NEURON_RT_VISIBLE_CORES=4,5,6,7)")


@pytest.mark.parametrize("value,unsets", [("4,5,6,7", False), ("0,1,2,3,4,5,6,7", True)])
def test_a_tpu_node_given_part_of_the_host_never_unsets_the_chips(value, unsets):
    """Ray unsets TPU_VISIBLE_CHIPS only for a grant of every chip of the host; a node given half has none such."""
    topo, p = given(catalog.load("tpu-v6e-8"), {TPU: value})
    _, d = prepare(topo, simulated=True, preset=p)
    t = decode_table((d / TABLE_FILE).read_bytes()).resources["TPU"]
    assert t.spec["whole_host_unsets"] is unsets
    from rayaccel.arbiter.placer import spec_of

    env = visible_env(topo, spec_of(t.spec), list(t.units))
    assert env["TPU_VISIBLE_CHIPS"] == (None if unsets else value)


def test_the_hook_hands_out_the_presets_ids(monkeypatch):
    """hook._ids_for / _family_env: Ray's ids and the variable for the node's units, named by the table."""
    from rayaccel.ray.worker import hook

    topo, p = given(catalog.load("trn2-48xlarge"), {NRT: "5,6,7,8"})
    _, d = prepare(topo, simulated=True, preset=p)
    table = decode_table((d / TABLE_FILE).read_bytes())
    t = table.resources["neuron_cores"]
    ns = SimpleNamespace(table=table, family_defaults={NRT: "rayaccel-unhooked-0"}, topology=topo,
                         arbiter=SimpleNamespace(table=table))  # ids are named by the arbiter's table (dynamic MIG)
    g = SimpleNamespace(units={"neuron_cores": (1, 2)})
    assert hook._ids_for(ns, g, "neuron_cores") == ["6", "7"]
    monkeypatch.setenv(NRT, "rayaccel-unhooked-0")
    hook._family_env(ns, t, (1, 2))
    assert os.environ[NRT] == "6,7"
    hook._family_env(ns, t, None)
    assert os.environ[NRT] == "rayaccel-unhooked-0"


def test_ray_start_takes_the_familys_resource_at_the_nodes_count():
    from rayaccel.ray.node.lifecycle import ray_start_command

    topo, _ = given(catalog.load("trn1-32xlarge"), {}, resources={"neuron_cores": 4})
    cmd = ray_start_command(topo, "0123456789ab", ["--head", '--resources={"neuron_cores": 4, "team": 1}'],
                            simulated=True)
    res = next(a for a in cmd if a.startswith("--resources="))
    assert '"neuron_cores": 4' in res and '"team": 1' in res


def test_init_takes_the_familys_resource_at_the_nodes_count():
    """rayaccel.init(resources={"neuron_cores": 4}) on a trn1: the node's own count, not a clash."""
    from rayaccel.ray.driver.init import with_caller_resources

    topo, _ = given(catalog.load("trn1-32xlarge"), {}, resources={"neuron_cores": 4})
    assert with_caller_resources(node_resources(topo)[1], {"neuron_cores": 4})["neuron_cores"] == 4


# --------------------------------------------------------------------- the arbiter chooses only among them
@settings(max_examples=40, deadline=None)
@hgiven(data=st.data())
def test_every_grant_of_a_neuron_preset_names_only_its_cores(data):
    """Any preset of a trn2's cores (splits included): a grant of any size on the free node is granted
    (never a wait no release can end: a split device has no whole-device shape), and grants one after
    another, until one must wait for a release, name only the preset's cores, each once."""
    host = catalog.load("trn2-48xlarge")
    cores = data.draw(st.lists(st.integers(0, 63), min_size=1, max_size=12, unique=True), label="cores")
    topo, p = given(host, {NRT: ",".join(map(str, cores))})
    spec = node_spec(topo)
    named = table_ids(topo, spec, p)
    units = {u.id for u in node_units(topo, spec)}
    preset = {str(c) for c in cores}
    for k in range(1, len(units) + 1):
        got = choose_units(topo, spec, units, k)
        assert got, (k, got)
        assert len(got.units) == k and {named[u] for u in got.units} <= preset
    free = set(units)
    while free:
        got = choose_units(topo, spec, free, data.draw(st.integers(1, len(free)), label="k"))
        if not got:
            break  # a wait for a release (fragmentation), as on a whole host
        assert set(got.units) <= free and {named[u] for u in got.units} <= preset
        free -= set(got.units)
