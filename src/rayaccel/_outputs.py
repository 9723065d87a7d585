"""Checks of output paths, run before any work: a picture, a results file, an output folder.

Used by :mod:`rayaccel.viz` (and re-exported there as :func:`rayaccel.viz.check_output_dir`
and :func:`rayaccel.viz.check_output_file`), the CLI and the demo. A check leaves nothing
behind; each failure is an :class:`~rayaccel.errors.OutputPathError` naming the path, what is
in the way and what would work.

Permission bits do not say whether a folder takes new files (root passes ``access()`` on
``/proc``, ``/sys`` and read-only mounts), so a check ends by creating and removing one empty
probe file in the nearest existing folder. Writers then go through :func:`output_dir` and
:func:`atomic_path`: a failure midway removes what they wrote and the folders they created,
so an output is either complete or absent.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

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
    _probe(folder, target, what)


def _probe(folder: Path, target: Path, what: str) -> None:
    """Create and remove one empty file in ``folder``: the only sure test that it takes new files."""
    try:
        fd, name = tempfile.mkstemp(prefix=".rayaccel-probe-", dir=folder)
    except OSError as e:
        why = e.strerror or str(e)
        raise OutputPathError(f"{target}: cannot write the {what} here: {folder} takes no new files ({why}; "
                              "a special or read-only file system?); expected a path in a folder you can write to",
                              target) from None
    os.close(fd)
    os.unlink(name)


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


def _fail_write(p: Path, what: str, e: OSError) -> OutputPathError:
    return OutputPathError(f"{str(p)[:200]}: cannot write the {what} ({e.strerror or e}); "
                           "expected a path in a folder you can write to", p)


@contextmanager
def output_dir(path: str | Path, what: str = "output") -> Iterator[Path]:
    """Check ``path`` (:func:`check_output_dir`), create it with its missing parents, yield it.

    All or nothing: when the body raises, the folders created here are removed with
    everything in them (a folder that existed before is left as it was, except for files
    written through :func:`atomic_path`, which never leave a partial file).

    Raises:
        OutputPathError: the check fails, or a folder cannot be created (names the path).
    """
    p = check_output_dir(path, what)
    missing = []
    probe = p
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        _remove_created(missing)
        raise _fail_write(p, what, e) from None
    try:
        yield p
    except BaseException:
        _remove_created(missing)
        raise


def _remove_created(created: list[Path]) -> None:
    """Remove the folders this process created (``created``: deepest first), with their contents."""
    if created:
        shutil.rmtree(created[-1], ignore_errors=True)


@contextmanager
def atomic_path(path: str | Path, what: str = "output") -> Iterator[Path]:
    """Yield a temporary name next to ``path`` (same suffix) to write; move it to ``path`` when the body ends.

    The file appears complete or not at all: when the body raises (or the move fails) the
    temporary file is removed. Missing parent folders are created, and removed again on failure.

    Raises:
        OutputPathError: a folder or the file cannot be written (names the path).
    """
    p = Path(path)
    missing = []
    probe = p.parent
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    try:
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, name = tempfile.mkstemp(prefix=f".{p.stem[:40]}-", suffix=p.suffix, dir=p.parent)
        os.close(fd)
        os.chmod(name, 0o666 & ~_umask())  # mkstemp makes 0600; the file gets what open() would give it
    except OSError as e:
        _remove_created(missing)
        raise _fail_write(p, what, e) from None
    tmp = Path(name)
    try:
        yield tmp
        os.replace(tmp, p)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        _remove_created(missing)
        raise _fail_write(p, what, e) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        _remove_created(missing)
        raise


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def write_text(path: str | Path, text: str, what: str = "output") -> Path:
    """Write ``text`` to ``path`` all or nothing (:func:`atomic_path`); return ``path``.

    Raises:
        OutputPathError: the file cannot be written (names the path).
    """
    with atomic_path(path, what) as tmp:
        try:
            tmp.write_text(text)
        except OSError as e:
            raise _fail_write(Path(path), what, e) from None
    return Path(path)
