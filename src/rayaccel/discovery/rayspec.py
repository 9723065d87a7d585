"""How each accelerator family appears to Ray: :class:`RaySpec`, one per ``Device.vendor``.

Ray 2.60 knows an accelerator through an ``AcceleratorManager`` (``ray/_private/accelerators``)
whose static methods name its resource, count its units, name the node's accelerator type
and write the visible-ids variable in each worker. A :class:`RaySpec` is the same knowledge
as plain data, declared by a discovery backend next to its discovery (an optional attribute
``ray_spec``: one spec or a tuple of them) -- so a plugin backend declares a whole
accelerator, and the built-ins go through the same path::

    class AcmeBackend:
        name = "acme"
        ray_spec = RaySpec(vendor="acme", resource="ACME", unit="device",
                           visible_env=("ACME_VISIBLE_DEVICES",), accelerator_type="model")
        def available(self): ...
        def discover(self): ...

* :func:`ray_specs` -- vendor -> spec for every registered backend (built-ins first, then
  plugins in name order; a malformed or duplicate plugin spec is skipped with a
  :class:`~rayaccel.discovery.registry.PluginWarning` naming it).
* :func:`spec_for` -- the spec of a topology's accelerators.
* :func:`ray_accelerator_type` -- Ray's name for a device model (``accelerator_type:<T>``,
  ``ray.io/accelerator-type``), computed with Ray's own rule for that family.
* :func:`ray_node_resources` -- the resources and labels Ray itself adds on that hardware.
* :func:`tpu_ray_extras` -- a TPU host's pod-slice resources and labels.

Built-in specs, each following Ray 2.60's manager for it: :data:`NVIDIA`, :data:`AMD`
(``HIP_VISIBLE_DEVICES``), :data:`NEURON` (``neuron_cores``, ``NEURON_RT_VISIBLE_CORES``),
:data:`TPU` (``TPU_VISIBLE_CHIPS`` and the bounds variables), :data:`HPU` (Gaudi,
``HABANA_VISIBLE_MODULES``) and :data:`NPU` (Ascend, ``ASCEND_RT_VISIBLE_DEVICES``).
"""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass
from typing import Any

from ..errors import BackendError, PluginError
from ..topology import Device, NodeTopology
from .registry import _PLUGIN_FAULTS, PluginWarning, _describe, backends

__all__ = ["AMD", "BUILTIN_SPECS", "HPU", "NEURON", "NPU", "NVIDIA", "TPU", "UNITS", "RaySpec",
           "ray_accelerator_type", "ray_node_resources", "ray_specs", "spec_for", "tpu_ray_extras"]

#: What one Ray slot of a spec's resource stands for.
UNITS = ("device", "core", "chip")
#: Label keys Ray 2.60 sets on a node (``ray._raylet.RAY_NODE_*_KEY``).
ACCELERATOR_TYPE_LABEL = "ray.io/accelerator-type"
TPU_SLICE_NAME_LABEL = "ray.io/tpu-slice-name"
TPU_WORKER_ID_LABEL = "ray.io/tpu-worker-id"
TPU_TOPOLOGY_LABEL = "ray.io/tpu-topology"
TPU_POD_TYPE_LABEL = "ray.io/tpu-pod-type"
#: Prefix of the resource Ray adds for the node's accelerator type (``RESOURCE_CONSTRAINT_PREFIX``).
ACCELERATOR_TYPE_PREFIX = "accelerator_type:"
_NAMINGS = ("nvidia", "amd", "tpu", "gaudi", "ascend", "model")
_RESOURCE_OK = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,62}$")
_ENV_OK = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
_VENDOR_OK = re.compile(r"^[a-z0-9][a-z0-9_-]{0,62}$")


