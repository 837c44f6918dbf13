"""What the kernel-table converters in this folder share: the GPU preset check, reading a benchmark's result, and
the result's path as the repository names it (a table cites its raw result, checked in)."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def unknown_gpu(name: str) -> str | None:
    """An error line for a GPU that is not a simspec preset; None for one that is."""
    from simspec.presets import gpus

    if name in gpus():
        return None
    return f"error: --gpu: unknown GPU preset {name!r}; allowed: {', '.join(sorted(gpus()))}"


def read_result(path: Path, what: str) -> dict:
    """A benchmark's JSON object; ValueError (or OSError) saying what is wrong."""
    result = json.loads(path.read_text())
    if not isinstance(result, dict):
        raise ValueError(f"is not a {what} result (a JSON object)")
    return result


def repo_path(path: Path) -> str:
    resolved = path.resolve()
    return resolved.relative_to(ROOT).as_posix() if resolved.is_relative_to(ROOT) else str(path)
