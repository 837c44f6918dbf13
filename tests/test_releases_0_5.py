"""SGLang 0.5.3 through 0.5.7 (post releases included), which simspec models beside 0.5.8 on: what each changes,
read from their wheels (scenario/releases.py)."""

from __future__ import annotations

import pytest

from simspec import presets
from simspec.errors import InputError
from simspec.scenario import releases
from simspec.scenario.loader import parse_scenario, resolve
from simspec.scenario.memory import tier_defaults
from simspec.timing.forward import ForwardModel, ForwardShape, moe_grid
from simspec.timing.iteration import IterationModel, captured_batch_sizes
from simspec.timing.stack import eagle_stack, part_kernels, target_stack
from tests.conftest import auto_tree


def _resolve(d: dict):
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def _eagle3(small: dict, version: str, tree: tuple[int, int, int] | None = (3, 1, 4), **server) -> dict:
    small["server"] = {"tp": 1, "sglang_version": version, **server}
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"}
    if tree is not None:
        small["speculative"] |= dict(zip(("num_steps", "topk", "num_draft_tokens"), tree, strict=True))
    small["acceptance"] = {"accept_length": 2.0}
    return small


def test_release_key_tells_post_releases_apart():
    assert releases.release_key("0.5.4.post1") == (5, 4, 1) and releases.release_key("0.5.4") == (5, 4, 0)
    assert releases.minor_patch("0.5.6.post2") == (5, 6)


def test_before_0_5_8_every_architecture_but_deepseek_type_gets_the_wide_auto_tree():
    """auto_choose_speculative_params falls back to (5, 4, 8) through 0.5.7, to (3, 1, 4) from 0.5.8."""
    assert auto_tree("0.5.7") == (5, 4, 8)
    assert auto_tree("0.5.8") == (3, 1, 4)
    assert not releases.auto_tree_is_wide((5, 3), "DeepseekV3ForCausalLM")
    assert releases.auto_tree_is_wide((5, 3), "LlamaForCausalLM") and releases.auto_tree_is_wide((5, 10),
                                                                                               "LlamaForCausalLM")


def test_0_5_3_to_0_5_6_give_the_kv_pool_headroom_for_the_drafts(small):
    """init_memory_pool adds max_num_reqs x (steps x topk + draft tokens) + 100 slots until 0.5.7 (same
    mem_fraction_static in both): 48 requests x (5 x 4 + 8) + 100 = 1,444 tokens for (5, 4, 8)."""
    with_room = _resolve(_eagle3(small, "0.5.6.post2", (5, 4, 8)))
    without = _resolve(_eagle3(small, "0.5.7", (5, 4, 8)))
    assert with_room.kv_capacity_tokens - without.kv_capacity_tokens == 48 * (5 * 4 + 8) + 100
    small.pop("speculative"), small.pop("acceptance")
    small["server"] = {"tp": 1, "sglang_version": "0.5.6"}
    base = _resolve(small).kv_capacity_tokens
    small["server"]["sglang_version"] = "0.5.7"
    assert _resolve(small).kv_capacity_tokens == base  # no drafts, no headroom


def test_v2_workers_by_release(small):
    """None in 0.5.3 and 0.5.3.post1; --enable-beta-spec from 0.5.3.post2; a standalone v2 worker only from 0.5.8."""
    for version in ("0.5.3", "0.5.3.post1"):
        with pytest.raises(InputError) as err:
            _resolve(_eagle3(small, version, spec_v2=True))
        assert err.value.key == "server.spec_v2" and "no v2" in str(err.value)
    assert _resolve(_eagle3(small, "0.5.3.post2", spec_v2=True)).spec_v2
    assert not releases.has_v2_workers((5, 7, 0), "standalone") and releases.has_v2_workers((5, 8, 0), "standalone")
    with pytest.raises(InputError) as err:
        _resolve(_eagle3(small, "0.5.6", (5, 4, 8), spec_v2=True))
    assert "before 0.5.7" in str(err.value)


