"""The time model's formulas against hand-computed figures."""

from __future__ import annotations

import copy
import dataclasses

import pytest

from simspec import presets
from simspec.scenario import releases
from simspec.scenario.loader import parse_scenario, resolve
from simspec.scenario.profile import CollectiveCurve
from simspec.timing.collectives import Collectives, ring_latency_us
from simspec.timing.forward import (
    MOE_BLOCK_ROWS,
    Efficiencies,
    ForwardModel,
    ForwardShape,
    distinct_experts,
    padded_rows,
)
from simspec.timing.iteration import IterationModel, captured_batch_sizes
from simspec.timing.stack import eagle_stack, target_stack

SMALL_FOR_PREFILL = {
    "name": "prefill", "hardware": {"gpu": "h100-pcie", "num_gpus": 1, "interconnect": "pcie5-nccl"},
    "model": "qwen3-14b", "server": {"tp": 1},
    "workload": {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 1,
                 "input_tokens": {"dist": "fixed", "value": 2048}, "output_tokens": {"dist": "fixed", "value": 4}},
}
IDEAL = Efficiencies(memory_bandwidth=1.0, compute=1.0, routing_locality=0.0, forward_overhead_ms=0.0,
                     kernel_gap_graph_us=0.0, small_kernel_us=0.0, layer_overhead_eager_us=0.0)


def test_distinct_experts_match_the_uniform_routing_figures():
    """E (1 - (1 - k/E)^T) on K2.5 (E = 384, k = 8): 8 at T = 1, 59.5 at T = 8, 109.8 at T = 16
    (hardware-and-models.md rounds these to ~61 and ~106)."""
    assert distinct_experts(384, 8, 1, 1, 0.0) == pytest.approx(8.0)
    assert distinct_experts(384, 8, 8, 8, 0.0) == pytest.approx(384 * (1 - (1 - 8 / 384) ** 8))
    assert distinct_experts(384, 8, 8, 8, 0.0) == pytest.approx(59.52, abs=0.01)
    assert distinct_experts(384, 8, 16, 16, 0.0) == pytest.approx(109.82, abs=0.01)


def test_routing_locality_only_discounts_tokens_after_the_first_of_a_sequence():
    # full locality: four tokens of one sequence reuse the first token's experts
    assert distinct_experts(384, 8, 1, 4, 1.0) == pytest.approx(8.0)
    # four separate sequences are independent whatever the locality
    assert distinct_experts(384, 8, 4, 4, 1.0) == pytest.approx(distinct_experts(384, 8, 4, 4, 0.0))


def test_locality_and_popularity_together_give_the_expert_union_a_router_counted():
    """Cohere's post on MoE speculative decoding (cohere.com/blog/mixture-of-experts-models-get-more-from-speculative-
    decoding, 2026-04-21; figures as summaries of it give them, headsupai.io and a research note) counted, on a
    production model of 128 experts and top 8, that consecutive tokens share 38.1% of their experts, that two
    unrelated tokens' sets overlap 11.8% (chance 6.25%: a popularity spread of 11.8 / 6.25 - 1 = 0.89), and that a
    four-token verify of one sequence at batch 1 loads 20.36 distinct experts a layer (2.55x a decode's). The union
    the model builds from the first two must land on the third: here 20.0."""
    union = distinct_experts(128, 8, 1, 4, 0.381, 11.8 / 6.25 - 1)
    assert union == pytest.approx(20.36, rel=0.05)
    # without the measured locality and popularity the same verify would load over two fifths more
    assert distinct_experts(128, 8, 1, 4, 0.0) > 1.4 * union


def test_expert_popularity_spread_matches_a_gamma_population_of_experts():
    """With each expert's chance of a pick drawn from a gamma law (mean 1/E, squared CV `spread`), the expected
    untouched share after T one-expert picks is the integral of (1 - q)^T over that law: the closed form must agree
    with the integral, and spread 0 must stay exactly uniform routing."""
    from scipy import integrate, stats

    experts, tokens = 4096, 2048
    for spread in (0.3, 0.9, 1.5):
        law = stats.gamma(a=1 / spread, scale=spread / experts)
        untouched, _ = integrate.quad(lambda q, law=law: (1 - q) ** tokens * law.pdf(q), 0, 1, limit=200,
                                      points=[1 / experts])
        assert distinct_experts(experts, 1, tokens, tokens, 0.0, spread) == pytest.approx(
            experts * (1 - untouched), rel=0.01)
    assert distinct_experts(64, 4, 32, 32, 0.0, 0.0) == pytest.approx(64 * (1 - (1 - 4 / 64) ** 32))


def test_popular_experts_leave_a_batch_fewer_distinct_experts_but_one_token_keeps_its_k():
    one = [distinct_experts(256, 8, 1, 1, 0.0, spread) for spread in (0.0, 0.55, 2.0)]
    assert one == pytest.approx([8.0, 8.0, 8.0], abs=0.05)
    batch = [distinct_experts(256, 8, 32, 32, 0.0, spread) for spread in (0.0, 0.55, 2.0)]
    assert batch[0] > batch[1] > batch[2] >= 8.0
    assert distinct_experts(256, 8, 10_000, 10_000, 0.0, 0.55) == pytest.approx(256, rel=1e-3)  # a prefill: all


def test_a_fused_moe_benchmarks_random_gating_keeps_uniform_routing():
    """Kernel tables draw random router logits: neither a model's locality nor its popularity spread applies."""
    from simspec.kernel_validation import default_efficiencies

    eff = default_efficiencies()
    assert eff.routing_locality == 0.0 and eff.routing_spread == 0.0


def test_llama_8b_weight_bytes_by_hand():
    """Per token, one GPU reads every weight but the embedding once: q,k,v,o + MLP per layer, and lm_head."""
    s = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    attention = (4096 * 4096 * 2 + 4096 * 1024 * 2) * 32
    mlp = 3 * 4096 * 14336 * 32
    head = 128256 * 4096
    assert sum(g.bytes_per_gpu for g in s.groups) == pytest.approx((attention + mlp + head) * 2)
    assert s.kv_bytes_per_token_per_gpu == 2 * 8 * 128 * 2 * 32  # K and V, 8 heads x 128, bf16, 32 layers
    assert s.all_reduces_per_forward == 0


def test_tensor_parallel_splits_weights_and_counts_collectives():
    m = presets.models()["llama-3.1-70b"]
    one, eight = target_stack(m, 1), target_stack(m, 8)
    assert sum(g.bytes_per_gpu for g in eight.groups) == pytest.approx(sum(g.bytes_per_gpu for g in one.groups) / 8)
    assert eight.all_reduces_per_forward == 2 * 80 + 1  # 2 per layer + the vocab-parallel embedding


def test_kernel_counts_follow_the_model_parts():
    """kernels.yaml by hand: a Llama layer (2 norms + 5 attention + 3 MLP kernels, 5 of them small) x 32 layers
    + 3 per forward (2 small); Qwen3 adds its QK norm; block-FP8 weights add one quant kernel per linear."""
    llama = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    assert (llama.kernels_per_forward, llama.small_kernels_per_forward) == (10 * 32 + 3, 5 * 32 + 2)
    bf16, fp8 = target_stack(presets.models()["qwen3-8b"], 1), target_stack(presets.models()["qwen3-8b-fp8"], 1)
    assert bf16.kernels_per_forward == 11 * 36 + 3
    assert fp8.kernels_per_forward - bf16.kernels_per_forward == 4 * 36
    assert fp8.small_kernels_per_forward - bf16.small_kernels_per_forward == 4 * 36
    # MLA + routed MoE + shared experts, every linear FP8 (DeepSeek-V3: 3 dense layers, 58 MoE layers)
    ds = presets.models()["deepseek-v3"]
    stack = target_stack(ds, tp=8)
    assert ds.num_dense_layers == 3 and ds.num_layers == 61
    per_dense = 2 + (12 + 3) + (3 + 2)
    per_moe = 2 + (12 + 3) + (7 + 2) + (3 + 2)
    assert stack.kernels_per_forward == 3 * per_dense + 58 * per_moe + 3


def test_draft_heads_count_their_own_kernels():
    """EAGLE-3 decode (llama_eagle3.py): 2 norms + hidden_norm, cat, attention 5, MLP 3, final norm, embedding,
    LM head = 15, 9 small. EAGLE-1/2 (llama_eagle.py): fc GEMM, cat, residual add, no layer-0 input norm, no
    final norm = 14, 7 small. MTP: one target layer and its forward + eh_proj, enorm, hnorm, cat."""
    from simspec.timing.stack import mtp_stack

    d = presets.drafters()
    e3 = eagle_stack(next(x for x in d.values() if x.algorithm == "eagle3" and x.weights == "bf16"), 1)
    e2 = eagle_stack(next(x for x in d.values() if x.algorithm == "eagle" and x.weights == "bf16"), 1)
    assert (e3.kernels_per_forward, e3.small_kernels_per_forward) == (15, 9)
    assert (e2.kernels_per_forward, e2.small_kernels_per_forward) == (14, 7)
    ds = presets.models()["deepseek-v3"]
    one_layer = target_stack(ds.model_copy(update={"num_layers": 1, "num_dense_layers": 0}), 8)
    mtp = mtp_stack(ds, 8)
    assert mtp.kernels_per_forward - one_layer.kernels_per_forward == 4
    assert mtp.small_kernels_per_forward - one_layer.small_kernels_per_forward == 3


