"""RaySpec: how each accelerator family appears to Ray; ray_specs(), naming, the node's resources and labels."""

from __future__ import annotations

import dataclasses
import importlib.metadata
import warnings

import pytest

from rayaccel import catalog
from rayaccel.discovery import registry
from rayaccel.discovery.rayspec import (AMD, BUILTIN_SPECS, HPU, NEURON, NPU, NVIDIA, TPU, RaySpec,
                                        ray_accelerator_type, ray_node_resources, ray_specs, spec_for, tpu_ray_extras)
from rayaccel.discovery.registry import BackendInfo, PluginWarning
from rayaccel.errors import BackendError, PluginError
from rayaccel.topology import Device, NodeTopology, Slice


@pytest.fixture(autouse=True)
def fresh_registry():
    registry._reset()
    yield
    registry._reset()


@pytest.fixture
def plugins(monkeypatch):
    real = list(importlib.metadata.entry_points(group=registry.ENTRY_POINT_GROUP))

    def install(*extra: tuple[str, str]):
        eps = [importlib.metadata.EntryPoint(name=n, value=v, group=registry.ENTRY_POINT_GROUP) for n, v in extra]
        monkeypatch.setattr(registry, "_entry_points", lambda: real + eps)
        registry._reset()

    return install


class _Plugin:
    name = "acmex"
    ray_spec = RaySpec(vendor="acmex", resource="ACMEX", unit="device", visible_env=("ACMEX_VISIBLE",),
                       accelerator_type="model")

    def available(self):
        return BackendInfo(self.name, False, "no hardware", "none")

    def discover(self):
        raise NotImplementedError


class BadSpecPlugin(_Plugin):
    name = "badspec"
    ray_spec = "GPU"  # not a RaySpec


class ClaimsNvidia(_Plugin):
    name = "claimsnvidia"
    ray_spec = dataclasses.replace(NVIDIA, resource="FAKEGPU")


class TwoSpecs(_Plugin):
    name = "twospecs"
    ray_spec = (RaySpec(vendor="x1", resource="X1", unit="device", visible_env=("X1_VIS",), accelerator_type="model"),
                RaySpec(vendor="x2", resource="X2", unit="chip", visible_env=("X2_VIS",), accelerator_type="fixed:X2"))


class GoodPlugin(_Plugin):
    pass


# ------------------------------------------------------------------ the spec itself
@pytest.mark.parametrize("field,value,needle", [
    ("vendor", "Has Caps", "vendor"), ("resource", "CPU", "resource"), ("resource", "bad name!", "resource"),
    ("unit", "gpu", "unit"), ("visible_env", (), "visible_env"), ("visible_env", ("lower",), "visible_env"),
    ("accelerator_type", "whatever", "accelerator_type"), ("accelerator_type", "fixed:", "accelerator_type"),
    ("bounds_env", ("A", "B"), "bounds_env"), ("valid_counts", (0,), "valid_counts"),
    ("default_cores", (("Trainium", 0),), "default_cores"), ("whole_units", 1, "whole_units"),
], ids=lambda v: str(v)[:20])
def test_a_malformed_spec_names_its_field(field, value, needle):
    kw = dict(vendor="acme", resource="ACME", unit="device", visible_env=("ACME_VISIBLE",), accelerator_type="model")
    kw[field] = value
    with pytest.raises(PluginError, match=f"ray_spec.{needle}"):
        RaySpec(**kw)


def test_builtin_specs_follow_rays_managers():
    # names, variables and units as ray/_private/accelerators/*.py write them (checked against Ray in
    # tests/ray/test_ray_accelerator_managers.py); here the table itself
    assert {v: (s.resource, s.unit, s.visible_env) for v, s in BUILTIN_SPECS.items()} == {
        "nvidia": ("GPU", "device", ("CUDA_VISIBLE_DEVICES",)),
        "amd": ("GPU", "device", ("HIP_VISIBLE_DEVICES",)),
        "aws": ("neuron_cores", "core", ("NEURON_RT_VISIBLE_CORES",)),
        "google": ("TPU", "chip", ("TPU_VISIBLE_CHIPS",)),
        "habana": ("HPU", "device", ("HABANA_VISIBLE_MODULES",)),
        "huawei": ("NPU", "device", ("ASCEND_RT_VISIBLE_DEVICES",)),
    }
    assert TPU.bounds_env == ("TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS") and TPU.whole_host_unsets
    assert TPU.valid_counts == (1, 2, 4, 8)
    assert all(s.noset_env == (f"RAY_EXPERIMENTAL_NOSET_{s.visible_env[0]}",) for s in BUILTIN_SPECS.values())


