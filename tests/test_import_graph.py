"""rayaccel's import graph: no circle, and no import that runs up the layer table of docs/ARCHITECTURE.md.

The graph is built with ``ast`` from every ``import`` / ``from ... import`` in the
package's source -- at module top, inside functions and under ``if TYPE_CHECKING:``
alike (an import inside a function hides an edge, it does not remove it). An edge goes
to the most specific module imported: ``from ..discovery import health`` is an edge to
``rayaccel.health``, ``from ..placement import plan`` one to the package
``rayaccel.placement``. A package's ``__init__`` running before its modules is not an
edge. Names fetched lazily by string (``importlib.import_module`` in ``rayaccel.__getattr__``)
are not imports and are not in the graph.

The layer table (docs/ARCHITECTURE.md, "Layers -- imports only go down") is the source
of truth: each row names its packages or top-level modules and what they may import --
packages of rows above it, named one by one (what those may import comes with them) or
as "everything above"; "stdlib only" means nothing of rayaccel. A module whose package
has no row fails the test, so a new package gets its row.
"""

from __future__ import annotations

import ast
import re
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SRC = ROOT / "src"
DOC = ROOT / "docs" / "ARCHITECTURE.md"

#: Circles allowed for now, each the exact set of modules of one strongly connected component,
#: each untangled by whoever owns those files in this round of issue 17. When one is gone this
#: test fails on its stale entry until the entry is removed; no other circle may be added here.
KNOWN_CYCLES: list[frozenset[str]] = []

#: Third-party libraries only some layers may import (the table's word, "the only package
#: that imports ray"; CONVENTIONS: placement is free of vendor libraries and of ray).
#: library -> the rows (by their first package) from which on it may be imported, upward.
LIBRARY_FLOOR = {"ray": "rayaccel.ray._ray_private"}
#: Vendor libraries: only the discovery backends and the doctor's checks talk to the hardware.
VENDOR_LIBRARIES = {"pynvml": ("rayaccel.discovery", "rayaccel.health", "rayaccel.doctor"),
                    "amdsmi": ("rayaccel.discovery", "rayaccel.health", "rayaccel.doctor")}


# ------------------------------------------------------------------ the graph
@dataclass(frozen=True)
class Graph:
    """``edges[a][b]``: the first line of module ``a`` that imports module ``b``; ``files``: module -> path;
    ``external[a]``: top-level names of the non-package libraries ``a`` imports -> first line."""

    edges: dict[str, dict[str, int]]
    files: dict[str, Path]
    external: dict[str, dict[str, int]]