def test_v2_draft_extend_runs_eagerly_until_0_5_5_post3(small):
    eager = IterationModel(_resolve(_eagle3(small, "0.5.5.post2", spec_v2=True)))
    graph = IterationModel(_resolve(_eagle3(small, "0.5.5.post3", spec_v2=True)))
    v1 = IterationModel(_resolve(_eagle3(small, "0.5.5.post2")))
    extend = [f for f in eager.plan(4) if f.is_draft][-1]
    extend_graph = [f for f in graph.plan(4) if f.is_draft][-1]
    assert extend.launch_ms == eager.eff.forward_overhead_ms  # its own launch, outside the iteration's graph
    assert extend.compute_ms > extend_graph.compute_ms
    assert not v1._eager_draft_extend and eager._eager_draft_extend and not graph._eager_draft_extend


def test_where_a_v2_iteration_waits_for_the_last_verify():
    wait = releases.v2_verify_wait
    for gpu, mla in (("H100 SXM", False), ("A100 80GB SXM", False), ("B200", True), ("RTX PRO 6000", True)):
        assert wait((5, 3, 2), gpu, mla) == "schedule" and wait((5, 12, 1), gpu, mla) == "schedule"
        assert wait((5, 13, 0), gpu, mla) == "launch" and wait((5, 15, 1), gpu, mla) == "launch"
    # from 0.5.16 only FlashInfer, the default of an MHA model off Hopper and SM100, still waits
    assert wait((5, 16, 0), "H200", False) is None and wait((5, 23, 0), "B200", False) is None
    assert wait((5, 16, 0), "A100 80GB SXM", False) == "launch" and wait((5, 23, 0), "RTX PRO 6000", False) == "launch"
    assert wait((5, 23, 0), "RTX PRO 6000", True) is None and wait((5, 23, 0), "H200", True) is None


def _v2_parts(model: IterationModel, bs: int, context: float) -> tuple[float, float, float]:
    """(draft extend, draft steps, verify) GPU ms of one iteration."""
    cost = model.decode(bs, context)
    extend = [f for f in model.plan(bs) if f.extend]
    assert len(extend) == 1 and extend[0].is_draft
    e = extend[0]
    kv = context + bs * e.tokens_per_request
    pairs = e.tokens_per_request * context + bs * e.tokens_per_request * (e.tokens_per_request + 1) / 2
    extend_gpu = e.compute_ms + max(kv * e.kv_ms_per_token, pairs * e.attention_ms_per_pair) + e.launch_ms + e.comm_ms
    draft_gpu = cost.draft_compute_ms + cost.draft_comm_ms - extend_gpu
    return extend_gpu, draft_gpu, cost.verify_compute_ms + cost.verify_comm_ms


def test_a_v2_iteration_exposes_the_host_work_its_wait_for_the_verify_leaves_uncovered(small):
    """Until 0.5.12 the next batch is built only after the last verify: the batch building, the draft's preparation
    and its launch run while the GPU has only the draft extend left, and the verify's launch while the draft runs.
    0.5.13 builds the batch before the wait; from 0.5.16 nothing waits and overlap hides what the GPU covers."""
    bs, context = 1, 1000.0
    models = {v: IterationModel(_resolve(_eagle3(dict(small), v, spec_v2=True, overlap_schedule="on")))
              for v in ("0.5.8", "0.5.13", "0.5.16")}
    c = models["0.5.8"].rs.coefficient
    sched = c("scheduler_cpu_ms") + bs * c("scheduler_cpu_per_request_ms")
    exposed = {v: m.decode(bs, context).cpu_ms for v, m in models.items()}
    extend_gpu, draft_gpu, verify_gpu = _v2_parts(models["0.5.8"], bs, context)
    draft_launch, verify_launch = (f.launch_host_ms for f in models["0.5.8"].plan(bs) if not f.extend)
    for version, before_draft in (("0.5.8", sched + c("spec_cpu_ms") + draft_launch),
                                  ("0.5.13", c("spec_cpu_ms") + draft_launch)):
        verify_start = max(max(before_draft, extend_gpu) + draft_gpu, before_draft + verify_launch)
        assert exposed[version] == pytest.approx(verify_start - extend_gpu - draft_gpu)
    assert exposed["0.5.8"] > exposed["0.5.13"] > 0.0 == exposed["0.5.16"]  # a small 8B step still covers its host
    v1 = IterationModel(_resolve(_eagle3(dict(small), "0.5.8"))).decode(bs, context).cpu_ms
    assert exposed["0.5.8"] < v1  # v1 waits on every graph and does all its host work in the open


