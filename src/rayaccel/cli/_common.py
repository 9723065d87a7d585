"""Shared pieces of the CLI: the console, JSON printing, error handling."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (plain, machine-readable)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def error_line(message: str) -> None:
    """Print ``error: message`` on stderr as one line (newlines in ``message`` become ``; ``).

    ``message`` is printed literally: brackets in it (``[0, 1]``, a path) are not rich markup.
    """
    one = "; ".join(part.strip() for part in str(message).splitlines() if part.strip())
    err_console.print(f"[bold red]error:[/] {escape(one)}", markup=True, soft_wrap=True)


def warn_line(message: str) -> None:
    """Print ``warning: message`` on stderr (``message`` printed literally)."""
    err_console.print(f"[yellow]warning:[/] {escape(str(message))}", markup=True, soft_wrap=True)


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr (one line, see :func:`error_line`) and exit with ``code``."""
    error_line(message)
    raise typer.Exit(code)


def na(value: Any) -> str:
    """Display placeholder for unknown values (the core uses None)."""
    return "N/A" if value is None else str(value)