def test_kernel_boundaries_and_small_kernels_cost_time_in_graphs_and_per_layer_dispatch_without():
    m = presets.models()["llama-3.1-8b"]
    gpu = presets.gpus()["h100-sxm"]
    stack = target_stack(m, 1)
    coll = Collectives(CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test"), 1, "nvlink")
    eff = dataclasses.replace(IDEAL, kernel_gap_graph_us=1.5, small_kernel_us=4.0, layer_overhead_eager_us=50.0)
    shape = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    bare = ForwardModel(stack, gpu, coll, IDEAL).cost(shape, 0, 0).compute_ms
    graph = ForwardModel(stack, gpu, coll, eff).cost(shape, 0, 0).compute_ms
    assert graph - bare == pytest.approx((stack.kernels_per_forward * 1.5 + stack.small_kernels_per_forward * 4.0)
                                         / 1e3)
    eager = ForwardModel(stack, gpu, coll, eff).cost(dataclasses.replace(shape, graph=False), 0, 0).compute_ms
    assert eager - bare == pytest.approx(50.0 * 32 / 1e3)
    # the fixed part of a streaming kernel: every kernel that is not small (GEMMs, attention), in graphs only
    ramp = dataclasses.replace(eff, streaming_kernel_us=3.0)
    ramped = ForwardModel(stack, gpu, coll, ramp).cost(shape, 0, 0).compute_ms
    streaming = stack.kernels_per_forward - stack.small_kernels_per_forward
    assert streaming == 32 * 5 + 1  # per layer: qkv, attention, o_proj, gate_up, down; the LM head (the embedding
    # lookup is counted small)
    assert ramped - graph == pytest.approx(streaming * 3.0 / 1e3)
    assert ForwardModel(stack, gpu, coll, ramp).cost(dataclasses.replace(shape, graph=False), 0, 0).compute_ms \
        == pytest.approx(eager)


def test_mla_latent_cache_is_replicated_across_tp_ranks():
    """MLA keeps one latent KV head (512 + 64 dims): 576 x 2 B x 61 layers on every rank."""
    s = target_stack(presets.models()["kimi-k2.5"], tp=8)
    assert s.kv_bytes_per_token_per_gpu == 70_272
    assert s.all_reduces_per_forward == 123  # 2 x 61 + 1, as sglang.md counts for DeepSeek-style models


def test_decode_forward_is_memory_bound_at_full_bandwidth():
    gpu = presets.gpus()["h100-sxm"]
    s = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    fm = ForwardModel(s, gpu, Collectives(curve, 1, "nvlink"), IDEAL)
    shape = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    cost = fm.cost(shape, context_tokens=0, attention_pairs=0)
    expected_ms = 15_009_316_864 / 3.35e12 * 1e3  # bytes above / 3,350 GB/s
    assert cost.compute_ms == pytest.approx(expected_ms)
    assert cost.roofline_ms == pytest.approx(expected_ms)
    assert cost.comm_ms == 0.0


def test_large_batches_become_compute_bound():
    gpu = presets.gpus()["h100-sxm"]
    s = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    fm = ForwardModel(s, gpu, Collectives(curve, 1, "nvlink"), IDEAL)
    t = 8192
    cost = fm.cost(ForwardShape(num_seqs=t, tokens=t, real_seqs=t, real_tokens=t, logit_tokens=t, graph=False),
                   0, 0)
    flops = sum(g.flops_per_token for g in s.groups) * t
    assert cost.compute_ms == pytest.approx(flops / 989e12 * 1e3)  # bf16 dense peak


def test_a_power_capped_card_runs_compute_bound_gemms_at_its_sustained_peak():
    """The H100 PCIe's 350 W cap holds its clock below boost under tensor load (gpus.yaml sustained_tensor_fraction):
    a large batch's linears take the datasheet's time over the measured fraction, FP8's more than BF16's."""
    gpu = presets.gpus()["h100-pcie"]
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    t = 8192
    for model, peak, fraction in (("qwen3-14b", 756e12, 0.81), ("qwen3-14b-fp8", 1513e12, 0.66)):
        s = target_stack(presets.models()[model], tp=1)
        groups = [g for g in s.groups if g.name != "lm_head"]  # the LM head is BF16 in both checkpoints
        assert {g.compute for g in groups} == {"fp8" if model.endswith("fp8") else "bf16"}
        fm = ForwardModel(s, gpu, Collectives(curve, 1, "nvlink"), IDEAL)
        linears = sum(fm._time(g.bytes_per_gpu, g.flops_per_token * t, g.compute) for g in groups)
        flops = sum(g.flops_per_token for g in groups) * t
        assert linears == pytest.approx(flops / (peak * fraction))
    assert gpu.sustained_tflops("fp8") / gpu.peak_tflops("fp8") < gpu.sustained_tflops("bf16") / gpu.peak_tflops("bf16")
    sxm = presets.gpus()["h100-sxm"]  # no shortfall measured: the datasheet's peak
    assert sxm.sustained_tflops("fp8") == sxm.peak_tflops("fp8")


def test_a_prediction_on_a_power_capped_card_says_where_its_sustained_peak_comes_from():
    from simspec.predict import sources
    from simspec.scenario.loader import parse_scenario, resolve
    from tests.conftest import SMALL

    pcie = resolve(parse_scenario(SMALL | {"hardware": {"gpu": "h100-pcie", "num_gpus": 1,
                                                        "interconnect": "pcie5-nccl"}}, "t.yaml"), "t.yaml")
    said = sources(pcie)["sustained_tensor_fraction"]
    assert said.startswith("bf16 0.81, fp8 0.66 of the datasheet's peak") and "pytorch/ao PR #3342" in said
    assert "sustained_tensor_fraction" not in sources(resolve(parse_scenario(SMALL, "t.yaml"), "t.yaml"))


def test_attention_core_runs_at_the_bf16_peak_whatever_the_weights():
    """A long prefill's QK^T and PV read a BF16 KV cache: FP8 projection weights do not make them FP8. The same
    attention over the same context costs the same for Qwen3-30B-A3B and its FP8 checkpoint, at the BF16 peak."""
    gpu = presets.gpus()["h20"]
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    shape = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=False)
    pairs = 8192 * 8193 / 2  # one 8,192-token prompt, causal

    def attention_ms(model: str) -> float:
        s = target_stack(presets.models()[model], tp=1)
        fm = ForwardModel(s, gpu, Collectives(curve, 1, "nvlink"), IDEAL)
        return fm.cost(shape, 0, pairs).compute_ms - fm.cost(shape, 0, 0).compute_ms

    bf16, fp8 = attention_ms("qwen3-30b-a3b"), attention_ms("qwen3-30b-a3b-fp8")
    flops = target_stack(presets.models()["qwen3-30b-a3b"], tp=1).attn_flops_per_pair * pairs
    assert fp8 == pytest.approx(bf16)
    assert bf16 == pytest.approx(flops / 148e12 * 1e3)  # the H20's BF16 peak, not its 296 FP8 TFLOPS


def test_small_gemms_pay_whole_tensor_core_tiles():
    assert [padded_rows(t, 64) for t in (0, 1, 64, 65)] == [0, 64, 64, 128]
    assert padded_rows(5, 16) == 16


def test_single_token_decode_on_the_h20_is_bound_by_padded_tensor_core_work():
    """The H20 pairs 4 TB/s with 148 BF16 TFLOPS: one token padded to Hopper's 64-row wgmma costs more tensor
    time than streaming the weights; on the H100 the same padding hides under the weight stream."""
    s = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    shape = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=False)
    bytes_ = sum(g.bytes_per_gpu for g in s.groups)
    padded_flops = sum(g.flops_per_token for g in s.groups) * 64
    assert padded_flops / 148e12 > bytes_ / 4.0e12
    h20 = ForwardModel(s, presets.gpus()["h20"], Collectives(curve, 1, "nvlink"), IDEAL).cost(shape, 0, 0)
    assert h20.compute_ms == pytest.approx(padded_flops / 148e12 * 1e3, rel=0.02)  # a few groups stay memory-bound
    h100 = ForwardModel(s, presets.gpus()["h100-sxm"], Collectives(curve, 1, "nvlink"), IDEAL).cost(shape, 0, 0)
    assert h100.compute_ms == pytest.approx(bytes_ / 3.35e12 * 1e3)