@pytest.mark.parametrize("model,cores", [("Trainium", 2), ("Trainium2", 4), ("Inferentia", 4), ("Inferentia2", 2),
                                         (None, None), ("Something else", None)])
def test_neuron_cores_default_by_model(model, cores):
    assert NEURON.cores_of(Device(0, "aws", model)) == cores
    assert NEURON.cores_of(Device(0, "aws", model, cores=7)) == 7  # what neuron-ls said wins
    assert HPU.cores_of(Device(0, "habana", model)) == 1


# ---------------------------------------------------------------------- registry
def test_ray_specs_has_every_builtin_through_the_backends():
    specs = ray_specs()
    assert specs == BUILTIN_SPECS
    assert registry.get_backend("neuron").ray_spec is NEURON and registry.get_backend("amd").ray_spec is AMD
    assert registry.get_backend("tpu").ray_spec is TPU and registry.get_backend("ascend").ray_spec is NPU


def test_a_plugin_declares_its_accelerator_and_bad_ones_degrade_only_themselves(plugins):
    plugins(("acmex", f"{__name__}:GoodPlugin"), ("badspec", f"{__name__}:BadSpecPlugin"),
            ("claimsnvidia", f"{__name__}:ClaimsNvidia"), ("twospecs", f"{__name__}:TwoSpecs"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        specs = ray_specs()
    assert specs["acmex"].resource == "ACMEX" and specs["x1"].resource == "X1" and specs["x2"].unit == "chip"
    assert specs["nvidia"] is NVIDIA  # the built-in keeps its vendor
    msgs = [str(w.message) for w in caught if issubclass(w.category, PluginWarning)]
    assert any("'badspec'" in m and "RaySpec" in m for m in msgs)
    assert any("'claimsnvidia'" in m and "already declared" in m for m in msgs)


def test_spec_for_a_topology():
    assert spec_for(catalog.load("trn1-32xlarge")) is NEURON
    assert spec_for(NodeTopology()) is None
    mixed = NodeTopology(devices=(Device(0, "nvidia"), Device(1, "aws")))
    with pytest.raises(BackendError, match="several vendors"):
        spec_for(mixed)
    with pytest.raises(BackendError, match="no backend declares how vendor 'acme'"):
        spec_for(NodeTopology(devices=(Device(0, "acme"),)))


# ------------------------------------------------------------------------ naming
@pytest.mark.parametrize("model,expected", [
    ("Tesla V100-SXM2-32GB", "V100"), ("NVIDIA A100-SXM4-40GB", "A100"), ("NVIDIA H100 80GB HBM3", "H100"),
    ("NVIDIA L40S", "L40S"), ("NVIDIA GeForce RTX 5090", "GeForce-RTX-5090"), ("NVIDIA GB200", "GB200"),
    ("NVIDIA RTX PRO 6000 Blackwell Server Edition", "RTX-PRO-6000"), (None, None),
])
def test_nvidia_names(model, expected):
    assert ray_accelerator_type(NVIDIA, model) == expected


@pytest.mark.parametrize("spec,model,expected", [
    (AMD, "AMD Instinct MI300X", "AMD-Instinct-MI300X-OAM"), (AMD, "AMD Instinct MI300X HF", "AMD-Instinct-MI300X-HF"),
    (AMD, "AMD Instinct MI210", "AMD-Instinct-MI210"), (AMD, "AMD Instinct MI250X", "AMD-Instinct-MI250X"),
    (AMD, "AMD Instinct MI250", "AMD-Instinct-MI250X-MI250"), (AMD, "Radeon Pro W7900", None),
    (NEURON, "Trainium", "aws-neuron-core"), (NEURON, None, "aws-neuron-core"),
    (HPU, "Gaudi2", "Intel-GAUDI2"), (HPU, "Gaudi 3", "Intel-GAUDI3"), (HPU, "Gaudi", "Intel-GAUDI"),
    (NPU, "Ascend910B3", "Ascend910B3"), (NPU, "910B4", "Ascend910B4"),
    (TPU, "TPU v4", "TPU-V4"), (TPU, "TPU v5e chip", "TPU-V5LITEPOD"), (TPU, "TPU v6e", "TPU-V6E"),
    (TPU, "TPU7x chip", "TPU-V7X"), (TPU, "mystery", None),
])
def test_family_names(spec, model, expected):
    assert ray_accelerator_type(spec, model) == expected


def test_tpu_name_comes_from_the_pod_slice_first():
    t = NodeTopology(devices=(Device(0, "google", "TPU v4", coords=(0, 0, 0)),),
                     slice=Slice(accelerator_type="v5litepod-16"))
    assert ray_accelerator_type(TPU, "TPU v4", t) == "TPU-V5LITEPOD"


# ------------------------------------------------------------- resources, labels
def test_ray_node_resources_per_family():
    res, labels = ray_node_resources(catalog.load("trn1-32xlarge"))
    assert res == {"neuron_cores": 32.0, "accelerator_type:aws-neuron-core": 1.0}
    assert labels == {"ray.io/accelerator-type": "aws-neuron-core"}
    res, labels = ray_node_resources(catalog.load("dgx1-v100"))
    assert res == {"GPU": 8.0, "accelerator_type:V100": 1.0} and labels == {"ray.io/accelerator-type": "V100"}
    assert ray_node_resources(catalog.load("trn2-48xlarge"))[0]["neuron_cores"] == 64.0
    assert ray_node_resources(catalog.load("gaudi2-hls2-8x"))[0] == {"HPU": 8.0, "accelerator_type:Intel-GAUDI2": 1.0}
    assert ray_node_resources(NodeTopology()) == ({}, {})


def test_tpu_pod_labels_and_head_resource():
    t = catalog.load("tpu-v6e-16-worker0")
    res, labels = ray_node_resources(t)
    assert res == {"TPU": 4.0, "accelerator_type:TPU-V6E": 1.0, "tpu-v6e-16": 1.0, "TPU-v6e-16-head": 1.0}
    assert labels == {"ray.io/accelerator-type": "TPU-V6E", "ray.io/tpu-slice-name": "tpu-v6e-16",
                      "ray.io/tpu-worker-id": "0", "ray.io/tpu-topology": "4x4", "ray.io/tpu-pod-type": "v6e-16"}
    worker1 = dataclasses.replace(t, slice=dataclasses.replace(t.slice, worker_id=1))
    res1, labels1 = tpu_ray_extras(worker1)
    assert res1 == {"tpu-v6e-16": 1.0} and labels1["ray.io/tpu-worker-id"] == "1"
    # Ray adds the slice resources only with name, worker id and pod type all known; labels one by one
    anon = dataclasses.replace(t, slice=Slice(topology="4x4", accelerator_type="v6e-16"))
    assert tpu_ray_extras(anon) == ({}, {"ray.io/tpu-topology": "4x4", "ray.io/tpu-pod-type": "v6e-16"})
    assert tpu_ray_extras(catalog.load("dgx1-v100")) == ({}, {})
    odd = dataclasses.replace(t, slice=Slice(name="x", worker_id=0, accelerator_type="trillium-16"))
    assert tpu_ray_extras(odd) == ({}, {"ray.io/tpu-slice-name": "x", "ray.io/tpu-worker-id": "0"})


def test_unknown_core_count_is_an_error_not_zero():
    t = NodeTopology(devices=(Device(0, "aws", "Mystery chip"),))
    with pytest.raises(BackendError, match="does not say how many neuron_cores"):
        ray_node_resources(t, NEURON)
