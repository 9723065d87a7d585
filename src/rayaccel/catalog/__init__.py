"""A catalog of real machines, as topologies.

Each machine is one JSON file in this package (``rayaccel.topology/1``), whose
``sources`` name where every fact comes from (real captures, GitHub issues,
vendor documents) and which facts are assumptions. The files are generated
from compact definitions by ``tools/build_catalog.py``; edit those, not the
JSON.

    >>> from rayaccel import catalog
    >>> catalog.names()[:3]
    ['a100-mig', 'a100-pcie-2x-nvbridge', 'dgx-a100']
    >>> catalog.load("dgx1-v100").link(0, 3).label
    'NV2'

MIG GPU-instance profile tables (with placements) are in ``_mig_tables.json``
and available through :func:`mig_table`.
"""

from __future__ import annotations

import difflib
import json
import re
from functools import lru_cache
from importlib import resources
from typing import Any

from ..errors import CatalogError, TopologyError
from ..topology import MigProfile, NodeTopology
from .racks import TRAYS_PER_RACK, rack_of

#: The embedded default machine (used when nothing else is named).
DEFAULT = "dgx1-v100"

_MIG_FILE = "_mig_tables.json"

__all__ = ["DEFAULT", "describe", "load", "mig_models", "mig_table", "names", "rack", "suggest"]


def _files() -> dict[str, Any]:
    root = resources.files(__name__)
    return {p.name[:-5]: p for p in root.iterdir() if p.name.endswith(".json") and not p.name.startswith("_")}


@lru_cache(maxsize=1)
def _index() -> dict[str, Any]:
    return _files()


def names() -> list[str]:
    """Names of all catalog machines, sorted."""
    return sorted(_index())


def suggest(name: str, n: int = 3) -> list[str]:
    """Catalog names close to ``name`` (difflib), best first; may be empty."""
    key = str(name).strip().lower()
    pool = names()
    close = difflib.get_close_matches(key, pool, n=n, cutoff=0.5)
    if not close:
        close = [c for c in pool if key and (key in c or c in key)][:n]
    return close


def _unknown(name: str) -> CatalogError:
    close = suggest(name)
    hint = f"; did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return CatalogError(f"unknown catalog machine {name!r}{hint} (known: {', '.join(names())})")


@lru_cache(maxsize=None)
def _load_raw(name: str) -> tuple[NodeTopology, str]:
    path = _index()[name]
    data = json.loads(path.read_text(encoding="utf-8"))
    try:
        topo = NodeTopology.from_dict(data)
    except TopologyError as e:  # a broken packaged file is a bug; say which one
        raise TopologyError(f"catalog file {name}.json: {e}") from None
    return topo, str(data.get("description") or topo.name or name)


def load(name: str) -> NodeTopology:
    """The topology of catalog machine ``name`` (validated; cached, immutable).

    Raises:
        CatalogError: unknown name; the message lists close names and all names.
    """
    if not isinstance(name, str) or name not in _index():
        raise _unknown(str(name))
    return _load_raw(name)[0]


def describe(name: str) -> str:
    """A one-line description of catalog machine ``name``.

    Raises:
        CatalogError: unknown name.
    """
    if not isinstance(name, str) or name not in _index():
        raise _unknown(str(name))
    return _load_raw(name)[1]


@lru_cache(maxsize=1)
def _mig_tables() -> dict[str, tuple[MigProfile, ...]]:
    data = json.loads(resources.files(__name__).joinpath(_MIG_FILE).read_text(encoding="utf-8"))
    out: dict[str, tuple[MigProfile, ...]] = {}
    for model, rows in data["tables"].items():
        out[model] = tuple(
            MigProfile(
                name=r["name"], id=r["id"], max_instances=r["max_instances"], memory_mib=r["memory_mib"],
                placements=tuple(r["placements"]), slots=r["slots"], sms=r.get("sms"),
            )
            for r in rows
        )
    return out


def mig_models() -> list[str]:
    """GPU models that have a MIG table: ``A100-40GB``, ``A100-80GB``, ``H100-80GB``, ``H200``."""
    return sorted(_mig_tables())


def _mig_key(model_name: str) -> str | None:
    s = re.sub(r"[\s_]+", "-", model_name.upper())
    tables = _mig_tables()
    if s in tables:
        return s
    if "H200" in s:
        return "H200"
    m = re.search(r"(\d+)\s*GB", s.replace("-", " "))
    gb = m.group(1) if m else None
    if "A100" in s:
        return {"40": "A100-40GB", "80": "A100-80GB"}.get(gb or "")
    if "H100" in s and gb == "80":
        return "H100-80GB"
    return None


def mig_table(model_name: str) -> tuple[MigProfile, ...]:
    """The MIG GPU-instance profile table of a GPU model, with placements.

    Args:
        model_name: a table key (``"A100-40GB"``, ``"H100-80GB"``, ``"H200"``) or a
            model as NVML names it (``"NVIDIA A100-SXM4-40GB"``, ``"NVIDIA H100 80GB HBM3"``).

    Returns:
        Profiles in ``nvidia-smi mig -lgip`` order (smallest first); each has
        ``placements`` (start slots out of 8) and ``slots`` (size).

    Raises:
        CatalogError: no table for that model (the message lists the known ones).
    """
    key = _mig_key(str(model_name))
    if key is None:
        raise CatalogError(f"no MIG profile table for {model_name!r} (known: {', '.join(mig_models())})")
    return _mig_tables()[key]


def rack(name: str = "gb200-nvl72-tray", trays: int = TRAYS_PER_RACK, rack: int = 0) -> tuple[NodeTopology, ...]:
    """The ``trays`` compute trays of NVL72 rack number ``rack``, one topology each (see :mod:`.racks`).

    Raises:
        CatalogError: unknown name, or a machine that is not an NVL72 compute tray.
        RequestError: ``trays`` not in 1..18 or ``rack`` not in 0..4095.
    """
    return rack_of(load(name), name, trays, rack)
