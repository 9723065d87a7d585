"""Ray's own semantics, which a rayaccel node keeps: each test asks a plain Ray node and a rayaccel node the same.

One cluster per preset: a plain Ray node and a rayaccel node on the same simulated hardware (DGX-1 V100;
an A100 in MIG mode for MIG UUIDs), both started with the same visible-devices preset, as Ray documents giving
a node part of a shared machine (Ray's ``test_specific_gpus``: ``CUDA_VISIBLE_DEVICES=4,5,6``;
``test_gpu_ids_cuda_visible_devices_preset``: GPU UUIDs; two MIG instances by UUID, which plain Ray counts as
two GPUs). What each test compares:

* what the nodes advertise: ``GPU`` = the preset's count, no ``mig_<profile>`` (MIG UUIDs are the GPUs);

* the ids a task gets (``ray.get_gpu_ids()``, ``get_accelerator_ids()``, ``CUDA_VISIBLE_DEVICES``): the
  preset's own text, of the same type, from the same set; all of them for a task asking for all;
* fractional GPUs: two half-GPU actors share one id; two one-GPU actors alive together get different ones;
* placement-group bundles: bundle ``i`` of a group holding the whole preset gets the same id on both;
* a task asking for no GPU: plain Ray 2.60 leaves the variable as the node was started (the whole preset);
  a rayaccel node's default (``see-none``) gives it ``""`` (no device: what Ray writes with
  ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``, and what Ray's older ``test_gpu_ids`` asserts), and ``zero_gpu_tasks="see-all"`` gives what
  plain Ray gives (the UUID cluster runs with it). The one documented difference (docs/ARCHITECTURE.md).

Another family, one cluster each: a trn1.32xlarge given ``NEURON_RT_VISIBLE_CORES=4,5,6,7`` (a rayaccel node numbers
those cores 0-3 over its two devices and names them by the host's ids) and a TPU v4-8 host given
``TPU_VISIBLE_CHIPS=2,3``: the count advertised, the ids a task gets (``get_accelerator_ids()``) and its variable,
one unit and all of them, and one actor per unit alive together holding exactly the preset.
"""

from __future__ import annotations

import os

import pytest

from raytest_helpers import needs_feature, ray_free, wait_for, wait_idle

pytestmark = pytest.mark.ray

CVD = "CUDA_VISIBLE_DEVICES"
TOPOLOGY = "dgx1-v100"
MIG_TOPOLOGY = "a100-mig"


def _uuids(*indices):
    from rayaccel import catalog

    t = catalog.load(TOPOLOGY)
    return ",".join(t.device(i).uuid for i in indices)


def _mig_uuids(n):
    from rayaccel import catalog

    return ",".join([p.uuid for p in catalog.load(MIG_TOPOLOGY).partitions() if p.uuid][:n])


#: preset -> (machine, value (None: UUIDs, made below), zero-GPU mode)
PRESETS = {"indices": (TOPOLOGY, "4,5,6", "see-none"), "uuids": (TOPOLOGY, None, "see-all"),
           "mig-uuids": (MIG_TOPOLOGY, None, "see-none")}


@pytest.fixture(scope="module", params=sorted(PRESETS))
def pair(request, ray_env):
    """(cluster, preset ids, zero-GPU mode): node 0 plain Ray, node 1 rayaccel, both given the preset."""
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    machine, value, zero = PRESETS[request.param]
    if value is None:  # in device order: see the bundle test
        value = _mig_uuids(2) if machine == MIG_TOPOLOGY else _uuids(2, 5)
    c = SimulatedCluster([machine, machine], plain=[0], num_cpus=4, env={CVD: value}, zero_gpu_tasks=zero,
                         labels=[{"side": "plain"}, {"side": "rayaccel"}], logging_level="ERROR",
                         log_to_driver=False)
    try:
        yield c, value.split(","), zero
    finally:
        c.shutdown()


def _on(node_id: str, **opts):
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return {"scheduling_strategy": NodeAffinitySchedulingStrategy(node_id, soft=False), **opts}


def _seen():
    import ray

    return (ray.get_gpu_ids(), ray.get_runtime_context().get_accelerator_ids().get("GPU"), os.environ.get(CVD))


def _both(c, fn):
    """fn(node_id) on the plain node and on the rayaccel node."""
    plain, managed = c.node_ids
    assert c.node(1).managed and not c.node(0).managed
    return fn(plain), fn(managed)


def _shape(seen, preset):
    """What must be equal: the ids' types and count, that each is one of the preset's, the variable = the ids."""
    ids, acc, var = seen
    return ([type(i).__name__ for i in ids], len(ids), all(str(i) in preset for i in ids),
            [str(i) for i in acc] == [str(i) for i in ids], var == ",".join(str(i) for i in ids))


