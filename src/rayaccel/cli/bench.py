"""``rayaccel bench placement``: run the placement benchmarks from the source tree."""

from __future__ import annotations

import runpy
import sys
from pathlib import Path

import typer

from ._common import fail

bench_app = typer.Typer(help="Run rayaccel's benchmarks (from a source checkout).", no_args_is_help=True)

_NAMES = {"quality": "placement_quality.py", "churn": "placement_churn.py", "latency": "placement_latency.py"}


def _bench_dir() -> Path | None:
    for base in (Path.cwd(), *Path(__file__).resolve().parents):
        d = base / "benchmarks"
        if (d / "placement_quality.py").is_file():
            return d
    return None


@bench_app.command("placement")
def placement(
    quick: bool = typer.Option(False, "--quick", help="fewer states / jobs / decisions"),
    which: str = typer.Option("quality", "--which", help="quality | churn | latency | all"),
) -> None:
    """Placement benchmarks: rayaccel vs first_free (Ray) vs besteffort (go-gpuallocator) vs random."""
    d = _bench_dir()
    if d is None:
        fail("benchmarks/ not found: run from a rayaccel source checkout (benchmarks are not installed)")
    names = list(_NAMES) if which == "all" else [which]
    for n in names:
        if n not in _NAMES:
            fail(f"--which: unknown benchmark {n!r}; expected one of {', '.join(_NAMES)}, all")
    sys.path.insert(0, str(d))
    for n in names:
        mod = runpy.run_path(str(d / _NAMES[n]))
        mod["main"](["--quick"] if quick else [])


def register(app: typer.Typer) -> None:
    """Add ``rayaccel bench`` to ``app``."""
    app.add_typer(bench_app, name="bench")
