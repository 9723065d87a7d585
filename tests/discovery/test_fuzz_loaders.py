"""Fuzz every loader with hostile input (issue 10): the answer is a value or a RayaccelError
naming what was wrong, never another exception, a hang or unbounded memory.

Bounded: each property runs a fixed number of derandomized examples (see tests/fuzzing.py),
each example under a time and address-space bound.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import warnings
from pathlib import Path

import pytest
from fuzzing import (
    CAPTURES,
    bounded,
    fuzz_settings,
    huge_ints,
    json_scalars,
    json_values,
    mutated_captures,
    mutated_cluster_specs,
    mutated_topologies,
)
from hypothesis import given
from hypothesis import strategies as st
from ray._private.label_utils import validate_label_key, validate_label_value  # Ray's own label syntax check

from rayaccel import catalog
from rayaccel.discovery.network import node_levels
from rayaccel.errors import RayaccelError, RequestError, TopologyError
from rayaccel.topology import NodeTopology
from rayaccel.units import MAX_BYTES, parse_bytes


# ---------------------------------------------------------------- properties
@fuzz_settings(400, 500)
@given(st.one_of(st.text(max_size=40), st.text(alphabet="0123456789.kKmMgGiIbBtTpPeE -+", max_size=30),
                 st.text(min_size=900, max_size=2000, alphabet="9"), huge_ints,
                 st.floats(allow_nan=True, allow_infinity=True)))
def test_parse_bytes(value):
    with bounded():
        try:
            n = parse_bytes(value, "field")
        except RequestError as e:
            assert str(e).startswith("field: ") and len(str(e)) < 400
        else:
            assert isinstance(n, int) and 0 <= n <= MAX_BYTES


@fuzz_settings(400, 500)
@given(st.text(alphabet="0123456789,- x", max_size=60) | st.text(max_size=30), st.integers(0, 20))
def test_parse_index_list(text, devices):
    from rayaccel.cli._common import parse_index_list

    with bounded():
        for known in (range(devices), None):
            try:
                got = parse_index_list(text, "--busy", known=known)
            except RequestError as e:
                assert str(e).startswith("--busy: ") and len(str(e)) < 400
            else:
                assert known is None or got <= set(known)
                assert len(got) <= 1 << 16


def _rendered(topo: NodeTopology) -> None:
    """What a person would see must not crash either: the text view and the JSON round trip."""
    from rayaccel.cli import topo as cli_topo
    from rayaccel.cli._common import console

    with console.capture():
        cli_topo.render(topo)
    assert NodeTopology.from_json(topo.to_json()) == topo


@fuzz_settings(250)
@given(mutated_topologies())
def test_topology_from_dict(d):
    with bounded():
        try:
            topo = NodeTopology.from_dict(d)
        except TopologyError as e:
            assert len(str(e)) < 600
        else:
            _rendered(topo)


@fuzz_settings(200)
@given(st.one_of(st.text(max_size=200), st.integers(1, 200_000).map(lambda n: "[" * n + "]" * n),
                 st.integers(1, 200_000).map(lambda n: '{"a":' * n + "1" + "}" * n),
                 mutated_topologies().map(lambda d: json.dumps(d, allow_nan=True))))
def test_topology_from_json(text):
    with bounded():
        try:
            topo = NodeTopology.from_json(text)
        except TopologyError as e:
            assert len(str(e)) < 600
        else:
            _rendered(topo)


FABRIC_KEYS = ("state", "cluster_uuid", "clique_id", "status", "health_mask")
fabric_values = st.one_of(json_values, st.sampled_from(["completed", "in_progress", "not_started", "not_supported",
                                                         "9c6f5af3-53bf-49b5-a436-b66766c413c3", 0, 2**32, -1]))


@fuzz_settings(200)
@given(st.one_of(json_values, st.dictionaries(st.sampled_from(FABRIC_KEYS), fabric_values, max_size=5)),
       st.integers(0, 3), st.one_of(st.none(), json_values))
def test_topology_fabric_and_nic_port(fabric, device, port):
    """Hostile NVLink fabric objects and NIC ports: a topology or one TopologyError naming the field."""
    d = catalog.load("gb200-nvl72-tray").to_dict()
    d["devices"][device]["fabric"] = fabric
    d["nics"][device]["port"] = port
    with bounded():
        try:
            topo = NodeTopology.from_dict(d)
        except TopologyError as e:
            assert str(e).startswith((f"devices[{device}].fabric", f"nics[{device}].port")), str(e)
            assert len(str(e)) < 600
        else:
            from rayaccel.topology import nvlink_domain_reason

            nvlink_domain_reason(topo)
            assert NodeTopology.from_json(topo.to_json()) == topo


NETWORK = sorted((Path(__file__).parent.parent / "data" / "network").glob("*.[cj]*"))


@st.composite
def mutated_network_files(draw):
    """A Slurm topology.conf or AWS instance-topology file, damaged as captures are (lines dropped,
    doubled, swapped, characters replaced, cut short, numbers blown up)."""
    text = draw(st.sampled_from(NETWORK)).read_text()
    lines = text.splitlines()
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(0, 5))):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.choice(["drop", "dup", "swap", "chars", "cut", "range"])
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "swap":
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif op == "chars":
            s = list(lines[i]) or [" "]
            for _ in range(rng.randint(1, 4)):
                s[rng.randrange(len(s))] = rng.choice("[]=,#-:\"{} 9x\u00e9")
            lines[i] = "".join(s)
        elif op == "cut":
            lines = lines[:i]
        else:
            lines[i] = lines[i].replace("[", "[" + str(rng.choice([0, 1, 10**6, 10**30])) + "-", 1)
    return "\n".join(lines) + "\n"


@fuzz_settings(200)
@given(mutated_network_files(), st.sampled_from(["nvl-r0-t03", "login1", "x"]),
       st.sampled_from([None, "i-1111111111example", "i-2222222222example"]))
def test_network_topology_files(scratch, text, host, instance):
    """A damaged topology.conf / instance-topology file: labels (valid Ray labels) or one CaptureError
    naming the file, never another exception or half a result."""
    path = scratch / "net.conf"
    path.write_text(text)
    with bounded():
        try:
            labels = node_levels(path, host, instance)
        except RayaccelError as e:
            assert str(e).startswith(str(path)) and "\n" not in str(e) and len(str(e)) < 600
        else:
            assert labels
            for k, v in labels.items():
                assert validate_label_key(k) is None
                validate_label_value(v)


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@fuzz_settings(150)
@given(content=st.one_of(st.binary(max_size=300), mutated_captures().map(str.encode),
                         mutated_topologies().map(lambda d: json.dumps(d).encode())),
       suffix=st.sampled_from([".json", ".txt", ""]))
def test_load_topology_file(scratch, content, suffix):
    from rayaccel.discovery.load import load_topology

    path = scratch / f"input{suffix}"
    path.write_bytes(content)
    with bounded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            topo = load_topology(path)
        except RayaccelError as e:
            assert len(str(e)) < 2000
        else:
            _rendered(topo)


@fuzz_settings(150)
@given(mutated_captures())
def test_capture_importers(text):
    from rayaccel.discovery.capture import import_captures

    with bounded():
        try:
            result = import_captures([text])
        except RayaccelError:
            return
        result.topology.validate()
        _rendered(result.topology)


@fuzz_settings(150)
@given(st.one_of(st.text(alphabet=st.characters(blacklist_characters="\x00", blacklist_categories=("Cs",)),
                         max_size=300),
                 st.sampled_from(catalog.names()), st.text(min_size=4000, max_size=6000, alphabet="x/.[{"),
                 mutated_captures()))
def test_rayaccel_topology_environment(value):
    from rayaccel.discovery import registry
    value = value.replace("\x00", "")  # an environment variable cannot hold a NUL byte
    old = os.environ.get("RAYACCEL_TOPOLOGY")
    os.environ["RAYACCEL_TOPOLOGY"] = value
    try:
        with bounded(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for info in registry.backend_infos():
                assert isinstance(info.available, bool)
            try:
                topo = registry.discover()
            except RayaccelError as e:
                assert len(str(e)) < 2000
            else:
                _rendered(topo)
    finally:
        if old is None:
            os.environ.pop("RAYACCEL_TOPOLOGY", None)
        else:
            os.environ["RAYACCEL_TOPOLOGY"] = old


def test_found_neuron_memory_overflow():
    """Found by this suite: a memory of 1e400 GB became float inf, then an OverflowError."""
    from rayaccel.discovery.capture import import_captures

    text = (CAPTURES_BY_NAME["67_neuron-ls-inf2.48xlarge-12dev-ring.txt"].read_text()
            .replace("32 GB", "1" + "0" * 400 + " GB", 1))
    try:
        import_captures([text])
    except RayaccelError:
        pass


CAPTURES_BY_NAME = {p.name: p for p in CAPTURES}


def test_found_capture_errors_echo_long_cells():
    """Found by this suite: a damaged header row used to be echoed whole (4,500 characters)."""
    from rayaccel.discovery.capture import import_captures

    lines = CAPTURES_BY_NAME["68_neuron-ls-trn1.32xlarge-16dev-collapsed-whitespace.txt"].read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if "NEURON" in ln and "CONNECTED" in ln)
    lines[header] = lines[header].replace("CONNECTED", "9" * 4000, 1)
    with pytest.raises(RayaccelError) as e:
        import_captures(["\n".join(lines) + "\n"])
    assert len(str(e.value)) < 2000


# ---------------------------------------------------------------- places across nodes (issue 14)
@fuzz_settings(150)
@given(content=st.one_of(st.binary(max_size=300), mutated_cluster_specs().map(lambda d: json.dumps(d).encode())))
def test_cluster_spec(scratch, content):
    from rayaccel.cli.cluster_spec import load_cluster_spec

    path = scratch / "cluster.json"
    path.write_bytes(content)
    with bounded(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            spec = load_cluster_spec(path)
        except RayaccelError as e:
            assert len(str(e)) < 2000 and "cluster.json" in str(e)
        else:
            assert len(spec.nodes) == len(spec.places) == len(spec.cliques) >= 1


@fuzz_settings(300, 500)
@given(labels=st.dictionaries(st.sampled_from(["ray.io/gpu-domain", "rayaccel.io/nvlink-clique", "rayaccel.io/net-",
                                               "rayaccel.io/net-block", "rayaccel.io/net-l1", "other"])
                              | st.text(max_size=20).map(lambda s: "rayaccel.io/net-" + s),
                              st.text(max_size=300), max_size=20))
def test_node_labels_to_places(labels):
    """Whatever a node's labels say, its place is a valid NodePlace (bad ones degrade to none)."""
    from rayaccel.placement.domains import NodePlace
    from rayaccel.ray.driver.places import place_of

    with bounded():
        pl = place_of(labels)
    assert isinstance(pl, NodePlace)
    assert pl.domain is None or pl.domain == labels.get("ray.io/gpu-domain")


