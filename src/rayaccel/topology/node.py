""":class:`NodeTopology`: everything rayaccel knows about one node's accelerators.

Pure data, stdlib only. Its invariants are checked by :meth:`NodeTopology.validate`
(:mod:`._checks`); its JSON form is :mod:`.codec`'s.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

from . import codec
from ._checks import check_topology
from .model import NO_LINK_RANK, UNKNOWN_PAIR_BANDWIDTH_GBPS, Device, Link, Nic, Partition, Slice


@dataclass(frozen=True, slots=True)
class NodeTopology:
    """Everything rayaccel knows about one node's accelerators.

    Invariants (checked by :meth:`validate`, which the constructor does not run
    so that importers can build incrementally): device indices are unique;
    links join two distinct known devices with ``a < b``, one per pair.
    """

    devices: tuple[Device, ...] = ()
    links: tuple[Link, ...] = ()
    nics: tuple[Nic, ...] = ()
    hostname: str | None = None
    driver: str | None = None
    name: str | None = None
    sources: tuple[str, ...] = ()
    slice: Slice | None = None
    _link_index: dict = field(default=None, init=False, repr=False, compare=False, hash=False)  # type: ignore[assignment]

    # ----------------------------------------------------------------- queries
    def __len__(self) -> int:
        return len(self.devices)

    def __iter__(self) -> Iterator[Device]:
        return iter(self.devices)

    @property
    def indices(self) -> tuple[int, ...]:
        """Device indices, sorted."""
        return tuple(sorted(d.index for d in self.devices))

    def device(self, index: int) -> Device:
        """The device with ``index``.

        Raises:
            KeyError: no such device.
        """
        for d in self.devices:
            if d.index == index:
                return d
        raise KeyError(f"no device {index} (devices: {list(self.indices)})")

    def _links(self) -> dict[tuple[int, int], Link]:
        idx = self._link_index
        if idx is None:
            idx = {(l.a, l.b): l for l in self.links}
            object.__setattr__(self, "_link_index", idx)
        return idx

    def link(self, a: int, b: int) -> Link | None:
        """The link between devices ``a`` and ``b`` (either order), or None."""
        if a > b:
            a, b = b, a
        return self._links().get((a, b))

    def rank(self, a: int, b: int) -> tuple[int, float]:
        """:attr:`Link.rank` of the pair, or :data:`NO_LINK_RANK` when unknown."""
        l = self.link(a, b)
        return l.rank if l is not None else NO_LINK_RANK

    def bandwidth_gbps(self, a: int, b: int) -> float:
        """Modeled per-direction bandwidth between two devices, GB/s."""
        l = self.link(a, b)
        return l.bandwidth_gbps if l is not None else UNKNOWN_PAIR_BANDWIDTH_GBPS

    def numa_nodes(self) -> tuple[int | None, ...]:
        """Distinct NUMA nodes of the devices, in device order."""
        seen: dict[int | None, None] = {}
        for d in sorted(self.devices, key=lambda d: d.index):
            seen.setdefault(d.numa_node, None)
        return tuple(seen)

    def direct_domains(self) -> list[frozenset[int]]:
        """Connected components of the direct-link (NVLink/xGMI/NeuronLink) graph."""
        parent = {i: i for i in self.indices}

        def find(x: int) -> int:
            while parent[x] != x:
                parent[x] = parent[parent[x]]
                x = parent[x]
            return x

        for l in self.links:
            if l.direct and l.a in parent and l.b in parent:
                parent[find(l.a)] = find(l.b)
        groups: dict[int, set[int]] = {}
        for i in self.indices:
            groups.setdefault(find(i), set()).add(i)
        return sorted((frozenset(g) for g in groups.values()), key=min)

    def partitions(self) -> tuple[Partition, ...]:
        """All MIG instances of the node, by parent device."""
        return tuple(p for d in sorted(self.devices, key=lambda d: d.index) for p in d.partitions)

    def subset(self, indices: Iterable[int], partitions: Iterable[str] | None = None) -> "NodeTopology":
        """The topology restricted to ``indices``: what a node given only those devices manages.

        Pure. Kept devices keep their host indices and every field (NUMA, CPUs, fabric); links
        and NIC paths among them only; NICs stay (a host NIC is still the host's), each with its
        paths to kept devices. ``partitions`` (MIG instance keys or UUIDs), when given, keeps only
        those MIG instances of the kept devices. Indices the topology lacks are ignored; the
        result validates whenever ``self`` does.
        """
        keep = set(indices)
        devices = tuple(d for d in self.devices if d.index in keep)
        if partitions is not None:
            want = set(partitions)
            devices = tuple(replace(d, partitions=tuple(p for p in d.partitions if p.key in want or p.uuid in want))
                            for d in devices)
        return replace(
            self,
            devices=devices,
            links=tuple(l for l in self.links if l.a in keep and l.b in keep),
            nics=tuple(replace(n, paths=tuple(p for p in n.paths if p[0] in keep)) for n in self.nics),
        )

    # ------------------------------------------------------------- validation
    def validate(self) -> "NodeTopology":
        """Check the invariants; return self.

        Raises:
            TopologyError: naming the bad field.
        """
        check_topology(self)
        return self

    # -------------------------------------------------------------------- JSON
    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict tagged with :data:`~rayaccel.topology.codec.SCHEMA`."""
        return codec.to_dict(self)

    def to_json(self, indent: int | None = 2) -> str:
        """Serialize to JSON text (see :meth:`from_json`)."""
        return codec.to_json(self, indent)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "NodeTopology":
        """Build and validate a topology from :meth:`to_dict` output.

        Raises:
            TopologyError: naming the bad field and what was expected.
        """
        return codec.from_dict(data, cls)

    @classmethod
    def from_json(cls, text: str) -> "NodeTopology":
        """Parse JSON text.

        Raises:
            TopologyError: malformed JSON (with line and column) or a bad field.
        """
        return codec.from_json(text, cls)

    @classmethod
    def load(cls, path: str | Path) -> "NodeTopology":
        """Read a topology JSON file.

        Raises:
            TopologyError: unreadable, malformed, or invalid (message names the file).
        """
        return codec.load(path, cls)

    def save(self, path: str | Path) -> None:
        """Write this topology as JSON."""
        codec.save(self, path)
