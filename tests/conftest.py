from __future__ import annotations

import copy
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