def test_speculative_graph_sizes_take_64_in_from_0_5_4_post2():
    old = captured_batch_sizes(80, True, (5, 4, 1))
    new = captured_batch_sizes(80, True, (5, 4, 2))
    assert 64 not in old and 60 in old and 72 in old and 64 in new
    assert captured_batch_sizes(80, False, (5, 3, 0)) == captured_batch_sizes(80, False)


def test_small_gpu_graph_cap_was_16_until_0_5_4_post1():
    rtx = presets.gpus()["rtx-4090"]
    assert tier_defaults(rtx, 1, (5, 4, 0)) == (2048, 16)
    assert tier_defaults(rtx, 1, (5, 4, 1)) == (2048, 24)
    assert tier_defaults(rtx, 4, (5, 3, 0)) == (2048, 80)  # tp >= 4 unchanged


@pytest.mark.parametrize(("release", "arch", "weights", "triton"), [
    ((5, 3, 0), "DeepseekV3ForCausalLM", "fp8-block128", True),
    ((5, 4, 0), "DeepseekV3ForCausalLM", "fp8-block128", True),  # modelopt_fp4 only
    ((5, 4, 1), "DeepseekV3ForCausalLM", "fp8-block128", False),
    ((5, 4, 3), "DeepseekV3ForCausalLM", "int4", False),  # any weights
    ((5, 5, 0), "DeepseekV3ForCausalLM", "int4", True),
    ((5, 6, 1), "DeepseekV3ForCausalLM", "bf16", False),  # an unquantized checkpoint is first given "fp8"
    ((5, 6, 2), "DeepseekV3ForCausalLM", "bf16", False),
    ((5, 10, 0), "DeepseekV3ForCausalLM", "bf16", False),
    ((5, 10, 0), "DeepseekV3ForCausalLM", "int4", True),
    ((5, 5, 3), "Qwen3MoeForCausalLM", "fp8-block128", True),
    ((5, 6, 0), "Qwen3MoeForCausalLM", "fp8-block128", False),
    ((5, 7, 0), "Qwen3MoeForCausalLM", "bf16", True),
    ((5, 8, 0), "Qwen3MoeForCausalLM", "bf16", False),
])
def test_b200_moe_runner_by_release(release, arch, weights, triton):
    assert releases.target_moe_runs_triton(release, "B200", arch, weights) is triton
    assert releases.target_moe_runs_triton(release, "H200 SXM", arch, weights)


def test_a_draft_follows_its_targets_moe_runner_until_0_5_7():
    assert not releases.draft_moe_runs_triton((5, 6, 2), False)
    assert releases.draft_moe_runs_triton((5, 7, 0), False) and releases.draft_moe_runs_triton((5, 3, 0), True)


def test_worst_case_grid_pads_e_plus_one_experts_from_0_4_10():
    """One token, top 8 of 128 experts, 16-row blocks: 8 + 129 x 15 rows, 122 row blocks (0.4.x: 121)."""
    assert releases.fused_moe_padded_rows(False, 8, 128, 16, plus_one=True) == 122
    qwen = presets.models()["qwen3-30b-a3b"]
    stack = target_stack(qwen, 1)
    grid = moe_grid("h200-sxm", qwen, stack, (5, 6, 2))
    assert grid.plus_one and not grid.tight
    assert moe_grid("h200-sxm", qwen, stack, (5, 7, 0)).tight
    assert not moe_grid("h200-sxm", qwen, target_stack(qwen, 1, version=(4, 6)), (4, 6)).plus_one


def test_a_tuned_config_file_counts_only_from_the_release_that_ships_it():
    """0.5.8's files carry `since`, read from the 0.5.3-0.5.7 wheels: an older release takes the default tile. The
    H200's per-tensor FP8 file for E 128, N 192 ships from 0.5.4 (Qwen3-235B-A22B's experts at TP 8, given per-tensor
    FP8 weights here: the preset's are block-FP8)."""
    file = presets.fused_moe_tiles()["0.5.8"][("h200-sxm", 128, 192, "fp8")]
    assert file.since == "0.5.4"
    base = presets.models()["qwen3-235b-a22b"]
    model = base.model_copy(update={"weights": base.weights.model_copy(update={"routed_experts": "fp8"})})
    stack = target_stack(model, 8)
    assert moe_grid("h200-sxm", model, stack, (5, 4, 0)).tiles == tuple(file.tiles)
    assert moe_grid("h200-sxm", model, stack, (5, 3, 3)).tiles == ()