def test_nodes_advertise_the_preset(pair):
    import ray

    c, preset, _ = pair
    res = {n["NodeID"]: n["Resources"] for n in ray.nodes() if n["Alive"]}
    assert [res[i].get("GPU") for i in c.node_ids] == [len(preset), len(preset)]
    # MIG UUIDs are the GPUs: an instance is never also a mig_<profile> slot (it would be booked twice)
    assert [sorted(r for r in res[i] if r.startswith("mig_")) for i in c.node_ids] == [[], []]


def test_one_gpu_task_gets_one_of_the_presets_ids(pair):
    import ray

    c, preset, _ = pair
    f = ray.remote(_seen)
    plain, managed = _both(c, lambda n: ray.get(f.options(**_on(n, num_gpus=1)).remote()))
    assert plain[0] == [preset[0]], plain  # plain Ray: the lowest slot, the preset's text
    assert _shape(managed, preset) == _shape(plain, preset), (plain, managed)
    wait_idle(c)


def test_a_task_asking_for_the_whole_preset_gets_all_of_it(pair):
    import ray

    c, preset, _ = pair
    f = ray.remote(_seen)
    plain, managed = _both(c, lambda n: ray.get(f.options(**_on(n, num_gpus=len(preset))).remote()))
    assert sorted(plain[0]) == sorted(managed[0]) == sorted(preset), (plain, managed)
    assert _shape(managed, preset) == _shape(plain, preset)
    wait_idle(c)


