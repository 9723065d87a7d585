"""Shared helpers of the placement benchmarks: machines from the catalog and the captures."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))


def catalog_machines() -> tuple[list, str]:
    """[(name, topology)] from rayaccel.catalog, or the test machines when the catalog is absent; plus a note."""
    try:
        from rayaccel import catalog

        out = [(n, catalog.load(n)) for n in catalog.names()]
        return out, "catalog"
    except Exception as e:  # noqa: BLE001 - optional part written concurrently; say so in the table
        sys.path.insert(0, str(ROOT / "tests"))
        from test_placement_machines import MACHINES

        return [(n, b()) for n, b in MACHINES.items()], f"catalog unavailable ({type(e).__name__}: {e}); test machines used"


def capture_machines() -> tuple[list, str]:
    """[(file name, topology)] for every capture in tests/data/captures that imports, plus a note."""
    d = ROOT / "tests" / "data" / "captures"
    try:
        from rayaccel.discovery.capture import import_captures
    except ImportError as e:
        return [], f"capture importer unavailable ({e})"
    from rayaccel.errors import RayaccelError

    out, failed = [], 0
    for p in sorted(d.glob("*.txt")) if d.is_dir() else []:
        try:
            topo = import_captures([p]).topology
        except RayaccelError:
            failed += 1
            continue
        if len(topo.devices) >= 2 and topo.links:
            out.append((p.stem[:34], topo))
    return out, f"{len(out)} captures with >= 2 linked devices imported ({failed} did not import)"
