"""Which SGLang releases simspec models, and what about a release changes a prediction.

Two early-2025 releases are modelled besides 0.5.3 through 0.5.23, because published measurements were taken
on them: 0.4.4 (the EAGLE-3 paper's batch-size sweep, M3) and 0.4.6.post1 (the Qwen documentation's H20
speed benchmark). Everything below was read from each release's wheel; where a rule is not listed here, the
0.5.x rule applies to them too (see the not-modelled list in docs/time-model.md). 0.5.3 through 0.5.7 (each
.postN wheel read too) differ from 0.5.8 where the 0.5.x rules below say so; a few rules tell .postN releases
apart (release_key).

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
- model architectures: Qwen3 arrived in 0.4.6, GLM-4.7-Flash's in 0.5.8 and Kimi-K2.5's wrapper in 0.5.9
  (models/ of each wheel; _ARCHITECTURE_FROM).
- whether the Triton fused MoE swaps its operands for FP8 tiles under 64 rows on Hopper, so that they run on
  wgmma: not before 0.5.8; 0.5.8 on the H20 only; from 0.5.9 on every SM90 part (fused_moe_triton_kernels.py
  should_enable_swap_ab, after SGLang PRs #15712 and #16723).
- which expert shapes have a tuned fused-MoE config, and its tiles (presets/fused_moe_tiles.yaml, by release and
  from each file's `since`; from 0.5.5 a separate file for the w2 GEMM, read from 0.5.8: forward.MoeGrid, whose
  16-row range forward.moe_small_tiles reads); and DeepSeek-V3's
  shared expert fused into the routed ones where the Triton fused MoE runs (fused_shared_expert_copies): tp copies
  on SM90+ in 0.4.6 (the kernel sees 256 + tp experts), one from 0.5.3 on SM80+ (257), none in 0.4.4.
- how many row blocks the Triton fused MoE's grid launches at small batch (fused_moe_padded_rows): sized for the
  worst case before 0.5.7, for the pairs routed from 0.5.7.
- whether a decode CUDA graph is one straight chain of kernels, which sets its launch's host time
  (decode_graph_branches).
- where a v2 speculative iteration's host work waits for the last verify (v2_verify_wait).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simspec.presets import ModelPreset

EARLY_RELEASES = ((4, 4), (4, 6))  # (minor, patch) of the 0.4 releases read
CURRENT_RANGE = ((5, 3), (5, 23))  # every 0.5 release from 0.5.3 to 0.5.23, .postN ones included
MODELLED_TEXT = "0.4.4, 0.4.6 (0.4.6.post1) and 0.5.3 through 0.5.23"
VERSION_PATTERN = r"^0\.(\d+)\.(\d+)(\.post\d+)?$"

_ALGORITHMS_0_4_4 = ("none", "eagle", "mtp")
_ALGORITHMS_0_4_6 = ("none", "eagle", "eagle3", "mtp")
EARLY_AUTO_TREE = (5, 4, 8)
# the first release whose models/ defines an architecture of simspec's model presets (the others are in all)
_ARCHITECTURE_FROM = {
    "Qwen3ForCausalLM": (4, 6),  # models/qwen3.py: not in the 0.4.4 wheel
    "Qwen3MoeForCausalLM": (4, 6),
    "KimiK25ForConditionalGeneration": (5, 9),  # models/kimi_k25.py (0.5.3-0.5.8 have kimi_linear, kimi_vl only)
    "Glm4MoeLiteForCausalLM": (5, 8),  # models/glm4_moe_lite.py (GLM-4.7-Flash): not in the 0.5.7 wheel
}


def minor_patch(version: str) -> tuple[int, int]:
    """(minor, patch) of an SGLang version string "0.M.P" or "0.M.P.postN"."""
    return release_key(version)[:2]


def release_key(version: str) -> tuple[int, int, int]:
    """(minor, patch, post) of an SGLang version string: "0.5.4.post1" -> (5, 4, 1), "0.5.4" -> (5, 4, 0). Only the
    rules that changed within a patch release look at `post` (v2 workers, EAGLE-3 on DeepSeek, CUDA-graph sizes, B200
    MoE runners, trtllm_mha on Blackwell)."""
    m = re.match(VERSION_PATTERN, version)
    if m is None:
        raise ValueError(f"not an SGLang version 0.M.P[.postN]: {version!r}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)[5:]) if m.group(3) else 0


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


# DeepSeek-V3/R1's shared expert runs inside the routed experts' Triton fused MoE rather than as its own MLP
# (models/deepseek_v2.py, read from each wheel). 0.4.6 (determine_n_share_experts_fusion) clones it once per TP rank
# on SM90 and newer and routes each token to one clone at random (layers/moe/topk.py: torch.randint over the
# clones), so the kernel sees 256 + tp experts, 9 a token; from 0.5.3 (determine_num_fused_shared_experts) one copy,
# expert 256 of 257, which every token routes to, on SM80 and newer. Only DeepseekV3ForCausalLM with 256 routed
# experts and one shared one (Kimi-K2's 384 are not fused), without expert parallelism (simspec models none), and
# never under flashinfer_trtllm's MoE (server_args sets disable_shared_experts_fusion for it). 0.4.4 has no fusion.
# The MTP layer (DeepseekV3ForCausalLMNextN) makes the same choice. GLM-4.7-Flash (Glm4MoeLiteForCausalLM, 0.5.8 on)
# fuses its one shared expert the same way, whatever its routed count (models/glm4_moe_lite.py
# determine_num_fused_shared_experts: n_shared_experts == 1 on SM80+, no expert parallelism; 65 experts, 5 a token).
# (Every GPU preset is SM80 or newer; the SM90+ ones, by display name prefix, are _SM90_OR_NEWER below.)


def fuses_shared_expert(architecture: str, routed_experts: int, shared_experts: int) -> bool:
    """Whether SGLang can run this model's shared expert among its routed experts (above)."""
    if architecture == "Glm4MoeLiteForCausalLM":
        return shared_experts == 1
    return architecture == "DeepseekV3ForCausalLM" and routed_experts == 256 and shared_experts == 1