@dataclass(frozen=True, slots=True)
class RaySpec:
    """How one accelerator family appears to Ray, following Ray's accelerator manager for it.

    Attributes:
        vendor: the ``Device.vendor`` it covers (``"nvidia"``, ``"aws"``, ``"google"`` ...).
        resource: the Ray resource: ``"GPU"``, ``"neuron_cores"``, ``"TPU"``, ``"HPU"``,
            ``"NPU"`` or a plugin's own.
        unit: what one slot of the resource is: ``"device"``, ``"core"`` (NeuronCores:
            ``Device.cores`` per device, numbered across devices in device order) or
            ``"chip"`` (TPU chips on the host's ICI grid, ``Device.coords``).
        visible_env: the variable(s) the manager writes with the granted ids, comma-joined.
        accelerator_type: how Ray names the node's type from the device model:
            ``"nvidia"`` (the NVML-name rule, ``Tesla V100-SXM2-16GB`` -> ``V100``), ``"amd"``
            (the PCI device-id table, by market name), ``"tpu"`` (``TPU-V4`` from the pod type
            or chip name), ``"gaudi"`` (``Intel-GAUDI2``), ``"ascend"`` (the SoC name,
            ``Ascend910B3``), ``"model"`` (the model text, sanitised) or ``"fixed:<name>"``.
        noset_env: ``RAY_EXPERIMENTAL_NOSET_<VAR>``: when it is true in a worker, Ray writes nothing.
        bounds_env: TPU only: ``(chips-per-host bounds, host bounds)`` variables Ray writes for
            sub-host grants (``TPU_CHIPS_PER_HOST_BOUNDS``, ``TPU_HOST_BOUNDS``).
        whole_host_unsets: a grant of all the node's units unsets the visible variable
            (and stale bounds) instead of listing every id (TPU).
        valid_counts: quantities Ray accepts for the resource (TPU: 1, 2, 4, 8), or None for any.
        whole_units: Ray rejects fractional quantities (Neuron, TPU, HPU).
        default_cores: ``(model text, cores)`` used when a device of a ``"core"`` spec does not
            say its core count (first match of a case-insensitive substring wins).

    Raises:
        PluginError: on construction, naming the field (and ``vendor`` as the plugin).
    """

    vendor: str
    resource: str
    unit: str
    visible_env: tuple[str, ...]
    accelerator_type: str
    noset_env: tuple[str, ...] = ()
    bounds_env: tuple[str, str] | None = None
    whole_host_unsets: bool = False
    valid_counts: tuple[int, ...] | None = None
    whole_units: bool = False
    default_cores: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        who = self.vendor if isinstance(self.vendor, str) else repr(self.vendor)

        def bad(field: str, msg: str) -> PluginError:
            return PluginError(f"ray_spec.{field}: {msg}", backend=who)

        if not isinstance(self.vendor, str) or not _VENDOR_OK.match(self.vendor):
            raise bad("vendor", f"expected a lowercase name such as 'aws', got {self.vendor!r}")
        if not isinstance(self.resource, str) or not _RESOURCE_OK.match(self.resource) \
                or self.resource in ("CPU", "memory", "object_store_memory"):
            raise bad("resource", f"expected a Ray resource name such as 'neuron_cores' (not CPU/memory), "
                                  f"got {self.resource!r}")
        if self.unit not in UNITS:
            raise bad("unit", f"expected one of {', '.join(UNITS)}, got {self.unit!r}")
        for field in ("visible_env", "noset_env"):
            val = getattr(self, field)
            if not isinstance(val, tuple) or not all(isinstance(v, str) and _ENV_OK.match(v) for v in val):
                raise bad(field, f"expected a tuple of environment variable names, got {val!r}")
        if not self.visible_env:
            raise bad("visible_env", "at least one variable is needed (the one the granted ids go to)")
        if self.bounds_env is not None and (not isinstance(self.bounds_env, tuple) or len(self.bounds_env) != 2
                                            or not all(isinstance(v, str) and _ENV_OK.match(v)
                                                       for v in self.bounds_env)):
            raise bad("bounds_env", f"expected (chips-per-host variable, host variable) or None, got {self.bounds_env!r}")
        if self.bounds_env is not None and self.unit != "chip":
            raise bad("bounds_env", "only chip units (TPU) have bounds variables")
        name = self.accelerator_type
        if not isinstance(name, str) or not (name in _NAMINGS or (name.startswith("fixed:") and len(name) > 6)):
            raise bad("accelerator_type", f"expected one of {', '.join(_NAMINGS)} or 'fixed:<name>', got {name!r}")
        for field in ("whole_host_unsets", "whole_units"):
            if not isinstance(getattr(self, field), bool):
                raise bad(field, f"expected True or False, got {getattr(self, field)!r}")
        vc = self.valid_counts
        if vc is not None and (not isinstance(vc, tuple) or not vc or not all(
                type(v) is int and v >= 1 for v in vc)):
            raise bad("valid_counts", f"expected a tuple of ints >= 1 or None, got {vc!r}")
        dc = self.default_cores
        if not isinstance(dc, tuple) or not all(isinstance(p, tuple) and len(p) == 2 and isinstance(p[0], str)
                                                and p[0] and type(p[1]) is int and 1 <= p[1] <= 1024 for p in dc):
            raise bad("default_cores", f"expected ((model text, cores 1..1024), ...), got {dc!r}")

    def cores_of(self, device: Device) -> int | None:
        """Units one device contributes: 1 for device and chip units; for core units the
        device's ``cores``, else :attr:`default_cores` by model, else None (unknown)."""
        if self.unit != "core":
            return 1
        if device.cores is not None:
            return device.cores
        model = (device.model or "").lower()
        for text, n in self.default_cores:
            if text.lower() in model:
                return n
        return None

    def covers(self, device: Device) -> bool:
        """True for a device of this spec's vendor."""
        return device.vendor == self.vendor