def test_each_touched_expert_runs_a_whole_fused_moe_block():
    s = target_stack(presets.models()["qwen3-30b-a3b"], tp=1)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    slow = presets.gpus()["h20"].model_copy(update={"bf16_tflops": 10.0})  # compute-bound everywhere
    fm = ForwardModel(s, slow, Collectives(curve, 1, "nvlink"), IDEAL)
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=False)
    dense = sum(max(g.bytes_per_gpu / 4e12, g.flops_per_token * 64 / 10e12) for g in s.groups)
    # one token routed to 8 experts: each runs a 16-row block, 16 x the 8 token-expert pairs' work
    experts = 8 * MOE_BLOCK_ROWS * s.expert_flops_per_token / s.experts_per_token / 10e12
    # silu_and_mul and moe_sum_reduce move the 8 pairs' activations (w13 out, silu out, w2 out) and the summed row
    between = 2 * 48 * (8 * 3 * 768 + 8 * 2048 + 2048) / 4e12
    assert fm._weights(one)[0] == pytest.approx(dense + experts + between)


def test_a_grids_row_blocks_run_whole_and_the_default_wide_tile_at_its_gpus_rate():
    """With the release's tile known, the tensor cores run every row block a touched expert fills, whole: 256 tokens
    over 128 experts (top 8) give ~16 rows an expert, one 64-row block each under the default heuristic's wide tile,
    8,192 rows of work for 2,048 pairs. Where the GPU has a rate for that tile (moe_default_tile_tflops) the GEMMs run
    at it, capped by the dense rate; a tuned config's tile of the same size, or calls up to E tokens (16-row tiles),
    keep the dense rate."""
    from simspec.timing.forward import MoeGrid

    s = target_stack(presets.models()["qwen3-30b-a3b"], tp=1)
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    gpu = presets.gpus()["h20"].model_copy(update={"bf16_tflops": 10.0, "moe_default_tile_tflops": 4.0})
    default = MoeGrid(tight=True, experts=128, weights="bf16", heuristic=True)
    tuned = MoeGrid(tight=True, experts=128, weights="bf16", tiles=((1, 64, 64),))

    def moe(grid, tokens):
        fm = ForwardModel(s, gpu, Collectives(curve, 1, "nvlink"), IDEAL, moe_grid=grid)
        shape = ForwardShape(num_seqs=tokens, tokens=tokens, real_seqs=tokens, real_tokens=tokens,
                             logit_tokens=tokens, graph=True)
        return fm._moe(shape)[0], fm.moe_kernels(shape), fm._touched_experts(shape)

    per_row = s.expert_flops_per_token / s.experts_per_token  # one (token, expert) row through all MoE layers
    for grid in (default, tuned):
        _, kernels, touched = moe(grid, 256)
        assert touched == pytest.approx(128, abs=0.5)
        assert sum(f for _, _, f in kernels) == pytest.approx(per_row * touched * 64)  # not 2,048 rows, nor 16 each
    assert default.runs_default_wide_tile(256) and not tuned.runs_default_wide_tile(256)
    assert not default.runs_default_wide_tile(128)  # up to E tokens the heuristic takes 16 x 32 tiles

    def by_hand(kernels, rate):
        return sum(max(b / 4e12, f / rate) if f else b / 4e12 for _, b, f in kernels)

    t, kernels, _ = moe(default, 256)
    assert t == pytest.approx(by_hand(kernels, 4e12))
    t, kernels, _ = moe(tuned, 256)
    assert t == pytest.approx(by_hand(kernels, 10e12))
    t, kernels, _ = moe(default, 128)
    assert t == pytest.approx(by_hand(kernels, 10e12))
    capped = gpu.model_copy(update={"moe_default_tile_tflops": 40.0})  # a rate above the dense one does not apply
    fm = ForwardModel(s, capped, Collectives(curve, 1, "nvlink"), IDEAL, moe_grid=default)
    shape = ForwardShape(num_seqs=256, tokens=256, real_seqs=256, real_tokens=256, logit_tokens=256, graph=True)
    assert fm._moe(shape)[0] == pytest.approx(by_hand(fm.moe_kernels(shape), 10e12))


def _moe_by_hand(t: int, touched: float, layers: int, h: int, w: int, k: int, weight_b: float, in_b: float):
    """(kernel, bytes, FLOPs) of Triton's fused MoE over t tokens, written out from the kernels' reads and writes."""
    pairs = t * k
    weights = touched * 3 * h * w * weight_b * layers
    flops = pairs * 3 * h * w * 2 * layers
    return {
        "w13": (weights * 2 / 3 + layers * pairs * (in_b * h + 2 * 2 * w), flops * 2 / 3),  # gather h, write 2w
        "silu_and_mul": (layers * pairs * (2 * 2 * w + 2 * w), 0.0),  # read 2w, write w
        "w2": (weights / 3 + layers * pairs * (in_b * w + 2 * h), flops / 3),  # read w, write a hidden row
        "moe_sum_reduce": (layers * (pairs * 2 * h + t * 2 * h), 0.0),  # read k rows, write one per token
    }


def _prefill_model(model: str, gpu, tp: int, t: int) -> tuple[ForwardModel, ForwardShape]:
    """A forward model with ideal efficiencies and flat collectives, and a t-token prefill shape."""
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    fm = ForwardModel(target_stack(presets.models()[model], tp=tp), gpu, Collectives(curve, tp, "nvlink"), IDEAL)
    return fm, ForwardShape(num_seqs=t, tokens=t, real_seqs=t, real_tokens=t, logit_tokens=t, graph=False)


def test_a_prefill_streams_the_elementwise_kernels_activations_and_a_decode_step_does_not():
    """Qwen3-14B-FP8 at TP 1, per token, by hand from kernels.yaml's per-layer kernels: two fused_add_rmsnorm (read
    hidden and residual, write both: 4 x 5,120 BF16), the q/k norm and the rotary (read and write q, 5,120, and k,
    1,024), the KV store (read k and v, write the cache), the attention's q in and output out, silu_and_mul (read
    2 x 17,408, write 17,408), and a per-token FP8 quantisation (BF16 read, FP8 written) before each of the four
    linears (inputs 5,120, 5,120, 5,120, 17,408 wide). A prefill of 8,192 tokens streams them on top of its GEMMs;
    a decode step of as many rows in a CUDA graph (kept in the L2) does not."""
    h, q, kv, inter = 5120, 5120, 1024, 17408
    layer = (2 * 4 * h + 2 * (q + kv) + 2 * (q + kv) + 4 * kv + 2 * q + 3 * inter) * 2 + (h + q + h + inter) * 3
    stack = target_stack(presets.models()["qwen3-14b-fp8"], tp=1)
    assert stack.elementwise_bytes_per_token == pytest.approx(40 * layer)
    assert target_stack(presets.models()["qwen3-14b"], tp=1).elementwise_bytes_per_token == pytest.approx(
        40 * (layer - (h + q + h + inter) * 3))  # BF16 linears: no quantisation kernels
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    gpu = presets.gpus()["h100-pcie"]
    fm = ForwardModel(stack, gpu, Collectives(curve, 1, "nvlink"), IDEAL)
    t = 8192
    plain = ForwardShape(num_seqs=4, tokens=t, real_seqs=4, real_tokens=t, logit_tokens=4, graph=False)
    prefill = dataclasses.replace(plain, prefill=True)
    extra = t * 40 * layer / (gpu.memory_bandwidth_gbps * 1e9)
    assert fm._weights(prefill)[0] - fm._weights(plain)[0] == pytest.approx(extra)
    assert fm._weights(prefill)[2] - fm._weights(plain)[2] == pytest.approx(extra)  # in the roofline too
    assert extra > 0.25 * fm._weights(plain)[0]  # a quarter of the GEMMs' time and more on this card
    # IterationModel's prefills are such forwards; its decode steps are not
    rs = resolve(parse_scenario(dict(SMALL_FOR_PREFILL, model="qwen3-14b-fp8"), "t.yaml"), "t.yaml")
    im = IterationModel(rs)
    with_bytes = im.prefill([2048] * 4).verify_compute_ms
    im.target.stack = dataclasses.replace(im.target.stack, elementwise_bytes_per_token=0.0)
    im.target._cache.clear()
    assert with_bytes > im.prefill([2048] * 4).verify_compute_ms


def _assert_kernels_match(fm: ForwardModel, shape: ForwardShape, hand: dict) -> None:
    got = {name: (b, f) for name, b, f in fm.moe_kernels(shape)}
    assert set(got) == set(hand)
    for name in hand:
        assert got[name] == pytest.approx(hand[name]), name


