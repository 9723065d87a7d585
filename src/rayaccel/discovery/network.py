"""A node's place in the network, and its NVLink domain, as Ray labels.

Two sources of network levels, detected from the file's content:

* a Slurm ``topology.conf``: the tree plugin (``SwitchName=s0 Nodes=node[01-18]``,
  ``SwitchName=s2 Switches=s[0-1]``, optional ``LinkSpeed=``) or the block plugin
  (``BlockName=b1 Nodes=node[01-18]``, ``BlockSizes=...``); names in Slurm's hostlist
  expressions (``tux[0-3,12,18-20]``); ``#`` starts a comment; parameter names are case
  insensitive (Slurm's topology.conf(5));
* AWS ``aws ec2 describe-instance-topology`` JSON: ``Instances[].InstanceId`` and
  ``NetworkNodes``, the node set from the top layer down to the node the instance connects to
  (3 or 4 layers; AWS EC2 user guide, "How Amazon EC2 topology works").

The labels (valid Ray label keys and values, so ``topology_strategy`` and label selectors can use them):

====================================  ==============================================================
``rayaccel.io/net-l1``                the lowest level: the leaf switch (Slurm) or the network node
                                      the instance connects to (AWS, the last of ``NetworkNodes``)
``rayaccel.io/net-l2``, ``-l3``, ...  each level above, up to the top
``rayaccel.io/net-block``             the Slurm block (block plugin)
``ray.io/gpu-domain``                 the NVLink domain ``<cluster UUID>.<clique>`` (:func:`domain_labels`)
``rayaccel.io/nvlink-cluster``        the fabric cluster UUID (one NVL72 rack)
``rayaccel.io/nvlink-clique``         the fabric clique id (an NVLink partition of it)
====================================  ==============================================================

A gang packs into the lowest common level with, e.g., ``topology_strategy={"rayaccel.io/net-l1":
"STRICT_PACK", "ray.io/node-id": "STRICT_SPREAD"}``. A name that is not a valid Ray label value
(longer than 63 characters, or other characters than ``[A-Za-z0-9._-]``) is shortened to a valid
value with a hash of the name, so distinct names stay distinct.

Every malformed file is one :class:`~rayaccel.errors.CaptureError` naming the file, the line
and what was expected; the whole file is read before any label is returned.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import CaptureError
from ..topology import NodeTopology, nvlink_domain

LEVEL_LABEL = "rayaccel.io/net-l{}"
BLOCK_LABEL = "rayaccel.io/net-block"
GPU_DOMAIN_LABEL = "ray.io/gpu-domain"
NVLINK_CLUSTER_LABEL = "rayaccel.io/nvlink-cluster"
NVLINK_CLIQUE_LABEL = "rayaccel.io/nvlink-clique"
#: Largest file read, bytes.
MAX_BYTES = 16 << 20
#: Most names one hostlist expression, or one file, may expand to.
MAX_NAMES = 1 << 18
#: Deepest switch tree (levels) accepted.
MAX_LEVELS = 64

# Ray's label value syntax (ray._private.label_utils.LABEL_REGEX, Kubernetes' rule): <= 63 characters.
_LABEL_VALUE = re.compile(r"^[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9_.\-\[\],]+$")
_TREE_KEYS = ("switchname", "switches", "nodes", "linkspeed")
_BLOCK_KEYS = ("blockname", "nodes")

__all__ = ["BLOCK_LABEL", "GPU_DOMAIN_LABEL", "LEVEL_LABEL", "NVLINK_CLIQUE_LABEL", "NVLINK_CLUSTER_LABEL",
           "NetworkFile", "domain_labels", "label_value", "node_levels", "read_network_file"]


@dataclass(frozen=True, slots=True)
class NetworkFile:
    """A parsed network-topology file.

    Attributes:
        path: the file. kind: ``"slurm-tree"``, ``"slurm-block"`` or ``"aws"``.
        levels: node name (hostname, or AWS instance id) -> its level names, lowest first.
        blocks: node name -> its Slurm block (block plugin).
    """

    path: str
    kind: str
    levels: dict[str, tuple[str, ...]] = field(default_factory=dict)
    blocks: dict[str, str] = field(default_factory=dict)

    def labels(self, node: str) -> dict[str, str] | None:
        """The labels of ``node`` (exact name), or None when the file does not name it."""
        if node in self.levels:
            return {LEVEL_LABEL.format(k): label_value(name) for k, name in enumerate(self.levels[node], start=1)}
        if node in self.blocks:
            return {BLOCK_LABEL: label_value(self.blocks[node])}
        return None


def node_levels(path: str | Path, hostname: str, instance_id: str | None = None) -> dict[str, str]:
    """The network-level labels of one node, from a Slurm ``topology.conf`` or an AWS
    ``describe-instance-topology`` JSON file (see the module docstring).

    Args:
        path: the file. hostname: the node's name as Slurm knows it (the full name, or the part
            before the first dot). instance_id: the node's EC2 instance id (AWS files need it).

    Raises:
        CaptureError: the file cannot be read or is malformed (names the file, the line and what was
            expected), or it does not name this node.
    """
    net = read_network_file(path)
    if net.kind == "aws":
        if not instance_id:
            raise CaptureError("an AWS instance-topology file names instances, not hosts: give the node's EC2 "
                               "instance id (--instance-id i-0123456789abcdef0)", net.path)
        keys = [instance_id]
    else:
        if not isinstance(hostname, str) or not hostname:
            raise CaptureError("no hostname to look up in this Slurm topology file", net.path)
        keys = [hostname, hostname.split(".", 1)[0]]
    for key in keys:
        labels = net.labels(key)
        if labels is not None:
            return labels
    names = sorted(net.levels or net.blocks)
    shown = ", ".join(names[:3]) + (f", ... ({len(names)} in all)" if len(names) > 3 else "")
    what = f"instance {instance_id!r}" if net.kind == "aws" else f"host {hostname!r}"
    raise CaptureError(f"{what} is not in this file (it names {shown or 'no node'})", net.path)


def domain_labels(topology: NodeTopology) -> dict[str, str]:
    """``ray.io/gpu-domain`` (``<cluster UUID>.<clique>``), ``rayaccel.io/nvlink-cluster`` and
    ``rayaccel.io/nvlink-clique`` of a node whose GPUs share one NVLink domain; ``{}`` otherwise
    (:func:`~rayaccel.topology.nvlink_domain_reason` says why)."""
    d = nvlink_domain(topology)
    if d is None:
        return {}
    return {GPU_DOMAIN_LABEL: d.name, NVLINK_CLUSTER_LABEL: d.cluster_uuid, NVLINK_CLIQUE_LABEL: str(d.clique_id)}


def label_value(name: str) -> str:
    """``name`` when it is a valid Ray label value, else a valid one that keeps it distinct: its
    characters outside ``[A-Za-z0-9._-]`` replaced, cut to 54, and ``-`` plus 8 hex of its SHA-1."""
    if _LABEL_VALUE.match(name):
        return name
    digest = hashlib.sha1(name.encode()).hexdigest()[:8]
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", name)[:54].strip("-._")
    return f"{stem}-{digest}" if stem else digest


# ---------------------------------------------------------------- reading
def read_network_file(path: str | Path) -> NetworkFile:
    """Parse a Slurm ``topology.conf`` or an AWS ``describe-instance-topology`` JSON file.

    Raises:
        CaptureError: unreadable, not text, too large, or malformed (names the line and what was expected).
    """
    p = str(path)
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise CaptureError("is a directory; expected a Slurm topology.conf or an AWS instance-topology JSON file",
                           p) from None
    except OSError as e:
        raise CaptureError(f"cannot read: {e.strerror or e}", p) from None
    if len(data) > MAX_BYTES:
        raise CaptureError(f"file too large ({len(data)} bytes; at most {MAX_BYTES})", p)
    if b"\x00" in data:
        raise CaptureError("not a text file (NUL bytes); expected a Slurm topology.conf or an AWS instance-topology "
                           "JSON file", p)
    text = data.decode("utf-8", errors="replace")
    if text.lstrip().startswith(("{", "[")):
        return _aws(text, p)
    return _slurm(text, p)


def _aws(text: str, path: str) -> NetworkFile:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CaptureError(f"not valid JSON: {e.msg} at column {e.colno}; expected the output of "
                           "`aws ec2 describe-instance-topology`", path, e.lineno) from None
    except (RecursionError, ValueError) as e:
        raise CaptureError(f"not valid JSON ({type(e).__name__}); expected the output of "
                           "`aws ec2 describe-instance-topology`", path) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("Instances"), list):
        raise CaptureError('expected a JSON object with an "Instances" list (the output of '
                           "`aws ec2 describe-instance-topology`)", path, 1)
    levels: dict[str, tuple[str, ...]] = {}
    for i, inst in enumerate(doc["Instances"]):
        where = f"Instances[{i}]"
        line = _line_of(text, inst.get("InstanceId")) if isinstance(inst, dict) else None
        if not isinstance(inst, dict):
            raise CaptureError(f"{where}: expected an object with InstanceId and NetworkNodes", path)
        iid, nodes = inst.get("InstanceId"), inst.get("NetworkNodes")
        if not isinstance(iid, str) or not iid.strip():
            raise CaptureError(f"{where}.InstanceId: expected the instance id (a string such as "
                               "\"i-0123456789abcdef0\")", path, line)
        if (not isinstance(nodes, list) or not nodes or len(nodes) > MAX_LEVELS
                or not all(isinstance(n, str) and n.strip() for n in nodes)):
            raise CaptureError(f"{where}.NetworkNodes: expected 1-{MAX_LEVELS} network node ids, top layer first "
                               "(strings such as \"nn-0123456789abcdef0\")", path, line)
        if iid in levels:
            raise CaptureError(f"{where}: instance {iid!r} is listed twice", path, line)
        levels[iid] = tuple(reversed([n.strip() for n in nodes]))  # lowest (the instance's own node) first
    return NetworkFile(path, "aws", levels=levels)


def _line_of(text: str, value: object) -> int | None:
    if not isinstance(value, str):
        return None
    at = text.find(json.dumps(value))
    return text.count("\n", 0, at) + 1 if at >= 0 else None


@dataclass
class _Entry:
    name: str
    line: int
    switches: list[str] = field(default_factory=list)
    nodes: list[str] = field(default_factory=list)


def _slurm(text: str, path: str) -> NetworkFile:
    switches: dict[str, _Entry] = {}
    blocks: dict[str, _Entry] = {}
    total = 0
    for no, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        params: dict[str, str] = {}
        for token in line.split():
            key, eq, value = token.partition("=")
            if not eq or not key:
                raise CaptureError(f"expected Key=Value pairs (SwitchName=, Switches=, Nodes=, LinkSpeed=, BlockName=, "
                                   f"BlockSizes=), got {token[:60]!r}", path, no)
            k = key.lower()
            if k in params:
                raise CaptureError(f"{key} given twice on one line", path, no)
            params[k] = value
        first = next(iter(params))
        if first == "blocksizes":
            if set(params) != {"blocksizes"} or not re.fullmatch(r"\d+(,\d+)*", params["blocksizes"]):
                raise CaptureError("expected BlockSizes=<n>[,<n>...] alone on its line", path, no)
            continue
        if first not in ("switchname", "blockname"):
            raise CaptureError(f"a line must start with SwitchName=, BlockName= or BlockSizes=, got {first!r}", path, no)
        kind, allowed, table = ((switches, _TREE_KEYS, "switch") if first == "switchname"
                                else (blocks, _BLOCK_KEYS, "block"))
        unknown = [k for k in params if k not in allowed]
        if unknown:
            names = ", ".join(a.capitalize() + "=" for a in allowed)
            raise CaptureError(f"{unknown[0]!r} is not a {table} parameter (expected {names})", path, no)
        name = params[first]
        if not name or not _NAME.match(name) or "[" in name or "," in name:
            raise CaptureError(f"{table} name {name[:60]!r} must be one name of [A-Za-z0-9_.-]", path, no)
        if name in kind:
            raise CaptureError(f"{table} {name!r} defined twice (first at line {kind[name].line})", path, no)
        if "linkspeed" in params and not params["linkspeed"].isdigit():
            raise CaptureError(f"LinkSpeed={params['linkspeed'][:30]!r}: expected an integer", path, no)
        entry = _Entry(name, no)
        for key in ("switches", "nodes"):
            if key in params:
                names = _hostlist(params[key], path, no)
                total += len(names)
                if total > MAX_NAMES:
                    raise CaptureError(f"the file names more than {MAX_NAMES} switches and nodes", path, no)
                getattr(entry, key).extend(names)
        if not entry.switches and not entry.nodes:
            raise CaptureError(f"{table} {name!r} has no {'Switches= or ' if table == 'switch' else ''}Nodes=",
                               path, no)
        kind[name] = entry
    if switches and blocks:
        line = min(e.line for e in blocks.values())
        raise CaptureError("a topology.conf is for the tree plugin (SwitchName=) or the block plugin (BlockName=), "
                           "not both", path, line)
    if blocks:
        return NetworkFile(path, "slurm-block", blocks=_block_members(blocks, path))
    if not switches:
        raise CaptureError("no SwitchName= or BlockName= line (expected a Slurm topology.conf or an AWS "
                           "instance-topology JSON file)", path)
    return NetworkFile(path, "slurm-tree", levels=_tree_levels(switches, path))


def _block_members(blocks: dict[str, _Entry], path: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for b in blocks.values():
        for n in b.nodes:
            if n in out:
                raise CaptureError(f"node {n!r} is in block {out[n]!r} (line {blocks[out[n]].line}) and in "
                                   f"{b.name!r}", path, b.line)
            out[n] = b.name
    return out


def _tree_levels(switches: dict[str, _Entry], path: str) -> dict[str, tuple[str, ...]]:
    parent: dict[str, str] = {}
    for s in switches.values():
        for child in s.switches:
            if child not in switches:
                raise CaptureError(f"switch {s.name!r} lists switch {child!r}, which no SwitchName= line defines",
                                   path, s.line)
            if child in parent:
                raise CaptureError(f"switch {child!r} has two parents ({parent[child]!r} at line "
                                   f"{switches[parent[child]].line} and {s.name!r}); the levels of a tree need one",
                                   path, s.line)
            parent[child] = s.name
    leaf_of: dict[str, str] = {}
    for s in switches.values():
        for n in s.nodes:
            if n in leaf_of:
                raise CaptureError(f"node {n!r} hangs off switch {leaf_of[n]!r} (line {switches[leaf_of[n]].line}) "
                                   f"and {s.name!r}; a node has one leaf switch", path, s.line)
            leaf_of[n] = s.name
    chains: dict[str, tuple[str, ...]] = {}
    for s in switches:
        chain = [s]
        while chain[-1] in parent:
            chain.append(parent[chain[-1]])
            if len(chain) > MAX_LEVELS or chain[-1] == s:
                raise CaptureError(f"switch {s!r} is in a cycle of Switches= (or a tree deeper than {MAX_LEVELS})",
                                   path, switches[s].line)
        chains[s] = tuple(chain)
    return {n: chains[s] for n, s in leaf_of.items()}


def _hostlist(expr: str, path: str, line: int) -> list[str]:
    """Slurm's hostlist expression -> names: ``tux[0-3,12,18-20]``, ``a[1-2]b[01-02]``, ``n1,n[3-4]``."""
    if not expr or not _NAME.match(expr):
        raise CaptureError(f"{expr[:60]!r} is not a hostlist (expected names such as node[01-18],gpu07)", path, line)
    items, depth, start = [], 0, 0
    for i, ch in enumerate(expr):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise CaptureError(f"{expr[:60]!r}: ']' without '['", path, line)
        elif ch == "," and depth == 0:
            items.append(expr[start:i])
            start = i + 1
    if depth:
        raise CaptureError(f"{expr[:60]!r}: '[' without ']'", path, line)
    items.append(expr[start:])
    out: list[str] = []
    for item in items:
        if not item:
            raise CaptureError(f"{expr[:60]!r}: an empty name between commas", path, line)
        out.extend(_expand(item, expr, path, line))
        if len(out) > MAX_NAMES:
            raise CaptureError(f"{expr[:60]!r} expands to more than {MAX_NAMES} names", path, line)
    return out


