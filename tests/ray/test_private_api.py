"""Ray's private API that rayaccel relies on is where ``_ray_private`` expects it, in the installed Ray.

rayaccel supports every Ray release from 2.48 to 2.60 (``.ci/ray-oldest`` runs these tests on
2.48, ``scripts/ray_matrix.py`` on every release). Each test names what it checks and the
installed release; if one fails, that release moved an API rayaccel relies on, and rayaccel
would misplace work silently: fix ``src/rayaccel/ray/_ray_private.py`` (and only it) first.
A test of a feature the release does not carry (``rp.FEATURES``) is skipped, saying so.
"""

from __future__ import annotations

import inspect
import logging
import os

import pytest
import ray

from rayaccel.ray import _ray_private as rp

RELEASE = ray.__version__
HAVE = rp.release_tuple(RELEASE)


def moved(what: str, why: str) -> str:
    """The message of a failure: the release moved ``what``."""
    return f"Ray {RELEASE} moved {what} ({why}): fix rayaccel/ray/_ray_private.py for this release"


def needs(feature: rp.Feature):
    return pytest.mark.skipif(HAVE < feature.since, reason=f"Ray {RELEASE} does not carry {feature.name} "
                              f"(Ray >= {feature.since_text})")


def _needs_torch() -> None:
    """The transport moves torch tensors: without torch (``scripts/ray_matrix.py --quick``'s venvs) it is not registered."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        pytest.skip("torch is not installed (the transport carries torch tensors)")


def test_a_supported_ray_release():
    assert rp.OLDEST <= HAVE <= rp.NEWEST, (
        f"rayaccel supports Ray {rp.OLDEST[0]}.{rp.OLDEST[1]} to {rp.NEWEST[0]}.{rp.NEWEST[1]}, this is Ray {RELEASE}")
    assert rp.release() == RELEASE


@pytest.mark.parametrize("feature", rp.FEATURES, ids=lambda f: f.name)
def test_capabilities_say_what_the_release_carries(feature):
    """``capabilities()`` finds each feature in Ray itself; the table says which release brings it: they agree."""
    found = rp.capabilities()[feature.name]
    expected = HAVE >= feature.since
    assert found == expected, (
        moved(f"what _ray_private._carries probes for {feature.name!r}", f"found={found}, but the feature came "
              f"with Ray {feature.since_text}") if expected else
        f"Ray {RELEASE} carries {feature.name!r}, which _ray_private.FEATURES dates to Ray {feature.since_text}: "
        f"correct the table")


def test_the_gpu_id_function_has_the_signature_the_hook_wraps():
    fn = rp.worker_class().get_accelerator_ids_for_accelerator_resource
    assert list(inspect.signature(fn).parameters) == ["self", "resource_name", "resource_regex"], moved(
        "ray._private.worker.Worker.get_accelerator_ids_for_accelerator_resource", "its parameters")
    # every public view of the grant goes through it
    src = inspect.getsource(ray._private.worker.get_gpu_ids)
    assert "get_accelerator_ids_for_accelerator_resource" in src, moved("ray.get_gpu_ids", "no longer calls it")
    src = inspect.getsource(ray.runtime_context.RuntimeContext.get_accelerator_ids)
    assert "get_accelerator_ids_for_accelerator_resource" in src, moved(
        "RuntimeContext.get_accelerator_ids", "no longer calls it")


def test_set_visible_accelerator_ids_reads_the_runtime_context():
    from ray._private import utils

    assert hasattr(utils, "set_visible_accelerator_ids"), moved("ray._private.utils.set_visible_accelerator_ids",
                                                                "gone")
    src = inspect.getsource(utils.set_visible_accelerator_ids)
    assert "get_accelerator_ids()" in src and "set_current_process_visible_accelerator_ids" in src, moved(
        "ray._private.utils.set_visible_accelerator_ids", "no longer writes the runtime context's ids")
    ret = inspect.signature(utils.set_visible_accelerator_ids).return_annotation
    if HAVE >= rp.TASK_END.since:  # it returns what reset_visible_accelerator_env_vars restores
        assert "None" != str(ret) and hasattr(utils, "reset_visible_accelerator_env_vars"), moved(
            "ray._private.utils.reset_visible_accelerator_env_vars", f"set_visible returns {ret}")
        assert len(inspect.signature(utils.reset_visible_accelerator_env_vars).parameters) == 1, moved(
            "ray._private.utils.reset_visible_accelerator_env_vars", "the wrap passes one argument")
    else:  # _ray_private.install passes {} to the hook and wraps no reset
        assert str(ret) == "None" and not hasattr(utils, "reset_visible_accelerator_env_vars"), moved(
            "ray._private.utils.set_visible_accelerator_ids", f"returns {ret} before Ray {rp.TASK_END.since_text}")


def test_default_worker_imports_preload_modules_before_its_loop():
    from ray._private.workers import default_worker

    src = inspect.getsource(default_worker)
    assert "--worker-preload-modules" in src and "try_import_each_module" in src, moved(
        "ray._private.workers.default_worker", "no --worker-preload-modules")
    assert src.index("try_import_each_module") < src.index("worker.main_loop()"), moved(
        "default_worker's preload", "after the main loop")


def test_the_raylet_knows_the_configs_rayaccel_sets():
    raylet = os.path.join(os.path.dirname(ray.__file__), "core", "src", "ray", "raylet", "raylet")
    with open(raylet, "rb") as f:
        blob = f.read()
    for config in (b"preload_python_modules", b"custom_unit_instance_resources"):
        assert config in blob, moved(f"the raylet config {config.decode()}", "not in the raylet binary")
    # the default list rayaccel repeats when it extends it: exactly this release's
    default = ",".join(rp.unit_instance_default())
    assert (default + "\0").encode() in blob, moved(
        "the default of custom_unit_instance_resources", f"not {default!r}: _ray_private._UNIT_INSTANCE_SINCE")


def test_option_tables_and_checks_rayaccel_validates_with():
    rou = rp.option_utils()
    for name in ("task_options", "actor_options"):
        assert isinstance(getattr(rou, name, None), dict), moved(f"{rou.__name__}.{name}", "gone")
    for name in ("validate_task_options", "validate_actor_options"):
        assert list(inspect.signature(getattr(rou, name)).parameters)[:2] == ["options", "in_options"], moved(
            f"{rou.__name__}.{name}", "rayaccel calls it with (options, in_options=)")
    assert "label_selector" in rou.task_options and "label_selector" in rou.actor_options, moved(
        "the label_selector option", "rayaccel.remote chooses nodes with it")


def test_the_node_temp_dir_is_read_from_the_global_node():
    from ray._private import worker

    assert hasattr(worker, "_global_node"), moved("ray._private.worker._global_node", "gone")
    from ray._private.node import Node

    assert callable(getattr(Node, "get_temp_dir_path", None)), moved("Node.get_temp_dir_path", "gone")


def test_grant_parsing_of_placement_group_resources():
    managed = {"GPU", "mig_1g.5gb"}
    slots, pg, bundle = rp.split_grant({
        "GPU_group_1_0a1b": [(3, 1.0)], "GPU_group_0a1b": [(3, 1.0)], "bundle_group_1_0a1b": [(0, 0.001)]}, managed)
    assert slots == {"GPU": ((3, 1.0),)} and pg == "0a1b" and bundle == 1
    assert rp.split_grant({"GPU": [(0, 0.5)]}, managed) == ({"GPU": ((0, 0.5),)}, None, None)
    # MIG profiles (names with dots) in a group; resources the node does not manage are ignored
    slots, pg, bundle = rp.split_grant({"mig_1g.5gb_group_0_ff": [(2, 1.0)], "mig_1g.5gb_group_ff": [(2, 1.0)],
                                        "CPU": [(0, 1.0)], "neuron_cores": [(1, 1.0)]}, managed)
    assert slots == {"mig_1g.5gb": ((2, 1.0),)} and pg == "ff" and bundle == 0


def test_state_and_kv_functions_exist():
    from ray._private import state
    from ray.experimental import internal_kv

    for name in ("available_resources_per_node", "total_resources_per_node"):
        assert callable(getattr(state, name))
    assert callable(state.state.placement_group_table)
    for name in ("_internal_kv_get", "_internal_kv_put", "_internal_kv_del", "_internal_kv_list",
                 "internal_kv_get_gcs_client", "_internal_kv_initialized"):
        assert callable(getattr(internal_kv, name))
    from ray._raylet import InnerGcsClient, PlacementGroupID

    assert hasattr(InnerGcsClient, "internal_kv_multi_get") and PlacementGroupID


def test_what_dynamic_mig_calls():
    """Ray's pending demand (the autoscaler's v2 SDK) and a placement group pinned to a node (dynamic MIG)."""
    from ray.autoscaler.v2 import schema, sdk
    from ray.util import placement_group, placement_group_table
    from ray.util.placement_group import PlacementGroup

    assert list(inspect.signature(sdk.get_cluster_status).parameters)[:2] == ["gcs_address", "timeout"], moved(
        "ray.autoscaler.v2.sdk.get_cluster_status", "rp.pending_demand passes gcs_address and timeout")
    fields = {f for f in schema.ResourceDemandSummary.__dataclass_fields__}
    assert "ray_task_actor_demand" in fields, moved("ResourceDemandSummary.ray_task_actor_demand", "pending_demand")
    assert {"bundles_by_count"} <= set(schema.RayTaskActorDemand.__dataclass_fields__), moved(
        "RayTaskActorDemand.bundles_by_count", "pending_demand")
    assert "placement_group_demand" in fields and {"bundles_by_count", "pg_id"} <= set(
        schema.PlacementGroupResourceDemand.__dataclass_fields__), moved(
        "ResourceDemandSummary.placement_group_demand / PlacementGroupResourceDemand.pg_id", "pending_demand")
    params = inspect.signature(placement_group).parameters
    assert "_soft_target_node_id" in params and "lifetime" in params, moved(
        "placement_group(_soft_target_node_id=, lifetime=)", "rp.pinned_group on 2.48-2.49")
    assert list(inspect.signature(PlacementGroup).parameters)[0] == "id" and callable(placement_group_table), moved(
        "PlacementGroup(id)", "rp.group_handle adopts a previous agent's holds")


# ------------------------------------------------------------------- Ray Direct Transport
@needs(rp.TRANSPORT)
def test_every_rdt_entry_point_calls_the_wrapped_registration_first():
    """rayaccel.ray.rdt registers its transport inside ``_ensure_default_transports_registered``."""
    from ray.experimental.rdt import util

    assert callable(util._ensure_default_transports_registered) and isinstance(util.transport_manager_info, dict)
    assert list(inspect.signature(util.register_tensor_transport).parameters) == [
        "transport_name", "devices", "transport_manager_class", "data_type"]
    for fn in (util.get_transport_data_type, util.get_tensor_transport_manager, util.device_match_transport,
               util.normalize_and_validate_tensor_transport, util.is_one_sided_transport,
               util.register_custom_tensor_transports_on_actor):
        assert "_ensure_default_transports_registered()" in inspect.getsource(fn), fn.__name__
    # the registration Ray sends to new actors looks the function up at call time (so it meets the wrap)
    src = inspect.getsource(util.register_custom_tensor_transports_on_actor)
    assert "from ray.experimental.rdt.util import" in src and "_ensure_default_transports_registered" in src
    assert "has_custom_transports" in src


@needs(rp.TRANSPORT)
def test_rdt_gives_tensor_transport_actors_the_short_call_group():
    src = inspect.getsource(ray.actor)
    assert f'_filled_options["concurrency_groups"]["{rp.RDT_SERVE_GROUP}"] = 1' in src


@needs(rp.TRANSPORT)
def test_the_transport_interface_rayaccel_implements():
    from ray.experimental.rdt.tensor_transport_manager import TensorTransportManager

    from rayaccel.ray.rdt.transport import RayaccelTransport

    assert TensorTransportManager.__abstractmethods__ == {
        "tensor_transport_backend", "is_one_sided", "can_abort_transport", "actor_has_tensor_transport",
        "extract_tensor_transport_metadata", "get_communicator_metadata", "recv_multiple_tensors",
        "send_multiple_tensors", "garbage_collect", "abort_transport"}
    assert not RayaccelTransport.__abstractmethods__
    for name in ("fetch_multiple_tensors", "wait_fetch_complete"):
        assert list(inspect.signature(getattr(TensorTransportManager, name)).parameters) == list(
            inspect.signature(getattr(RayaccelTransport, name)).parameters)


@needs(rp.TRANSPORT)
def test_rays_nixl_manager_has_what_the_transport_calls():
    from ray.experimental.rdt.nixl_tensor_transport import NixlCommunicatorMetadata, NixlTensorTransport

    assert NixlCommunicatorMetadata() is not None
    for name, params in (("extract_tensor_transport_metadata", ["self", "obj_id", "rdt_object"]),
                         ("fetch_multiple_tensors", ["self", "obj_id", "tensor_transport_metadata",
                                                     "communicator_metadata", "target_buffers"]),
                         ("wait_fetch_complete", ["self", "fetch_request", "timeout"]),
                         ("garbage_collect", ["self", "obj_id", "tensor_transport_meta", "tensors"]),
                         ("abort_transport", ["self", "obj_id", "communicator_metadata"])):
        assert list(inspect.signature(getattr(NixlTensorTransport, name)).parameters) == params, name
    # a timed-out wait leaves the request alive (the transport polls it in slices)
    assert "except TimeoutError:\n            raise" in inspect.getsource(NixlTensorTransport.wait_fetch_complete)


def test_where_this_release_checks_a_transports_name():
    """Before 2.56 ``_ray_private.adopt_rdt_module`` lets ``"rayaccel"`` through Ray's own check of the name."""
    src = inspect.getsource(ray.actor)
    if HAVE >= (2, 55):
        where, fn = rp.RDT_NAME_MODULES[0], "normalize_and_validate_tensor_transport"
    elif HAVE >= (2, 53):
        where, fn = rp.RDT_NAME_MODULES[1], "normalize_and_validate_tensor_transport"
    else:
        where, fn = rp.RDT_NAME_MODULES[2], "from_str"
        assert "TensorTransportEnum.from_str(" in src, moved("ray.method's check of tensor_transport", "not from_str")
        from ray._private.custom_types import TensorTransportEnum

        assert hasattr(TensorTransportEnum, "OBJECT_STORE"), moved("TensorTransportEnum.OBJECT_STORE", "gone")
        return
    assert f"from {where} import" in src and f"{fn}(" in src, moved(
        "ray.method's check of tensor_transport", f"not {where}.{fn}")
    import importlib

    assert callable(getattr(importlib.import_module(where), fn, None)), moved(f"{where}.{fn}", "gone")