def test_fused_moe_prefill_moves_every_token_expert_pair_at_full_hidden_width():
    """Qwen3-235B-A22B at TP 8 (94 MoE layers, 128 experts, top-8, hidden 4,096, 192 intermediate columns per GPU)
    prefilling 8,192 tokens on an H100, kernel by kernel, by hand. The w13 GEMM gathers a 4,096-wide row per
    (token, expert) pair and writes 384 columns; the w2 GEMM writes a 4,096-wide row per pair, which
    moe_sum_reduce reads back. These activations and the experts' weights, not the 192-column GEMMs' FLOPs, set
    the time."""
    t = 8192
    fm, shape = _prefill_model("qwen3-235b-a22b", presets.gpus()["h100-sxm"], 8, t)
    touched = distinct_experts(128, 8, t, t, 0.0)
    assert touched == pytest.approx(128)
    hand = _moe_by_hand(t, touched, layers=94, h=4096, w=192, k=8, weight_b=2, in_b=2)
    _assert_kernels_match(fm, shape, hand)
    bw, peak = 3.35e12, 989e12
    compute, roof = fm._moe(shape)
    assert compute == pytest.approx(sum(max(b / bw, f / peak) for b, f in hand.values()))
    assert roof == pytest.approx(sum(b for b, _ in hand.values()) / bw)
    weights = touched * 3 * 4096 * 192 * 2 * 94
    flops = t * 8 * 3 * 4096 * 192 * 2 * 94
    assert compute > 1.5 * max(weights / bw, flops / peak)  # one roofline over the weights alone: far too cheap
    # at decode the activations are noise beside the touched experts' weights
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    n1 = distinct_experts(128, 8, 1, 1, 0.0)
    assert fm._moe(one)[0] == pytest.approx(n1 * 3 * 4096 * 192 * 2 * 94 / bw, rel=0.02)


def test_each_fused_moe_gemm_pays_its_own_roofline():
    """With tensor throughput set between the two GEMMs' ridge points, the w13 GEMM (two thirds of the FLOPs) is
    compute-bound while the w2 GEMM (one third) stays memory-bound: the sum of per-kernel maxima, not one max."""
    t = 1024
    hand = _moe_by_hand(t, distinct_experts(128, 8, t, t, 0.0), layers=94, h=4096, w=192, k=8, weight_b=2, in_b=2)
    bw = 3.35e12
    (b13, f13), (b2, f2) = hand["w13"], hand["w2"]
    peak = ((f13 * bw / b13) * (f2 * bw / b2)) ** 0.5  # between w2's ridge and w13's
    assert f13 / peak > b13 / bw and f2 / peak < b2 / bw
    gpu = presets.gpus()["h100-sxm"].model_copy(update={"bf16_tflops": peak / 1e12})
    fm, shape = _prefill_model("qwen3-235b-a22b", gpu, 8, t)
    between = (hand["silu_and_mul"][0] + hand["moe_sum_reduce"][0]) / bw
    assert fm._moe(shape)[0] == pytest.approx(f13 / peak + b2 / bw + between)


def test_fp8_experts_read_their_gemm_inputs_in_fp8():
    """DeepSeek-V3's experts are FP8 (w8a8, 128x128 blocks): fused_moe quantizes each GEMM's input rows, so the
    w13 gather and the w2 input move one byte per element; outputs stay BF16."""
    t = 4096
    fm, shape = _prefill_model("deepseek-v3", presets.gpus()["h200-sxm"], 8, t)
    touched = distinct_experts(256, 8, t, t, 0.0)
    w = 2048 // 8
    weight_b = fm.stack.expert_bytes_per_gpu / (3 * 7168 * w)
    _assert_kernels_match(fm, shape, _moe_by_hand(t, touched, layers=58, h=7168, w=w, k=8, weight_b=weight_b, in_b=1))


def test_all_reduce_curve_interpolates_and_extends_with_bus_bandwidth():
    """Past its last point a measured curve goes on in the protocol NCCL runs there: measured in LL only (NCCL's own
    model keeps LL on 8 PCIe GPUs up to (88.2 - 20.6) us / the difference of LL's and Simple's costs per byte,
    ~1.5 MB at 40 GB/s), at LL's bus bandwidth term (half the bus bandwidth), whatever its last segment's slope;
    past that switch, at Simple's latency and the full bus bandwidth."""
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1024, 10.0), (5120, 30.0)], bus_bandwidth_gbps=40.0,
                            source="test")
    c = Collectives(curve, 8, "pcie")
    assert c.all_reduce_us(100) == 10.0  # flat below the first point
    assert c.all_reduce_us(3072) == pytest.approx(20.0)  # linear between points
    assert c.all_gather_us(2048) == c.all_reduce_us(1024)
    simple_per_byte = 2 * 7 / 8 / 40e9 * 1e6
    switch = (8.4 + 14 * 5.7 - (6.6 + 14 * 1.0)) / simple_per_byte  # LL's cost per byte is twice Simple's
    assert switch == pytest.approx(1.545e6, rel=1e-3)
    assert c.all_reduce_us(20_000) == pytest.approx(30.0 + (20_000 - 5120) * 2 * simple_per_byte)
    assert c.all_reduce_us(1_500_000) == pytest.approx(30.0 + (1_500_000 - 5120) * 2 * simple_per_byte)
    assert c.all_reduce_us(2_000_000) == pytest.approx(8.4 + 14 * 5.7 + 2_000_000 * simple_per_byte)
    # a curve measured past the switch, in Simple, grows at the full bus bandwidth from its last point
    long = Collectives(CollectiveCurve(measured_gpus=8, points_bytes_us=[(1024, 24.0), (4_194_304, 200.0)],
                                       bus_bandwidth_gbps=40.0, source="test"), 8, "pcie")
    assert long.all_reduce_us(2**26) == pytest.approx(200.0 + (2**26 - 4_194_304) * simple_per_byte)
    # over NVLink NCCL also runs LL128, which takes over from LL sooner
    nv = Collectives(CollectiveCurve(measured_gpus=8, points_bytes_us=[(1024, 15.0)], bus_bandwidth_gbps=365.0,
                                     source="test"), 8, "nvlink")
    ll128 = 14.0 + 14 * 1.9 + 2**24 * 2 * 7 / 8 / (0.92 * 365e9) * 1e6
    assert nv.all_reduce_us(2**24) == pytest.approx(ll128)


def test_a_curve_measured_at_small_messages_goes_on_at_nccls_ll_rate_as_a_measured_box_does():
    """One dual-socket box of 8 RTX PRO 6000 (validation/kernels/rtx6kpro-nccl-allreduce-turin-8-to-4-gpus: nccl-tests
    bus bandwidth 4.96 GB/s at 64 KB, 9.36 at 256 KB, 13.06 at 512 KB, 16.47 at 1 MB, 19.10 at 2 MB; 40.39 at
    16 MB). Given its 64 KB point alone and the large-message bus bandwidth, the curve's continuation at LL's cost
    per byte lands within 20% of the measured 256 KB-2 MB times (-18, -9, -1, -7%), where growing at the full bus
    bandwidth from the last point missed them by 35-42%."""
    def time_us(nbytes: int, busbw: float) -> float:
        return nbytes / (busbw * 1e9) * 2 * 7 / 8 * 1e6

    measured = {262144: 9.36, 524288: 13.06, 1048576: 16.47, 2097152: 19.10}
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(65536, time_us(65536, 4.96))],
                            bus_bandwidth_gbps=40.39, source="test")
    c = Collectives(curve, 8, "pcie")
    for nbytes, busbw in measured.items():
        truth = time_us(nbytes, busbw)
        assert c.all_reduce_us(nbytes) == pytest.approx(truth, rel=0.2)
        simple_tail = time_us(65536, 4.96) + (nbytes - 65536) * 2 * 7 / 8 / 40.39e9 * 1e6
        assert simple_tail < 0.66 * truth


def test_all_reduce_latency_moves_with_gpu_count_by_ncclring_model():
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1024, 20.6)], source="test")
    assert ring_latency_us(8, "pcie") == pytest.approx(20.6)
    assert Collectives(curve, 4, "pcie").all_reduce_us(512) == pytest.approx(6.6 + 2 * 3 * 1.0)
    assert Collectives(curve, 1, "pcie").all_reduce_us(512) == 0.0