def test_0_5_3_to_0_5_6_store_k_and_v_apart_and_norm_qwen3_q_and_k_apart():
    """memory_pool.set_kv_buffer's two index_puts until 0.5.8 (+1 a layer; Qwen3-MoE's rope stores them, so it
    keeps its count); q_norm and k_norm as two RMSNorms until 0.5.7 (+1, and +1 copy from two query rows)."""
    models = presets.models()
    llama, qwen, moe = models["llama-3.1-8b"], models["qwen3-8b"], models["qwen3-30b-a3b"]
    for version, qwen_extra in (((5, 5), 2), ((5, 6), 2), ((5, 7), 1)):
        assert (target_stack(llama, 1, version=version).kernels_per_forward
                - target_stack(llama, 1).kernels_per_forward) == llama.num_layers
        old, new = target_stack(qwen, 1, version=version), target_stack(qwen, 1)
        assert old.kernels_per_forward - new.kernels_per_forward == qwen_extra * qwen.num_layers
        old_moe, new_moe = target_stack(moe, 1, version=version), target_stack(moe, 1)
        assert old_moe.kernels_per_forward - new_moe.kernels_per_forward == (qwen_extra - 1) * moe.num_layers
    assert target_stack(qwen, 1, version=(5, 6)).small_kernels_from_two_rows == qwen.num_layers
    assert target_stack(qwen, 1, version=(5, 7)).small_kernels_from_two_rows == 0
    head = next(d for d in presets.drafters().values() if d.algorithm == "eagle3" and d.weights == "bf16")
    assert eagle_stack(head, 1, (5, 6)).kernels_per_forward - eagle_stack(head, 1).kernels_per_forward == 1


def test_models_and_drafts_a_release_cannot_serve_are_refused(small):
    small["model"] = "kimi-k2.5"
    small["hardware"] = {"gpu": "h200-sxm", "num_gpus": 8, "interconnect": "nvlink4-nccl"}
    small["server"] = {"tp": 8, "sglang_version": "0.5.8"}  # models/kimi_k25.py first ships in 0.5.9
    with pytest.raises(InputError) as err:
        _resolve(small)
    assert err.value.key == "model"
    small["server"]["sglang_version"] = "0.5.9"
    _resolve(small)
    small["model"] = "kimi-k2"
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-kimi-k2", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 2.0}
    small["server"]["sglang_version"] = "0.5.4.post1"
    with pytest.raises(InputError) as err:
        _resolve(small)
    assert err.value.key == "speculative.algorithm" and "0.5.4.post2" in str(err.value)
    small["server"]["sglang_version"] = "0.5.4.post2"
    _resolve(small)


def test_0_5_6_post1_on_blackwell_refuses_an_eagle_server_without_topk(small):
    """trtllm_mha is picked for an unset topk, then the (5, 4, 8) auto tree is refused: the server does not start."""
    small["hardware"] = {"gpu": "b200", "num_gpus": 1, "interconnect": "nvlink5-nccl"}
    with pytest.raises(InputError) as err:
        _resolve(_eagle3(small, "0.5.6.post1", None))
    assert err.value.key == "speculative.topk" and "trtllm_mha" in str(err.value)
    _resolve(_eagle3(small, "0.5.6.post1", (5, 4, 8)))  # a topk given: flashinfer, starts
    assert _resolve(_eagle3(small, "0.5.7", None)).topk == 4
    assert _resolve(_eagle3(small, "0.5.6", None)).topk == 4


def test_ngram_replay_takes_post_releases_and_0_5_3_to_0_5_7_run_0_5_8s_drafter():
    from simspec.ngram.config import nearest_read_version
    assert nearest_read_version("0.5.6.post1") == "0.5.8" and nearest_read_version("0.5.3") == "0.5.8"
    assert nearest_read_version("0.5.10.post1") == "0.5.10" and nearest_read_version("0.5.23") == "0.5.23"
    with pytest.raises(InputError):
        nearest_read_version("0.4.6")


