"""Simulated nodes look like real ones: rayaccel's resources and labels vs what Ray 2.60 itself computes.

On a release whose managers are older (Ray 2.48: no node labels, older model tables) the module is skipped:
rayaccel follows the newest release's managers.

Ray's own accelerator managers are called with the device model (their static naming
methods) or with their discovery fed the same real captures rayaccel imports (``neuron-ls
--json-output``, GKE's TPU variables, a stand-in ``acl`` / ``habana_frameworks`` module),
and Ray's ``ResourceAndLabelSpec.resolve()`` -- what a raylet starts with -- is compared
with :func:`rayaccel.discovery.ray_node_resources`. No cluster is started.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("ray")

import importlib.util  # noqa: E402

from rayaccel.ray import _ray_private as _rp  # noqa: E402

if importlib.util.find_spec("ray._private.resource_and_label_spec") is None:  # Ray 2.48
    pytest.skip(f"Ray {_rp.release()} does not carry the accelerator managers rayaccel's simulated nodes follow "
                "(ResourceAndLabelSpec: no ray.io/accelerator-type or TPU labels; GeForce/RTX models named 'G'/'RTX'; "
                "no MI350X/MI355X/MI50 ids, no TPU7x)", allow_module_level=True)

from ray._private import accelerators as ray_accel  # noqa: E402
from ray._private.accelerators import (AMDGPUAcceleratorManager, HPUAcceleratorManager,  # noqa: E402
                                       NeuronAcceleratorManager, NPUAcceleratorManager, NvidiaGPUAcceleratorManager,
                                       TPUAcceleratorManager)
from ray._private.accelerators import hpu as ray_hpu  # noqa: E402
from ray._private.accelerators import tpu as ray_tpu  # noqa: E402
from ray._private.accelerators.amd_gpu import amd_product_dict  # noqa: E402
from ray._private.resource_and_label_spec import ResourceAndLabelSpec  # noqa: E402

from rayaccel import catalog  # noqa: E402
from rayaccel.discovery.capture import import_captures  # noqa: E402
from rayaccel.discovery.rayspec import (AMD, AMD_MODELS, BUILTIN_SPECS, HPU, NEURON, NPU, NVIDIA, TPU,  # noqa: E402
                                        ray_accelerator_type, ray_node_resources, tpu_ray_extras)
from rayaccel.placement import node_units  # noqa: E402
from rayaccel.topology import Slice  # noqa: E402

CAPTURES = Path(__file__).parent.parent / "data" / "captures"
MANAGERS = {"nvidia": NvidiaGPUAcceleratorManager, "amd": AMDGPUAcceleratorManager, "aws": NeuronAcceleratorManager,
            "google": TPUAcceleratorManager, "habana": HPUAcceleratorManager, "huawei": NPUAcceleratorManager}


@pytest.mark.parametrize("vendor", sorted(BUILTIN_SPECS))
def test_resource_names_and_variables_are_rays(vendor, monkeypatch):
    spec, mgr = BUILTIN_SPECS[vendor], MANAGERS[vendor]
    monkeypatch.delenv("ROCR_VISIBLE_DEVICES", raising=False)
    assert spec.resource == mgr.get_resource_name()
    assert spec.visible_env[0] == mgr.get_visible_accelerator_ids_env_var()
    assert spec.whole_units == (not mgr.validate_resource_request_quantity(0.5)[0])
    if spec.valid_counts:
        assert all(mgr.validate_resource_request_quantity(q)[0] for q in spec.valid_counts)
        assert not mgr.validate_resource_request_quantity(3)[0]


def test_unit_instance_resources_are_in_rays_default_list():
    from rayaccel.ray import _ray_private as rp
    for spec in BUILTIN_SPECS.values():
        assert spec.resource == "GPU" or spec.resource in rp.UNIT_INSTANCE_DEFAULT


NVIDIA_NAMES = sorted({d.model for n in catalog.names() for d in catalog.load(n).devices if d.vendor == "nvidia"} | {
    "Tesla V100-SXM2-16GB", "Tesla K80", "NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 3090", "NVIDIA A10G",
    "NVIDIA RTX PRO 6000 Blackwell Server Edition", "NVIDIA H100 PCIe", "NVIDIA A800-SXM4-80GB", "Quadro RTX 8000",
    "NVIDIA H20", "NVIDIA B200", "NVIDIA L4", "Tesla T4"})


@pytest.mark.parametrize("model", NVIDIA_NAMES)
def test_nvidia_naming_is_rays(model):
    assert ray_accelerator_type(NVIDIA, model) == NvidiaGPUAcceleratorManager._gpu_name_to_accelerator_type(model)


@pytest.mark.parametrize("pattern,device_id,name", AMD_MODELS, ids=[r[2] for r in AMD_MODELS])
def test_amd_naming_is_rays_device_id_table(pattern, device_id, name):
    assert AMDGPUAcceleratorManager._gpu_name_to_accelerator_type(device_id) == name == amd_product_dict[device_id]
    assert ray_accelerator_type(AMD, f"AMD Instinct {pattern.split('|')[0].split('.')[0]}") is not None


def test_amd_catalog_machine_is_named_as_ray_names_its_device_id():
    model = catalog.load("mi300x-8x").devices[0].model
    assert ray_accelerator_type(AMD, model) == amd_product_dict["0x74a1"]  # MI300X OAM


# ------------------------------------------------------------------- Neuron
def _neuron_ls_json(capture: str) -> str:
    text = (CAPTURES / capture).read_text()
    return text[text.index("[\n"):]


@pytest.mark.parametrize("capture", ["93_neuron-ls-json-trn1-2xlarge-single-device-null-neighbours.txt",
                                     "94_neuron-ls-trn2-48xlarge-2.34-container-1dev-table-and-json.txt"])
def test_neuron_core_count_and_type_are_rays(capture, monkeypatch):
    """Ray's Neuron manager runs `neuron-ls --json-output` and sums nc_count: feed it the real capture."""
    out = _neuron_ls_json(capture).encode()
    real_isdir = ray_accel.neuron.os.path.isdir
    monkeypatch.setattr(ray_accel.neuron.os.path, "isdir", lambda p: p == "/opt/aws/neuron/bin/" or real_isdir(p))
    monkeypatch.setattr(ray_accel.neuron.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a[0], 0, stdout=out, stderr=b""))
    topo = import_captures([CAPTURES / capture]).topology
    ours, labels = ray_node_resources(topo, NEURON)
    assert ours["neuron_cores"] == NeuronAcceleratorManager.get_current_node_num_accelerators()
    assert len(node_units(topo, NEURON)) == NeuronAcceleratorManager.get_current_node_num_accelerators()
    t = NeuronAcceleratorManager.get_current_node_accelerator_type()
    assert ours[f"accelerator_type:{t}"] == 1 and labels == {"ray.io/accelerator-type": t}
    spec = _resolve(monkeypatch)
    assert _accel_part(spec) == (ours, labels)