NVIDIA = RaySpec(vendor="nvidia", resource="GPU", unit="device", visible_env=("CUDA_VISIBLE_DEVICES",),
                 accelerator_type="nvidia", noset_env=("RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES",))
AMD = RaySpec(vendor="amd", resource="GPU", unit="device", visible_env=("HIP_VISIBLE_DEVICES",),
              accelerator_type="amd", noset_env=("RAY_EXPERIMENTAL_NOSET_HIP_VISIBLE_DEVICES",))
#: NeuronCores per device when neuron-ls is not at hand: Inferentia 4, Inferentia2 / Trainium 2,
#: Trainium2 4 (the default logical-core configuration LNC=2 exposes 4 of its 8 physical cores).
NEURON = RaySpec(vendor="aws", resource="neuron_cores", unit="core", visible_env=("NEURON_RT_VISIBLE_CORES",),
                 accelerator_type="fixed:aws-neuron-core",
                 noset_env=("RAY_EXPERIMENTAL_NOSET_NEURON_RT_VISIBLE_CORES",), whole_units=True,
                 default_cores=(("Inferentia2", 2), ("Trainium2", 4), ("Trainium3", 4), ("Inferentia", 4),
                                ("Trainium", 2)))
TPU = RaySpec(vendor="google", resource="TPU", unit="chip", visible_env=("TPU_VISIBLE_CHIPS",),
              accelerator_type="tpu", noset_env=("RAY_EXPERIMENTAL_NOSET_TPU_VISIBLE_CHIPS",),
              bounds_env=("TPU_CHIPS_PER_HOST_BOUNDS", "TPU_HOST_BOUNDS"), whole_host_unsets=True,
              valid_counts=(1, 2, 4, 8), whole_units=True)
HPU = RaySpec(vendor="habana", resource="HPU", unit="device", visible_env=("HABANA_VISIBLE_MODULES",),
              accelerator_type="gaudi", noset_env=("RAY_EXPERIMENTAL_NOSET_HABANA_VISIBLE_MODULES",),
              whole_units=True)
NPU = RaySpec(vendor="huawei", resource="NPU", unit="device", visible_env=("ASCEND_RT_VISIBLE_DEVICES",),
              accelerator_type="ascend", noset_env=("RAY_EXPERIMENTAL_NOSET_ASCEND_RT_VISIBLE_DEVICES",))
