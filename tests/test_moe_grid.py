"""The fused MoE's launch grid: programs whose row block the routing left empty (timing/forward.py MoeGrid,
scenario/releases.py fused_moe_padded_rows), and the A100 kernel table the cost of one was fitted to."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simspec import presets
from simspec.cli import main
from simspec.scenario import releases
from simspec.scenario.profile import CollectiveCurve
from simspec.timing.collectives import Collectives
from simspec.timing.forward import Efficiencies, ForwardModel, ForwardShape, MoeGrid, moe_grid
from simspec.timing.stack import target_stack

ROOT = Path(__file__).resolve().parent.parent
IDEAL = Efficiencies(memory_bandwidth=1.0, compute=1.0, routing_locality=0.0, forward_overhead_ms=0.0,
                     kernel_gap_graph_us=0.0, small_kernel_us=0.0, layer_overhead_eager_us=0.0)


def test_the_grid_is_sized_for_the_worst_case_before_0_5_7_and_for_the_pairs_routed_from_it():
    # one token, top 8 of 128 experts, 16-row blocks: 8 + 128 x 15 rows before 0.5.7, 8 x 16 from it
    assert releases.fused_moe_padded_rows(False, 8, 128, 16) == 121
    assert releases.fused_moe_padded_rows(True, 8, 128, 16) == 8
    # from E + 1 pairs on, 0.5.7 pads for the worst case again, with E + 1 blocks of slack
    assert releases.fused_moe_padded_rows(True, 129, 128, 16) == -(-(129 + 129 * 15) // 16)
    assert releases.fused_moe_padded_rows(True, 128, 128, 16) == 128
    assert releases.fused_moe_padded_rows(False, 0, 128, 16) == 0
    assert not releases.tight_moe_align((4, 6)) and not releases.tight_moe_align((4, 4))
    assert releases.tight_moe_align((5, 8)) and releases.tight_moe_align((5, 23))


def test_empty_programs_are_the_grid_less_the_blocks_the_touched_experts_fill():
    grid = MoeGrid(tight=False, experts=128, weights="bf16", tiles=((1, 16, 64),))
    # one token: 121 row blocks, 8 filled; w13 has 2 x 768 / 64 column tiles, w2 2048 / 64
    assert grid.empty_programs(1, 8, 8.0, 768, 2048) == (121 - 8) * (24 + 32)
    assert dataclasses.replace(grid, tight=True).empty_programs(1, 8, 8.0, 768, 2048) == 0
    # a prefill fills about every block: (32,768 + 1,920) / 16 rows, 32,768 / 16 + 64 of them filled
    assert grid.empty_programs(4096, 32768, 128.0, 768, 2048) == pytest.approx((2168 - 2112) * 56)
    assert grid.empty_programs(0, 0, 0.0, 768, 2048) == 0


def test_the_tile_is_the_tuned_files_nearest_entry_else_the_default_by_weight_format():
    tuned = MoeGrid(False, 128, "bf16", ((1, 16, 64), (8, 16, 128), (64, 64, 64)))
    assert tuned.tile(1) == (16, 64) and tuned.tile(6) == (16, 128) and tuned.tile(100) == (64, 64)
    assert tuned.tile(36) == (16, 128)  # a tie goes to the first key, as SGLang's min() over the keys does
    assert MoeGrid(False, 128, "bf16").tile(128) == (16, 32) and MoeGrid(False, 128, "bf16").tile(129) == (64, 64)
    assert MoeGrid(False, 128, "fp8").tile(1) == (64, 128) and MoeGrid(False, 128, "fp8").tile(200) == (128, 256)
    assert MoeGrid(False, 384, "fp8-block128").tile(1) == (64, 128)


def test_a_preset_shape_takes_its_releases_tuned_file_and_int4_experts_have_no_grid():
    qwen = presets.models()["qwen3-30b-a3b"]
    grid = moe_grid("h200-sxm", qwen, target_stack(qwen, tp=1, version=(4, 6)), (4, 6))
    # 0.4.6.post1 ships E=128,N=768,device_name=NVIDIA_H200.json: 16 x 64 at one token
    assert grid is not None and not grid.tight and grid.tile(1) == (16, 64)
    grid = moe_grid("a100-40gb-pcie", qwen, target_stack(qwen, tp=1, version=(5, 8)), (5, 8))
    assert grid is not None and grid.tight and grid.tiles == () and grid.tile(1) == (16, 32)
    kimi = presets.models()["kimi-k2.5"]  # INT4 experts: Marlin, not the Triton kernel
    assert moe_grid("h200-sxm", kimi, target_stack(kimi, tp=8), (5, 10)) is None


def _decode_step_s(version: tuple[int, int], empty_block_us: float) -> float:
    model = presets.models()["qwen3-30b-a3b"]
    stack = target_stack(model, tp=1, version=version)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    fm = ForwardModel(stack, presets.gpus()["h200-sxm"], Collectives(curve, 1, "nvlink"),
                      dataclasses.replace(IDEAL, moe_empty_block_us=empty_block_us), None,
                      moe_grid("h200-sxm", model, stack, version))
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    return fm._weights(one)[0]


def test_a_one_token_decode_pays_every_empty_program_of_every_moe_layer_before_0_5_7_only():
    """Qwen3-30B-A3B at batch 1: 48 MoE layers x 6,328 empty programs at the tuned 16 x 64 tile under 0.4.6; none
    under 0.5.8, whose grid holds the 8 filled blocks alone."""
    us = 0.002
    extra = _decode_step_s((4, 6), us) - _decode_step_s((4, 6), 0.0)
    assert extra == pytest.approx(48 * (121 - 8) * (24 + 32) * us * 1e-6)
    assert _decode_step_s((5, 8), us) == pytest.approx(_decode_step_s((5, 8), 0.0))


def test_a_shape_without_a_tuned_file_runs_the_default_heuristic_and_its_wide_tile_past_e_tokens():
    # GLM-4.7-Flash's experts on an H100 PCIe: no file for the shape in any release read; Qwen3-30B-A3B's on an H200
    # have one
    glm = presets.models()["glm-4.7-flash"]
    grid = moe_grid("h100-pcie", glm, target_stack(glm, tp=1), (5, 10, 1))
    assert grid is not None and grid.heuristic and not grid.tiles
    assert not grid.runs_default_wide_tile(grid.experts) and grid.runs_default_wide_tile(grid.experts + 1)
    qwen = presets.models()["qwen3-30b-a3b"]
    tuned = moe_grid("h200-sxm", qwen, target_stack(qwen, tp=1), (5, 8, 0))
    assert tuned is not None and tuned.tiles and not tuned.heuristic
    assert not any(tuned.runs_default_wide_tile(t) for t in (1, 64, 512, 4096))
    # FP8 experts never run the wide BF16 tile: the heuristic gives them 64 x 128 and 128 x 256
    fp8 = MoeGrid(tight=True, experts=128, weights="fp8", heuristic=True)
    assert not fp8.runs_default_wide_tile(64) and not fp8.runs_default_wide_tile(4096)


def test_dense_models_have_no_grid():
    model = presets.models()["llama-3.1-8b"]
    assert moe_grid("h200-sxm", model, target_stack(model, tp=1), (4, 6)) is None


def test_the_default_is_the_fit_to_the_a100_table_which_is_marked_fitted_and_kept_out_of_the_kernel_mean():
    proc = subprocess.run([sys.executable, str(ROOT / "calibration" / "fit_moe_empty_blocks.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    from simspec import kernel_validation as kv

    results = kv.run_tables(kv.kernel_files(ROOT / "validation"))
    fitted = [r for r in results if r.table.fitted]
    # and the H200 table moe_program_gbps was fitted to (tests/test_moe_programs.py)
    assert [r.table.id for r in fitted] == ["sglang6825-qwen3-30b-a3b-bf16-a100-pcie-40gb",
                                            "simspec-h200-fused-moe-dsv3-tp8-sglang057-w13"]
    s = kv.summary(results)
    rest = [abs(p.error_pct) for r in results if not r.table.fitted for p in r.compared]
    assert s["mape_pct"] == pytest.approx(sum(rest) / len(rest))
    assert s["points_fitted"] == sum(len(r.compared) for r in fitted)


def _suite(tmp_path: Path, **table_changes) -> Path:
    case = yaml.safe_load((ROOT / "validation" / "cases" / "tengyunw-qwen3-8b-h200-baseline.yaml").read_text())
    (tmp_path / "cases").mkdir(parents=True)
    (tmp_path / "cases" / f"{case['id']}.yaml").write_text(yaml.safe_dump(case))
    (tmp_path / "kernels").mkdir()
    table = {"id": "t", "title": "t", "source": {"citation": "test"}, "kernel": "fused_moe", "gpu": "h200-sxm",
             "shape": {"experts": 128, "experts_per_token": 8, "hidden_size": 2048, "intermediate_per_gpu": 768,
                       "weights": "bf16"},
             "routing_timed": True, "config": "default", "l2_cache_mb": 1, "l2_source": "test",
             "points": [[1, 100.0], [4, 200.0]], **table_changes}
    (tmp_path / "kernels" / "t.yaml").write_text(yaml.safe_dump(table))
    return tmp_path


def test_a_table_that_states_its_grid_is_charged_its_empty_programs_and_one_that_does_not_is_not(tmp_path):
    plain = json.loads(CliRunner().invoke(main, ["validate", str(_suite(tmp_path / "a")), "--json"]).output)
    grid = {"rows": "worst_case", "block_m": 16, "block_n": 32}
    gridded = json.loads(CliRunner().invoke(main, ["validate", str(_suite(tmp_path / "b", grid=grid)),
                                                   "--json"]).output)
    before = [p["predicted_us"] for p in plain["kernels"]["points"]]
    after = [p["predicted_us"] for p in gridded["kernels"]["points"]]
    # 0.002 us per program (defaults.yaml): at one token 113 empty row blocks x 112 column tiles
    assert after[0] - before[0] == pytest.approx(113 * 112 * 0.002)
    assert after[1] > before[1]


def test_a_fitted_table_is_named_and_reported_apart(tmp_path):
    res = CliRunner().invoke(main, ["validate", str(_suite(tmp_path, fitted=True))])
    assert res.exit_code == 0, res.output
    assert "t (fitted)" in res.output and "kernel points of fitted tables (2)" in res.output
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["kernels"]["summary"]
    assert out["mape_pct"] is None and out["points_fitted"] == 2


@pytest.mark.parametrize(("grid", "needle"), [
    ({"rows": "sometimes", "block_m": 16, "block_n": 32}, "grid.rows"),
    ({"rows": "worst_case", "block_m": 0, "block_n": 32}, "grid.block_m"),
])
def test_a_bad_grid_exits_2_naming_the_field(tmp_path, grid, needle):
    res = CliRunner().invoke(main, ["validate", str(_suite(tmp_path, grid=grid))])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_the_tight_rule_starts_at_0_5_7():
    assert not releases.tight_moe_align((5, 6)) and releases.tight_moe_align((5, 7))


def test_a_b200_target_on_flashinfer_trtllm_has_no_grid_but_its_mtp_draft_keeps_one():
    """0.5.8 on an SM100 part runs DeepSeek-V3's FP8 experts on flashinfer_trtllm (server_args), not the Triton
    kernel; the draft's MoE stays on Triton. An H200 target, or 0.4.6, keeps the Triton grid."""
    from simspec.scenario.loader import parse_scenario, resolve
    from simspec.timing.iteration import IterationModel

    def model(gpu: str, version: str) -> IterationModel:
        data = {"name": "t", "hardware": {"gpu": gpu, "num_gpus": 8, "interconnect": "nvlink5-nccl" if gpu == "b200"
                                          else "nvlink4-nccl"},
                "model": "deepseek-v3", "server": {"tp": 8, "sglang_version": version},
                "speculative": {"algorithm": "mtp", "num_steps": 1, "topk": 1, "num_draft_tokens": 2},
                "acceptance": {"accept_length": 1.8, "source": "test"},
                "workload": {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 1,
                             "input_tokens": {"dist": "fixed", "value": 16},
                             "output_tokens": {"dist": "fixed", "value": 16}}}
        return IterationModel(resolve(parse_scenario(data, "<test>")))

    b200 = model("b200", "0.5.8")
    assert b200.target._grid is None and b200.draft is not None and b200.draft._grid is not None
    h200 = model("h200-sxm", "0.5.8")
    assert h200.target._grid is not None and h200.draft._grid is not None
    assert releases.target_moe_runs_triton((4, 6), "B200", "DeepseekV3ForCausalLM", "fp8-block128")
    assert not releases.target_moe_runs_triton((5, 8), "B200", "Qwen3MoeForCausalLM", "bf16")