def fused_shared_expert_copies(version: tuple[int, int], gpu_display_name: str, architecture: str,
                               routed_experts: int, shared_experts: int, tp: int, moe_runs_triton: bool) -> int:
    """Copies of the shared expert among the routed experts of the fused MoE this release runs (above): 0 when the
    shared expert is its own MLP, 1 from 0.5.3, tp in 0.4.6."""
    if not moe_runs_triton or not fuses_shared_expert(architecture, routed_experts, shared_experts):
        return 0
    if version == (4, 6):
        return tp if gpu_display_name.startswith(_SM90_OR_NEWER) else 0
    return 1 if version >= CURRENT_RANGE[0] else 0


def runs_architecture(version: tuple[int, int], architecture: str) -> bool:
    return version >= _ARCHITECTURE_FROM.get(architecture, (0, 0))


# EAGLE-3 needs the target to expose its hidden states (set_eagle3_layers_to_capture, which ModelRunner calls for
# every EAGLE-3 target): models/deepseek_v2.py has it from 0.5.4.post2, so before that DeepseekV3ForCausalLM
# targets (DeepSeek-V3/R1, Kimi-K2) cannot run EAGLE-3 (the 0.5.3-0.5.4.post1 wheels).
EAGLE3_ON_DEEPSEEK_FROM = (5, 4, 2)


def runs_eagle3_on(release: tuple[int, int, int], architecture: str) -> bool:
    return not (architecture == "DeepseekV3ForCausalLM" and (5, 0) <= release < EAGLE3_ON_DEEPSEEK_FROM)


# The (num_steps, topk, num_draft_tokens) an EAGLE-family server picks when none is set
# (server_args.auto_choose_speculative_params): (3, 1, 4) for the DeepSeek-type architectures in every 0.5
# release; for every other architecture (5, 4, 8) through 0.5.7, (3, 1, 4) from 0.5.8 but for Llama and Grok.
# The DeepSeek-type list grows by release (Glm4Moe, MistralLarge3, MiMoV2Flash, ...); these are its 0.5.3 members.
_NARROW_AUTO_TREE = ("DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM",
                     "GptOssForCausalLM", "BailingMoeForCausalLM", "BailingMoeV2ForCausalLM")
_WIDE_AUTO_TREE_FROM_0_5_8 = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
NARROW_FALLBACK_FROM = (5, 8)


def auto_tree_is_wide(version: tuple[int, int], architecture: str) -> bool:
    """Whether an EAGLE-family server (not standalone) of this 0.5 release picks (5, 4, 8) for this architecture
    when no tree is set, rather than (3, 1, 4)."""
    if version < NARROW_FALLBACK_FROM:
        return architecture not in _NARROW_AUTO_TREE
    return architecture in _WIDE_AUTO_TREE_FROM_0_5_8


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


