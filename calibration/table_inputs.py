"""What the kernel-table converters in this folder share: their common arguments, the GPU preset check, reading a
benchmark's result, and the result's path as the repository names it (a table cites its raw result, checked in)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")

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


def common_arguments(p: argparse.ArgumentParser, bench: str, out_help: str) -> None:
    """The result, --gpu and --out every converter takes."""
    p.add_argument("result", help=f"{bench}'s JSON")
    p.add_argument("--gpu", required=True, help="simspec GPU preset the result was measured on")
    p.add_argument("--out", required=True, help=out_help)


def build_or_refuse(args: argparse.Namespace, bench: str, build: Callable[[dict, str], T]) -> T | None:
    """build(result, its repository path) from args.result; None, with the reason on stderr, where the GPU is not a
    preset or the result cannot be read or converted (the converter then exits 2, writing nothing)."""
    if (bad := unknown_gpu(args.gpu)) is not None:
        print(bad, file=sys.stderr)
        return None
    path = Path(args.result)
    try:
        return build(read_result(path, bench), repo_path(path))
    except (OSError, ValueError) as err:
        print(f"error: {path}: {err}", file=sys.stderr)
    except (KeyError, TypeError, IndexError) as err:  # a point without a field the converter reads
        print(f"error: {path}: a point lacks or mistypes {err} (is it {bench}'s output?)", file=sys.stderr)
    return None