def test_the_rayaccel_transport_name_works_on_this_release(caplog):
    """2.56+: registered (Ray knows the name); older: Ray's object store, with one warning naming the release."""
    _needs_torch()
    import rayaccel  # noqa: F401 - installs the transport's registration

    caplog.set_level(logging.WARNING, logger="rayaccel")

    def f(self):
        return 1

    for _ in range(2):
        ray.method(tensor_transport="rayaccel")(f)
    lines = [r.getMessage() for r in caplog.records if "tensor transport" in r.getMessage()]
    if HAVE >= rp.TRANSPORT.since:
        assert f.__ray_tensor_transport__ == "RAYACCEL" and not lines
    else:
        assert str(getattr(f.__ray_tensor_transport__, "name", f.__ray_tensor_transport__)) in ("OBJECT_STORE", "None")
        assert len(lines) <= 1 and all(f"Ray {RELEASE}" in m and "2.56" in m for m in lines)
        assert lines or "rayaccel tensor transport" in rp._warned  # said once per process (maybe earlier)


def test_torchs_cuda_ipc_rebuild_takes_the_device_seventh():
    _needs_torch()
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from rayaccel.ray.rdt.gpu import _DEVICE_ARG

    assert list(inspect.signature(rebuild_cuda_tensor).parameters)[_DEVICE_ARG] == "storage_device"