def _two_actors(num_gpus: float):
    """What two ``num_gpus`` actors, alive together on node ``n``, each see: for :func:`_both`."""
    import ray

    class A:
        def seen(self):
            return _seen()

    def two(n):
        actors = [ray.remote(A).options(**_on(n, num_gpus=num_gpus, num_cpus=0)).remote() for _ in range(2)]
        out = ray.get([a.seen.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        return out

    return two


def test_two_half_gpu_actors_share_one_id(pair):
    c, preset, _ = pair
    plain, managed = _both(c, _two_actors(0.5))
    assert plain[0][0] == plain[1][0] and managed[0][0] == managed[1][0], (plain, managed)
    assert [_shape(s, preset) for s in managed] == [_shape(s, preset) for s in plain]
    wait_idle(c)


def test_one_gpu_actors_alive_together_get_different_ids(pair):
    c, preset, _ = pair
    plain, managed = _both(c, _two_actors(1))
    assert plain[0][0] != plain[1][0] and managed[0][0] != managed[1][0], (plain, managed)
    assert [_shape(s, preset) for s in managed] == [_shape(s, preset) for s in plain]
    wait_idle(c)


def test_get_devices_and_status_name_what_ray_names(pair):
    """rayaccel.get_devices() in a one-GPU actor: the device (and, for MIG UUIDs, the instance) behind the id;
    ``rayaccel status`` shows the same holder there."""
    import ray

    from rayaccel.ray.driver.status import cluster_status

    c, preset, _ = pair

    class A:
        def devices(self):
            import rayaccel

            a = rayaccel.get_devices()
            return (os.environ.get(CVD), [(d.index, d.uuid) for d in a.devices],
                    [(p.parent, p.uuid, p.key) for p in a.partitions], a.memory_bytes)

    actor = ray.remote(A).options(**_on(c.node_ids[1], num_gpus=1, num_cpus=0)).remote()
    var, devs, parts, mem = ray.get(actor.devices.remote())
    assert var in preset and len(devs) == 1, (var, devs)
    dev = devs[0][0]
    if var.startswith("MIG-"):
        assert [p[:2] for p in parts] == [(dev, var)], (var, devs, parts)
        from rayaccel import catalog

        inst = next(p for p in catalog.load(MIG_TOPOLOGY).partitions() if p.uuid == var)
        assert mem == {dev: inst.memory_bytes}  # the instance's memory, not the parent's
        want = f"[MIG {parts[0][2]}]"
    else:
        assert parts == [] and var in (str(dev), devs[0][1]), (var, devs)
        want = "(pid"

    def row():
        node = next(n for n in cluster_status()["nodes"] if n["node_key"] == c.node(1).node_key)
        d = next(x for x in node["devices"] if x["index"] == dev)
        return d if d["state"] != "free" and any(want in h for h in d["holders"]) else None

    d = wait_for(row, 20.0, "status to show the actor's device")
    assert d["state"] == ("mig" if var.startswith("MIG-") else "busy") and len(d["holders"]) == 1, d
    ray.kill(actor)
    wait_idle(c)


def test_bundle_i_gets_the_same_id(pair):
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    from rayaccel.ray import _ray_private as rp

    # each side's group is pinned to its node by a bundle label selector
    needs_feature(rp.BUNDLE_LABELS, "Ray would place both sides' groups wherever they fit")
    c, preset, _ = pair
    f = ray.remote(_seen)

    def bundles(side):
        pg = placement_group([{"GPU": 1, "CPU": 1}] * len(preset), strategy="STRICT_PACK",
                             bundle_label_selector=[{"side": side}] * len(preset))
        ray.get(pg.ready(), timeout=60)
        try:
            return ray.get([f.options(num_gpus=1, num_cpus=1, scheduling_strategy=PlacementGroupSchedulingStrategy(
                pg, placement_group_bundle_index=i)).remote() for i in range(len(preset))])
        finally:
            remove_placement_group(pg)

    # Presets in device order: a rayaccel node hands a group's devices out ascending by device index (the
    # arbiter's ring order), plain Ray by preset position; they differ for a preset such as 6,4 (documented).
    assert [int(i) if i.isdigit() else i for i in preset] == sorted(int(i) if i.isdigit() else i for i in preset) \
        or not preset[0].isdigit()
    plain, managed = bundles("plain"), bundles("rayaccel")
    assert [s[0] for s in managed] == [s[0] for s in plain], (plain, managed)
    wait_idle(c)


def test_a_zero_gpu_task_sees_what_the_mode_says(pair):
    import ray

    c, preset, zero = pair
    f = ray.remote(_seen)
    plain, managed = _both(c, lambda n: ray.get(f.options(**_on(n, num_gpus=0)).remote()))
    # plain Ray 2.60: the node's variable, untouched; a release before Ray's RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO
    # switch (Ray 2.48) always writes "" for no GPU
    untouched = hasattr(ray._private.accelerators, "RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO_ENV_VAR")
    assert plain == ([], [], ",".join(preset) if untouched else ""), plain
    if zero == "see-all":  # the node's variable as it was given (plain Ray 2.60's)
        assert managed == ([], [], ",".join(preset)), managed
    else:  # rayaccel's default: no device, "" as plain Ray writes it with RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1
        assert managed == ([], [], ""), managed
    wait_idle(c)


# ------------------------------------------------------------ another family: Neuron, TPU
#: family -> (machine, variable, preset, resource). A plain and a rayaccel node each given the preset; the plain
#: node advertises the preset's count as Ray's manager would on that hardware (SimulatedCluster plain=).
FAMILIES = {"neuron": ("trn1-32xlarge", "NEURON_RT_VISIBLE_CORES", "4,5,6,7", "neuron_cores"),
            "tpu": ("tpu-v4-8", "TPU_VISIBLE_CHIPS", "2,3", "TPU")}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, ray_env):
    """(cluster, preset ids, resource, variable): node 0 plain Ray, node 1 rayaccel, both given the family's preset."""
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    machine, var, value, resource = FAMILIES[request.param]
    c = SimulatedCluster([machine, machine], plain=[0], num_cpus=4, env={var: value}, logging_level="ERROR",
                         log_to_driver=False)
    try:
        yield c, value.split(","), resource, var
    finally:
        c.shutdown()


def _family_idle(c, resource):
    def free(node_id):
        avail, total = ray_free(node_id)
        return abs(avail.get(resource, 0.0) - total.get(resource, 0.0)) < 1e-6

    wait_for(lambda: all(free(n) for n in c.node_ids), 30.0, f"every {resource} slot free")


def _units_seen(resource, var):
    import ray

    return sorted(ray.get_runtime_context().get_accelerator_ids().get(resource, []), key=int), os.environ.get(var)


def test_family_nodes_advertise_the_preset(family):
    import ray

    c, preset, resource, _ = family
    have = {n["NodeID"]: n["Resources"].get(resource) for n in ray.nodes() if n["Alive"]}
    assert [have[i] for i in c.node_ids] == [len(preset), len(preset)]


@pytest.mark.parametrize("k", [1, "all"])
def test_family_task_gets_the_presets_ids(family, k):
    import ray

    c, preset, resource, var = family
    n = len(preset) if k == "all" else k
    f = ray.remote(_units_seen)
    plain, managed = _both(c, lambda node: ray.get(f.options(**_on(node, resources={resource: n})).remote(
        resource, var)))
    assert len(plain[0]) == len(managed[0]) == n and set(plain[0]) <= set(preset), (plain, managed)
    assert set(managed[0]) <= set(preset), managed  # the preset's own text, never a unit outside it
    for ids, value in (plain, managed):
        assert sorted(value.split(","), key=int) == ids  # the variable names the same ids
    if n == len(preset):
        assert plain[0] == managed[0] == sorted(preset, key=int)
    _family_idle(c, resource)


def test_family_units_held_at_once_are_the_preset(family):
    """One actor per unit, all alive together: on both nodes they hold exactly the preset, each unit once."""
    import ray

    c, preset, resource, var = family

    class A:
        def seen(self):
            return _units_seen(resource, var)

    def hold(node):
        actors = [ray.remote(A).options(**_on(node, resources={resource: 1}, num_cpus=0)).remote() for _ in preset]
        out = ray.get([a.seen.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        return sorted((ids[0] for ids, _ in out), key=int)

    plain, managed = _both(c, hold)
    assert plain == managed == sorted(preset, key=int), (plain, managed)
    _family_idle(c, resource)
