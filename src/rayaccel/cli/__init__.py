"""The ``rayaccel`` command. Thin over the library: each sub-module registers its commands.

Every error a person can cause ends as ONE line on stderr, ``error: <what was wrong; what
would be right>``, and a non-zero exit code; never a traceback:

* a usage error found by the parser (unknown option, missing argument, bad int) exits 2;
* a :class:`~rayaccel.errors.RayaccelError` raised by the library exits 2;
* ``fail(msg)`` (see :mod:`rayaccel.cli._common`) exits 2.

This happens inside the command object itself (:class:`RayaccelGroup`), so the installed
script, :func:`main` and ``typer.testing.CliRunner().invoke(app, ...)`` all behave alike.

Each command imports what it needs inside itself, so ``rayaccel --help`` and the offline
commands never load Ray, matplotlib or the placer they do not use.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import typer
from typer.core import TyperGroup

from ..errors import RayaccelError
from ._common import error_line


def _exception_classes() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(usage-error classes, abort classes) of the parser: typer's own, and click's for older typers."""
    usage: list[type[BaseException]] = [typer.TyperException]
    abort: list[type[BaseException]] = [typer.Abort]
    try:
        import click
    except ImportError:  # typer >= 0.29 vendors its click; the plain package may be absent
        pass
    else:
        usage.append(click.ClickException)
        abort.append(click.exceptions.Abort)
    return tuple(usage), tuple(abort)


_USAGE_ERRORS, _ABORTS = _exception_classes()


class RayaccelGroup(TyperGroup):
    """The top-level command group: turns every expected error into one ``error:`` line."""

    def main(self, args: Sequence[str] | None = None, prog_name: str | None = None,
             complete_var: str | None = None, standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                                standalone_mode=False, **extra)
        try:
            rv = super().main(args=args, prog_name=prog_name, complete_var=complete_var,
                              standalone_mode=False, **extra)
        except _USAGE_ERRORS as e:
            if type(e).__name__ == "NoArgsIsHelpError":  # `rayaccel topo` alone: the help, exit 2
                text = e.format_message()  # type: ignore[attr-defined]
                if text.strip():  # typer's rich help is already printed; click's plain one is here
                    sys.stdout.write(text.rstrip("\n") + "\n")
                sys.exit(getattr(e, "exit_code", 2))
            ctx = getattr(e, "ctx", None)
            hint = f" (see '{ctx.command_path} --help')" if ctx is not None else ""
            error_line(e.format_message() + hint)  # type: ignore[attr-defined]
            sys.exit(getattr(e, "exit_code", 2))
        except _ABORTS:
            error_line("aborted")
            sys.exit(1)
        except RayaccelError as e:
            error_line(str(e))
            sys.exit(2)
        # standalone_mode=False returns the exit code of typer.Exit / ctx.exit(), else the command's value
        sys.exit(rv if isinstance(rv, int) else 0)


app = typer.Typer(
    name="rayaccel",
    cls=RayaccelGroup,
    help="Make Ray accelerator-aware: see how devices are wired, place work on the best-connected ones.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


def _version(value: bool) -> None:
    if value:
        from .. import __version__

        sys.stdout.write(f"rayaccel {__version__}\n")
        raise typer.Exit(0)


@app.callback()
def _root(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print rayaccel's version and exit.")) -> None:
    """Make Ray accelerator-aware: see how devices are wired, place work on the best-connected ones."""


def _register() -> None:
    from . import bench, cluster, ops, path, plan, topo

    topo_app = topo.register(app)
    path.register(topo_app)
    plan.register(app)
    bench.register(app)
    cluster.register(app)
    ops.register(app)


_register()


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``rayaccel`` script: library errors become one clear line, exit code 2."""
    app(args=argv)
