"""Shared pieces of the CLI: the console, JSON printing, error handling."""

from __future__ import annotations

import json
import sys
from typing import Any, NoReturn

import typer
from rich.console import Console

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)


def print_json(obj: Any) -> None:
    """Print ``obj`` as JSON on stdout (plain, machine-readable)."""
    sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")


def fail(message: str, code: int = 2) -> NoReturn:
    """Print ``error: message`` on stderr and exit with ``code``."""
    err_console.print(f"[bold red]error:[/] {message}", markup=True, soft_wrap=True)
    raise typer.Exit(code)


def na(value: Any) -> str:
    """Display placeholder for unknown values (the core uses None)."""
    return "N/A" if value is None else str(value)
