"""Presets are data: every one loads, cites a source, and its derived figures match published ones."""

from __future__ import annotations

import pytest

from simspec import presets
from simspec.timing.stack import target_stack


def test_every_preset_loads_and_cites_a_source():
    for kind, items in presets.catalog().items():
        assert items, kind
        for name, preset in items.items():
            assert preset.source.strip(), f"{kind}/{name} has no source"


def test_required_presets_exist():
    cat = presets.catalog()
    for gpu in ("rtx-pro-6000-workstation", "rtx-pro-6000-server", "h100-sxm", "h100-pcie", "h200-sxm", "b200",
                "a100-80gb-sxm", "l40s", "rtx-4090"):
        assert gpu in cat["gpus"]
    for model in ("kimi-k2.5", "deepseek-v3", "llama-3.1-8b", "llama-3.1-70b", "qwen3-235b-a22b"):
        assert model in cat["models"]
    for drafter in ("eagle3-llama-3.1-8b", "eagle3-kimi-k2", "eagle3-kimi-k2.5"):
        assert drafter in cat["drafters"]


@pytest.mark.parametrize("name", list(presets.models()))
def test_parameter_counts_match_published_totals(name):
    m = presets.models()[name]
    assert target_stack(m, 1).total_params / 1e9 == pytest.approx(m.published_params_b, rel=0.01)


def test_kimi_k25_int4_weights_per_gpu():
    """~571 GB INT4 routed experts + ~23 GB BF16 (hardware-and-models.md), over 8 GPUs."""
    s = target_stack(presets.models()["kimi-k2.5"], 8)
    # MLA's A projections are replicated (~1.8 GB per GPU), so the per-GPU figure is a bit over 594/8
    assert 594 / 8 < s.weight_bytes_per_gpu / 1e9 < 594 / 8 + 2.5


def test_fp8_falls_back_to_bf16_on_gpus_without_fp8():
    a100 = presets.gpus()["a100-80gb-sxm"]
    assert a100.peak_tflops("fp8") == a100.bf16_tflops