# ---------------------------------------------------------------------- TPU
def _gke(monkeypatch, name: str, worker: int, topology: str, accel: str) -> None:
    monkeypatch.setattr(ray_tpu, "_get_tpu_metadata", lambda key: None)  # no metadata server
    monkeypatch.setenv("TPU_NAME", name)
    monkeypatch.setenv("TPU_WORKER_ID", str(worker))
    monkeypatch.setenv("TPU_TOPOLOGY", topology)
    monkeypatch.setenv("TPU_ACCELERATOR_TYPE", accel)


@pytest.mark.parametrize("worker", [0, 1])
def test_tpu_pod_resources_and_labels_are_rays(worker, monkeypatch):
    base = catalog.load("tpu-v6e-16-worker0")
    topo = dataclasses.replace(base, slice=dataclasses.replace(base.slice, worker_id=worker))
    _gke(monkeypatch, topo.slice.name, worker, topo.slice.topology, topo.slice.accelerator_type)
    res, labels = tpu_ray_extras(topo)
    assert res == TPUAcceleratorManager.get_current_node_additional_resources()
    assert labels == TPUAcceleratorManager.get_current_node_accelerator_labels()
    assert ray_accelerator_type(TPU, topo.devices[0].model, topo) == TPUAcceleratorManager.get_current_node_accelerator_type()
    monkeypatch.setattr(TPUAcceleratorManager, "get_current_node_num_accelerators", staticmethod(lambda: 4))
    spec = _resolve(monkeypatch)
    assert _accel_part(spec) == ray_node_resources(topo, TPU)


@pytest.mark.parametrize("accel,model", [("v4-8", "TPU v4"), ("v5litepod-8", "TPU v5e"), ("v5p-8", "TPU v5p"),
                                         ("v6e-8", "TPU v6e"), ("tpu7x-8", "TPU7x chip")])