_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _expand(item: str, expr: str, path: str, line: int) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", item)
    if m is None:
        if "[" in item or "]" in item:
            raise CaptureError(f"{expr[:60]!r}: nested brackets", path, line)
        return [item]
    head, tail = item[:m.start()], item[m.end():]
    parts: list[str] = []
    for piece in m.group(1).split(","):
        r = _RANGE.match(piece)
        if r is None:
            raise CaptureError(f"{expr[:60]!r}: {piece[:20]!r} is not a number or a range such as 01-18", path, line)
        lo, hi = r.group(1), r.group(2) or r.group(1)
        if int(hi) < int(lo):
            raise CaptureError(f"{expr[:60]!r}: range {piece!r} runs backwards", path, line)
        if int(hi) - int(lo) >= MAX_NAMES:
            raise CaptureError(f"{expr[:60]!r}: range {piece[:30]!r} is longer than {MAX_NAMES} names", path, line)
        width = len(lo) if lo.startswith("0") else 0
        parts.extend(f"{head}{k:0{width}d}" for k in range(int(lo), int(hi) + 1))
        if len(parts) > MAX_NAMES:
            raise CaptureError(f"{expr[:60]!r} expands to more than {MAX_NAMES} names", path, line)
    out: list[str] = []
    for p in parts:
        out.extend(_expand(p + tail, expr, path, line))
        if len(out) > MAX_NAMES:
            raise CaptureError(f"{expr[:60]!r} expands to more than {MAX_NAMES} names", path, line)
    return out