def test_a_curve_derived_from_nccls_model_takes_its_fastest_ring_protocol():
    """NCCL's tuning model on 8 H100s (nvlink4-nccl): LL's 15 us latency with its bus bandwidth capped at 141 GB/s
    (Hopper's llMaxBws), LL128 from 14 + 14 x 1.9 us at 0.92 of the link, Simple from 8.4 + 14 x 3.4 us at the
    link's 365 GB/s. A 1 MiB message still goes by LL, at about 28 us, not 20 us as LL's latency and Simple's
    bandwidth would give; LL128 takes over near 3.5 MB and Simple past ~40 MB."""
    from simspec.scenario.loader import preset_curve

    c = Collectives(preset_curve("nvlink4-nccl"), 8, "nvlink")
    per_byte = {bw: 2 * 7 / 8 / (bw * 1e9) * 1e6 for bw in (141.0, 0.92 * 365, 365.0)}
    ll = 15.0 + (2**20 - 256) * per_byte[141.0]
    assert c.all_reduce_us(2**20) == pytest.approx(ll)
    assert 27 < ll < 29
    assert c.all_reduce_us(8 * 2**20) == pytest.approx(14.0 + 14 * 1.9 + 8 * 2**20 * per_byte[0.92 * 365])
    assert c.all_reduce_us(2**30) == pytest.approx(8.4 + 14 * 3.4 + 2**30 * per_byte[365.0])
    assert c.all_reduce_us(256) == pytest.approx(15.0)  # small messages: LL's latency, as before
    # no protocol is faster than the model says: the LL-latency-plus-Simple-bandwidth floor is never crossed
    hybrid = Collectives(preset_curve("nvlink4-nccl").model_copy(update={"nccl_ring": None}), 8, "nvlink")
    sizes = [2**k for k in range(8, 32)]
    times = [c.all_reduce_us(s) for s in sizes]
    assert times == sorted(times)
    assert all(c.all_reduce_us(s) >= hybrid.all_reduce_us(s) - 1e-9 for s in sizes)
    # over PCIe NCCL runs no LL128, and LL carries half the link (below any generation's cap)
    pcie = Collectives(preset_curve("pcie4-nccl"), 8, "pcie")
    simple = 8.4 + 14 * 5.7 + 2**26 * 2 * 7 / 8 / 20e9 * 1e6
    assert pcie.all_reduce_us(2**26) == pytest.approx(simple)
    assert pcie.all_reduce_us(2**16) == pytest.approx(20.6 + (2**16 - 256) * 2 * 7 / 8 / 10e9 * 1e6)


def test_a_curve_derived_from_nccls_model_needs_its_simple_bandwidth():
    from pydantic import ValidationError

    from simspec.presets import NcclRingModel

    with pytest.raises(ValidationError, match="bus_bandwidth_gbps"):
        CollectiveCurve(measured_gpus=8, points_bytes_us=[(256, 15.0)], source="test",
                        nccl_ring=NcclRingModel(ll_max_bus_bandwidth_gbps=141.0, ll128=True))


def test_pcie_custom_all_reduce_helps_below_its_crossover_and_follows_nccl_above():
    """Both PCIe presets come from one box's measured table (interconnects.yaml sources): the custom kernel wins
    below 32 KB and hands larger messages to NCCL, so a 12-token verify of Kimi's 7168-wide hidden state (172 KB)
    costs the same on both, where the kernel alone would take ~2x longer."""
    from simspec.scenario.loader import preset_curve

    nccl = Collectives(preset_curve("pcie5-nccl"), 8, "pcie")
    custom = Collectives(preset_curve("pcie5-custom-allreduce"), 8, "pcie")
    kernel_only = Collectives(preset_curve("pcie5-custom-allreduce").model_copy(update={"fallback": None}), 8, "pcie")
    one_token, ngram_verify = 7168 * 2, 12 * 7168 * 2
    assert custom.all_reduce_us(1024) == pytest.approx(7.5) and nccl.all_reduce_us(1024) == pytest.approx(24.3)
    assert custom.all_reduce_us(one_token) < 0.6 * nccl.all_reduce_us(one_token)
    assert custom.all_reduce_us(ngram_verify) == pytest.approx(nccl.all_reduce_us(ngram_verify))
    assert kernel_only.all_reduce_us(ngram_verify) > 1.8 * nccl.all_reduce_us(ngram_verify)
    assert kernel_only.all_reduce_us(65536) == pytest.approx(25.9)
    assert nccl.all_reduce_us(262144) == pytest.approx(28.0)  # measured, not the bus-bandwidth extension (~32 us)
    for tp in (2, 4, 8):  # the faster of the two at every size, whatever the group
        c, n = (Collectives(preset_curve(name), tp, "pcie") for name in ("pcie5-custom-allreduce", "pcie5-nccl"))
        for size in (256, 4096, 32768, 65536, 200_000, 10_000_000):
            assert c.all_reduce_us(size) <= n.all_reduce_us(size)


def test_an_interconnect_fallback_must_be_an_nccl_preset_on_the_same_link(monkeypatch):
    from simspec import presets as p

    real = p._load

    def patched(name):
        data = real(name)
        if name == "interconnects.yaml":
            data = dict(data)
            data["pcie5-custom-allreduce"] = dict(data["pcie5-custom-allreduce"], fallback="nvlink4-nccl")
        return data

    monkeypatch.setattr(p, "_load", patched)
    p.interconnects.cache_clear()
    try:
        with pytest.raises(ValueError, match="same link"):
            p.interconnects()
    finally:
        p.interconnects.cache_clear()


def test_eagle3_drafter_parameters_match_the_reference():
    """hardware-and-models.md derives ~1.19B for the K2/K2.5 EAGLE-3 head and ~0.42B for Llama-3.1-8B's."""
    d = presets.drafters()
    assert eagle_stack(d["eagle3-kimi-k2.5"], 1).total_params / 1e9 == pytest.approx(1.19, abs=0.01)
    assert eagle_stack(d["eagle3-llama-3.1-8b"], 1).total_params / 1e9 == pytest.approx(0.42, abs=0.01)


def test_captured_batch_sizes_follow_sglang():
    sizes = captured_batch_sizes(300, speculative=True)
    assert sizes[:10] == [1, 2, 3, 4, 5, 6, 7, 8, 10, 12]
    assert 32 in sizes and 34 not in sizes and 36 not in sizes and 40 in sizes and 44 in sizes
    assert 72 in sizes and 80 in sizes and 256 in sizes and 264 not in sizes and 272 in sizes and 288 in sizes
    assert sizes[-1] == 300  # cuda_graph_max_bs itself is always captured
    plain = captured_batch_sizes(600, speculative=False)
    assert plain[:7] == [1, 2, 4, 8, 12, 16, 24]
    assert 496 in plain and 512 in plain and 544 in plain and 576 in plain and plain[-1] == 600


def _resolved(small, **spec):
    d = dict(small)
    if spec:
        d["speculative"] = spec
        d["acceptance"] = {"accept_length": 1.5}
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def test_eagle_iteration_runs_num_steps_draft_passes(small):
    """num_steps - 1 draft forwards + one draft extend: the draft costs num_steps passes of one layer."""
    rs = _resolved(small, algorithm="eagle3", drafter="eagle3-llama-3.1-8b", num_steps=3, topk=1, num_draft_tokens=4)
    m = IterationModel(rs)
    plan = m.plan(1)
    drafts = [f for f in plan if f.is_draft]
    assert sum(f.repeats for f in drafts) == 3
    assert [f.tokens_per_request for f in drafts] == [1, 4]  # topk per step; extend padded to num_steps + 1 (v1)
    graph_gpu_ms = rs.coefficient("graph_replay_gpu_us") / 1e3
    assert drafts[0].launch_ms == pytest.approx(graph_gpu_ms)  # the two draft steps are one CUDA graph
    assert drafts[0].launch_host_ms == pytest.approx(rs.coefficient("graph_launch_us") / 1e3)  # a straight chain
    verify = [f for f in plan if not f.is_draft]
    assert len(verify) == 1 and verify[0].tokens_per_request == 4  # one verify over num_draft_tokens


def test_v2_workers_extend_over_num_draft_tokens(small):
    small["server"] = {"tp": 1, "sglang_version": "0.5.23"}
    rs = _resolved(small, algorithm="eagle3", drafter="eagle3-llama-3.1-8b", num_steps=3, topk=1, num_draft_tokens=4)
    assert rs.spec_v2 and rs.overlap
    extend = [f for f in IterationModel(rs).plan(1) if f.is_draft][-1]
    assert extend.tokens_per_request == 4


def test_ngram_has_no_draft_forward_and_pays_cpu(small):
    rs = _resolved(small, algorithm="ngram", num_draft_tokens=8)
    cost = IterationModel(rs).decode(4, 4 * 500)
    assert cost.draft_compute_ms == 0.0 and cost.draft_comm_ms == 0.0
    c = rs.coefficient
    expected_cpu = c("scheduler_cpu_ms") + 4 * c("scheduler_cpu_per_request_ms") + c("spec_cpu_ms") + \
        4 * c("ngram_cpu_per_request_us") / 1e3 + 4 * 8 * c("spec_cpu_per_verified_token_us") / 1e3 + \
        sum(f.launch_host_ms for f in IterationModel(rs).plan(4))  # the verify graph's launch
    assert cost.cpu_ms == pytest.approx(expected_cpu)  # 0.5.10: n-gram cannot overlap