#: Every built-in spec, by vendor.
BUILTIN_SPECS: dict[str, RaySpec] = {s.vendor: s for s in (NVIDIA, AMD, NEURON, TPU, HPU, NPU)}


# ----------------------------------------------------------------------- naming
# NVIDIA: Ray's NVIDIA_GPU_NAME_PATTERN (nvidia_gpu.py) and its fallback, rule for rule.
_NVIDIA_NAME = re.compile(r"\w+\s+((?:[A-Z]+\s+)*[A-Z0-9]*\d[A-Z0-9]*)")
# AMD: Ray maps the PCI device id (amd_gpu.py amd_product_dict); rayaccel knows the market name.
#: ``(market-name pattern, PCI device id, Ray's name)``, most specific first.
AMD_MODELS: tuple[tuple[str, str, str], ...] = (
    (r"MI300X.*\bHF\b", "0x74a9", "AMD-Instinct-MI300X-HF"),
    (r"MI300X", "0x74a1", "AMD-Instinct-MI300X-OAM"),
    (r"MI308X", "0x74a2", "AMD-Instinct-MI308X-OAM"),
    (r"MI300A", "0x74a0", "AMD-Instinct-MI300A"),
    (r"MI325X", "0x74a5", "AMD-Instinct-MI325X-OAM"),
    (r"MI350X", "0x75a0", "AMD-Instinct-MI350X-OAM"),
    (r"MI355X", "0x75a3", "AMD-Instinct-MI355X-OAM"),
    (r"MI250X", "0x7408", "AMD-Instinct-MI250X"),
    (r"MI250", "0x740c", "AMD-Instinct-MI250X-MI250"),
    (r"MI210", "0x740f", "AMD-Instinct-MI210"),
    (r"MI100", "0x738c", "AMD-Instinct-MI100"),
    (r"MI50|MI60", "0x66a1", "AMD-Instinct-MI50"),
)
# TPU: chip names (tpu-info "TPU v5e chip", catalog "TPU v6e") -> the version in Ray's spelling.
_TPU_VERSIONS = {"v2": "V2", "v3": "V3", "v4": "V4", "v5e": "V5LITEPOD", "v5litepod": "V5LITEPOD", "v5lite": "V5LITEPOD",
                 "v5p": "V5P", "v6e": "V6E", "v7x": "V7X", "7x": "V7X"}
_TPU_POD_TYPE = re.compile(r"^(v|tpu)\d+[a-zA-Z]*-\d+$")
_LABEL_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def ray_accelerator_type(spec: RaySpec, model: str | None, topology: NodeTopology | None = None) -> str | None:
    """Ray's accelerator-type name for a device model (``accelerator_type:<T>``, ``ray.io/accelerator-type``).

    Follows the manager of the family: NVIDIA's NVML-name rule (``Tesla V100-SXM2-16GB`` ->
    ``V100``, ``NVIDIA GeForce RTX 5090`` -> ``GeForce-RTX-5090``); AMD's device-id table
    (here by market name, :data:`AMD_MODELS`); TPU ``TPU-<VERSION>`` from the topology's
    pod slice type or the chip name; Gaudi ``Intel-<DEVICE NAME>``; Ascend the SoC name.

    Returns:
        the name, or None when Ray would find none (unknown model, an AMD GPU outside its table).
    """
    rule = spec.accelerator_type
    if rule.startswith("fixed:"):
        return rule[6:]
    if rule == "tpu":
        return _tpu_type(model, topology)
    if model is None or not model.strip():
        return None
    if rule == "nvidia":
        m = _NVIDIA_NAME.match(model)
        result = m.group(1).replace(" ", "-") if m else None
        if result and len(result) > 1:
            return result
        cleaned = re.sub(r"^NVIDIA\s+", "", model).strip()
        return cleaned.replace(" ", "-") if cleaned else None
    if rule == "amd":
        for pattern, _, name in AMD_MODELS:
            if re.search(pattern, model, re.I):
                return name
        return None
    if rule == "gaudi":
        m = re.search(r"gaudi\s*-?\s*(\d*)", model, re.I)
        return f"Intel-GAUDI{m.group(1)}" if m else None
    if rule == "ascend":
        m = re.search(r"(?:ascend\s*)?(\d{3}[A-Za-z0-9]*)", model, re.I)
        return f"Ascend{m.group(1)}" if m else None
    text = _LABEL_BAD.sub("-", model).strip("-._")[:63].strip("-._")  # "model"
    return text or None