@fuzz_settings(300, 500)
@given(domain=json_scalars, levels=json_values, net=json_scalars, fab=json_scalars)
def test_node_place_fields(domain, levels, net, fab):
    from rayaccel.placement.domains import NodePlace

    with bounded():
        try:
            NodePlace(domain, levels, net, fab)
        except RequestError as e:
            assert e.field and len(str(e)) < 1000


# ------------------------------------------------- accelerators beyond GPUs (issue 16)
ACCEL_CAPTURES = [p for p in CAPTURES if p.name[:2] in {"66", "67", "68", "69", *map(str, range(88, 100))}]


@st.composite
def mutated_accel_captures(draw):
    """neuron-ls (table and JSON), npu-smi, hl-smi, tpu-info and tpu-env captures, damaged as above."""
    text = draw(st.sampled_from(ACCEL_CAPTURES)).read_text(encoding="utf-8", errors="replace")
    lines = text.splitlines()
    rng = random.Random(draw(st.integers(0, 2**32)))
    for _ in range(draw(st.integers(1, 5))):
        if not lines:
            break
        i = rng.randrange(len(lines))
        op = rng.choice(["drop", "dup", "chars", "cut", "numbers", "json"])
        if op == "drop":
            del lines[i]
        elif op == "dup":
            lines.insert(i, lines[i])
        elif op == "chars":
            s = list(lines[i]) or [" "]
            for _ in range(rng.randint(1, 4)):
                s[rng.randrange(len(s))] = rng.choice("X9 |,-:'\"[]{}nullHCCS\u2502")
            lines[i] = "".join(s)
        elif op == "cut":
            lines = lines[:i]
        elif op == "numbers":
            lines[i] = " ".join(str(rng.choice([10**rng.randint(1, 40), -1, 0, 2**63])) if t.strip(",").isdigit() else t
                                for t in lines[i].split())
        else:
            lines[i] = lines[i].replace(": ", ": " + rng.choice(["null, ", "[], ", "\"x\", ", "1e999, ", "true, "]), 1)
    return "\n".join(lines) + "\n"


