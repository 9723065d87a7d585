"""The ``rayaccel`` command. Thin over the library: each sub-module registers its commands."""

from __future__ import annotations

import sys

import typer

from ..errors import RayaccelError
from ._common import err_console

app = typer.Typer(
    name="rayaccel",
    help="Make Ray accelerator-aware: see how devices are wired, place work on the best-connected ones.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _register() -> None:
    from . import bench, cluster, path, plan, topo

    topo_app = topo.register(app)
    path.register(topo_app)
    plan.register(app)
    bench.register(app)
    cluster.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``rayaccel`` script: library errors become one clear line, exit code 2."""
    try:
        app(args=argv, standalone_mode=True)
    except RayaccelError as e:
        err_console.print(f"[bold red]error:[/] {e}", soft_wrap=True)
        sys.exit(2)