def _tpu_type(model: str | None, topology: NodeTopology | None) -> str | None:
    pod = tpu_pod_type(topology) if topology is not None else None
    if pod is not None:
        return f"TPU-{pod.split('-')[0].upper()}"
    if model:
        m = re.search(r"(?:tpu\s*)?(v?\d+[a-z]*)", model.strip().lower())
        if m:
            key = m.group(1) if m.group(1).startswith("v") or m.group(1) == "7x" else "v" + m.group(1)
            version = _TPU_VERSIONS.get(key)
            if version:
                return f"TPU-{version}"
    return None


def tpu_pod_type(topology: NodeTopology) -> str | None:
    """The slice's pod type in Ray's spelling (``"v4-16"``; ``"TPU-V7X"``-style prefixes
    normalised as Ray's ``normalize_tpu_accelerator_type`` does), or None when unknown or not
    of Ray's form ``v<gen>-<cores>``."""
    sl = topology.slice
    if sl is None or not sl.accelerator_type or not _TPU_POD_TYPE.match(sl.accelerator_type):
        return None
    return re.sub(r"^tpu-?v?", "v", sl.accelerator_type.strip().lower())


def tpu_ray_extras(topology: NodeTopology) -> tuple[dict[str, float], dict[str, str]]:
    """The pod-slice resources and labels Ray 2.60's TPU manager adds on a TPU host.

    Resources (``get_current_node_additional_resources``): ``{<slice name>: 1}`` on every
    host and ``{"TPU-<pod type>-head": 1}`` on worker 0, only when the slice name, worker id
    and pod type are all known. Labels (``get_current_node_accelerator_labels``):
    ``ray.io/tpu-slice-name``, ``ray.io/tpu-worker-id``, ``ray.io/tpu-topology``,
    ``ray.io/tpu-pod-type``, each when known. Both empty without a slice.
    """
    sl = topology.slice
    if sl is None:
        return {}, {}
    pod = tpu_pod_type(topology)
    resources: dict[str, float] = {}
    if sl.name and sl.worker_id is not None and pod:
        resources[sl.name] = 1.0
        if sl.worker_id == 0:
            resources[f"TPU-{pod}-head"] = 1.0
    labels: dict[str, str] = {}
    if sl.name:
        labels[TPU_SLICE_NAME_LABEL] = sl.name
    if sl.worker_id is not None:
        labels[TPU_WORKER_ID_LABEL] = str(sl.worker_id)
    if sl.topology:
        labels[TPU_TOPOLOGY_LABEL] = sl.topology.strip().lower()
    if pod:
        labels[TPU_POD_TYPE_LABEL] = pod
    return resources, labels