@fuzz_settings(200)
@given(mutated_accel_captures())
def test_accelerator_capture_importers(text):
    """Damaged accelerator captures import or fail with a CaptureError that is not an importer bug."""
    from rayaccel.discovery.capture import import_captures

    with bounded():
        try:
            result = import_captures([text])
        except RayaccelError as e:
            assert "internal error" not in str(e), e
            return
        topo = result.topology.validate()
        _rendered(topo)


@fuzz_settings(200)
@given(vendor=st.one_of(st.text(max_size=12), st.sampled_from(["acme", "aws"])),
       resource=st.one_of(st.text(max_size=12), st.sampled_from(["ACME", "GPU", "CPU"])),
       unit=st.one_of(st.text(max_size=6), st.sampled_from(["device", "core", "chip"])),
       env=st.one_of(st.lists(st.text(max_size=10), max_size=3).map(tuple), st.just(("ACME_VISIBLE",)), json_scalars),
       naming=st.one_of(st.text(max_size=12), st.sampled_from(["model", "nvidia", "fixed:X", "fixed:"])),
       counts=st.one_of(st.none(), st.lists(huge_ints, max_size=3).map(tuple), json_scalars))
def test_ray_spec_of_a_plugin(vendor, resource, unit, env, naming, counts):
    """A plugin's RaySpec is built or refused with a PluginError naming the field, nothing else."""
    from rayaccel.discovery.rayspec import RaySpec
    from rayaccel.errors import PluginError

    try:
        spec = RaySpec(vendor=vendor, resource=resource, unit=unit, visible_env=env, accelerator_type=naming,
                       valid_counts=counts)
    except PluginError as e:
        assert "ray_spec." in str(e)
    else:
        assert spec.unit in ("device", "core", "chip") and spec.visible_env


@fuzz_settings(200)
@given(machine=st.sampled_from(["trn1-32xlarge", "tpu-v6e-8", "gaudi2-hls2-8x", "atlas-800-910a-8x"]),
       free=st.one_of(st.lists(huge_ints, max_size=40), st.lists(st.integers(0, 40), max_size=40), json_scalars),
       k=st.one_of(huge_ints, json_scalars), strict=st.booleans())
def test_choose_units_hostile_arguments(machine, free, k, strict):
    """choose_units answers a choice, a Rejection or a RequestError; visible_env likewise."""
    from rayaccel.discovery.rayspec import spec_for
    from rayaccel.placement import Rejection, UnitChoice, choose_units, visible_env

    topo = catalog.load(machine)
    spec = spec_for(topo)
    with bounded():
        try:
            got = choose_units(topo, spec, free, k, strict=strict)
        except RequestError:
            return
        assert isinstance(got, (UnitChoice, Rejection))
        if isinstance(got, UnitChoice):
            assert len(set(got.units)) == len(got.units) == k
            env = visible_env(topo, spec, got.units)
            assert all(v is None or isinstance(v, str) for v in env.values())
