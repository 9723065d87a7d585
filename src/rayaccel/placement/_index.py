"""Per-topology precomputation shared by every placement call.

A :class:`TopoIndex` holds dense matrices (link level, bandwidth, NUMA, NIC
proximity) over device *positions* ``0..n-1`` (devices sorted by index). It is
built once per distinct topology *content*: clusters have many nodes but few
machine types, so nodes of one type share one index and one result cache.

Also per topology, cached on the index: the GPU pool as a position mask
(:func:`pool_mask`, from :func:`.pools.gpu_pool`) and the node's symmetries --
:func:`twin_classes` (devices with identical link rows are interchangeable) and
:func:`canonical` (a representative of a device set under them).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..topology import NEAR_PCIE_CLASSES, NO_LINK_RANK, NodeTopology
from .pools import gpu_pool

_NEAR_NIC = NEAR_PCIE_CLASSES
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


def pool_mask(ix: TopoIndex) -> int:
    """Positions of the GPU pool (:func:`.pools.gpu_pool`): what whole-device requests may use on an idle node. Cached."""
    got = ix.cache.get("pool")
    if got is None:
        pool = set(gpu_pool(ix.topology))
        got = ix.cache["pool"] = sum(1 << i for i, d in enumerate(ix.indices) if d in pool)
    return got


def twin_classes(ix: TopoIndex, with_nic: bool, pcie: bool = True) -> list[int]:
    """Class id per position: devices with identical rows share an id (twins). Cached.

    Twins have the same level, bandwidth and PCIe path to every other device, the same
    NUMA node and (with ``with_nic``) the same NIC proximity, so they are interchangeable
    for the searches (see :mod:`.search`, "Symmetry").

    ``pcie=False``: rows need only equal levels and bandwidths (the PCIe paths may differ),
    for what does not look at the PCIe paths (criteria 1-4).
    """
    ck = ("twins", with_nic, pcie)
    got = ix.cache.get(ck)
    if got is not None:
        return got
    n = ix.n
    lv, bw, pc = ix.level, ix.bw, ix.pcie
    cls = [-1] * n
    members: list[list[int]] = []
    for v in range(n):
        for c, mem in enumerate(members):
            r = mem[0]
            if ix.numa[r] != ix.numa[v] or (with_nic and ix.nic_near[r] != ix.nic_near[v]):
                continue
            ok = True
            for m in mem:
                for w in range(n):
                    if w != m and w != v and (lv[m][w] != lv[v][w] or bw[m][w] != bw[v][w]
                                              or (pcie and pc[m][w] != pc[v][w])):
                        ok = False
                        break
                if not ok:
                    break
            if ok:
                cls[v] = c
                mem.append(v)
                break
        if cls[v] < 0:
            cls[v] = len(members)
            members.append([v])
    ix.cache[ck] = cls
    return cls


def canonical(ix: TopoIndex, rest: int) -> int:
    """A representative of ``rest`` under the twin symmetries (same count per twin class, lowest positions).

    Twins that differ in health, MIG mode or GPU-pool membership are kept apart (they
    are not interchangeable). Criterion 4 (:mod:`._tiebreak`) computes its qualities
    once per class of remainders alike under this.
    """
    got = ix.cache.get("canon")
    if got is None:
        cls = twin_classes(ix, False, pcie=False)  # criterion 4 does not look at the PCIe paths
        mig = {d.index for d in ix.topology.devices if d.mig_mode}
        pool = pool_mask(ix)
        members: dict[tuple, list[int]] = {}
        for p, c in enumerate(cls):
            members.setdefault((c, p in ix.failed, ix.indices[p] in mig, pool >> p & 1), []).append(p)
        singles = 0
        groups = []
        for ps in members.values():
            if len(ps) == 1:
                singles |= 1 << ps[0]
            else:
                cm = sum(1 << p for p in ps)
                prefix = [0]
                for p in ps:
                    prefix.append(prefix[-1] | (1 << p))
                groups.append((cm, prefix))
        got = ix.cache["canon"] = (singles, tuple(groups))
    singles, groups = got
    out = rest & singles
    for cm, prefix in groups:
        out |= prefix[(rest & cm).bit_count()]
    return out
