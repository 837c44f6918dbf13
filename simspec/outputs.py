"""Files a command writes: checked before any work, so a wrong name never silently holds the wrong format and an
output never overwrites one of the command's own inputs (or another of its outputs)."""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from simspec.errors import InputError


def same_file(a: str | Path, b: str | Path) -> bool:
    """Do these two paths name one file: equal once resolved, or the same file on disk (a hard link, a
    case-insensitive file system)?"""
    if Path(a).resolve() == Path(b).resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet): then they are not one file
        return False


def check_output(path: str, flag: str, what: str, suffixes: Sequence[str],
                 inputs: Iterable[tuple[str, str | Path | None]] = ()) -> None:
    """Refuse an output path that is one of the command's inputs or other outputs ((role, path) pairs, e.g.
    ("the sweep file", "W.yaml")), or whose name does not end in one of `suffixes` (`what` it writes, e.g.
    "a CSV table")."""
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
    parent = Path(path).resolve().parent
    if not parent.is_dir():
        raise InputError(f"folder {str(parent)!r} does not exist; allowed: a file in an existing folder (create it "
                         f"first)", file=path, key=flag)
    if not os.access(parent, os.W_OK | os.X_OK):
        raise InputError(f"folder {str(parent)!r} is not writable; allowed: a file in a folder you can write",
                         file=path, key=flag)
