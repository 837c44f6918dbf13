"""--kv-cache-dtype: an FP8 KV cache keeps and reads one byte an element where the model's BF16 cache takes two."""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from simspec import presets
from simspec.cli import main
from simspec.scenario.loader import parse_scenario, resolve
from simspec.timing.iteration import IterationModel
from simspec.timing.stack import target_stack, with_kv_cache_dtype


def _resolve(d: dict):
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def test_an_fp8_cache_halves_a_tokens_kv_bytes_and_auto_keeps_the_models():
    stack = target_stack(presets.models()["llama-3.1-8b"], 1)
    fp8 = with_kv_cache_dtype(stack, "fp8_e4m3")
    assert fp8 is not None and fp8.kv_bytes_per_token_per_gpu == stack.kv_bytes_per_token_per_gpu / 2
    for same in ("auto", "bf16", "bfloat16"):
        assert with_kv_cache_dtype(stack, same) is stack
    assert with_kv_cache_dtype(None, "fp8_e4m3") is None


def test_an_fp8_cache_holds_twice_the_tokens_and_reads_half_the_bytes_a_decode_step(small):
    bf16 = _resolve(small)
    small["server"]["kv_cache_dtype"] = "fp8_e4m3"
    fp8 = _resolve(small)
    # the same memory for the pool, half the bytes a token: twice the tokens (to SGLang's page rounding)
    assert fp8.kv_capacity_tokens == pytest.approx(2 * bf16.kv_capacity_tokens, rel=1e-3)
    a, b = IterationModel(bf16), IterationModel(fp8)
    context = 8 * 8000.0
    saved = a.decode(8, context).total_ms - b.decode(8, context).total_ms
    kv_ms_per_token = a.plan(8)[0].kv_ms_per_token  # the BF16 cache's, per token read
    assert saved == pytest.approx((context + 8) * kv_ms_per_token / 2)  # the 8 new tokens' entries are read too
    # the weights are the same: with no context only the new tokens' entries differ
    assert a.decode(8, 0.0).total_ms - b.decode(8, 0.0).total_ms == pytest.approx(8 * kv_ms_per_token / 2)


def test_an_unknown_kv_cache_dtype_is_refused_with_the_field_and_the_choices(small, tmp_path):
    import yaml
    small["server"]["kv_cache_dtype"] = "fp4_e2m1"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small))
    result = CliRunner().invoke(main, ["predict", str(path)])
    assert result.exit_code == 2
    assert "server.kv_cache_dtype" in result.output and "fp8_e4m3" in result.output
