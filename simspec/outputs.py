"""Files a command writes: checked before any work, so a wrong name never silently holds the wrong format and an
output never overwrites one of the command's own inputs (or another of its outputs)."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from simspec.errors import InputError


class _SymlinkLoop(Exception):
    """Path.resolve() ran into a symlink loop."""


def _resolve(path: str | Path) -> Path:
    """Path.resolve(), with a symlink loop on the way (`ln -s x x`) raised as _SymlinkLoop: Python 3.11 and 3.12
    raise RuntimeError for it, later ones OSError(ELOOP)."""
    try:
        return Path(path).resolve()
    except RuntimeError:
        raise _SymlinkLoop from None
    except OSError as err:
        if err.errno == errno.ELOOP:
            raise _SymlinkLoop from None
        raise


def resolve_or_absolute(path: str | Path) -> Path:
    """Path.resolve(); for a path in a symlink loop, the absolute path as given (it names no file: reading it
    fails later, with its own message)."""
    try:
        return _resolve(path)
    except _SymlinkLoop:
        return Path(os.path.abspath(path))


def resolve_output(path: str | Path, flag: str) -> Path:
    """The output path resolved; a symlink loop is bad input naming the path and the flag."""
    try:
        return _resolve(path)
    except _SymlinkLoop:
        raise InputError("is a symlink loop (following its links never reaches a file, e.g. after `ln -s x x`); "
                         "allowed: a file name, or a link that ends at a file", file=str(path), key=flag) from None


def same_file(a: str | Path, b: str | Path) -> bool:
    """Do these two paths name one file: equal once resolved, or the same file on disk (a hard link, a
    case-insensitive file system)? A path in a symlink loop names no file, so only the same path spelled alike
    counts as one (reading such an input fails later, with its own message)."""
    if resolve_or_absolute(a) == resolve_or_absolute(b):
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): then they are not one file
        return False


def check_output(path: str, flag: str, what: str, suffixes: Sequence[str],
                 inputs: Iterable[tuple[str, str | Path | None]] = ()) -> None:
    """Refuse an output path that is one of the command's inputs or other outputs ((role, path) pairs, e.g.
    ("the sweep file", "W.yaml")), that is a symlink loop, or whose name does not end in one of `suffixes` (`what`
    it writes, e.g. "a CSV table")."""
    resolve_output(path, flag)
    for role, given in inputs:
        if given is not None and same_file(path, given):
            raise InputError(f"is {role} ({given}): writing {what} there would overwrite it; give another path",
                             file=path, key=flag)
    if Path(path).suffix.lower() not in suffixes:
        allowed = " or ".join(suffixes)
        raise InputError(f"writes {what}; allowed: a file name ending in {allowed}", file=path, key=flag)


def check_folder(path: str, flag: str) -> None:
    """Refuse, before any work, an output path whose folder does not exist or cannot be written: otherwise the
    command would compute everything and only then fail to write, losing its result."""
    parent = resolve_output(path, flag).parent
    if not parent.is_dir():
        raise InputError(f"folder {str(parent)!r} does not exist; allowed: a file in an existing folder (create it "
                         f"first)", file=path, key=flag)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"folder {str(parent)!r} is not writable; allowed: a file in a folder you can write",
                         file=path, key=flag)
