from __future__ import annotations

import copy
import gc
from pathlib import Path

import pytest

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
