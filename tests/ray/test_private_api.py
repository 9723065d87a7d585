"""Ray's private API that rayaccel relies on is where ``_ray_private`` expects it, in the pinned Ray.

If one of these fails after a Ray upgrade, rayaccel would misplace work silently:
fix ``src/rayaccel/ray/_ray_private.py`` (and only it) before anything else.
"""

from __future__ import annotations

import inspect

import ray

from rayaccel.ray import _ray_private as rp
def test_pinned_ray_version():
    assert ray.__version__.startswith("2.60."), f"rayaccel is checked against Ray 2.60, this is {ray.__version__}"


def test_the_gpu_id_function_has_the_signature_the_hook_wraps():
    fn = rp.worker_class().get_accelerator_ids_for_accelerator_resource
    assert list(inspect.signature(fn).parameters) == ["self", "resource_name", "resource_regex"]
    # every public view of the grant goes through it
    src = inspect.getsource(ray._private.worker.get_gpu_ids)
    assert "get_accelerator_ids_for_accelerator_resource" in src
    src = inspect.getsource(ray.runtime_context.RuntimeContext.get_accelerator_ids)
    assert "get_accelerator_ids_for_accelerator_resource" in src


def test_set_visible_accelerator_ids_reads_the_runtime_context():
    from ray._private import utils

    assert hasattr(utils, "set_visible_accelerator_ids") and hasattr(utils, "reset_visible_accelerator_env_vars")
    src = inspect.getsource(utils.set_visible_accelerator_ids)
    assert "get_accelerator_ids()" in src and "set_current_process_visible_accelerator_ids" in src


def test_default_worker_imports_preload_modules_before_its_loop():
    from ray._private.workers import default_worker

    src = inspect.getsource(default_worker)
    assert "--worker-preload-modules" in src and "try_import_each_module" in src
    assert src.index("try_import_each_module") < src.index("worker.main_loop()")


def test_the_raylet_knows_the_configs_rayaccel_sets():
    import os

    raylet = os.path.join(os.path.dirname(ray.__file__), "core", "src", "ray", "raylet", "raylet")
    with open(raylet, "rb") as f:
        blob = f.read()
    assert b"preload_python_modules" in blob and b"custom_unit_instance_resources" in blob
    for name in rp.UNIT_INSTANCE_DEFAULT:  # the default list rayaccel repeats when it extends it
        assert name.encode() in blob


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


# ------------------------------------------------------------------- Ray Direct Transport
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


def test_rdt_gives_tensor_transport_actors_the_short_call_group():
    src = inspect.getsource(ray.actor)
    assert f'_filled_options["concurrency_groups"]["{rp.RDT_SERVE_GROUP}"] = 1' in src


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


def test_torchs_cuda_ipc_rebuild_takes_the_device_seventh():
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    from rayaccel.ray.rdt.gpu import _DEVICE_ARG

    assert list(inspect.signature(rebuild_cuda_tensor).parameters)[_DEVICE_ARG] == "storage_device"


def test_one_grant_is_read_from_ray_in_one_call():
    """The hook reads a grant's facts through rp.grant_of; the lazy facts are read once, when asked."""
    calls = []

    class Core:
        def resource_ids(self):
            calls.append("ids")
            return {"GPU": [(1, 1.0)], "GPU_group_0_ab12": [(1, 1.0)], "GPU_group_ab12": [(1, 1.0)]}

        def get_actor_id(self):
            class Nil:
                def is_nil(self):
                    return True
            return Nil()

        def get_current_task_id(self):
            return bytes.fromhex("0a")

        def get_current_task_function_name(self):
            calls.append("function")
            return "m.f"

        def get_current_node_id(self):
            calls.append("node")
            return bytes.fromhex("ff")

    class W:
        core_worker = Core()

    rg = rp.grant_of(W(), frozenset({"GPU"}))
    assert (rg.key, rg.slots, rg.pg, rg.bundle) == ("task:0a", {"GPU": ((1, 1.0),)}, "ab12", 0)
    assert rg.sig == ("task:0a", (("GPU", ((1, 1.0),)),))
    assert calls == ["ids"]
    assert rg.function == rg.function == "m.f" and rg.node_id == rg.node_id == "ff"
    assert calls == ["ids", "function", "node"]