def test_tpu_type_names_are_rays(accel, model, monkeypatch):
    _gke(monkeypatch, "x", 0, "2x2x1", accel)
    expected = TPUAcceleratorManager.get_current_node_accelerator_type()
    assert ray_accelerator_type(TPU, model) == expected  # from the chip name (tpu-info's)
    topo = dataclasses.replace(catalog.load("tpu-v4-8"), slice=Slice(accelerator_type=accel))
    assert ray_accelerator_type(TPU, "TPU v4", topo) == expected  # from the slice type first


# ------------------------------------------------------------ Gaudi, Ascend
@pytest.mark.parametrize("machine,device_name", [("gaudi2-hls2-8x", "GAUDI2"), ("gaudi3-hls3-8x", "GAUDI3")])
def test_gaudi_type_is_rays(machine, device_name, monkeypatch):
    fake = types.ModuleType("habana_frameworks.torch.hpu")
    fake.is_available = lambda: True
    fake.is_initialized = lambda: True
    fake.device_count = lambda: 8
    fake.get_device_name = lambda: device_name
    for mod in ("habana_frameworks", "habana_frameworks.torch"):
        monkeypatch.setitem(sys.modules, mod, types.ModuleType(mod))
    monkeypatch.setitem(sys.modules, "habana_frameworks.torch.hpu", fake)
    sys.modules["habana_frameworks"].torch = sys.modules["habana_frameworks.torch"]
    sys.modules["habana_frameworks.torch"].hpu = fake
    monkeypatch.setattr(ray_hpu, "HPU_PACKAGE_AVAILABLE", True)
    topo = catalog.load(machine)
    assert ray_accelerator_type(HPU, topo.devices[0].model) == HPUAcceleratorManager.get_current_node_accelerator_type()
    assert len(node_units(topo, HPU)) == HPUAcceleratorManager.get_current_node_num_accelerators()
    assert _accel_part(_resolve(monkeypatch)) == ray_node_resources(topo, HPU)


@pytest.mark.parametrize("machine", ["atlas-800t-a2-910b3", "atlas-800-910a-8x"])
def test_ascend_type_is_rays(machine, monkeypatch):
    topo = catalog.load(machine)
    fake = types.ModuleType("acl")
    fake.get_soc_name = lambda: topo.devices[0].model  # what AscendCL reports is the SoC name
    fake.rt = types.SimpleNamespace(get_device_count=lambda: (len(topo.devices), 0))
    monkeypatch.setitem(sys.modules, "acl", fake)
    assert ray_accelerator_type(NPU, topo.devices[0].model) == NPUAcceleratorManager.get_current_node_accelerator_type()
    assert len(node_units(topo, NPU)) == NPUAcceleratorManager.get_current_node_num_accelerators()
    assert _accel_part(_resolve(monkeypatch)) == ray_node_resources(topo, NPU)


def test_npu_smi_names_the_soc_as_acl_does():
    topo = import_captures([CAPTURES / "95_npu-smi-topo-and-info-910b3-8npu-all-hccs-valle.txt"]).topology
    assert ray_accelerator_type(NPU, topo.devices[0].model) == "Ascend910B3"  # acl.get_soc_name() on a 910B3


# ----------------------------------------------------------------- helpers
def _resolve(monkeypatch) -> ResourceAndLabelSpec:
    """What Ray's raylet would start with on this (patched) node."""
    for var in ("CUDA_VISIBLE_DEVICES", "NEURON_RT_VISIBLE_CORES", "TPU_VISIBLE_CHIPS", "HABANA_VISIBLE_MODULES",
                "ASCEND_RT_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "RAY_OVERRIDE_RESOURCES", "RAY_OVERRIDE_LABELS"):
        monkeypatch.delenv(var, raising=False)
    if hasattr(ray_accel.get_accelerator_manager_for_resource, "_resource_name_to_accelerator_manager"):
        monkeypatch.delattr(ray_accel.get_accelerator_manager_for_resource, "_resource_name_to_accelerator_manager")
    return ResourceAndLabelSpec(num_cpus=1, memory=10**9, object_store_memory=10**8).resolve(
        is_head=False, node_ip_address="127.0.0.1")


def _accel_part(spec: ResourceAndLabelSpec) -> tuple[dict, dict]:
    """The accelerator resources and labels of a resolved spec (not CPU, memory, node id)."""
    res = {k: float(v) for k, v in spec.resources.items() if not k.startswith("node:")}
    if spec.num_gpus:
        res["GPU"] = float(spec.num_gpus)
    labels = {k: v for k, v in spec.labels.items() if k.startswith(("ray.io/accelerator", "ray.io/tpu"))}
    return res, labels