def test_v1_speculative_host_work_grows_with_requests_and_verified_tokens(small):
    """spec_cpu_per_verified_token_us x batch x num_draft_tokens, exposed in v1 (no overlap), on top of the
    per-iteration and per-request CPU; trees (topk > 1) pay spec_tree_cpu_ms per iteration, chains do not."""
    rs = _resolved(small, algorithm="eagle3", drafter="eagle3-llama-3.1-8b", num_steps=4, topk=4,
                   num_draft_tokens=16)
    assert not rs.overlap
    per_token_ms = rs.coefficient("spec_cpu_per_verified_token_us") / 1e3
    assert per_token_ms > 0
    m = IterationModel(rs)
    one, eight = m.decode(1, 500).cpu_ms, m.decode(8, 8 * 500).cpu_ms
    assert eight - one == pytest.approx(7 * (rs.coefficient("scheduler_cpu_per_request_ms") + 16 * per_token_ms))
    chain = IterationModel(_resolved(small, algorithm="eagle3", drafter="eagle3-llama-3.1-8b", num_steps=3,
                                     topk=1, num_draft_tokens=4)).decode(8, 8 * 500).cpu_ms
    tree_ms = rs.coefficient("spec_tree_cpu_ms")
    assert tree_ms > 0
    assert eight - chain == pytest.approx(8 * 12 * per_token_ms + tree_ms)


def test_tp_ranks_pay_the_schedulers_request_broadcast_each_loop_turn(small):
    """At TP > 1 SGLang's scheduler broadcasts what it received to the other ranks over gloo every loop turn
    (tp_request_broadcast_us, with the scheduler's own host work): a v1 speculative iteration, which overlap does
    not cover, pays it on top of what the same iteration's host does at TP 1; at TP 1 there is nothing to send."""
    spec = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    one = _resolved(small, **spec)
    two_gpus = dict(small, hardware={**small["hardware"], "num_gpus": 2}, server={"tp": 2})
    two = _resolved(two_gpus, **spec)
    assert not one.overlap and not two.overlap
    broadcast_ms = two.coefficient("tp_request_broadcast_us") / 1e3
    assert broadcast_ms == pytest.approx(0.15)
    m1, m2 = IterationModel(one), IterationModel(two)
    launches = [sum(f.launch_host_ms for f in m.plan(1)) for m in (m1, m2)]
    host_one = m1.decode(1, 500).cpu_ms - launches[0]
    host_two = m2.decode(1, 500).cpu_ms - launches[1]
    assert host_two - host_one == pytest.approx(broadcast_ms)
    # --scheduler-recv-interval 10: a decode turn receives, and broadcasts, one time in ten
    skipping = IterationModel(_resolved(dict(two_gpus, server={"tp": 2, "scheduler_recv_interval": 10}), **spec))
    host_skipping = skipping.decode(1, 500).cpu_ms - launches[1]
    assert host_two - host_skipping == pytest.approx(0.9 * broadcast_ms)


def test_overlap_hides_cpu_behind_the_gpu(small):
    rs = _resolved(small)
    assert rs.overlap
    cost = IterationModel(rs).decode(1, 500)
    gpu = cost.verify_compute_ms + cost.verify_comm_ms
    cpu = rs.coefficient("scheduler_cpu_ms") + rs.coefficient("scheduler_cpu_per_request_ms") + \
        IterationModel(rs).plan(1)[0].launch_host_ms
    assert cost.cpu_ms == pytest.approx(max(0.0, cpu - gpu))
    off = dataclasses.replace(rs, overlap=False)
    assert IterationModel(off).decode(1, 500).cpu_ms == pytest.approx(cpu)


def test_verify_over_more_tokens_costs_more_on_moe():
    """Verifying 12 tokens reads more distinct experts and sends 12x larger all-reduces than 4."""
    from simspec.scenario.loader import load_scenario
    from tests.conftest import SCENARIOS

    four = IterationModel(load_scenario(SCENARIOS / "ngram_chain.yaml")).decode(1, 2000)
    twelve = IterationModel(load_scenario(SCENARIOS / "ngram_tree.yaml")).decode(1, 2000)
    assert twelve.verify_compute_ms > four.verify_compute_ms * 1.5
    assert twelve.verify_comm_ms > four.verify_comm_ms


