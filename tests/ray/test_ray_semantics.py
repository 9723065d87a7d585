"""Ray's own semantics, which a rayaccel node keeps: each test asks a plain Ray node and a rayaccel node the same.

One cluster per preset: a plain Ray node and a rayaccel node on the same simulated hardware (DGX-1 V100),
both started with the same visible-devices preset, as Ray documents giving a node part of a shared machine
(Ray's ``test_specific_gpus``: ``CUDA_VISIBLE_DEVICES=4,5,6``; ``test_gpu_ids_cuda_visible_devices_preset``:
GPU UUIDs). What each test compares:

* the ids a task gets (``ray.get_gpu_ids()``, ``get_accelerator_ids()``, ``CUDA_VISIBLE_DEVICES``): the
  preset's own text, of the same type, from the same set; all of them for a task asking for all;
* fractional GPUs: two half-GPU actors share one id;
* placement-group bundles: bundle ``i`` of a group holding the whole preset gets the same id on both;
* a task asking for no GPU: plain Ray 2.60 leaves the variable as the node was started (the whole preset);
  a rayaccel node's default (``see-none``) gives it ``""`` (no device: what Ray writes with
  ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO=1``, and what Ray's older ``test_gpu_ids`` asserts), and ``zero_gpu_tasks="see-all"`` gives what
  plain Ray gives (the UUID cluster runs with it). The one documented difference (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import os

import pytest

from raytest_helpers import needs_feature, wait_idle

pytestmark = pytest.mark.ray

CVD = "CUDA_VISIBLE_DEVICES"
TOPOLOGY = "dgx1-v100"


def _uuids(*indices):
    from rayaccel import catalog

    t = catalog.load(TOPOLOGY)
    return ",".join(t.device(i).uuid for i in indices)


PRESETS = {"indices": ("4,5,6", "see-none"), "uuids": (None, "see-all")}


@pytest.fixture(scope="module", params=sorted(PRESETS))
def pair(request, ray_env):
    """(cluster, preset ids, zero-GPU mode): node 0 plain Ray, node 1 rayaccel, both given the preset."""
    import ray

    from rayaccel.ray.driver.cluster import SimulatedCluster

    if ray.is_initialized():
        ray.shutdown()
    value, zero = PRESETS[request.param]
    value = value or _uuids(2, 5)  # in device order: see the bundle test
    c = SimulatedCluster([TOPOLOGY, TOPOLOGY], plain=[0], num_cpus=4, env={CVD: value}, zero_gpu_tasks=zero,
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
    gpus = {n["NodeID"]: n["Resources"].get("GPU") for n in ray.nodes() if n["Alive"]}
    assert [gpus[i] for i in c.node_ids] == [len(preset), len(preset)]


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


def test_two_half_gpu_actors_share_one_id(pair):
    import ray

    c, preset, _ = pair

    class A:
        def seen(self):
            return _seen()

    def two(n):
        actors = [ray.remote(A).options(**_on(n, num_gpus=0.5, num_cpus=0)).remote() for _ in range(2)]
        out = ray.get([a.seen.remote() for a in actors])
        for a in actors:
            ray.kill(a)
        return out

    plain, managed = _both(c, two)
    assert plain[0][0] == plain[1][0] and managed[0][0] == managed[1][0], (plain, managed)
    assert [_shape(s, preset) for s in managed] == [_shape(s, preset) for s in plain]
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
