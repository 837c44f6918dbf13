"""Which SGLang releases simspec models, and what about a release changes a prediction.

Two early-2025 releases are modelled besides 0.5.8 through 0.5.23, because published measurements were taken
on them: 0.4.4 (the EAGLE-3 paper's batch-size sweep, M3) and 0.4.6.post1 (the Qwen documentation's H20
speed benchmark). Everything below was read from each release's wheel; where a rule is not listed here, the
0.5.x rule applies to them too (see the not-modelled list in docs/time-model.md).

What differs, by release:
- speculative algorithms: 0.4.4 has EAGLE (and NEXTN, which it maps to EAGLE); 0.4.6 adds EAGLE3. Neither
  has n-gram or standalone-draft speculation, nor v2 workers (srt/speculative/spec_info.py).
- the running-request cap an EAGLE-family server sets when the user sets none: 32 in 0.4.4, 48 from 0.4.6
  (server_args.__post_init__).
- which batch sizes get a CUDA graph, and whether the draft's extend after a verify runs in one: see
  simspec/timing/iteration.py early_captured_batch_sizes and IterationModel (the eager draft extend).
- memory defaults (mem_fraction_static, chunked_prefill_size, cuda_graph_max_bs): simspec/scenario/memory.py.
- kernels per decode forward: presets/kernels.yaml `releases`.
- the (num_steps, topk, num_draft_tokens) an EAGLE-family server picks when none is set: (5, 4, 8) for every
  model in both (0.4.4's argument defaults; 0.4.6's auto_choose_speculative_params), where 0.5.x picks by
  architecture (loader.py).
- model architectures: Qwen3 arrived in 0.4.6 and Kimi-K2.5's wrapper after both (models/ of each wheel).
- whether the Triton fused MoE swaps its operands for FP8 tiles under 64 rows on Hopper, so that they run on
  wgmma: not before 0.5.8; 0.5.8 on the H20 only; from 0.5.9 on every SM90 part (fused_moe_triton_kernels.py
  should_enable_swap_ab, after SGLang PRs #15712 and #16723).
- which FP8 expert shapes have a tuned H20 fused-MoE config with 16-row tiles, and up to how many tokens
  (_H20_FP8_MOE_SMALL_TILE_TOKENS below); and DeepSeek-V3's shared experts fused into the routed ones on SM90 in
  0.4.6 (deepseek_v2.py determine_n_share_experts_fusion: tp copies, so the kernel sees 256 + tp experts).
- how many row blocks the Triton fused MoE's grid launches at small batch (fused_moe_padded_rows): sized for the
  worst case before 0.5.7, for the pairs routed from 0.5.7.
"""

from __future__ import annotations

import re

EARLY_RELEASES = ((4, 4), (4, 6))  # (minor, patch) of the 0.4 releases read
CURRENT_RANGE = ((5, 8), (5, 23))  # every 0.5 release from 0.5.8 to 0.5.23
MODELLED_TEXT = "0.4.4, 0.4.6 (0.4.6.post1) and 0.5.8 through 0.5.23"
VERSION_PATTERN = r"^0\.(\d+)\.(\d+)(\.post\d+)?$"

_ALGORITHMS_0_4_4 = ("none", "eagle", "mtp")
_ALGORITHMS_0_4_6 = ("none", "eagle", "eagle3", "mtp")
EARLY_AUTO_TREE = (5, 4, 8)
# architectures of simspec's model presets that a release's models/ does not define
_MISSING_ARCHITECTURES = {
    (4, 4): ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM", "KimiK25ForConditionalGeneration"),
    (4, 6): ("KimiK25ForConditionalGeneration",),
}


def minor_patch(version: str) -> tuple[int, int]:
    """(minor, patch) of an SGLang version string "0.M.P" or "0.M.P.postN"."""
    m = re.match(VERSION_PATTERN, version)
    if m is None:
        raise ValueError(f"not an SGLang version 0.M.P[.postN]: {version!r}")
    return int(m.group(1)), int(m.group(2))


def is_modelled(version: tuple[int, int]) -> bool:
    low, high = CURRENT_RANGE
    return version in EARLY_RELEASES or low <= version <= high


def is_early(version: tuple[int, int]) -> bool:
    """A 0.4 release: v1 speculative workers only, the older CUDA-graph and memory rules."""
    return version < CURRENT_RANGE[0]


def speculative_algorithms(version: tuple[int, int]) -> tuple[str, ...] | None:
    """The algorithms this release can run; None = every algorithm simspec models."""
    if version == (4, 4):
        return _ALGORITHMS_0_4_4
    if version == (4, 6):
        return _ALGORITHMS_0_4_6
    return None


def spec_default_max_running(version: tuple[int, int]) -> int:
    """max_running_requests an EAGLE-family (or any speculative, 0.5.x) server sets when the user sets none."""
    return 32 if version == (4, 4) else 48


def _is_h20(gpu_display_name: str) -> bool:
    """SGLang's own test of the device name (fused_moe_triton_kernels.py, 0.5.8), applied to simspec's preset name."""
    return "H20" in gpu_display_name and "H200" not in gpu_display_name


def fp8_moe_swaps_ab(version: tuple[int, int], gpu_display_name: str) -> bool:
    """Whether this release's Triton fused MoE swaps A and B for FP8 tiles under 64 rows (then they run on wgmma).
    0.5.8 enables it where the device name holds "H20" but not "H200"; 0.5.9 on any SM90 part (and simspec asks
    only for GPUs whose small-tile rate was measured, Hopper ones)."""
    if version < (5, 8):
        return False
    if version == (5, 8):
        return _is_h20(gpu_display_name)
    return True