def _modules(src: Path, package: str) -> dict[str, tuple[Path, bool]]:
    out = {}
    for path in sorted((src / package).rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        if is_pkg:
            parts = parts[:-1]
        out[".".join(parts)] = (path, is_pkg)
    return out


def build_graph(src: Path, package: str) -> Graph:
    """The import graph of ``package`` under ``src`` (see the module docstring)."""
    mods = _modules(src, package)
    edges: dict[str, dict[str, int]] = {}
    external: dict[str, dict[str, int]] = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        here = name if is_pkg else name.rpartition(".")[0]
        out = edges.setdefault(name, {})
        ext = external.setdefault(name, {})

        def add(target: str, line: int) -> None:
            if target.split(".")[0] != package:
                ext.setdefault(target.split(".")[0], line)
                return
            while target not in mods:  # `import pkg.a.b` of a name that is not a module: its package
                target = target.rpartition(".")[0]
            if target != name:
                out.setdefault(target, line)

        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = here.split(".")
                    base = base[:len(base) - (node.level - 1)]
                    mod = ".".join(base + ([node.module] if node.module else []))
                else:
                    mod = node.module or ""
                for alias in node.names:
                    sub = f"{mod}.{alias.name}"
                    add(sub if sub in mods else mod, node.lineno)
    return Graph(edges, {m: p for m, (p, _) in mods.items()}, external)


def find_cycles(graph: Graph) -> list[tuple[frozenset[str], list[str]]]:
    """Every circle: (its strongly connected component, one cycle through it as a module path)."""
    edges = graph.edges
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    comps: list[list[str]] = []
    counter = [0]

    def strong(v: str) -> None:  # Tarjan, iterative over the successors of one node at a time
        work = [(v, iter(sorted(edges.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            node, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges.get(w, ())))))
                    break
                if w in on:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    comps.append(comp)

    for v in sorted(edges):
        if v not in index:
            strong(v)
    out = []
    for comp in comps:
        members = frozenset(comp)
        if len(comp) > 1:
            out.append((members, _cycle_in(edges, members)))
    return out


def _cycle_in(edges: dict[str, dict[str, int]], members: frozenset[str]) -> list[str]:
    """A shortest cycle through the smallest module of a strongly connected component."""
    start = min(members)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return [start, *reversed(path[:-1]), start] if len(path) > 1 else [start, v, start]
                if w in members and w not in prev and w != start:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def show_cycle(graph: Graph, path: list[str]) -> str:
    """``a (a.py:12) -> b (b.py:3) -> a``: each hop with the line that imports the next."""
    hops = []
    for a, b in zip(path, path[1:]):
        hops.append(f"{a} (line {graph.edges[a][b]} imports {b})")
    return " -> ".join(hops)


# ------------------------------------------------------------------ the layer table
@dataclass(frozen=True)
class Row:
    units: tuple[str, ...]
    may_import: frozenset[str]
    line: int


def parse_layers(text: str, package: str = "rayaccel") -> list[Row]:
    """The rows of the table under the "## Layers" heading, bottom layer first.

    Raises:
        ValueError: no such table, a row naming no package, a "may import" cell that names
            nothing recognizable, or a name that is not in a row above.
    """
    lines = text.splitlines()
    try:
        start = next(i for i, l in enumerate(lines) if re.match(r"^##\s+Layers\b", l))
    except StopIteration:
        raise ValueError("no '## Layers' section") from None
    rows: list[Row] = []
    header_seen = False
    seen: list[str] = []
    for i in range(start + 1, len(lines)):
        line = lines[i].strip()
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if rows:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not header_seen:
            if [c.lower() for c in cells] != ["package", "holds", "may import"]:
                raise ValueError(f"line {i + 1}: expected the header | package | holds | may import |, got {line}")
            header_seen = True
            continue
        if set(line) <= set("|-: "):
            continue
        if len(cells) != 3:
            raise ValueError(f"line {i + 1}: expected 3 cells, got {len(cells)}")
        units = tuple(_unit(n, package) for n in re.findall(r"`([^`]+)`", cells[0]))
        if not units:
            raise ValueError(f"line {i + 1}: the package cell names no `package`")
        cell = cells[2]
        names = {_unit(n, package) for n in re.findall(r"`([^`]+)`", cell)}
        if "everything above" in cell:
            names |= set(seen)
        elif not names and cell.lower() not in ("stdlib only", "nothing"):
            raise ValueError(f"line {i + 1}: 'may import' must name `packages`, 'everything above' or "
                             f"'stdlib only', got {cell!r}")
        bad = sorted(names - set(seen))
        if bad:
            raise ValueError(f"line {i + 1}: {', '.join(units)} may import {', '.join(bad)}, "
                             f"which is not in a row above it")
        rows.append(Row(units, frozenset(names), i + 1))
        seen.extend(units)
    if not rows:
        raise ValueError("the '## Layers' section has no table")
    return rows


def _unit(name: str, package: str) -> str:
    name = name.strip()
    if name == package or name.startswith(package + "."):
        return name
    return f"{package}.{name}"


def unit_of(module: str, units: set[str], package: str) -> str | None:
    """The table unit a module belongs to (its package or top-level module; ``package`` itself for its ``__init__``)."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        cand = ".".join(parts[:n])
        if cand in units and (cand != package or module == package):
            return cand
    return None


def layer_violations(graph: Graph, rows: list[Row], package: str = "rayaccel") -> list[str]:
    """Every module without a row, and every import that runs up (or sideways) against the table."""
    allowed: dict[str, set[str]] = {}
    row_of: dict[str, Row] = {}
    for row in rows:  # bottom first: what a row may import comes with the rows it names
        reach = set(row.may_import)
        for u in row.may_import:
            reach |= allowed[u]
        for u in row.units:
            allowed[u] = reach | set(row.units)
            row_of[u] = row
    units = set(allowed)
    out = []
    for mod in sorted(graph.edges):
        src = unit_of(mod, units, package)
        if src is None:
            out.append(f"{mod} ({graph.files[mod]}) belongs to no row of the layer table: add its package there")
            continue
        for target, line in sorted(graph.edges[mod].items()):
            dst = unit_of(target, units, package)
            if dst is None or dst == src:
                continue  # a target without a row is reported as a module of its own
            if dst not in allowed[src]:
                out.append(f"{mod} imports {target} (line {line}): {src} may import only "
                           f"{', '.join(sorted(allowed[src] - {src})) or 'nothing of ' + package} "
                           f"(docs/ARCHITECTURE.md line {row_of[src].line})")
    return out


def library_violations(graph: Graph, rows: list[Row], package: str = "rayaccel") -> list[str]:
    """Imports of ``ray`` below its floor and of vendor libraries outside their packages."""
    order = [u for row in rows for u in row.units]
    units = set(order)
    out = []
    for mod, libs in sorted(graph.external.items()):
        unit = unit_of(mod, units, package)
        for lib, line in sorted(libs.items()):
            floor = LIBRARY_FLOOR.get(lib)
            if floor is not None and unit is not None and order.index(unit) < order.index(floor):
                out.append(f"{mod} imports {lib} (line {line}): only {floor} and the rows above it may")
            homes = VENDOR_LIBRARIES.get(lib)
            if homes is not None and not any(mod == h or mod.startswith(h + ".") for h in homes):
                out.append(f"{mod} imports {lib} (line {line}): only {', '.join(homes)} may")
    return out


# ------------------------------------------------------------------ rayaccel
@pytest.fixture(scope="module")
def graph() -> Graph:
    return build_graph(SRC, "rayaccel")


@pytest.fixture(scope="module")
def rows() -> list[Row]:
    return parse_layers(DOC.read_text(encoding="utf-8"))


def test_no_circle_but_the_known_ones(graph):
    cycles = find_cycles(graph)
    new = [f"{len(comp)} modules ({', '.join(sorted(comp))}), e.g. {show_cycle(graph, path)}"
           for comp, path in cycles if comp not in KNOWN_CYCLES]
    assert not new, "import circles:\n  " + "\n  ".join(new)
    stale = [sorted(k) for k in KNOWN_CYCLES if k not in {comp for comp, _ in cycles}]
    assert not stale, f"KNOWN_CYCLES lists circles that are gone, remove them: {stale}"


def test_no_import_runs_up_the_layer_table(graph, rows):
    bad = layer_violations(graph, rows)
    assert not bad, "imports against docs/ARCHITECTURE.md's layer table:\n  " + "\n  ".join(bad)


def test_ray_and_vendor_libraries_stay_in_their_layers(graph, rows):
    bad = library_violations(graph, rows)
    assert not bad, "\n  ".join(bad)


def test_the_table_names_every_package_once(rows):
    units = [u for row in rows for u in row.units]
    assert len(units) == len(set(units)), units
    tops = {p.stem if p.is_file() else p.name for p in (SRC / "rayaccel").iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert {f"rayaccel.{t}" for t in tops} | {"rayaccel"} == {u for u in units if u.count(".") <= 1}


def test_the_ray_layer_is_laid_out_by_process(rows):
    """Every module and package directly under ``rayaccel.ray`` has its own row: a reader knows from the
    path where a line runs (every worker, a node, the driver) and what it may import."""
    units = {u for row in rows for u in row.units}
    ray = SRC / "rayaccel" / "ray"
    kids = {p.stem if p.is_file() else p.name for p in ray.iterdir()
            if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists())}
    assert {f"rayaccel.ray.{k}" for k in kids} == {u for u in units if u.startswith("rayaccel.ray.")}
    for process in ("worker", "node", "driver"):
        assert f"rayaccel.ray.{process}" in units


def test_the_graph_sees_function_level_and_relative_imports(graph):
    e = graph.edges
    assert "rayaccel.testing.fakenvml" in e["rayaccel.health"]  # inside probe_for
    assert "rayaccel.catalog" in e["rayaccel.discovery.load"]  # `from .. import catalog`, inside a function
    assert "rayaccel.memory.share" in e["rayaccel.memory.store"]  # `from . import share as _share`
    assert "rayaccel" in e["rayaccel.cli"]  # `from .. import __version__`
    assert "ray" in graph.external["rayaccel.ray._ray_private"]


# ------------------------------------------------------------------ the test of the test
_DOC = """\
# synthetic

## Layers — imports only go down

| package | holds | may import |
| --- | --- | --- |
| `pkg.base` | the bottom | stdlib only |
| `pkg` | the surface | `base` |
| `pkg.low`, `pkg.peer` | a layer | `base` |
| `pkg.high` | the top | everything above |

## Next
"""


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(textwrap.dedent(text))


def test_the_checker_finds_a_circle_and_an_upward_import(tmp_path):
    _write(tmp_path, {
        "pkg/__init__.py": "from .base import thing\n",
        "pkg/base.py": "thing = 1\n",
        "pkg/high.py": "from . import base\n",
        "pkg/peer.py": "from . import low\n",
        "pkg/low/__init__.py": "",
        "pkg/low/a.py": """\
            from typing import TYPE_CHECKING
            if TYPE_CHECKING:
                from .b import B
            """,
        "pkg/low/b.py": """\
            import ray

            def f():
                from .a import x          # a circle through a function-level import
                from ..high import y      # up the table
                from pkg.base import thing  # down: allowed
            """,
    })
    g = build_graph(tmp_path, "pkg")
    rows = parse_layers(_DOC, "pkg")
    cycles = find_cycles(g)
    assert [comp for comp, _ in cycles] == [frozenset({"pkg.low.a", "pkg.low.b"})]
    assert show_cycle(g, cycles[0][1]) == "pkg.low.a (line 3 imports pkg.low.b) -> pkg.low.b (line 4 imports pkg.low.a)"
    bad = layer_violations(g, rows, "pkg")
    assert bad == ["pkg.low.b imports pkg.high (line 5): pkg.low may import only pkg.base, pkg.peer "
                   "(docs/ARCHITECTURE.md line 9)"]
    # and the same graph with the bad edges gone passes
    _write(tmp_path, {"pkg/low/b.py": "from pkg.base import thing\n", "pkg/low/a.py": "from .b import thing\n"})
    g = build_graph(tmp_path, "pkg")
    assert find_cycles(g) == [] and layer_violations(g, rows, "pkg") == []


def test_the_checker_finds_a_module_without_a_row_and_a_library_below_its_floor(tmp_path, monkeypatch):
    _write(tmp_path, {"pkg/__init__.py": "", "pkg/base.py": "import ray\n", "pkg/stray.py": "from . import base\n"})
    g = build_graph(tmp_path, "pkg")
    rows = parse_layers(_DOC, "pkg")
    bad = layer_violations(g, rows, "pkg")
    assert len(bad) == 1 and bad[0].startswith("pkg.stray (") and "belongs to no row" in bad[0]
    monkeypatch.setitem(LIBRARY_FLOOR, "ray", "pkg.high")
    assert library_violations(g, rows, "pkg") == ["pkg.base imports ray (line 1): only pkg.high and the rows above it may"]


@pytest.mark.parametrize("table,message", [
    ("| package | holds | may import |\n| --- | --- | --- |\n| `pkg.a` | x | `b` |\n", "not in a row above"),
    ("| package | holds | may import |\n| --- | --- | --- |\n| `pkg.a` | x | whatever |\n", "'may import' must name"),
    ("| package | holds | may import |\n| --- | --- | --- |\n| a | x | stdlib only |\n", "names no `package`"),
    ("| pkg | holds |\n| --- | --- |\n", "expected the header"),
    ("no table here\n", "has no table"),
], ids=["a name not above", "an unreadable cell", "no package", "bad header", "no table"])
def test_a_broken_layer_table_is_an_error_naming_the_line(table, message):
    with pytest.raises(ValueError, match=message):
        parse_layers("## Layers\n\n" + table, "pkg")


if __name__ == "__main__":  # print the graph's circles and bad edges without pytest
    g = build_graph(SRC, "rayaccel")
    for comp, path in find_cycles(g):
        print(f"circle of {len(comp)} modules ({', '.join(sorted(comp))}):", show_cycle(g, path),
              "(known)" if comp in KNOWN_CYCLES else "")
    for line in layer_violations(g, parse_layers(DOC.read_text(encoding="utf-8"))):
        print(line)
    sys.exit(0)