def fused_moe_tile_release(version: tuple[int, int], sections: Iterable[str]) -> str | None:
    """The section of presets/fused_moe_tiles.yaml (`sections`, by release) that stands for this release: 0.4.6.post1's
    for 0.4.6; 0.5.8's for 0.5.3 through 0.5.8, each file from its `since` on (the 0.5.3-0.5.7 wheels ship 0.5.8's
    files byte for byte, less the later ones); from 0.5.9 the newest section at or before the release (a later
    section is written where the tiles a release resolves change: calibration/read_fused_moe_tiles.py read 0.5.9
    through 0.5.23 with each one's own lookup); None for 0.4.4, whose files were not read (the default tile)."""
    if version == (4, 4):
        return None
    if version < CURRENT_RANGE[0]:
        return "0.4.6"
    later = [s for s in sections if (5, 8) <= minor_patch(s) <= version]
    return max(later, key=minor_patch) if later else "0.5.8"


# SM100 parts among simspec's GPU presets (is_sm100_supported: compute capability 10.x), by display name
_SM100 = ("B200",)
_HOPPER = ("H100", "H200", "H20")  # SM90 parts among simspec's GPU presets, by display name prefix

# MLA attention backends that take the rotary parts of q and k apart (deepseek_v2.py, from 0.5.9
# deepseek_common/utils.py: FORWARD_ABSORB_CORE_ATTENTION_BACKENDS, fa3, nsa, flashinfer, cutlass_mla, trtllm_mla)
# leave out the absorbed decode's two torch.cat copies (q_nope with q_pe, k_nope with k_pe). The backend SGLang picks
# for an MLA model when none is set (server_args: fa3 on Hopper, flashinfer on SM100, trtllm_mla there for
# DeepSeek-V3; triton elsewhere: Ampere, Ada, SM120) is one of them on Hopper and SM100. Read in the 0.5.3, 0.5.8 and
# 0.5.10 wheels; 0.4.x is counted as before (kernels.yaml per_layer).


def mla_takes_rope_apart(version: tuple[int, int], gpu_display_name: str) -> bool:
    """Whether this release's default MLA attention backend on this GPU takes q_rope and k_rope apart (above)."""
    return version >= CURRENT_RANGE[0] and (gpu_display_name.startswith(_HOPPER) or gpu_display_name in _SM100)

_FP8_EXPERTS = ("fp8", "fp8-block128")
# When an SM100 target's default MoE runner became flashinfer_trtllm (server_args
# _handle_model_specific_adjustments, read from each wheel):
# - DeepseekV3ForCausalLM: never in 0.5.3 and 0.5.3.post1; for modelopt_fp4 checkpoints only (no simspec format)
#   from 0.5.3.post2 through 0.5.4; for any weights in 0.5.4.post1-0.5.4.post3; from 0.5.5 for fp8 (and modelopt
#   fp8/fp4), where a checkpoint without quantization is first given "fp8" (online FP8 quantization, which simspec
#   does not model: it reads BF16 expert bytes), so BF16 switches too, in every release to 0.5.23.
# - Qwen3MoeForCausalLM: from 0.5.6 for fp8 (and modelopt_fp4); from 0.5.8 for unquantized (BF16) weights too.
DSV3_TRTLLM_ANY_FROM = (5, 4, 1)
DSV3_FP8_ONLY_FROM = (5, 5)
QWEN3_MOE_TRTLLM_FROM = (5, 6)
QWEN3_MOE_BF16_TRTLLM_FROM = (5, 8)
# From 0.5.7 a draft whose target runs flashinfer_trtllm gets speculative_moe_runner_backend "auto" (Triton); before,
# the draft's MoE runs the target's backend (0.5.5-0.5.6.post2: SPECULATIVE_MOE_RUNNER_BACKEND defaults to it).
DRAFT_MOE_OWN_RUNNER_FROM = (5, 7)