def test_every_tile_file_names_a_gpu_preset_and_a_weight_format(monkeypatch):
    """A misspelt name would never be looked up (the default tile would stand in silently); the loader refuses it."""
    real = presets._load
    bad = {"0.4.6": {"source": "t", "files": [{"gpu": "h200", "experts": 128, "n": 768, "weights": "bf16",
                                               "file": "x.json", "tiles": [[1, 16, 64]]}]}}
    monkeypatch.setattr(presets, "_load", lambda name: bad if name == "fused_moe_tiles.yaml" else real(name))
    presets.fused_moe_tiles.cache_clear()
    with pytest.raises(ValueError, match="'h200'"):
        presets.fused_moe_tiles()
    monkeypatch.setattr(presets, "_load", real)
    presets.fused_moe_tiles.cache_clear()
    tiles = presets.fused_moe_tiles()
    assert {"0.4.6", "0.5.8", "0.5.9", "0.5.12"} <= set(tiles)
    assert tiles["0.4.6"][("h200-sxm", 128, 768, "bf16")].tiles[0] == (1, 16, 64)


def test_a_later_section_is_the_one_before_it_with_its_changes():
    """Sections after 0.5.8 list only what changed; each loads whole. Reading 0.5.9-0.5.23 with each release's own
    lookup (its pinned torch's Triton folder first; the fixed fallback list through 0.5.11, every shipped folder
    from 0.5.12): DeepSeek-V3's E=257 H200 file moves to 64-column tiles with a down file in 0.5.9, back to 0.5.8's
    in 0.5.11 (Triton 3.6.0's folder lacks it and the fixed list skips 3.5.1), and to the 64-column one from 0.5.12."""
    tiles = presets.fused_moe_tiles()
    key = ("h200-sxm", 257, 256, "fp8-block128")
    assert tiles["0.5.8"][key].tiles[0] == (1, 16, 128) and tiles["0.5.8"][key].down_tiles is None
    assert tiles["0.5.9"][key].tiles[0] == (1, 16, 64) and tiles["0.5.9"][key].down_tiles[0] == (1, 16, 128)
    assert tiles["0.5.11"][key].tiles[0] == (1, 16, 128) and tiles["0.5.11"][key].down_tiles is None
    assert tiles["0.5.12"][key].tiles[0] == (1, 16, 64)
    unchanged = ("h200-sxm", 128, 768, "fp8-block128")
    assert all(tiles[r][unchanged] == tiles["0.5.8"][unchanged] for r in tiles if r != "0.4.6")
    sections = list(tiles)
    assert releases.fused_moe_tile_release((5, 4), sections) == "0.5.8"
    assert releases.fused_moe_tile_release((5, 10), sections) == "0.5.9"
    assert releases.fused_moe_tile_release((5, 12), sections) == "0.5.12"
    assert releases.fused_moe_tile_release((4, 6), sections) == "0.4.6"
    assert releases.fused_moe_tile_release((4, 4), sections) is None