def ray_node_resources(topology: NodeTopology, spec: RaySpec | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """The resources and labels Ray itself adds on a node with ``topology``'s hardware.

    As ``ResourceAndLabelSpec.resolve`` does with the family's manager: the resource
    counted by unit (``{"neuron_cores": 32}`` on a trn1.32xlarge, ``{"GPU": 8}``),
    ``accelerator_type:<T>: 1`` and the label ``ray.io/accelerator-type=<T>`` when Ray names
    the model (the first device's model, as the managers read device 0), and on a TPU host
    the pod-slice resources and labels (:func:`tpu_ray_extras`). A node without devices of
    the spec's vendor gets nothing.

    Args:
        topology: the node. spec: its family; default :func:`spec_for` ``(topology)``.

    Raises:
        BackendError: no spec covers the topology's vendor (from :func:`spec_for`), or a
            device of a core spec whose core count is unknown.
    """
    if spec is None:
        spec = spec_for(topology)
        if spec is None:
            return {}, {}
    devices = sorted((d for d in topology.devices if spec.covers(d)), key=lambda d: d.index)
    if not devices:
        return {}, {}
    count = 0
    for d in devices:
        n = spec.cores_of(d)
        if n is None:
            raise BackendError(f"device {d.index} ({d.model or 'model unknown'}) does not say how many "
                               f"{spec.resource} it has; set Device.cores (neuron-ls 'NEURON CORES')")
        count += n
    resources: dict[str, float] = {spec.resource: float(count)}
    labels: dict[str, str] = {}
    name = ray_accelerator_type(spec, devices[0].model, topology)
    if name:
        resources[ACCELERATOR_TYPE_PREFIX + name] = 1.0
        labels[ACCELERATOR_TYPE_LABEL] = name
    if spec.resource == "TPU":  # Ray applies accelerator labels for TPU only
        extra_res, extra_labels = tpu_ray_extras(topology)
        resources.update(extra_res)
        labels.update(extra_labels)
    return resources, labels


# --------------------------------------------------------------------- registry
def _declared(name: str, backend: Any) -> tuple[RaySpec, ...]:
    """The specs a backend declares (``ray_spec``: a RaySpec or a tuple of them; absent: none).

    Raises:
        PluginError: the attribute is something else or cannot be read.
    """
    try:
        value = getattr(backend, "ray_spec", None)
    except _PLUGIN_FAULTS as e:  # a plugin's property that raises is the plugin's fault: name it
        raise PluginError(f"ray_spec cannot be read: {_describe(e)}", backend=name) from e
    if value is None:
        return ()
    specs = value if isinstance(value, tuple) else (value,)
    for s in specs:
        if not isinstance(s, RaySpec):
            raise PluginError(f"ray_spec must be a rayaccel.discovery.RaySpec (or a tuple of them), "
                              f"got {type(s).__name__}", backend=name)
    return specs


def ray_specs() -> dict[str, RaySpec]:
    """Vendor -> :class:`RaySpec` for every registered backend that declares one.

    Built-ins come first, then plugins in name order (the registry's order); a vendor
    claimed twice keeps the first claim. A plugin whose ``ray_spec`` is malformed, or that
    claims a vendor already claimed, is skipped with a
    :class:`~rayaccel.discovery.registry.PluginWarning` that names it: one bad plugin
    degrades only itself.
    """
    out: dict[str, RaySpec] = {}
    owner: dict[str, str] = {}
    for name, backend in backends().items():
        try:
            specs = _declared(name, backend)
        except PluginError as e:
            warnings.warn(f"backend {name!r}: {e}; its accelerator is not known to Ray", PluginWarning, stacklevel=2)
            continue
        for s in specs:
            if s.vendor in out:
                if out[s.vendor] != s:
                    warnings.warn(f"backend {name!r} declares vendor {s.vendor!r}, already declared by backend "
                                  f"{owner[s.vendor]!r}; its declaration is ignored", PluginWarning, stacklevel=2)
                continue
            out[s.vendor] = s
            owner[s.vendor] = name
    return out


def spec_for(topology: NodeTopology, specs: dict[str, RaySpec] | None = None) -> RaySpec | None:
    """The spec of ``topology``'s accelerators (None for a node without devices).

    Args:
        specs: vendor -> spec to choose from; default :func:`ray_specs`.

    Raises:
        BackendError: devices of several vendors (Ray assumes one accelerator family per
            node), or a vendor no registered backend declares.
    """
    vendors = sorted({d.vendor for d in topology.devices})
    if not vendors:
        return None
    if len(vendors) > 1:
        raise BackendError(f"devices of several vendors on one node ({', '.join(vendors)}); Ray counts one "
                           "accelerator family per node: give each family its own node")
    table = ray_specs() if specs is None else specs
    spec = table.get(vendors[0])
    if spec is None:
        raise BackendError(f"no backend declares how vendor {vendors[0]!r} appears to Ray (declared: "
                           f"{', '.join(sorted(table)) or 'none'}); its backend needs a ray_spec attribute")
    return spec