def test_0_5_6_post1_on_an_sm120_part_refuses_every_mha_server_but_an_eagle_tree_given_topk_above_1(small):
    """is_blackwell() counts SM120, so trtllm_mha is picked, then refused there as SM100-only (server_args of the
    0.5.6.post1 and 0.5.6.post2 wheels); an MLA model (DeepSeek-type) takes another backend."""
    small["hardware"] = {"gpu": "rtx-pro-6000-server", "num_gpus": 1, "interconnect": "pcie5-nccl"}
    small["server"] = {"tp": 1, "sglang_version": "0.5.6.post2"}
    with pytest.raises(InputError) as err:
        _resolve(small)  # no speculation
    assert err.value.key == "server.sglang_version" and "SM100" in str(err.value)
    for tree in ((3, 1, 4), None):
        with pytest.raises(InputError):
            _resolve(_eagle3(small, "0.5.6.post1", tree))
    _resolve(_eagle3(small, "0.5.6.post1", (5, 4, 8)))  # topk 4 given: flashinfer, starts
    _resolve(_eagle3(small, "0.5.7", (3, 1, 4)))
    _resolve(_eagle3(small, "0.5.6", (3, 1, 4)))


def _deepseek_on(gpu: str, version: str, **extra) -> IterationModel:
    """DeepSeek-V3 on 8 GPUs at TP 8, one short request; `extra` adds top-level scenario keys (speculative, ...)."""
    link = "nvlink5-nccl" if gpu == "b200" else "nvlink4-nccl"
    return IterationModel(_resolve({
        "name": "t", "hardware": {"gpu": gpu, "num_gpus": 8, "interconnect": link}, "model": "deepseek-v3",
        "server": {"tp": 8, "sglang_version": version},
        "workload": {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 1,
                     "input_tokens": {"dist": "fixed", "value": 16}, "output_tokens": {"dist": "fixed", "value": 16}},
        **extra}))