def test_w2_takes_its_down_files_columns_and_w13s_rows():
    grid = MoeGrid(True, 257, "fp8-block128", ((1, 16, 64),), down_tiles=((1, 16, 128), (32, 16, 256)))
    assert grid.down_block_n(1) == 128 and grid.down_block_n(30) == 256
    assert grid.working_programs(1, 9, 9.0, 256, 7168) == {"w13": 9 * 8, "w2": 9 * 56}
    assert MoeGrid(True, 257, "fp8-block128", ((1, 16, 64),)).down_block_n(1) == 64
    model = presets.models()["deepseek-v3"]
    for version, w13, w2 in (((5, 7), 128, 128), ((5, 10), 64, 128), ((5, 11), 128, 128), ((5, 12), 64, 128)):
        stack = target_stack(model, tp=8, version=version, shared_expert_copies=1)
        g = moe_grid("h200-sxm", model, stack, version)
        assert g is not None and (g.tile(1)[1], g.down_block_n(1)) == (w13, w2), version


@pytest.mark.parametrize(("change", "needle"), [
    ({"fitted": "yes"}, "fitted"),
    ({"grid": {"rows": "worst_case", "block_m": "16", "block_n": 32}}, "grid.block_m"),
    ({"grid": {"rows": "worst_case", "block_m": True, "block_n": 32}}, "grid.block_m"),
])
def test_a_bad_fitted_flag_or_a_grid_size_that_is_not_an_integer_exits_2(tmp_path, change, needle):
    res = CliRunner().invoke(main, ["validate", str(_suite(tmp_path, **change))])
    assert res.exit_code == 2 and needle in res.output and "Traceback" not in res.output, res.output