def target_moe_runs_triton(release: tuple[int, int, int], gpu_display_name: str, architecture: str,
                           expert_weights: str) -> bool:
    """Whether the target's routed experts run SGLang's Triton fused MoE in this release (minor, patch, post). On
    SM100 parts later releases switch the default MoE runner to flashinfer_trtllm (above). simspec does not model
    flashinfer's kernel: it charges no grid for it."""
    if release[:2] < CURRENT_RANGE[0] or gpu_display_name not in _SM100:
        return True
    if architecture == "DeepseekV3ForCausalLM":
        if release < DSV3_TRTLLM_ANY_FROM:
            return True
        if release < DSV3_FP8_ONLY_FROM:
            return False
        return expert_weights not in _FP8_EXPERTS + ("bf16",)
    if architecture == "Qwen3MoeForCausalLM":
        if release < QWEN3_MOE_TRTLLM_FROM:
            return True
        if release < QWEN3_MOE_BF16_TRTLLM_FROM:
            return expert_weights not in _FP8_EXPERTS
        return expert_weights not in _FP8_EXPERTS + ("bf16",)
    return True


def draft_moe_runs_triton(release: tuple[int, int, int], target_runs_triton: bool) -> bool:
    """Whether a draft's routed experts (an MTP layer, a standalone draft model) run the Triton fused MoE."""
    return True if release >= DRAFT_MOE_OWN_RUNNER_FROM else target_runs_triton


def shared_expert_copies(release: tuple[int, int, int], gpu_display_name: str, model: ModelPreset, tp: int,
                         draft_of: ModelPreset | None = None) -> int:
    """fused_shared_expert_copies for `model`'s layers under the MoE runner this release gives them: the target's,
    or, for a draft's layers (an MTP layer, a standalone draft model; `draft_of` = its target), the draft's."""
    target = draft_of if draft_of is not None else model
    triton = target_moe_runs_triton(release, gpu_display_name, target.architecture, target.weights.routed_experts)
    if draft_of is not None:
        triton = draft_moe_runs_triton(release, triton)
    return fused_shared_expert_copies(release[:2], gpu_display_name, model.architecture, model.num_routed_experts,
                                      model.num_shared_experts, tp, triton)


def tight_moe_align(version: tuple[int, int]) -> bool:
    """Whether this release sizes the fused-MoE alignment buffer for the pairs routed (0.5.7 on)."""
    return version >= _TIGHT_MOE_ALIGN


def moe_align_pads_experts_plus_one(version: tuple[int, int]) -> bool:
    """Whether the worst-case alignment buffer pads E + 1 experts (0.4.10 on) rather than E (0.4.4-0.4.9)."""
    return version >= (4, 10)