def test_one_grant_is_read_from_ray_in_one_call(monkeypatch):
    """rp.grant_of reads every fact of a new grant at once; asked again about the same grant, only its identity."""
    calls = []
    ids = {"GPU": [(1, 1.0)], "GPU_group_0_ab12": [(1, 1.0)], "GPU_group_ab12": [(1, 1.0)]}

    class Nil:
        def is_nil(self):
            return True

        def hex(self):
            return "00"

    class Core:
        task = "0a"

        def resource_ids(self):
            calls.append("ids")
            return ids

        def get_actor_id(self):
            return Nil()

        def get_current_task_id(self):
            return bytes.fromhex(self.task)

        def get_current_task_function_name(self):
            calls.append("function")
            return "m.f"

        def get_current_task_name(self):
            return "f"

        def get_current_job_id(self):
            return bytes.fromhex("01")

        def get_current_node_id(self):
            calls.append("node")
            return bytes.fromhex("ff")

    class W:
        core_worker = Core()

    monkeypatch.setattr(rp, "_NODE_ID", None)
    rg = rp.grant_of(W(), frozenset({"GPU"}))
    assert rg == rp.RayGrant("task:0a", {"GPU": ((1, 1.0),)}, "ab12", 0, "m.f", {"name": "f", "kind": "task", "job": "01"},
                             "ff")
    assert calls == ["ids", "function", "node"]
    assert rp.grant_of(W(), frozenset({"GPU"}), rg) is rg and calls[3:] == ["ids"]  # the same grant: identity only
    W.core_worker.task = "0b"
    again = rp.grant_of(W(), frozenset({"GPU"}), rg)  # the next task, the same slots: a new grant
    assert again is not rg and again.key == "task:0b" and calls[4:] == ["ids", "function"]  # the node: read once
    ids.clear()
    assert rp.grant_of(W(), frozenset({"GPU"}), again).slots == {}


