from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest
from click.testing import CliRunner

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"

SMALL = {
    "name": "small",
    "hardware": {"gpu": "h100-sxm", "num_gpus": 1, "interconnect": "nvlink4-nccl"},
    "model": "llama-3.1-8b",
    "server": {"tp": 1},
    "workload": {
        "arrival": {"type": "closed", "concurrency": 1},
        "num_requests": 2,
        "input_tokens": {"dist": "fixed", "value": 128},
        "output_tokens": {"dist": "fixed", "value": 64},
    },
}


def calibration_script(stem: str):
    """A script of calibration/ (not a package) imported as a module, registered under its stem so that its
    dataclasses resolve their module."""
    import importlib.util
    import sys

    spec = importlib.util.spec_from_file_location(stem, ROOT / "calibration" / f"{stem}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return module


def auto_tree(version: str, model: str = "qwen3-8b", drafter: str = "eagle3-qwen3-8b") -> tuple[int, int, int]:
    """The (num_steps, topk, num_draft_tokens) SGLang `version` picks for an EAGLE-3 server of `model` given none."""
    from simspec.scenario.loader import parse_scenario, resolve

    scenario = copy.deepcopy(SMALL)
    scenario |= {"model": model, "server": {"tp": 1, "sglang_version": version},
                 "speculative": {"algorithm": "eagle3", "drafter": drafter}, "acceptance": {"accept_length": 2.0}}
    rs = resolve(parse_scenario(scenario, "t.yaml"), "t.yaml")
    return rs.num_steps, rs.topk, rs.num_draft_tokens


@pytest.fixture
def small() -> dict:
    """A small, valid scenario mapping (Llama-3.1-8B on one H100) to mutate per test."""
    return copy.deepcopy(SMALL)


@pytest.fixture
def no_long_gc_pauses():
    """For tests that time a live fake server (tests/fake_sglang.py) in this process: a full garbage collection over
    what earlier tests left alive stalls the server's scheduler thread, and the catch-up that follows shortens the
    next steps the client measures (seen as a 10% miss at batch 4 when the suite ran in another order). Objects
    alive now are moved out of the collector's reach for the test."""
    gc.collect()
    gc.freeze()
    yield
    gc.unfreeze()


def cli_runner() -> CliRunner:
    """A runner that keeps stderr apart from stdout: click < 8.2 needs mix_stderr=False, click >= 8.2 always
    keeps result.stderr apart (and has no mix_stderr)."""
    try:
        return CliRunner(mix_stderr=False)  # type: ignore[call-arg]
    except TypeError:
        return CliRunner()


def assert_refused(result, *needles: str, stdout_empty: bool = True, one_line: bool = True) -> str:
    """Bad input as the CLI must answer it: exit code 2, no traceback (the command exited, nothing escaped it) and
    every needle on stderr; by default also nothing on stdout and one line on stderr. Returns stderr, stripped."""
    where = (f"exit {result.exit_code}; stdout: {result.stdout!r}; stderr: {result.stderr!r};"
             f" exception: {result.exception!r}")
    assert result.exit_code == 2, where
    assert isinstance(result.exception, SystemExit), where
    assert "Traceback" not in result.output and "Traceback" not in result.stderr, where
    if stdout_empty:
        assert result.stdout == "", where
    if one_line:
        assert len(result.stderr.strip().splitlines()) == 1, where
    for needle in needles:
        assert needle in result.stderr, f"{needle!r} missing; {where}"
    return result.stderr.strip()