def test_recording_a_suite_whose_only_kernel_table_is_fitted_is_refused_saying_why(tmp_path):
    res = CliRunner().invoke(main, ["validate", str(_suite(tmp_path, fitted=True)), "--record"])
    assert res.exit_code == 2 and "fitted tables" in res.output and "Traceback" not in res.output, res.output
    assert not (tmp_path / "recorded.yaml").exists()


def test_small_tile_range_ends_where_nearest_key_lookup_first_reaches_a_wider_tile():
    """Keys 1, 8 and 64: calls up to 36 tokens are nearer 8 (36 - 8 = 28 = 64 - 36, the first key on a tie), 37 is
    nearer 64; a config whose every key is 16-row serves every call in 16-row tiles; a first key of 64 rows, none."""
    from simspec.timing.forward import ALL_CALLS, MoeGrid

    grid = MoeGrid(False, 128, "fp8-block128", ((1, 16, 64), (8, 16, 64), (64, 64, 128)))
    assert grid.small_tile_tokens() == 36
    assert grid.tile(36)[0] == 16 and grid.tile(37)[0] == 64
    assert MoeGrid(False, 128, "fp8-block128", ((1, 16, 64), (8, 16, 128))).small_tile_tokens() == ALL_CALLS
    assert MoeGrid(False, 128, "fp8-block128", ((1, 64, 64), (8, 16, 128))).small_tile_tokens() == 0
    assert MoeGrid(False, 128, "fp8-block128").small_tile_tokens() == 0