# The H20's tuned fused-MoE configs for block-FP8 experts in the 0.4.6.post1 wheel (fused_moe_triton/configs/
# E=...,N=...,device_name=NVIDIA_H20,dtype=fp8_w8a8,block_shape=[128, 128].json), by (E, N) as the kernel sees
# them: the most tokens a call may have and still get a BLOCK_SIZE_M 16 config under try_get_optimal_moe_config's
# nearest-key lookup (keys in file order, the first on a tie). A shape without a file runs get_default_config,
# whose block-FP8 tiles are 64 rows at every size; 0.4.4 ships no H20 FP8 file.
_H20_FP8_MOE_SMALL_TILE_TOKENS = {
    (4, 6): {(128, 768): 192, (128, 384): 192, (256, 128): 384, (264, 256): 384, (272, 128): 768},
}


def fused_moe_experts(version: tuple[int, int], architecture: str, routed_experts: int, tp: int) -> int:
    """Experts the fused-MoE kernel sees: 0.4.6 fuses DeepSeek-V3/R1's shared expert into the routed ones on SM90
    (one copy per TP rank, so 256 + tp); otherwise the routed experts."""
    if version == (4, 6) and architecture == "DeepseekV3ForCausalLM" and routed_experts == 256:
        return routed_experts + tp
    return routed_experts


def fp8_moe_small_tile_tokens(version: tuple[int, int], gpu_display_name: str, experts: int, n: int) -> int:
    """The most tokens per fused-MoE call that this release runs in 16-row tiles for FP8 experts of this shape (E
    experts as the kernel sees them, N intermediate columns per GPU) on this GPU; 0 when it has no such config."""
    if not _is_h20(gpu_display_name):
        return 0
    return _H20_FP8_MOE_SMALL_TILE_TOKENS.get(version, {}).get((experts, n), 0)


def runs_architecture(version: tuple[int, int], architecture: str) -> bool:
    return architecture not in _MISSING_ARCHITECTURES.get(version, ())


# The Triton fused MoE's grid (fused_moe.py invoke_fused_moe_kernel: cdiv(sorted_token_ids.shape[0], BLOCK_SIZE_M)
# x cdiv(N, BLOCK_SIZE_N) programs) is sized by moe_align_block_size's buffer, max_num_tokens_padded, not by the
# blocks the routing fills; a program whose row block lies past num_tokens_post_padded returns at once
# (fused_moe_kernel: `if pid_m * BLOCK_SIZE_M >= num_tokens_post_padded: return`). Read from the wheels:
# - 0.4.4 through 0.4.9: topk_ids.numel() + E * (BLOCK_SIZE_M - 1); 0.4.10 through 0.5.6.post2: (E + 1) in place of E;
# - from 0.5.7 (SGLang PR #14133, after vLLM PR #29642): topk_ids.numel() * BLOCK_SIZE_M while numel < E + 1,
#   otherwise numel + (E + 1) * (BLOCK_SIZE_M - 1).
# At batch 1 with 128 experts, top 8 and 16-row blocks that is 121 row blocks before 0.5.7 and 8 from it; SGLang
# never took vLLM's clamp of the grid itself for batches under BLOCK_SIZE_M.
_TIGHT_MOE_ALIGN = (5, 7)


def fused_moe_tile_release(version: tuple[int, int]) -> str | None:
    """The release whose tuned fused-MoE config files (presets/fused_moe_tiles.yaml) stand for this one: 0.4.6.post1's
    for 0.4.6, 0.5.8's for 0.5.8 on (files added after 0.5.8 are not read); None for 0.4.4, whose files were not read
    (its calls take the default tile)."""
    if version == (4, 4):
        return None
    return "0.4.6" if version < CURRENT_RANGE[0] else "0.5.8"


# SM100 parts among simspec's GPU presets (is_sm100_supported: compute capability 10.x), by display name
_SM100 = ("B200",)


def target_moe_runs_triton(version: tuple[int, int], gpu_display_name: str, architecture: str,
                           expert_weights: str) -> bool:
    """Whether the target's routed experts run SGLang's Triton fused MoE. From 0.5.8 (server_args.__post_init__) an
    SM100 part switches the default MoE runner to flashinfer_trtllm for DeepseekV3ForCausalLM with FP8 weights and
    for Qwen3MoeForCausalLM with FP8 or unquantized ones; the draft's MoE keeps the Triton kernel
    (speculative_moe_runner_backend falls back to auto). simspec does not model flashinfer's kernel: it charges no
    grid for it."""
    if version < CURRENT_RANGE[0] or gpu_display_name not in _SM100:
        return True
    if architecture == "DeepseekV3ForCausalLM":
        return expert_weights not in ("fp8", "fp8-block128")
    if architecture == "Qwen3MoeForCausalLM":
        return expert_weights not in ("fp8", "fp8-block128", "bf16")
    return True


def tight_moe_align(version: tuple[int, int]) -> bool:
    """Whether this release sizes the fused-MoE alignment buffer for the pairs routed (0.5.7 on)."""
    return version >= _TIGHT_MOE_ALIGN


def fused_moe_padded_rows(tight: bool, pairs: int, experts: int, block_m: int) -> int:
    """Row blocks of the fused-MoE grid for `pairs` (token, expert) pairs over `experts` experts (as the kernel sees
    them) in blocks of `block_m` rows: max_num_tokens_padded / BLOCK_SIZE_M rounded up, under the tight rule (0.5.7
    on) or the worst-case one (before)."""
    if pairs <= 0:
        return 0
    if tight:
        padded = pairs * block_m if pairs < experts + 1 else pairs + (experts + 1) * (block_m - 1)
    else:
        padded = pairs + experts * (block_m - 1)
    return -(-padded // block_m)
