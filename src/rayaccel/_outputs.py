"""Checks of output paths, run before any work: a picture, a results file, an output folder.

Used by :mod:`rayaccel.viz` (and re-exported there as :func:`rayaccel.viz.check_output_dir`
and :func:`rayaccel.viz.check_output_file`), the CLI and the demo. Nothing is created by a
check; each failure is an :class:`~rayaccel.errors.OutputPathError` naming the path, what is
in the way and what would work.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Sequence

from .errors import OutputPathError, RayaccelError

#: Supported picture suffixes.
SUFFIXES = (".png", ".svg")


class VizError(RayaccelError, ValueError):
    """A picture cannot be drawn as asked (bad path suffix, bad assignment)."""


def _kind(st: os.stat_result) -> str:
    if stat.S_ISDIR(st.st_mode):
        return "a folder"
    if stat.S_ISREG(st.st_mode):
        return "a file"
    if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
        return "a device"
    return "not a file or folder"


def _writable_folder(folder: Path, target: Path, what: str) -> None:
    """``folder`` (the nearest existing ancestor of ``target``) is a folder this process may write in."""
    try:
        st = folder.stat()
    except OSError as e:
        raise OutputPathError(f"{target}: cannot write the {what} here: {folder}: {e.strerror or e}", target) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{target}: cannot write the {what} here: {folder} is {_kind(st)}, not a folder; "
                              "expected a path in a folder you can write to", target)
    if not os.access(folder, os.W_OK | os.X_OK):
        raise OutputPathError(f"{target}: cannot write the {what} here: no permission to write in {folder}; "
                              "expected a path in a folder you can write to", target)


def _existing_ancestor(p: Path) -> Path:
    """The nearest ancestor of ``p`` (``p`` itself included) that exists, or that stat cannot pass."""
    probe = p
    while True:
        try:
            probe.stat()
            return probe
        except (FileNotFoundError, NotADirectoryError):
            if probe.parent == probe:
                return probe
            probe = probe.parent
        except OSError:  # too long, no permission: let the caller report it
            return probe


def check_output_dir(path: str | Path, what: str = "output") -> Path:
    """Check, before any work, that ``path`` is a folder (or can be created as one) this process can write in.

    Creates nothing. A path that exists must be a folder; otherwise its nearest existing
    ancestor must be a writable folder (so ``/dev/null/x`` fails here, naming ``/dev/null``).

    Args:
        path: the output folder. what: what will be written there, for messages.

    Returns:
        ``path`` as a Path.

    Raises:
        OutputPathError: naming the path, what is in the way and what would work.
    """
    p = Path(path)
    if not str(path).strip():
        raise OutputPathError(f"empty output folder name; expected a folder to write the {what} to", path)
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        _writable_folder(_existing_ancestor(p), p, what)
        return p
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:
            raise OutputPathError(f"{str(p)[:80]}…: cannot write the {what} here: the name is too long", path) from None
        raise OutputPathError(f"{p}: cannot write the {what} here: {e.strerror or e}", path) from None
    if not stat.S_ISDIR(st.st_mode):
        raise OutputPathError(f"{p}: is {_kind(st)}, not a folder; expected a folder for the {what}", path)
    _writable_folder(p, p, what)
    return p


def check_output_file(path: str | Path, what: str = "picture", suffixes: Sequence[str] | None = SUFFIXES) -> Path:
    """Check, before any work, that a file can be written at ``path`` (a picture by default).

    Args:
        path: the output file. what: what it is, for messages.
        suffixes: allowed suffixes (lower case, with the dot), or None for any.

    Returns:
        ``path`` as a Path.

    Raises:
        VizError: a suffix not in ``suffixes``.
        OutputPathError: the path is a folder, or its folder cannot be created or written.
    """
    p = Path(path)
    if suffixes is not None and p.suffix.lower() not in suffixes:
        raise VizError(f"{p}: unsupported picture format {p.suffix or '(none)'!r}; use a file name ending in "
                       + " or ".join(suffixes))
    try:
        st = p.stat()
    except (FileNotFoundError, NotADirectoryError):
        _writable_folder(_existing_ancestor(p.parent), p, what)
        return p
    except OSError as e:
        raise OutputPathError(f"{str(p)[:200]}: cannot write the {what}: {e.strerror or e}", path) from None
    if stat.S_ISDIR(st.st_mode):
        ends = " or ".join(suffixes) if suffixes else ""
        raise OutputPathError(f"{p}: is a directory; expected a file name" + (f" ending in {ends}" if ends else ""),
                              path)
    _writable_folder(p.parent, p, what)
    return p