def test_doctor_says_in_one_line_what_this_release_lacks():
    from rayaccel.ray.driver.doctor import feature_row

    row = feature_row(rp.capabilities(), RELEASE)
    lacking = [f for f in rp.FEATURES if HAVE < f.since]
    assert row.status == ("warn" if lacking else "ok") and "\n" not in row.detail
    for f in lacking:
        assert f"{f.name} (Ray >= {f.since_text}" in row.detail
    old = feature_row({f.name: f is rp.LABEL_SELECTORS for f in rp.FEATURES}, "2.48.0")
    assert old.status == "warn" and ">=2.57" in old.fix and "rayaccel tensor transport (Ray >= 2.56" in old.detail


@needs(rp.TRANSPORT)
def test_the_cpu_target_hint_names_a_function_this_release_has():
    from ray import experimental

    hint = rp.cpu_target_hint()
    assert callable(getattr(experimental, hint.split("(")[0].rsplit(".", 1)[1], None)), moved(hint, "gone")


def test_a_simulated_clusters_driver_sits_on_the_head(cluster):
    """``ray.init(address=)`` on a host with several raylets: 2.49+ attach the driver to the head's, 2.48 to any
    (``rp.driver_on_head`` steers it); a driver on a node ``remove_node`` takes would exit with that raylet."""
    head = cluster.node_ids[0]
    assert len(cluster.node_ids) > 1
    for _ in range(2):
        assert ray.get_runtime_context().get_node_id() == head, f"Ray {RELEASE}: the driver is not on the head's raylet"
        ray.shutdown()
        cluster.connect(logging_level="ERROR", log_to_driver=False)