def fused_moe_padded_rows(tight: bool, pairs: int, experts: int, block_m: int, plus_one: bool = False) -> int:
    """Row blocks of the fused-MoE grid for `pairs` (token, expert) pairs over `experts` experts (as the kernel sees
    them) in blocks of `block_m` rows: max_num_tokens_padded / BLOCK_SIZE_M rounded up, under the tight rule (0.5.7
    on) or the worst-case one (before), which pads E experts (0.4.x) or E + 1 (`plus_one`: 0.4.10-0.5.6.post2)."""
    if pairs <= 0:
        return 0
    if tight:
        padded = pairs * block_m if pairs < experts + 1 else pairs + (experts + 1) * (block_m - 1)
    else:
        padded = pairs + (experts + 1 if plus_one else experts) * (block_m - 1)
    return -(-padded // block_m)


# v2 speculative workers (EAGLEWorkerV2, overlapped with the scheduler): none in 0.5.3 and 0.5.3.post1; switched on
# by --enable-beta-spec from 0.5.3.post2 through 0.5.4 and by SGLANG_ENABLE_SPEC_V2 from 0.5.4.post1 (simspec's
# server.spec_v2 stands for either); for EAGLE and EAGLE3 only until 0.5.8 adds a standalone v2 worker. Until 0.5.7
# nothing stops v2 with topk > 1 (0.5.7 added "Spec v2 currently only supports topk = 1"); simspec models v2 chains.
# (Until 0.5.6.post2 SGLANG_ENABLE_SPEC_V2 forces overlap on for EAGLE and leaves EAGLE3 at the overlap default,
# which is on: both then get EAGLEWorkerV2, as in 0.5.7 on.)
V2_WORKERS_FROM = (5, 3, 2)
STANDALONE_V2_FROM = (5, 8)
# Under v2 the draft's extend after a verify runs eagerly (EAGLEWorkerV2 calls the draft model's forward) until
# 0.5.5.post3 replays its CUDA graph; v1's runs in a graph in every 0.5 release.
V2_DRAFT_EXTEND_GRAPH_FROM = (5, 5, 3)


def has_v2_workers(release: tuple[int, int, int], algorithm: str) -> bool:
    if release[:2] < CURRENT_RANGE[0] or release < V2_WORKERS_FROM:
        return False
    return algorithm != "standalone" or release >= STANDALONE_V2_FROM


def v2_draft_extend_eager(release: tuple[int, int, int]) -> bool:
    return release < V2_DRAFT_EXTEND_GRAPH_FROM


# What a v2 speculative iteration's host work waits for (read from the wheels). Until 0.5.12 the scheduler builds the
# next batch only once the last verify has finished: ScheduleBatch.maybe_wait_verify_done synchronises on the
# verify_done event inside get_next_batch_to_run ("The batch has been launched but we need it verified to get correct
# next batch info"), so the batch building, the draft's preparation and the verify's launch run while the GPU has
# only the last iteration's draft extend and the new draft to do. 0.5.13 moves the wait to the start of run_batch
# (FutureMap.resolve_seq_lens_cpu: a D2H of the new sequence lengths gated on the verify's publish event), after the
# batch building, and skips it when every attention backend declares needs_cpu_seq_lens False
# (decide_needs_cpu_seq_lens). FlashAttention 3 does so for EAGLE and MTP from 0.5.16 (0.5.15: for DFlash only);
# triton and trtllm_mha by 0.5.15; FlashInfer never. The backend SGLang picks when none is set (0.5.16 and 0.5.23
# server_args, _get_default_attn_backend; topk 1 as v2 requires): an MHA model runs FA3 on Hopper, trtllm_mha on
# SM100 and FlashInfer elsewhere (Ampere, Ada, SM120), so it keeps waiting there; an MLA model runs FA3 on Hopper and
# triton on Ampere, Ada and SM120, so it does not. On SM100 an MLA model gets FlashInfer's MLA backend, which waits,
# unless a model override picks trtllm_mla (DeepSeek-V3); simspec takes no wait there.
V2_WAIT_AT_LAUNCH_FROM = (5, 13, 0)
V2_NO_WAIT_FROM = (5, 16, 0)


def v2_verify_wait(release: tuple[int, int, int], gpu_display_name: str, mla: bool) -> str | None:
    """Where a v2 iteration's host work waits for the last verify: "schedule" (before building the next batch),
    "launch" (after building it, before the draft's launch) or None (it does not), for this release's default
    attention backend on this GPU (above)."""
    if release < V2_WAIT_AT_LAUNCH_FROM:
        return "schedule"
    if release < V2_NO_WAIT_FROM:
        return "launch"
    flashinfer = not mla and not gpu_display_name.startswith(_HOPPER) and gpu_display_name not in _SM100
    return "launch" if flashinfer else None


# 0.5.3 through 0.5.6.post2 give the target's KV pool (and the scheduler's token budget) headroom for the draft's
# tokens when the algorithm is EAGLE-family or standalone (ModelRunner.init_memory_pool: draft_runner_cache_size =
# max_total_num_tokens + max_num_reqs x (num_steps x topk + num_draft_tokens) + 100); 0.5.7 dropped it.
DRAFT_KV_HEADROOM_UNTIL = (5, 7)


def draft_kv_headroom(version: tuple[int, int], algorithm: str, request_pool: int, steps: int, topk: int,
                      num_draft_tokens: int) -> int:
    """KV-cache tokens this release adds to the pool for a speculative server's drafts (above)."""
    if not CURRENT_RANGE[0] <= version < DRAFT_KV_HEADROOM_UNTIL or algorithm in ("none", "ngram"):
        return 0
    return request_pool * (steps * topk + num_draft_tokens) + 100


# The speculative CUDA-graph batch sizes (server_args._generate_cuda_graph_batch_sizes) stepped 40-60 by 4 and then
# 72 (range(40, 64, 4): a batch of 61-64 padded to 72) until 0.5.4.post2 took 64 in.
SPEC_GRAPH_64_FROM = (5, 4, 2)
# cuda_graph_max_bs for GPUs of 20-35 GiB at tp < 4: 16 until 0.5.4.post1 raised it to 24
# (_handle_gpu_memory_settings).
SMALL_GPU_GRAPH_BS_24_FROM = (5, 4, 1)


# 0.5.6.post1 and 0.5.6.post2 pick the trtllm_mha attention backend for an MHA target (not MLA) on Blackwell, SM100
# and SM120 alike (server_args._handle_attention_backend_compatibility: is_blackwell() and
# is_no_spec_infer_or_topk_one, true when no topk is given or topk is 1; it runs before the speculative settings are
# filled in, so an n-gram server, which sets its topk later, counts as no topk). Then:
# - on SM120 (the RTX PRO 6000s) the same function refuses it: "TRTLLM MHA backend is only supported on Blackwell
#   GPUs (SM100)". Every MHA server but an EAGLE one given topk > 1 fails to start.
# - on SM100 (B200) an EAGLE auto tree with topk > 1 is refused ("trtllm_mha backend only supports topk = 1"), so an
#   EAGLE server whose auto tree is wide does not start.
# 0.5.7 picks trtllm_mha on SM100 only, and only when the topk was given as 1 or speculation is off.
_TRTLLM_MHA_BLACKWELL_ANY = ((5, 6, 1), (5, 6, 2))
_SM120 = ("RTX PRO 6000",)
_SM90_OR_NEWER = _HOPPER + _SM100 + _SM120


def trtllm_mha_refused_on(release: tuple[int, int, int], gpu_display_name: str) -> bool:
    """Whether an MHA server given no topk or topk 1 fails to start here, trtllm_mha having been picked for an SM120
    part (above)."""
    return release in _TRTLLM_MHA_BLACKWELL_ANY and gpu_display_name.startswith(_SM120)


def auto_tree_fails_on(release: tuple[int, int, int], gpu_display_name: str) -> bool:
    """Whether an EAGLE-family server of an MHA model with a wide auto tree fails to start on this SM100 part
    (above)."""
    return release in _TRTLLM_MHA_BLACKWELL_ANY and gpu_display_name in _SM100


# The host time of a CUDA graph's launch (defaults.yaml graph_launch_us, graph_launch_per_node_us): CUDA 12.6 made
# a straight chain of kernels cost about the same to launch whatever its length; a graph with branches still pays
# for every node. What branches SGLang's decode graphs (read from the wheels):
#   - a collective through NCCL: its graph-mixing support joins NCCL's own stream to the captured one with event
#     nodes (pytorch/pytorch issue #180960: a captured NCCL collective brings EVENT_WAIT nodes, gone with
#     NCCL_GRAPH_MIXING_SUPPORT=0). At TP > 1 every forward all-gathers its logits through pynccl
#     (distributed/parallel_state.py _all_gather_into_tensor), whatever kernel runs its all-reduces;
#   - a second stream forked during capture: DeepSeek-V2/V3's attention norms (models/deepseek_v2.py, `alt_stream`
#     under get_is_capture_mode, from 0.4.7; deepseek_nextn.py's MTP layer too), and Qwen3's q and k norms
#     (qwen3.py, qwen3_moe.py, 0.4.9 through 0.5.6; from 0.5.7 models/utils.apply_qk_norm runs one fused in-place
#     kernel first, on one stream). Llama's graph (and an EAGLE head's, llama_eagle3.py) has no second stream.
DEEPSEEK_NORM_STREAM_FROM = (4, 7)
QWEN3_QK_NORM_STREAM = ((4, 9), (5, 7))  # [from, until)
# GLM-4.7-Flash (Glm4MoeLiteForCausalLM) runs DeepSeek-V2's attention and MoE classes but is not among them: its
# layer builds DeepseekV2AttentionMLA without the alt_stream (models/glm4_moe_lite.py, 0.5.8 and 0.5.10), and its
# MoE takes the second stream only when the shared expert is not fused (DeepseekV2MoE.forward), which it is on SM80+.
_DEEPSEEK_GRAPHS = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM", "KimiK25ForConditionalGeneration")
_QWEN3_GRAPHS = ("Qwen3ForCausalLM", "Qwen3MoeForCausalLM")


def decode_graph_branches(architecture: str | None, version: tuple[int, int], tp: int) -> bool:
    """Whether this release's decode CUDA graph of `architecture` (None: an EAGLE head, Llama-shaped) at `tp` has
    branches (above), so that its launch costs the host per node."""
    if tp > 1:
        return True
    if architecture in _DEEPSEEK_GRAPHS:
        return version >= DEEPSEEK_NORM_STREAM_FROM
    if architecture in _QWEN3_GRAPHS:
        return QWEN3_QK_NORM_STREAM[0] <= version < QWEN3_QK_NORM_STREAM[1]
    return False
