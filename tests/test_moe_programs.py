"""A fused-MoE call whose grid has too few working programs to keep DRAM busy streams its experts at programs x
moe_program_gbps (timing/forward.py MoeGrid.working_programs), and the H200 table that rate was fitted to."""

from __future__ import annotations

import dataclasses
import math
import subprocess
import sys
from pathlib import Path

import pytest

from simspec import kernel_validation as kv
from simspec import presets
from simspec.timing.forward import Efficiencies, ForwardModel, ForwardShape, MoeGrid
from simspec.timing.stack import target_stack

ROOT = Path(__file__).resolve().parent.parent
IDEAL = Efficiencies(memory_bandwidth=1.0, compute=1.0, routing_locality=0.0, forward_overhead_ms=0.0,
                     kernel_gap_graph_us=0.0, small_kernel_us=0.0, layer_overhead_eager_us=0.0)
# DeepSeek-V3's experts at TP 8 with the fused shared expert, as one H200 runs them
DSV3 = kv.MoeShape(experts=257, experts_per_token=9, hidden_size=7168, intermediate_per_gpu=256,
                   weights="fp8-block128")


def test_working_programs_are_the_filled_row_blocks_times_each_gemms_column_tiles():
    grid = MoeGrid(tight=True, experts=257, weights="fp8-block128", tiles=((1, 16, 128),))
    # one token routed to 9 experts: 9 row blocks; w13 is 2 x 256 columns wide, w2 7168
    assert grid.working_programs(1, 9, 9.0, 256, 7168) == {"w13": 9 * 4, "w2": 9 * 56}
    half = MoeGrid(tight=True, experts=257, weights="fp8-block128", tiles=((1, 16, 64),))
    assert half.working_programs(1, 9, 9.0, 256, 7168) == {"w13": 9 * 8, "w2": 9 * 112}
    # experts given more pairs than one block holds fill more blocks (half a block of slack each): 576 pairs over
    # 20 experts in 16-row blocks; over 200 experts, each fills one
    assert grid.working_programs(64, 576, 20.0, 256, 7168)["w13"] == pytest.approx((576 / 16 + 10) * 4)
    assert grid.working_programs(64, 576, 200.0, 256, 7168)["w13"] == pytest.approx(200 * 4)
    assert grid.working_programs(0, 0, 0.0, 256, 7168) == {"w13": 0.0, "w2": 0.0}


def _model(shape: kv.MoeShape, tile_n: int, gbps: float) -> ForwardModel:
    stack = target_stack(kv._one_moe_layer(shape), tp=1)
    grid = MoeGrid(True, shape.experts, shape.weights, ((1, 16, tile_n),))
    return ForwardModel(stack, presets.gpus()["h200-sxm"], None,  # type: ignore[arg-type]
                        dataclasses.replace(IDEAL, moe_program_gbps=gbps), moe_grid=grid)


def test_a_call_with_few_programs_streams_at_their_rate_and_halving_the_tile_halves_its_time():
    gbps = 20.0
    wide, narrow = _model(DSV3, 128, gbps), _model(DSV3, 64, gbps)
    w13_bytes = 9 * 2 * 256 * 7168  # 9 experts' FP8 w13, the activations aside
    t_wide = wide.fused_moe_call_us(1, 0, 0, only=("w13",))
    assert t_wide == pytest.approx(w13_bytes / (36 * gbps * 1e9) * 1e6, rel=0.01)
    assert narrow.fused_moe_call_us(1, 0, 0, only=("w13",)) == pytest.approx(t_wide / 2, rel=0.01)
    # w2's 504 programs x 20 GB/s outrun the H200's 4.8 TB/s: w2 stays at the bandwidth
    w2 = wide.fused_moe_call_us(1, 0, 0, only=("w2",))
    unlimited = _model(DSV3, 128, math.inf)
    assert w2 == pytest.approx(unlimited.fused_moe_call_us(1, 0, 0, only=("w2",)))
    assert unlimited.fused_moe_call_us(1, 0, 0, only=("w13",)) < t_wide / 5


def test_a_call_of_many_tokens_is_not_limited():
    limited, unlimited = _model(DSV3, 128, 23.0), _model(DSV3, 128, math.inf)
    assert limited.fused_moe_call_us(4096, 0, 0) == pytest.approx(unlimited.fused_moe_call_us(4096, 0, 0))


def test_without_a_grid_nothing_is_limited():
    stack = target_stack(kv._one_moe_layer(DSV3), tp=1)
    gpu = presets.gpus()["h200-sxm"]
    slow = ForwardModel(stack, gpu, None, dataclasses.replace(IDEAL, moe_program_gbps=1.0))  # type: ignore[arg-type]
    fast = ForwardModel(stack, gpu, None, IDEAL)  # type: ignore[arg-type]
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    assert slow.working_programs(one) == {}
    assert slow.fused_moe_call_us(1, 0, 0) == fast.fused_moe_call_us(1, 0, 0)


def test_the_default_is_the_fit_to_the_057_w13_table_which_is_marked_fitted_and_the_others_are_not():
    proc = subprocess.run([sys.executable, str(ROOT / "calibration" / "fit_moe_program_rate.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tables = {p.stem: kv.load_table(p) for p in kv.kernel_files(ROOT / "validation")}
    assert tables["simspec-h200-fused-moe-dsv3-tp8-sglang057-w13"].fitted
    assert not any(tables[f"simspec-h200-fused-moe-dsv3-tp8-{t}"].fitted
                   for t in ("sglang057-w2", "sglang0512-w13", "sglang0512-w2"))


def test_a_kernel_grid_takes_one_tile_or_a_tile_per_size_not_both(tmp_path):
    assert kv.KernelGrid(rows="tight", block_m=16, block_n=64).tile_entries() == ((1, 16, 64),)
    assert kv.KernelGrid(rows="tight", tiles=[(1, 16, 64), (8, 16, 128)]).tile_entries() == ((1, 16, 64),
                                                                                          (8, 16, 128))
    for bad in ({}, {"block_m": 16}, {"block_m": 16, "block_n": 64, "tiles": [(1, 16, 64)]},
                {"block_m": 16, "tiles": [(1, 16, 64)]}):
        with pytest.raises(ValueError):
            kv.KernelGrid(rows="tight", **bad)
