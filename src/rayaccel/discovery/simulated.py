"""The ``simulated`` backend: pretend to have the hardware a topology describes.

The source is, in order: the ``source`` given to :class:`SimulatedBackend`, or
the ``RAYACCEL_TOPOLOGY`` environment variable. It may be a catalog name
(``dgx1-v100``), a topology JSON file, a text capture (``nvidia-smi topo -m``
output ...), several capture files joined with ``os.pathsep``, or a
:class:`~rayaccel.topology.NodeTopology` object. Everything is read by
:func:`rayaccel.discovery.load.load_topology`.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

from ..errors import BackendUnavailable
from ..topology import NodeTopology
from ..units import shorten
from .load import load_topology
from .registry import TOPOLOGY_ENV, BackendInfo

_HINT = (
    f"set {TOPOLOGY_ENV} to a catalog name (e.g. dgx1-v100; `rayaccel topo show --topology NAME`), "
    "a topology JSON file, or a capture file"
)

Source = NodeTopology | str | Path | Sequence[str | Path]


class SimulatedBackend:
    """Answers :meth:`discover` from a topology instead of hardware.

    Args:
        source: a NodeTopology, a catalog name, a path, or a list of capture paths;
            None reads ``RAYACCEL_TOPOLOGY`` at each call.
    """

    name = "simulated"

    def __init__(self, source: Source | None = None):
        self._source = source

    def _resolve(self) -> Source | None:
        if self._source is not None:
            return self._source
        value = os.environ.get(TOPOLOGY_ENV, "").strip()
        if not value:
            return None
        parts = [p for p in value.split(os.pathsep) if p]
        if len(parts) > 1 and all(_is_file(Path(p)) for p in parts):
            return parts
        return value

    def available(self) -> BackendInfo:
        """Cheap: checks only that a source is set and, for a path, that it exists."""
        src = self._resolve()
        if src is None:
            return BackendInfo(self.name, False, f"{TOPOLOGY_ENV} is not set", _HINT)
        for p in _paths(src):
            if not _exists(p):
                return BackendInfo(self.name, False, f"{shorten(p, 200, quote=False)}: no such file", _HINT)
        return BackendInfo(self.name, True)

    def discover(self) -> NodeTopology:
        """The topology of the source.

        Raises:
            BackendUnavailable: no source is set.
            CatalogError / TopologyError / CaptureError: the source cannot be read
                (unknown catalog name with close names, bad JSON field, capture line).
        """
        src = self._resolve()
        if src is None:
            raise BackendUnavailable(self.name, f"{TOPOLOGY_ENV} is not set", _HINT)
        if isinstance(src, NodeTopology):
            return src.validate()

        if isinstance(src, (list, tuple)):
            return load_topology([str(p) for p in src])
        return load_topology(str(src))


def _is_file(p: Path) -> bool:
    """``p.is_file()`` that is False (not an OSError) for names too long or not accessible."""
    try:
        return p.is_file()
    except OSError:
        return False


def _exists(p: Path) -> bool:
    try:
        return p.exists()
    except OSError:
        return False


def _paths(src: Source) -> list[Path]:
    """The source's file paths (a bare catalog-like name has none)."""
    if isinstance(src, NodeTopology):
        return []
    if isinstance(src, (list, tuple)):
        return [Path(p) for p in src]
    s = str(src)
    looks_like_path = isinstance(src, Path) or os.sep in s or s.endswith((".json", ".txt", ".log"))
    return [Path(s)] if looks_like_path else []
