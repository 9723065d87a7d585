"""``load_topology``: one entry point for every way of naming a topology.

A *source* is, in this order of precedence:

1. a catalog machine name (``"dgx1-v100"``; see :mod:`rayaccel.catalog`);
2. a topology JSON file (``{"schema": "rayaccel.topology/1", ...}``);
3. a text capture file (``nvidia-smi topo -m``, ``nvidia-smi -L``,
   ``nvidia-smi mig -lgip``, ``rocm-smi --showtopo``, ``neuron-ls`` ...), or
   several capture files of one machine, which are combined;
4. capture text itself (a string with a newline in it).

This is exactly what ``rayaccel topo show --topology`` and the ``simulated``
backend (``RAYACCEL_TOPOLOGY``) use.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import warnings
from pathlib import Path
from typing import Sequence, Union

from .. import catalog
from ..errors import CaptureError, CatalogError, TopologyError
from ..topology import NodeTopology
from ..units import shorten
from .capture import import_captures

log = logging.getLogger(__name__)

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]]]

__all__ = ["CaptureWarning", "load_topology", "load_topology_with_warnings"]

#: Largest topology JSON file read, bytes (the biggest catalog machine is ~60 KiB).
MAX_TOPOLOGY_FILE_BYTES = 64 << 20


class CaptureWarning(UserWarning):
    """Something in a capture was skipped or guessed (the topology is still usable)."""


def load_topology(source: Source, *, name: str | None = None) -> NodeTopology:
    """Load a topology from a catalog name, a topology JSON file, or text capture(s).

    Warnings from capture import (skipped rows, guessed fields) are logged on
    this module's logger and issued as :class:`CaptureWarning`; use
    :func:`load_topology_with_warnings` to get them as strings instead.

    Args:
        source: a catalog name, a path, a list of capture paths, or capture text.
        name: a name for a topology built from captures (default: from the capture).

    Returns:
        A validated :class:`NodeTopology`.

    Raises:
        CatalogError: ``source`` is neither a catalog name nor an existing file
            (the message lists close catalog names and what was tried).
        TopologyError: a JSON file that is malformed or invalid (names file and field).
        CaptureError: a capture that cannot be read (names file, line, what was expected).
    """
    topo, warns = load_topology_with_warnings(source, name=name)
    for w in warns:
        log.warning("%s", w)
        warnings.warn(w, CaptureWarning, stacklevel=2)
    return topo


def load_topology_with_warnings(source: Source, *, name: str | None = None) -> tuple[NodeTopology, tuple[str, ...]]:
    """Like :func:`load_topology`, but return ``(topology, warnings)`` instead of emitting them.

    Raises:
        CatalogError, TopologyError, CaptureError: as :func:`load_topology`.
    """
    if name is not None and not isinstance(name, str):
        raise TopologyError(f"expected a str or None, got {type(name).__name__}", "name")
    if isinstance(source, (str, os.PathLike)):
        return _load_one(source, name)
    if isinstance(source, Sequence) and not isinstance(source, (bytes, bytearray)):
        items = list(source)
        if not items:
            raise TopologyError("no topology source given (expected a catalog name, a JSON file or capture files)")
        if len(items) == 1:
            return load_topology_with_warnings(items[0], name=name)
        for k, p in enumerate(items):
            if not isinstance(p, (str, os.PathLike)):
                raise TopologyError(f"source {k}: expected a capture file path or capture text, got {type(p).__name__}")
        missing = [shorten(p, 200, quote=False) for p in items
                   if not _is_text_capture_arg(p) and path_kind(Path(p))[0] != "file"]
        if missing:
            raise CaptureError(f"not a file: {', '.join(missing)} (several sources must all be capture files)", missing[0])
        for p in items:
            if not _is_text_capture_arg(p) and _looks_like_json(Path(p)):
                raise TopologyError(f"{p}: a topology JSON file must be given alone (got {len(items)} sources); "
                                    "only text captures of one machine are combined")
        return _import(items, name)
    raise TopologyError(
        f"cannot load a topology from {type(source).__name__}; expected a catalog name, a file path or a list of capture files"
    )


def path_kind(path: Path) -> tuple[str | None, str]:
    """``("file" | "dir" | "other" | None, why)`` without raising: None is absent or not usable as a path.

    ``why`` says what was found (for messages): ``"tried /abs/path"``, ``"too long for a file name"``,
    ``"cannot access it: Permission denied"``, ``"a character device"``.
    """
    try:
        st = path.stat()
    except ValueError:  # an embedded NUL byte
        return None, "not usable as a file name (it contains a NUL byte)"
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            return None, "too long for a file name"
        if e.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            try:
                where = str(path.absolute())
            except OSError:  # the working directory is gone
                where = str(path)
            return None, f"tried {shorten(where, 200, quote=False)}"
        return None, f"cannot access it: {e.strerror or e}"
    if stat.S_ISDIR(st.st_mode):
        return "dir", "a directory"
    if stat.S_ISREG(st.st_mode):
        return "file", "a file"
    return "other", "not a regular file (a device, a pipe or a socket)"


def _is_text_capture_arg(item: object) -> bool:
    return isinstance(item, str) and "\n" in item


def _looks_like_json(path: Path) -> bool:
    """A ``.json`` file, or one whose first non-blank character is ``{`` (unreadable: False)."""
    if path.suffix.lower() == ".json":
        return True
    try:
        with path.open("rb") as f:
            head = f.read(256)
    except OSError:
        return False
    return head.lstrip().startswith(b"{")


def _load_one(source: str | os.PathLike, name: str | None) -> tuple[NodeTopology, tuple[str, ...]]:
    if isinstance(source, str):
        if "\n" in source:  # capture text itself
            return _import([source], name)
        key = source.strip()
        if not key:
            raise TopologyError(f"empty topology source {source!r}; expected a catalog name (e.g. {catalog.DEFAULT}; "
                                "see `rayaccel topo list`), a topology JSON file or a capture file")
        if key in catalog.names():
            return catalog.load(key), ()
    path = Path(source)
    kind, why = path_kind(path)
    if kind == "dir":
        raise TopologyError(f"{shorten(path, 200, quote=False)}: is a directory; expected a topology JSON file or a text capture")
    if kind == "other":
        raise TopologyError(f"{shorten(path, 200, quote=False)}: {why}; expected a topology JSON file or a text capture")
    if kind is None:
        close = catalog.suggest(str(source)[:100])
        did_you_mean = f"did you mean {', '.join(repr(c) for c in close)}? " if close else ""
        raise CatalogError(
            f"{shorten(str(source), 80)} is not a catalog machine ({did_you_mean}known: {', '.join(catalog.names())}) "
            f"and not a file ({why})"
        )
    try:
        size = path.stat().st_size
    except OSError as e:
        raise TopologyError(f"{path}: cannot read: {e.strerror}") from None
    if size > MAX_TOPOLOGY_FILE_BYTES:
        raise TopologyError(f"{path}: {size} bytes, larger than any topology ({MAX_TOPOLOGY_FILE_BYTES} bytes at most); "
                            "expected a topology JSON file or a text capture")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise TopologyError(f"{path}: not a text file (expected a topology JSON file or a text capture)") from None
    except OSError as e:
        raise TopologyError(f"{path}: cannot read: {e.strerror}") from None
    if path.suffix.lower() == ".json" and not text.strip():
        raise TopologyError(f"{path}: empty file; expected a topology JSON object ({{\"schema\": ...}})")
    if path.suffix.lower() == ".json" or text.lstrip().startswith("{"):
        try:
            return NodeTopology.from_json(text), ()
        except TopologyError as e:
            raise TopologyError(f"{path}: {e}") from None
    return _import([path], name)


def _import(items: list, name: str | None) -> tuple[NodeTopology, tuple[str, ...]]:
    result = import_captures(items, name=name)
    return result.topology.validate(), tuple(result.warnings)