def test_profiled_draft_step_time_replaces_the_modelled_steps(small, tmp_path):
    """draft_forward_ms prices each of the num_steps - 1 draft steps; the draft extend stays modelled."""
    import yaml

    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 2.0}
    costs = []
    for ms in (0.7, 1.7):
        (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "draft_forward_ms": {"value": ms,
                                                                                        "source": "test"}}))
        small["calibration"] = "p.yaml"
        rs = resolve(parse_scenario(small, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml"))
        costs.append(IterationModel(rs).decode(2, 1000))
    assert costs[1].draft_compute_ms - costs[0].draft_compute_ms == pytest.approx(2 * 1.0)  # 2 steps x 1 ms
    assert costs[0].draft_compute_ms > 2 * 0.7  # plus the modelled extend


def test_host_time_per_output_token_is_charged_per_committed_token_and_never_hidden(small, tmp_path):
    """host_per_output_token_us x the tokens an iteration commits, on top of the rest of its host time, whether
    overlap scheduling hides that rest (no speculation) or not (v1 EAGLE-3); 0 by default; and a call that
    leaves committed_tokens out prices the iteration without it."""
    import yaml

    spec = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    for speculative in (None, spec):
        plain = _resolved(copy.deepcopy(small), **(speculative or {}))
        assert plain.coefficient("host_per_output_token_us") == 0.0
        (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "coefficients": {
            "host_per_output_token_us": {"value": 250.0, "source": "test"}}}))
        d = copy.deepcopy(small)
        d["calibration"] = "p.yaml"
        if speculative:
            d["speculative"], d["acceptance"] = speculative, {"accept_length": 1.5}
        rs = resolve(parse_scenario(d, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml"))
        assert rs.overlap == (speculative is None)
        base, charged = IterationModel(plain).decode(8, 8 * 500, 12), IterationModel(rs).decode(8, 8 * 500, 12)
        assert charged.cpu_ms - base.cpu_ms == pytest.approx(12 * 0.25)
        assert IterationModel(rs).decode(8, 8 * 500).total_ms == pytest.approx(base.total_ms)


def test_the_engine_charges_host_time_for_every_token_it_commits(small, tmp_path):
    """Without speculation, a closed loop of one client commits one token per decode iteration: the per-token host
    time lengthens each request's decode by (output - 1) x the coefficient, the first token being the prefill's."""
    import yaml

    from simspec.predict import predict

    small["workload"] = {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 3,
                         "input_tokens": {"dist": "fixed", "value": 64}, "output_tokens": {"dist": "fixed",
                                                                                          "value": 101}}
    plain = predict(_resolved(copy.deepcopy(small)))
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "coefficients": {
        "host_per_output_token_us": {"value": 500.0, "source": "test"}}}))
    small["calibration"] = "p.yaml"
    charged = predict(resolve(parse_scenario(small, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml")))
    assert charged["iteration_ms"] - plain["iteration_ms"] == pytest.approx(0.5, rel=1e-6)
    assert 1e3 / charged["tokens_per_s"] - 1e3 / plain["tokens_per_s"] == pytest.approx(0.5, rel=1e-3)


def test_the_engine_charges_host_time_for_accepted_drafts_and_the_bonus_token(small, tmp_path):
    """With speculation, per committed token, not per request: a chain of 3 drafts always accepted commits 4 tokens
    a step, so each step gains 4 x the coefficient, and the last step, cut at the output length, only what it
    commits (100 decode tokens = 25 steps of 4; 97 = 24 of 4 and one of 1)."""
    import yaml

    from simspec.predict import predict

    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"chain_rates": [1.0, 1.0, 1.0]}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump({"name": "p", "coefficients": {
        "host_per_output_token_us": {"value": 500.0, "source": "test"}}}))
    extra_ms = {}
    for output in (101, 98):
        small["workload"] = {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 2,
                             "input_tokens": {"dist": "fixed", "value": 64},
                             "output_tokens": {"dist": "fixed", "value": output}}
        small.pop("calibration", None)
        plain = predict(_resolved(copy.deepcopy(small)))
        small["calibration"] = "p.yaml"
        charged = predict(resolve(parse_scenario(small, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml")))
        assert plain["accept_length"] == charged["accept_length"]
        steps = -(-(output - 1) // 4)
        extra_ms[output] = (charged["iteration_ms"] - plain["iteration_ms"]) * steps
    assert extra_ms[101] == pytest.approx(100 * 0.5, rel=1e-6)  # 25 steps, 4 tokens each
    assert extra_ms[98] == pytest.approx(97 * 0.5, rel=1e-6)  # the 25th step commits 1


def _qwen3_moe(small, model="qwen3-30b-a3b", tp=1, **spec):
    small["model"] = model
    small["hardware"] = {"gpu": "h200-sxm", "num_gpus": tp, "interconnect": "nvlink4-nccl"}
    small["server"] = {"tp": tp}
    return _resolved(small, **spec)


def test_a_models_measured_routing_locality_replaces_the_default_and_a_profile_replaces_it(small, tmp_path):
    """Coefficients come from the most specific place that has them: profile, then model preset, then defaults."""
    import yaml

    measured = presets.models()["qwen3-30b-a3b"].moe_routing_locality
    assert measured is not None and measured.value > 8 / 128  # above uniform routing's chance overlap
    rs = _qwen3_moe(small)
    assert rs.coefficient("moe_routing_locality") == measured.value
    assert rs.coefficients["moe_routing_locality"].source.startswith("model qwen3-30b-a3b: ")
    # a model nobody measured keeps the default (uniform routing)
    other = _qwen3_moe(copy.deepcopy(small), model="deepseek-v3", tp=8)
    assert other.coefficient("moe_routing_locality") == presets.default_coefficients()["moe_routing_locality"].value
    assert other.coefficients["moe_routing_locality"].source.startswith("default: ")
    # a profile of the box wins over the model's figure
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(
        {"name": "p", "coefficients": {"moe_routing_locality": {"value": 0.2, "source": "test"}}}))
    small["calibration"] = "p.yaml"
    rs = resolve(parse_scenario(small, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml"))
    assert rs.coefficient("moe_routing_locality") == 0.2
    assert rs.coefficients["moe_routing_locality"].source.startswith("profile p: ")


def test_measured_locality_makes_a_qwen3_verify_cheaper_and_leaves_its_decode_alone(small):
    """Four verify tokens of one request reuse experts (fewer bytes than uniform routing); four requests' decode
    tokens are independent whatever the locality."""
    it = IterationModel(_qwen3_moe(small))
    assert it.target.eff.routing_locality == presets.models()["qwen3-30b-a3b"].moe_routing_locality.value
    uniform = ForwardModel(it.target.stack, it.rs.gpu, it.collectives,
                           dataclasses.replace(it.target.eff, routing_locality=0.0), moe_grid=it.target._grid)
    verify = ForwardShape(num_seqs=1, tokens=4, real_seqs=1, real_tokens=4, logit_tokens=4, graph=True)
    decode = ForwardShape(num_seqs=4, tokens=4, real_seqs=4, real_tokens=4, logit_tokens=4, graph=True)
    assert it.target.cost(verify, 1000, 4000).compute_ms < uniform.cost(verify, 1000, 4000).compute_ms
    assert it.target.cost(decode, 1000, 1000).compute_ms == pytest.approx(uniform.cost(decode, 1000, 1000).compute_ms)


def test_measured_popularity_makes_a_batch_of_requests_cheaper_and_leaves_one_request_alone(small):
    """Popular experts: 32 requests' decode tokens touch fewer experts than uniform routing draws, so the step reads
    fewer expert bytes; one request's token touches its k experts either way."""
    it = IterationModel(_qwen3_moe(small))
    assert it.target.eff.routing_spread == presets.models()["qwen3-30b-a3b"].moe_routing_spread.value > 0
    uniform = ForwardModel(it.target.stack, it.rs.gpu, it.collectives,
                           dataclasses.replace(it.target.eff, routing_spread=0.0), moe_grid=it.target._grid)
    batch = ForwardShape(num_seqs=32, tokens=32, real_seqs=32, real_tokens=32, logit_tokens=32, graph=True)
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    assert it.target.cost(batch, 32_000, 32_000).compute_ms < 0.95 * uniform.cost(batch, 32_000, 32_000).compute_ms
    assert it.target.cost(one, 1000, 1000).compute_ms == pytest.approx(uniform.cost(one, 1000, 1000).compute_ms,
                                                                      rel=1e-3)


def test_a_standalone_draft_model_routes_by_its_own_locality_not_the_targets(small, monkeypatch):
    """The target's figure says nothing about another model drafting for it."""
    models = presets.models()
    target = models["qwen3-235b-a22b-fp8"]
    assert target.moe_routing_locality is not None  # the figure its preset carries
    own = target.moe_routing_locality.model_copy(update={"value": 0.2})
    monkeypatch.setitem(models, "qwen3-235b-a22b-fp8", target.model_copy(update={"moe_routing_locality": own}))
    rs = _qwen3_moe(small, model="qwen3-235b-a22b-fp8", tp=4, algorithm="standalone", drafter="qwen3-30b-a3b",
                    num_steps=3, topk=1, num_draft_tokens=4)
    it = IterationModel(rs)
    assert it.target.eff.routing_locality == 0.2
    assert it.draft.eff.routing_locality == models["qwen3-30b-a3b"].moe_routing_locality.value
    # and the other way round: an unmeasured MoE drafter keeps the default, not the measured target's figure
    monkeypatch.setitem(models, "qwen3-235b-a22b-fp8", target.model_copy(update={"moe_routing_locality": None}))
    rs = _qwen3_moe(copy.deepcopy(small), model="qwen3-30b-a3b", tp=8, algorithm="standalone",
                    drafter="qwen3-235b-a22b-fp8", num_steps=3, topk=1, num_draft_tokens=4)
    it = IterationModel(rs)
    assert it.target.eff.routing_locality == models["qwen3-30b-a3b"].moe_routing_locality.value
    assert it.draft.eff.routing_locality == presets.default_coefficients()["moe_routing_locality"].value


def test_qwen3_235b_carries_its_siblings_locality_and_says_it_was_not_measured():
    """Same routing design as Qwen3-30B-A3B (128 experts, top 8, no shared expert, MoE on every layer): the
    sibling's figure, labelled as such. Locality is not carried beyond a sibling: GLM-4.7-Flash has its own measured
    figure, DeepSeek-V3 and the Kimis (a shared expert, none measured) keep uniform routing."""
    models = presets.models()
    sibling = models["qwen3-30b-a3b"]
    for name in ("qwen3-235b-a22b", "qwen3-235b-a22b-fp8"):
        m = models[name]
        assert (m.num_routed_experts, m.experts_per_token, m.num_shared_experts, m.num_dense_layers) == (
            sibling.num_routed_experts, sibling.experts_per_token, 0, 0)
        assert m.moe_routing_locality.value == sibling.moe_routing_locality.value
        assert m.moe_routing_locality.source.startswith("NOT MEASURED FOR THIS MODEL")
    for name in ("deepseek-v3", "kimi-k2", "kimi-k2.5"):
        assert models[name].num_shared_experts > 0 and models[name].moe_routing_locality is None
    glm = models["glm-4.7-flash"].moe_routing_locality
    assert glm.value == pytest.approx(0.257) and not glm.source.startswith("NOT MEASURED")


def test_a_carried_locality_keeps_its_label_where_the_user_sees_its_source(small):
    """The figure a scenario resolves to names its model and says it was not measured for it (--sources)."""
    rs = _qwen3_moe(small, model="qwen3-235b-a22b-fp8", tp=4)
    source = rs.coefficients["moe_routing_locality"].source
    assert source.startswith("model qwen3-235b-a22b-fp8: NOT MEASURED FOR THIS MODEL")


def test_an_mtp_draft_routes_with_its_targets_locality(small, monkeypatch):
    """MTP layers are the target's own experts: the draft stack takes the target's figure, not the default."""
    models = presets.models()
    ds = models["deepseek-v3"]
    figure = presets.RoutingLocality(value=0.3, source="test")
    monkeypatch.setitem(models, "deepseek-v3", ds.model_copy(update={"moe_routing_locality": figure}))
    small.update(model="deepseek-v3", hardware={"gpu": "h200-sxm", "num_gpus": 8, "interconnect": "nvlink4-nccl"})
    small["server"] = {"tp": 8}
    small["speculative"] = {"algorithm": "mtp", "num_steps": 1, "topk": 1, "num_draft_tokens": 2}
    small["acceptance"] = {"accept_length": 1.8}
    im = IterationModel(resolve(parse_scenario(small, "t.yaml"), "t.yaml"))
    assert im.target.eff.routing_locality == 0.3
    assert im.draft.eff.routing_locality == 0.3


@pytest.mark.parametrize("change, message", [
    ({"moe_routing_locality": {"value": 1.0, "source": "x"}}, "less than 1"),
    ({"moe_routing_locality": {"value": 0.5}}, "source"),
])
def test_a_model_presets_locality_must_be_a_sourced_fraction(change, message):
    from pydantic import ValidationError

    data = presets.models()["qwen3-30b-a3b"].model_dump() | change
    with pytest.raises(ValidationError, match=message):
        presets.ModelPreset.model_validate(data)


def test_a_dense_model_cannot_carry_a_routing_locality():
    from pydantic import ValidationError

    data = presets.models()["llama-3.1-8b"].model_dump() | {"moe_routing_locality": {"value": 0.3, "source": "x"}}
    with pytest.raises(ValidationError, match="needs MoE layers"):
        presets.ModelPreset.model_validate(data)


def test_fp8_expert_tiles_on_the_h20_run_at_the_small_tile_rate_until_the_release_swaps_them():
    """0.4.6.post1's tuned H20 config for Qwen3-30B-A3B-FP8's experts (E 128, N 768) runs calls up to 192 tokens in
    16-row tiles; without swap-AB the H20 runs those FP8 tiles at its measured small-tile rate (gpus.yaml
    moe_small_tile_tflops, an achieved rate: no compute efficiency on top), which makes them compute-bound. 0.5.3-0.5.7
    ship the same config and do not swap either; 0.5.8 swaps them onto wgmma; BF16 experts, GPUs without a measured
    rate, 0.4.4 (no H20 FP8 configs) and calls past
    the config's 16-row range keep the dense peak."""
    from simspec.timing.forward import moe_grid, moe_small_tiles

    h20 = presets.gpus()["h20"]
    m8, m16 = presets.models()["qwen3-30b-a3b-fp8"], presets.models()["qwen3-30b-a3b"]
    fp8, bf16 = target_stack(m8, tp=1), target_stack(m16, tp=1)
    rate = h20.moe_small_tile_tflops
    assert rate is not None

    def small_tiles(gpu, model, stack, version):
        return moe_small_tiles(presets.gpus()[gpu], stack, moe_grid(gpu, model, stack, version), version)

    tiles = small_tiles("h20", m8, fp8, (4, 6))
    assert tiles is not None and (tiles.tflops, tiles.max_tokens) == (rate, 192)
    assert small_tiles("h20", m8, fp8, (5, 8)) is None  # 0.5.8 swaps on the H20
    assert small_tiles("h20", m8, fp8, (5, 7)) == tiles  # 0.5.7 does not, and ships the same config
    assert small_tiles("h20", m8, fp8, (4, 4)) is None  # no H20 FP8 config: 64-row default tiles
    assert small_tiles("h20", m16, bf16, (4, 6)) is None
    assert small_tiles("h200-sxm", m8, fp8, (4, 6)) is None  # no measured rate: the dense peak
    curve = CollectiveCurve(measured_gpus=8, points_bytes_us=[(1, 1.0)], source="test")
    eff = dataclasses.replace(IDEAL, compute=0.5, memory_bandwidth=0.8)

    def moe_s(stack, small_tiles, tokens):
        fm = ForwardModel(stack, h20, Collectives(curve, 1, "nvlink"), eff, small_tiles)
        shape = ForwardShape(num_seqs=tokens, tokens=tokens, real_seqs=tokens, real_tokens=tokens,
                             logit_tokens=tokens, graph=True)
        return fm._moe(shape)[0], fm.moe_kernels(shape)

    # 64 tokens touch nearly every expert: the GEMMs' FLOPs at the small-tile rate outlast their bytes
    bw = 4.0e12 * 0.8

    def by_hand(kernels):
        return sum(max(b / bw, f / (rate * 1e12)) if f else b / bw for _, b, f in kernels)

    small, kernels = moe_s(fp8, tiles, 64)
    assert small == pytest.approx(by_hand(kernels))
    assert sum(f for _, _, f in kernels) / (rate * 1e12) > sum(b for _, b, f in kernels if f) / bw
    assert small > 1.3 * moe_s(fp8, None, 64)[0]
    # the config's 16-row range ends at 192 tokens: past it, 64-row tiles on wgmma at the dense peak
    small, kernels = moe_s(fp8, tiles, 192)
    assert small == pytest.approx(by_hand(kernels)) and small > 1.3 * moe_s(fp8, None, 192)[0]
    assert moe_s(fp8, tiles, 193)[0] == pytest.approx(moe_s(fp8, None, 193)[0])


def test_iteration_model_applies_the_small_tile_rate_by_release_to_target_and_mtp_draft(small):
    """The release decides, for the target and for an MoE draft alike: DeepSeek-V3 with MTP on eight H20s under
    0.4.6.post1 (its shared experts fused, so the kernel sees 256 + 8 experts of 256 columns: a tuned 16-row config
    up to 384 tokens) charges both at the small-tile rate; 0.5.8 (swap-AB on the H20) charges neither."""
    small.update(model="deepseek-v3", hardware={"gpu": "h20", "num_gpus": 8, "interconnect": "nvlink4-nccl"})
    small["speculative"] = {"algorithm": "mtp", "num_steps": 1, "topk": 1, "num_draft_tokens": 2}
    small["acceptance"] = {"accept_length": 1.8}
    steps = {}
    for version in ("0.4.6.post1", "0.5.8"):
        small["server"] = {"tp": 8, "sglang_version": version, "mem_fraction_static": 0.93}
        im = IterationModel(resolve(parse_scenario(copy.deepcopy(small), "t.yaml"), "t.yaml"))
        for fm in (im.target, im.draft):
            assert (fm._small_tiles is not None) == (version == "0.4.6.post1")
        if version == "0.4.6.post1":
            assert im.target._small_tiles.max_tokens == 384 and im.draft._small_tiles.max_tokens == 384
        steps[version] = im.decode(32, 32 * 1000).total_ms
    assert steps["0.4.6.post1"] > steps["0.5.8"]


def _plain(small, **server):
    d = dict(small)
    d["server"] = {"tp": 1, **server}
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def test_graph_launch_is_host_time_that_overlap_hides(small):
    """A CUDA graph's launch is host time: overlap scheduling hides it behind the GPU step; a v1 speculative
    iteration, which waits for its results, pays it on top of the GPU."""
    rs = _plain(small)
    m = IterationModel(rs)
    (decode,) = m.plan(1)
    assert rs.overlap and decode.launch_host_ms > 0
    cost = m.decode(1, 1000.0)
    gpu = cost.verify_compute_ms + cost.verify_comm_ms
    assert cost.cpu_ms == pytest.approx(max(0.0, rs.coefficient("scheduler_cpu_ms")
                                            + rs.coefficient("scheduler_cpu_per_request_ms")
                                            + decode.launch_host_ms - gpu))
    spec = IterationModel(_resolved(small, algorithm="eagle3", drafter="eagle3-llama-3.1-8b", num_steps=3, topk=1,
                                    num_draft_tokens=4))
    assert not spec.rs.overlap
    host = sum(f.launch_host_ms for f in spec.plan(1))
    without = dataclasses.replace(spec.rs, coefficients={
        **spec.rs.coefficients, "graph_launch_us": dataclasses.replace(spec.rs.coefficients["graph_launch_us"],
                                                                       value=0.0)})
    assert spec.decode(1, 1000.0).cpu_ms - IterationModel(without).decode(1, 1000.0).cpu_ms == pytest.approx(host)


def test_branched_graphs_pay_per_node(small):
    """Llama at TP 1 is one straight chain of kernels: its launch costs graph_launch_us whatever its length. At
    TP > 1 (NCCL's event nodes) or with a stream forked during capture (Qwen3's q/k norms in 0.5.3-0.5.6) every
    node costs graph_launch_per_node_us more."""
    per_node_ms = presets.default_coefficients()["graph_launch_per_node_us"].value / 1e3
    fixed_ms = presets.default_coefficients()["graph_launch_us"].value / 1e3
    (straight,) = IterationModel(_plain(small)).plan(1)
    assert straight.launch_host_ms == pytest.approx(fixed_ms)
    d = dict(small)
    d["hardware"] = {**small["hardware"], "num_gpus": 2}
    d["server"] = {"tp": 2}
    tp2 = IterationModel(resolve(parse_scenario(d, "t.yaml"), "t.yaml"))
    (branched,) = tp2.plan(1)
    stack = tp2.target.stack
    assert stack.graph_nodes_per_forward == stack.kernels_per_forward + 2 * stack.num_layers + 2
    assert branched.launch_host_ms == pytest.approx(fixed_ms + per_node_ms * stack.graph_nodes_per_forward)
    for version, branches in (("0.5.6", True), ("0.5.7", False)):
        q = dict(small)
        q["model"] = "qwen3-8b"
        q["server"] = {"tp": 1, "sglang_version": version}
        (f,) = IterationModel(resolve(parse_scenario(q, "t.yaml"), "t.yaml")).plan(1)
        assert (f.launch_host_ms > 10 * fixed_ms) is branches
    assert releases.decode_graph_branches("DeepseekV3ForCausalLM", (5, 8), 1)
    assert not releases.decode_graph_branches("DeepseekV3ForCausalLM", (4, 6), 1)
    assert not releases.decode_graph_branches(None, (5, 8), 1)  # an EAGLE head