_MTP_3_1_4 = {"speculative": {"algorithm": "mtp", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
              "acceptance": {"accept_length": 2.0}}


def test_an_mtp_draft_on_b200_runs_its_targets_moe_runner_until_0_5_7():
    """DeepSeek-V3's FP8 experts take flashinfer_trtllm on a B200 from 0.5.5: no Triton grid for the target, nor, until
    0.5.7 gives the draft its own runner ("auto": Triton), for its MTP layer."""
    old = _deepseek_on("b200", "0.5.6", **_MTP_3_1_4)
    new = _deepseek_on("b200", "0.5.7", **_MTP_3_1_4)
    assert old.target._grid is None and new.target._grid is None
    assert old.draft is not None and old.draft._grid is None
    assert new.draft is not None and new.draft._grid is not None


def test_a_small_gpus_speculative_server_captures_graphs_to_16_before_0_5_4_post1(small):
    small["hardware"] = {"gpu": "rtx-4090", "num_gpus": 1, "interconnect": "pcie4-nccl"}
    small["model"] = "llama-3.2-1b"
    small["server"] = {"tp": 1, "sglang_version": "0.5.4"}
    small["speculative"] = {"algorithm": "ngram", "num_draft_tokens": 8}
    small["acceptance"] = {"accept_length": 2.0}
    assert _resolve(small).cuda_graph_max_bs == 16
    small["server"]["sglang_version"] = "0.5.4.post1"
    assert _resolve(small).cuda_graph_max_bs == 24


def test_a_speculative_server_graphs_a_batch_of_64_only_from_0_5_4_post2(small):
    small["hardware"] = {"gpu": "h200-sxm", "num_gpus": 1, "interconnect": "nvlink4-nccl"}
    old = IterationModel(_resolve(_eagle3(small, "0.5.4.post1")))
    new = IterationModel(_resolve(_eagle3(small, "0.5.4.post2")))
    assert 64 not in old._graph_sizes and 72 in old._graph_sizes and 64 in new._graph_sizes


def test_qwen3_moe_stores_k_and_v_in_its_rotary_kernel_from_0_5_3():
    """models/qwen3_moe.py passes fused_set_kv_buffer_arg to rotary_emb for a BF16 KV cache (0.5.3 on; not in
    0.4.6.post1): one kernel and one small kernel fewer a layer than the same attention in Qwen3, in every release
    since, and the split K / V store of 0.5.3-0.5.7 does not apply to it."""
    from simspec.timing.stack import _count_parts
    for version, expected in (((4, 6), (6, 3)), ((5, 3), (4, 1)), ((5, 7), (4, 1)), ((5, 10), (4, 1))):
        kernels, small, _ = _count_parts([("gqa_attention", 1, None)], version, "Qwen3MoeForCausalLM")
        assert (kernels, small) == expected
    assert _count_parts([("gqa_attention", 1, None)], (5, 10), "Qwen3ForCausalLM")[:2] == (5, 2)
    assert _count_parts([("gqa_attention", 1, None)], (5, 5), "Qwen3ForCausalLM")[:2] == (6, 3)


def test_mla_attention_skips_the_rope_concats_on_hopper_and_sm100_backends(small):
    """fa3 (Hopper) and flashinfer / trtllm_mla (SM100), SGLang's default MLA backends there from 0.5.3, take
    q_rope and k_rope apart (FORWARD_ABSORB_CORE_ATTENTION_BACKENDS): two small copies fewer a layer than the
    triton backend that the A100, the Ada parts and SM120 default to. 0.4.x keeps its count."""
    kimi = presets.models()["kimi-k2"]
    gpus = presets.gpus()
    assert releases.mla_takes_rope_apart((5, 3), gpus["h200-sxm"].display_name)
    assert releases.mla_takes_rope_apart((5, 8), gpus["b200"].display_name)
    assert releases.mla_takes_rope_apart((5, 8), gpus["h20"].display_name)
    assert not releases.mla_takes_rope_apart((5, 8), gpus["rtx-pro-6000-server"].display_name)
    assert not releases.mla_takes_rope_apart((5, 8), gpus["a100-80gb-sxm"].display_name)
    assert not releases.mla_takes_rope_apart((4, 6), gpus["h20"].display_name)
    apart = target_stack(kimi, 8, mla_rope_apart=True)
    concat = target_stack(kimi, 8)
    assert concat.kernels_per_forward - apart.kernels_per_forward == 2 * kimi.num_layers
    assert concat.small_kernels_per_forward - apart.small_kernels_per_forward == 2 * kimi.num_layers
    # end to end: an MTP head on an H200 is counted the same way as its target
    small["hardware"] = {"gpu": "h200-sxm", "num_gpus": 8, "interconnect": "nvlink4-nccl"}
    small["model"] = "deepseek-v3"
    small["server"] = {"tp": 8, "sglang_version": "0.5.8"}
    small["speculative"] = {"algorithm": "mtp", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 2.0}
    model = IterationModel(_resolve(small))
    deepseek = presets.models()["deepseek-v3"]
    fused = {"version": (5, 8), "shared_expert_copies": 1}  # its shared expert runs among the routed experts
    assert model.target.stack.kernels_per_forward == target_stack(deepseek, 8, mla_rope_apart=True,
                                                                 **fused).kernels_per_forward
    assert model.draft is not None
    assert (target_stack(deepseek, 8, **fused).kernels_per_forward - model.target.stack.kernels_per_forward
            == 2 * deepseek.num_layers)


def test_deepseek_v3s_shared_expert_runs_among_its_routed_experts_where_the_triton_moe_runs():
    """deepseek_v2.py fuses the shared expert into the routed experts' Triton kernel: one copy, expert 256 of 257,
    from 0.5.3 on SM80+; TP copies picked at random per token in 0.4.6 on SM90+; never under B200's flashinfer_trtllm
    MoE, in 0.4.4, or for Kimi-K2's 384 experts. Fused, the stack launches no MLP of its own for it (5 kernels a MoE
    layer with FP8 weights, 3 of them small), its weights are read as one more expert, and the grid sees 257."""
    fused, own = _deepseek_on("h200-sxm", "0.5.8"), _deepseek_on("h200-sxm", "0.4.4")
    st, base = fused.target.stack, own.target.stack
    assert (st.shared_expert_copies, base.shared_expert_copies) == (1, 0)
    assert "shared_experts" not in {g.name for g in st.groups} and "shared_experts" in {g.name for g in base.groups}
    unfused = target_stack(presets.models()["deepseek-v3"], 8, version=(5, 8), mla_rope_apart=True)
    assert unfused.kernels_per_forward - st.kernels_per_forward == 5 * st.num_moe_layers
    assert unfused.small_kernels_per_forward - st.small_kernels_per_forward == 3 * st.num_moe_layers
    assert st.weight_bytes_per_gpu == pytest.approx(unfused.weight_bytes_per_gpu)
    assert fused.target._grid.experts == 257
    one = ForwardShape(num_seqs=1, tokens=1, real_seqs=1, real_tokens=1, logit_tokens=1, graph=True)
    assert fused.target._touched_experts(one) == pytest.approx(9.0)
    assert fused.target._pairs(one) == 9 and own.target._pairs(one) == 8
    # a token's weight bytes barely move: the shared expert is read either way
    _, _, roof_fused = fused.target._weights(one)
    _, _, roof_own = ForwardModel(unfused, fused.rs.gpu, fused.collectives, fused.eff)._weights(one)
    assert roof_fused == pytest.approx(roof_own, rel=0.01)

    assert _deepseek_on("b200", "0.5.8").target.stack.shared_expert_copies == 0  # flashinfer_trtllm's MoE
    a100 = presets.gpus()["a100-80gb-sxm"].display_name
    assert releases.fused_shared_expert_copies((5, 8), a100, "DeepseekV3ForCausalLM", 256, 1, 16, True) == 1  # SM80
    assert releases.fused_shared_expert_copies((4, 6), a100, "DeepseekV3ForCausalLM", 256, 1, 16, True) == 0
    old = _deepseek_on("h200-sxm", "0.4.6.post1")
    assert old.target.stack.shared_expert_copies == 8 and old.target._grid.experts == 264
    # the seven clones more are stored on every GPU, beside the routed experts (the KV cache gets less)
    st8 = old.target.stack
    assert st8.weight_bytes_per_gpu - unfused.weight_bytes_per_gpu == pytest.approx(
        7 * st8.num_moe_layers * st8.expert_bytes_per_gpu)
    eight = ForwardShape(num_seqs=8, tokens=8, real_seqs=8, real_tokens=8, logit_tokens=8, graph=True)
    routed = old.target._touched_experts(eight) - 8 * (1 - (7 / 8) ** 8)  # the clones 8 random picks touch
    assert routed == pytest.approx(_deepseek_on("h200-sxm", "0.4.4").target._touched_experts(eight))
    assert releases.fused_shared_expert_copies((5, 8), "H200 SXM", "DeepseekV3ForCausalLM", 384, 1, 8, True) == 0


def test_an_mtp_layer_fuses_its_shared_expert_as_its_target_does():
    mtp = {"speculative": {"algorithm": "mtp", "num_steps": 1, "topk": 1, "num_draft_tokens": 2},
           "acceptance": {"accept_length": 1.5}}
    im = _deepseek_on("h200-sxm", "0.5.8", **mtp)
    assert im.draft is not None and im.draft.stack.shared_expert_copies == 1
    assert im.draft._grid is not None and im.draft._grid.experts == 257


def test_glm_4_7_flash_runs_from_0_5_8_with_its_shared_expert_fused_and_its_router_unfused(small):
    """GLM-4.7-Flash's model file ships from 0.5.8; its one shared expert runs among the routed ones (65 experts), and
    with it fused no gate kernel takes its routing, so each MoE layer's top-k launches the torch.compile'd chain
    (kernels.yaml unfused_router) where DeepSeek-V3's launches one kernel; its TP-1 graph has no branch."""
    glm = presets.models()["glm-4.7-flash"]
    assert not releases.runs_architecture((5, 7), glm.architecture)
    assert releases.runs_architecture((5, 8), glm.architecture)
    assert releases.shared_expert_copies((5, 10, 1), "H100 PCIe", glm, 1) == 1
    assert not releases.decode_graph_branches(glm.architecture, (5, 10), 1)
    extra = presets.kernel_counts().unfused_router
    assert glm.architecture in extra.architectures and extra.kernels > 0
    fused, own_mlp = target_stack(glm, 1, shared_expert_copies=1), target_stack(glm, 1)
    # fused: the shared expert's own MLP gone, the router's chain added, on each of the 46 MoE layers
    shared_mlp, _ = part_kernels("shared_experts", glm.weights.shared_experts)
    assert fused.kernels_per_forward - own_mlp.kernels_per_forward == (extra.kernels - shared_mlp) * glm.num_moe_layers
    dsv3 = presets.models()["deepseek-v3"]  # fused too, but its gate is one kernel (moe_fused_gate)
    dsv3_mlp, _ = part_kernels("shared_experts", dsv3.weights.shared_experts)
    assert (target_stack(dsv3, 8, shared_expert_copies=1).kernels_per_forward
            - target_stack(dsv3, 8).kernels_per_forward) == -dsv3_mlp * dsv3.num_moe_layers
    small["model"] = "glm-4.7-flash"
    small["server"] = {"tp": 1, "sglang_version": "0.5.7"}
    with pytest.raises(InputError, match="Glm4MoeLiteForCausalLM"):
        _resolve(small)
