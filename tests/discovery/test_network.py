"""A node's place in the network (Slurm topology.conf, AWS describe-instance-topology) and its NVLink
domain, as Ray labels: what each file gives, and one error naming file and line for each kind of damage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ray._private.label_utils import validate_label_key, validate_label_value

from rayaccel import catalog
from rayaccel.discovery.network import (
    BLOCK_LABEL, GPU_DOMAIN_LABEL, NVLINK_CLIQUE_LABEL, NVLINK_CLUSTER_LABEL, domain_labels, label_value, node_levels,
    read_network_file,
)
from rayaccel.errors import CaptureError

DATA = Path(__file__).parent.parent / "data" / "network"
TREE, BLOCK, AWS = DATA / "slurm-tree-topology.conf", DATA / "slurm-block-topology.conf", DATA / "aws-describe-instance-topology.json"


def valid_labels(labels: dict[str, str]) -> None:
    for k, v in labels.items():
        assert validate_label_key(k) is None, k
        validate_label_value(v)


@pytest.mark.parametrize("host, want", [
    ("nvl-r1-t05", {"rayaccel.io/net-l1": "leaf-r1", "rayaccel.io/net-l2": "spine0", "rayaccel.io/net-l3": "core"}),
    ("nvl-r0-t00.cluster.local", {"rayaccel.io/net-l1": "leaf-r0", "rayaccel.io/net-l2": "spine0",
                                  "rayaccel.io/net-l3": "core"}),
    ("login2", {"rayaccel.io/net-l1": "leaf-mgmt", "rayaccel.io/net-l2": "core"}),
], ids=["tray", "fqdn", "shallower-branch"])
def test_slurm_tree_levels_lowest_first(host, want):
    got = node_levels(TREE, host)
    assert got == want
    valid_labels(got)


def test_slurm_tree_every_node_expanded_with_zero_padding():
    net = read_network_file(TREE)
    assert net.kind == "slurm-tree" and len(net.levels) == 39
    assert "nvl-r0-t09" in net.levels and "nvl-r0-t9" not in net.levels


def test_slurm_block():
    assert node_levels(BLOCK, "nvl-r1-t17") == {BLOCK_LABEL: "rack1"}
    assert read_network_file(BLOCK).kind == "slurm-block"


def test_aws_levels_bottom_node_first():
    got = node_levels(AWS, "ip-10-0-0-1", instance_id="i-1111111111example")
    assert got == {"rayaccel.io/net-l1": "nn-3333333333example", "rayaccel.io/net-l2": "nn-2222222222example",
                   "rayaccel.io/net-l3": "nn-1111111111example"}
    four = node_levels(AWS, "x", instance_id="i-2222222222example")
    assert len(four) == 4 and four["rayaccel.io/net-l4"] == "nn-1111111111example"
    valid_labels(four)


def test_names_that_are_not_label_values_are_shortened_and_stay_distinct():
    long_a, long_b = "s" * 70 + "a", "s" * 70 + "b"
    for name in (long_a, "leaf/7", "-edge-", "x y"):
        validate_label_value(label_value(name))
    assert label_value(long_a) != label_value(long_b) and label_value("leaf-7") == "leaf-7"


def test_domain_labels_of_a_tray_and_of_nodes_without_a_domain():
    (t,) = catalog.rack("gb200-nvl72-tray", trays=1, rack=4)
    labels = domain_labels(t)
    d = t.devices[0].fabric
    assert labels == {GPU_DOMAIN_LABEL: f"{d.cluster_uuid}.5", NVLINK_CLUSTER_LABEL: d.cluster_uuid,
                      NVLINK_CLIQUE_LABEL: "5"}
    valid_labels(labels)
    assert domain_labels(catalog.load("hgx-h100")) == {} and domain_labels(catalog.load("dgx1-v100")) == {}


# ---------------------------------------------------------------- errors: one line naming file and line
def write(tmp_path: Path, text: str, name: str = "topology.conf") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p


@pytest.mark.parametrize("text, line, words", [
    ("SwitchName=s0 Nodes=n[1-4]\nSwitchName=s1 Nodes=n[5-8] Speed=10\n", 2, "'speed' is not a switch parameter"),
    ("SwitchName=s0 Nodes=n[1-4\n", 1, "'[' without ']'"),
    ("SwitchName=s0 Nodes=n1-4]\n", 1, "']' without '['"),
    ("SwitchName=s0 Nodes=n[4-1]\n", 1, "runs backwards"),
    ("SwitchName=s0 Nodes=n[a-b]\n", 1, "not a number or a range"),
    ("SwitchName=s0 Nodes=n[1-4]\nSwitchName=s0 Nodes=m1\n", 2, "defined twice (first at line 1)"),
    ("SwitchName=s0 Nodes=n1\nSwitchName=top Switches=s[0-1]\n", 2, "lists switch 's1', which no SwitchName="),
    ("SwitchName=s0 Nodes=n1\nSwitchName=a Switches=s0\nSwitchName=b Switches=s0\n", 3, "has two parents"),
    ("SwitchName=s0 Nodes=n1\nSwitchName=s1 Nodes=n1\n", 2, "a node has one leaf switch"),
    ("SwitchName=a Switches=b\nSwitchName=b Switches=a\n", 1, "cycle"),
    ("SwitchName=s0\n", 1, "has no Switches= or Nodes="),
    ("SwitchName=s0 Nodes=n1 LinkSpeed=fast\n", 1, "LinkSpeed='fast': expected an integer"),
    ("Nodes=n1 SwitchName=s0\n", 1, "must start with SwitchName=, BlockName= or BlockSizes="),
    ("SwitchName=s0 Nodes=n1 garbage\n", 1, "expected Key=Value pairs"),
    ("SwitchName=s[0-1] Nodes=n1\n", 1, "must be one name"),
    ("BlockName=b0 Nodes=n[1-4]\nSwitchName=s0 Nodes=n9\n", 1, "not both"),
    ("BlockName=b0 Nodes=n[1-4]\nBlockName=b1 Nodes=n4\n", 2, "is in block 'b0'"),
    ("BlockName=b0 Nodes=n1\nBlockSizes=4,x\n", 2, "BlockSizes=<n>"),
    ("BlockName=b0 Switches=s1\n", 1, "'switches' is not a block parameter"),
    ("SwitchName=s0 Nodes=n[1-9999999]\n", 1, "longer than"),
], ids=["unknown-key", "open-bracket", "close-bracket", "backwards", "not-number", "twice", "undefined-child",
        "two-parents", "two-leaves", "cycle", "empty", "linkspeed", "first-key", "not-kv", "bracket-name", "both",
        "two-blocks", "blocksizes", "block-switches", "huge-range"])
def test_malformed_slurm_file(tmp_path, text, line, words):
    p = write(tmp_path, text)
    with pytest.raises(CaptureError) as e:
        node_levels(p, "n1")
    msg = str(e.value)
    assert words in msg and e.value.line == line and msg.startswith(f"{p}, line {line}: ")
    assert "\n" not in msg


@pytest.mark.parametrize("doc, words", [
    ('{"Instances": [', "not valid JSON"),
    ('{"Reservations": []}', 'expected a JSON object with an "Instances" list'),
    ('{"Instances": [7]}', "Instances[0]: expected an object"),
    ('{"Instances": [{"NetworkNodes": ["nn-1"]}]}', "Instances[0].InstanceId"),
    ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": []}]}', "Instances[0].NetworkNodes: expected 1-64"),
    ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": ["nn-1", 2]}]}', "Instances[0].NetworkNodes"),
    ('{"Instances": [{"InstanceId": "i-1", "NetworkNodes": ["a"]}, {"InstanceId": "i-1", "NetworkNodes": ["a"]}]}',
     "listed twice"),
], ids=["syntax", "no-instances", "not-object", "no-id", "no-nodes", "bad-node", "twice"])
def test_malformed_aws_file(tmp_path, doc, words):
    p = write(tmp_path, doc, "topo.json")
    with pytest.raises(CaptureError) as e:
        node_levels(p, "h", instance_id="i-1")
    assert words in str(e.value) and str(e.value).startswith(str(p))


def test_aws_error_names_the_line_of_the_instance(tmp_path):
    doc = json.loads(AWS.read_text())
    doc["Instances"][1]["NetworkNodes"] = "nn-5555555555example"
    text = json.dumps(doc, indent=4)
    p = write(tmp_path, text, "topo.json")
    with pytest.raises(CaptureError) as e:
        node_levels(p, "h", instance_id="i-2222222222example")
    want = next(k for k, ln in enumerate(text.splitlines(), start=1) if '"i-2222222222example"' in ln)
    assert e.value.line == want and "Instances[1].NetworkNodes" in str(e.value)


def test_node_not_in_the_file_and_aws_without_instance_id():
    with pytest.raises(CaptureError, match=r"host 'gpu-99' is not in this file \(it names head01, login1, login2, "
                                           r"\.\.\. \(39 in all\)\)"):
        node_levels(TREE, "gpu-99")
    with pytest.raises(CaptureError, match="give the node's EC2 instance id"):
        node_levels(AWS, "ip-10-0-0-1")
    with pytest.raises(CaptureError, match="instance 'i-9' is not in this file"):
        node_levels(AWS, "h", instance_id="i-9")


@pytest.mark.parametrize("content, words", [(b"\x00\x01", "not a text file"), (b"", "no SwitchName= or BlockName=")])
def test_not_a_network_file(tmp_path, content, words):
    p = tmp_path / "f"
    p.write_bytes(content)
    with pytest.raises(CaptureError, match=words):
        read_network_file(p)


def test_unreadable_paths(tmp_path):
    with pytest.raises(CaptureError, match="is a directory"):
        read_network_file(tmp_path)
    with pytest.raises(CaptureError, match="cannot read"):
        read_network_file(tmp_path / "missing.conf")
