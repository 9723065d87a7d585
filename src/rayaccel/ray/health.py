"""Device health on a rayaccel node (filled in by the health watcher; see :func:`attach`)."""

from __future__ import annotations

from typing import Any


def attach(agent: Any) -> None:
    """Register the health watcher on a node agent (nothing is watched yet)."""
    return None
