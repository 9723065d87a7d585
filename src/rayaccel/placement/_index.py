"""Per-topology precomputation shared by every placement call.

A :class:`TopoIndex` holds dense matrices (link level, bandwidth, NUMA, NIC
proximity) over device *positions* ``0..n-1`` (devices sorted by index). It is
built once per distinct topology *content*: clusters have many nodes but few
machine types, so nodes of one type share one index and one result cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..topology import NO_LINK_RANK, NodeTopology

_NEAR_NIC = ("PIX", "PXB")
#: Score of the PCIe path class under a link, for the tie-break after total bandwidth
#: (criterion 2b): same switch > several switches > same host bridge (root complex) >
#: same socket > across sockets; 0 when the class is unknown (a direct link whose
#: PCIe path was not recorded, or no link record at all).
PCIE_PATH_SCORE = {"PIX": 5, "PXB": 4, "PHB": 3, "NODE": 2, "SYS": 1}
_BY_ID: dict[int, tuple[NodeTopology, "TopoIndex"]] = {}
_BY_CONTENT: dict[tuple, "TopoIndex"] = {}
_MAX_IDS = 20_000


@dataclass(eq=False)
class TopoIndex:
    """Dense views of one topology (see module docstring). ``key`` is a small int, equal for equal content."""

    topology: NodeTopology
    key: int
    indices: tuple[int, ...]
    pos: dict[int, int]
    index_set: frozenset[int]
    level: list[list[int]]
    levels: list[tuple]  # level number -> Link.rank tuple
    bw: list[list[int]]  # milli-GB/s, per direction
    direct: list[list[bool]]
    pcie: list[list[int]]  # PCIE_PATH_SCORE of the pair's PCIe path (0 unknown)
    numa: list[int | None]
    nic_near: list[bool]
    failed: frozenset[int]  # positions
    cache: dict = field(default_factory=dict)  # per-topology precomputation (tables, twin classes): never evicted
    results: dict = field(default_factory=dict)  # (free mask, k, flags) -> search result (bounded, cleared when full)
    rings: dict = field(default_factory=dict)  # device-set mask -> best ring order (bounded, cleared when full)

    @property
    def n(self) -> int:
        return len(self.indices)

    def label(self, i: int, j: int) -> str:
        """``nvidia-smi topo -m`` style label of the pair at positions i, j (``"no link"`` when unknown)."""
        link = self.topology.link(self.indices[i], self.indices[j])
        return link.label if link is not None else "no link"

    def mask_of(self, devices) -> int:
        m = 0
        for d in devices:
            m |= 1 << self.pos[d]
        return m

    def devices_of(self, mask: int) -> tuple[int, ...]:
        out = []
        i = 0
        while mask:
            if mask & 1:
                out.append(self.indices[i])
            mask >>= 1
            i += 1
        return tuple(out)


def index_of(topology: NodeTopology) -> TopoIndex:
    """The (cached) :class:`TopoIndex` of ``topology``."""
    hit = _BY_ID.get(id(topology))
    if hit is not None and hit[0] is topology:
        return hit[1]
    content = (topology.devices, topology.links, topology.nics)
    ix = _BY_CONTENT.get(content)
    if ix is None:
        ix = _build(topology, len(_BY_CONTENT) + 1)
        _BY_CONTENT[content] = ix
    if len(_BY_ID) >= _MAX_IDS:
        _BY_ID.clear()
    _BY_ID[id(topology)] = (topology, ix)
    return ix


def _build(topo: NodeTopology, key: int) -> TopoIndex:
    indices = tuple(sorted(d.index for d in topo.devices))
    pos = {d: i for i, d in enumerate(indices)}
    n = len(indices)
    ranks = {NO_LINK_RANK}
    for l in topo.links:
        ranks.add(l.rank)
    levels = sorted(ranks)
    level_of = {r: i for i, r in enumerate(levels)}
    level = [[0] * n for _ in range(n)]
    bw = [[0] * n for _ in range(n)]
    direct = [[False] * n for _ in range(n)]
    pcie = [[0] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1, n):
            a, b = indices[i], indices[j]
            lvl = level_of[topo.rank(a, b)]
            mbw = int(round(topo.bandwidth_gbps(a, b) * 1000))
            link = topo.link(a, b)
            dr = bool(link is not None and link.direct)
            level[i][j] = level[j][i] = lvl
            bw[i][j] = bw[j][i] = mbw
            direct[i][j] = direct[j][i] = dr
            pcie[i][j] = pcie[j][i] = PCIE_PATH_SCORE.get(link.pcie, 0) if link is not None else 0
    devs = {d.index: d for d in topo.devices}
    numa = [devs[d].numa_node for d in indices]
    near = [False] * n
    for nic in topo.nics:
        if not nic.rdma:
            continue
        for d, cls in nic.paths:
            if cls in _NEAR_NIC and d in pos:
                near[pos[d]] = True
    failed = frozenset(pos[d] for d in indices if devs[d].health == "failed")
    return TopoIndex(topo, key, indices, pos, frozenset(indices), level, levels, bw, direct, pcie, numa, near, failed)
