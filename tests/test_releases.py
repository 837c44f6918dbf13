"""The SGLang 0.4 releases simspec models (scenario/releases.py): what each changes, by hand from their wheels."""

from __future__ import annotations

import dataclasses

import pytest

from simspec import presets
from simspec.errors import InputError
from simspec.scenario.loader import parse_scenario, resolve
from simspec.scenario.memory import early_mem_fraction_static
from simspec.timing.forward import ForwardShape
from simspec.timing.iteration import IterationModel, early_captured_batch_sizes
from simspec.timing.stack import eagle_stack, target_stack
from tests.conftest import auto_tree


def _resolve(d: dict):
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def _eagle(small: dict, version: str, **server) -> dict:
    small["server"] = {"tp": 1, "sglang_version": version, **server}
    small["speculative"] = {"algorithm": "eagle", "drafter": "eagle-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 1.5}
    return small


def test_only_read_releases_are_modelled(small):
    for version in ("0.4.4", "0.4.6", "0.4.6.post1", "0.5.3", "0.5.5.post1", "0.5.7", "0.5.8", "0.5.23"):
        small["server"] = {"tp": 1, "sglang_version": version}
        _resolve(small)
    for version in ("0.4.5", "0.4.7", "0.5.2", "0.5.24"):
        small["server"] = {"tp": 1, "sglang_version": version}
        with pytest.raises(InputError) as err:
            _resolve(small)
        assert err.value.key == "server.sglang_version" and "0.4.4, 0.4.6" in str(err.value)


def test_early_releases_run_only_their_own_algorithms(small):
    small["server"] = {"tp": 1, "sglang_version": "0.4.4"}
    small["speculative"] = {"algorithm": "ngram"}
    small["acceptance"] = {"accept_length": 1.5}
    with pytest.raises(InputError) as err:
        _resolve(small)
    assert err.value.key == "speculative.algorithm" and "none, eagle, mtp" in str(err.value)
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"}
    with pytest.raises(InputError):  # EAGLE3 arrived in 0.4.6
        _resolve(small)
    small["server"]["sglang_version"] = "0.4.6.post1"
    assert _resolve(small).speculative
    small["server"]["spec_v2"] = True
    with pytest.raises(InputError) as err:
        _resolve(small)
    assert err.value.key == "server.spec_v2"


def test_eagle_in_0_4_4_graphs_batches_up_to_32_and_runs_larger_ones_eagerly(small):
    """get_batch_sizes_to_capture (0.4.4): speculative -> 1..32; EAGLE turns padding off; the baseline keeps
    1, 2, 4, 8..160 step 8."""
    rs = _resolve(_eagle(small, "0.4.4", max_running_requests=64))
    m = IterationModel(rs)
    assert m._graph_sizes == list(range(1, 33))
    assert m.padded(32) == (32, True) and m.padded(33) == (33, False) and m.padded(48) == (48, False)
    small.pop("speculative"), small.pop("acceptance")
    base = IterationModel(_resolve(small))  # 64 running requests: a pool of 65 slots cuts the list
    assert base._graph_sizes == [1, 2, 4] + list(range(8, 65, 8)) + [65]
    assert base.padded(48) == (48, True) and base.padded(50) == (56, True)
    # an eager verify pays per-layer dispatch (60 us x 32 layers) where a graph pays its kernel boundaries and
    # small kernels (~1.0 ms): one request more costs ~0.9 ms more across the edge of the list
    step = m.decode(33, 33 * 300).verify_compute_ms - m.decode(32, 32 * 300).verify_compute_ms
    within = m.decode(32, 32 * 300).verify_compute_ms - m.decode(31, 31 * 300).verify_compute_ms
    assert step > 0.5 and within < 0.1


def test_0_4_6_capture_list_and_its_request_pool():
    """0.4.6: speculative 1-8, 10-32 step 2, 40-152 step 16 (+160-256 step 8 above 81,920 MiB); the pool of
    max_running_requests + 1 slots cuts the list and adds its last two sizes."""
    assert early_captured_batch_sizes((4, 6), True, 160, 49, 81_559) == (
        list(range(1, 9)) + list(range(10, 33, 2)) + [40, 48, 49])
    big = early_captured_batch_sizes((4, 6), False, 256, 4097, 97_871)
    assert big[:6] == [1, 2, 4, 8, 16, 24] and big[-1] == 256 and 168 in big
    assert early_captured_batch_sizes((4, 4), True, 160, 21, 81_559) == list(range(1, 22))


def test_eagle_defaults_of_the_early_releases(small):
    """max_running_requests under EAGLE: 32 in 0.4.4, 48 in 0.4.6; mem_fraction_static by tp only, with no
    drafter reserve (0.4.4), and (memory - 13 GiB) / memory on GPUs above 81,920 MiB (0.4.6)."""
    assert _resolve(_eagle(small, "0.4.4")).max_running_requests == 32
    assert _resolve(_eagle(small, "0.4.6")).max_running_requests == 48
    h100, h200 = presets.gpus()["h100-sxm"], presets.gpus()["h200-sxm"]
    assert [early_mem_fraction_static(h100, tp, (4, 4)) for tp in (1, 2, 4, 8, 16)] == [0.88, 0.87, 0.85, 0.81,
                                                                                         0.79]
    assert early_mem_fraction_static(h100, 8, (4, 6)) == 0.81
    assert early_mem_fraction_static(h200, 8, (4, 6)) == pytest.approx((h200.memory_mib - 13312) / h200.memory_mib)
    assert early_mem_fraction_static(h200, 8, (4, 4)) == 0.81


def test_early_kv_pool_follows_its_static_fraction(small):
    """The pool is (free at startup x fraction - weights) / KV bytes per token, with 0.4.4's 0.88 at tp 1."""
    small["server"] = {"tp": 1, "sglang_version": "0.4.4"}
    rs = _resolve(small)
    stack = target_stack(rs.model, 1)
    startup = rs.coefficient("startup_memory_mib")
    budget = (rs.gpu.memory_mib - startup) * 2**20 * 0.88
    assert rs.kv_capacity_tokens == int((budget - stack.weight_bytes_per_gpu) / stack.kv_bytes_per_token_per_gpu)


def test_0_4_6_qwen3_launches_more_small_kernels():
    """0.4.6.post1 by hand: q_norm and k_norm as two RMSNorms (+1), K and V stored by two index_puts (+1) in every
    layer; an MoE layer's gating cast, renormalising sum and divide, sorted-id fill (+4); Qwen3-MoE's store, which
    its rotary kernel makes from 0.5.3, one more (+1); from two query rows the q and k reshapes copy (+2 per layer; a
    Llama layer's attention copies its q instead, +1). All of them small."""
    models = presets.models()
    for name, extra in (("qwen3-8b", 2), ("qwen3-30b-a3b", 7)):
        m = models[name]
        new, old = target_stack(m, 1), target_stack(m, 1, version=(4, 6))
        assert old.kernels_per_forward - new.kernels_per_forward == extra * m.num_layers
        assert old.small_kernels_per_forward - new.small_kernels_per_forward == extra * m.num_layers
        assert (old.small_kernels_from_two_rows, new.small_kernels_from_two_rows) == (2 * m.num_layers, 0)
    llama = models["llama-3.1-8b"]
    for version in ((4, 4), (4, 6)):
        old = target_stack(llama, 1, version=version)
        assert old.kernels_per_forward - target_stack(llama, 1).kernels_per_forward == 32  # the split K / V store
        assert old.small_kernels_from_two_rows == 32  # q.contiguous() of the split q view
    head = next(d for d in presets.drafters().values() if d.algorithm == "eagle" and d.weights == "bf16")
    assert eagle_stack(head, 1, (4, 4)).kernels_per_forward - eagle_stack(head, 1).kernels_per_forward == 1


def test_copies_cost_time_only_from_two_query_rows(small):
    """Batch 1 decode has one query row: no copies. Batch 2, or one request verifying 4 draft tokens, has more."""
    small["model"] = "qwen3-8b"
    small["server"] = {"tp": 1, "sglang_version": "0.4.6"}
    old = IterationModel(_resolve(small))
    small["server"]["sglang_version"] = "0.5.10"
    new = IterationModel(_resolve(small))
    per_kernel_ms = (new.eff.kernel_gap_graph_us + new.eff.small_kernel_us) / 1e3
    layers = presets.models()["qwen3-8b"].num_layers
    gap1 = old.decode(1, 100).verify_compute_ms - new.decode(1, 100).verify_compute_ms
    gap2 = old.decode(2, 200).verify_compute_ms - new.decode(2, 200).verify_compute_ms
    assert gap1 == pytest.approx(2 * layers * per_kernel_ms)
    assert gap2 == pytest.approx(4 * layers * per_kernel_ms)
    stack = old.target.stack
    shape = dict(num_seqs=1, tokens=4, real_seqs=1, real_tokens=4, logit_tokens=4, graph=True)
    one_request_verify = old.target.fixed_and_rates(ForwardShape(**shape))[0]
    no_copies = dataclasses.replace(stack, small_kernels_from_two_rows=0.0)
    bare = type(old.target)(no_copies, old.rs.gpu, old.target.collectives, old.eff)
    assert one_request_verify - bare.fixed_and_rates(ForwardShape(**shape))[0] == pytest.approx(
        2 * layers * per_kernel_ms)


def test_early_draft_extend_runs_eagerly(small):
    """0.4.x calls the draft ModelRunner for the extend after a verify, which captured no graph: its forward pays
    per-layer dispatch and its own launch; the num_steps - 1 draft steps stay one graph."""
    m = IterationModel(_resolve(_eagle(small, "0.4.4")))
    steps, extend = [f for f in m.plan(4) if f.is_draft]
    assert extend.launch_ms == m.eff.forward_overhead_ms and extend.launch_host_ms == 0.0  # eager: GPU time
    assert steps.launch_ms == pytest.approx(m.rs.coefficient("graph_replay_gpu_us") / 1e3) and steps.launch_host_ms > 0
    eager_dispatch_ms = m.eff.layer_overhead_eager_us / 1e3  # one decoder layer
    assert extend.compute_ms > eager_dispatch_ms
    current = IterationModel(_resolve(_eagle(small, "0.5.8")))
    _, extend_now = [f for f in current.plan(4) if f.is_draft]
    now = current.draft.stack
    in_graph_ms = (now.kernels_per_forward * m.eff.kernel_gap_graph_us + now.small_kernels_per_forward
                   * m.eff.small_kernel_us) / 1e3
    # same work at the same batch: eager dispatch where 0.5.8 pays its graph's kernel boundaries and small kernels
    assert extend.compute_ms - extend_now.compute_ms == pytest.approx(eager_dispatch_ms - in_graph_ms, abs=1e-9)


def test_early_releases_pick_5_4_8_and_serve_only_their_models(small):
    """With no tree set, 0.4.4 (its argument defaults) and 0.4.6 (auto_choose_speculative_params) pick (5, 4, 8)
    for any model, where 0.5.x picks (3, 1, 4) outside Llama and Grok; 0.4.4 has no Qwen3 model code."""
    assert auto_tree("0.4.6") == (5, 4, 8)
    assert auto_tree("0.5.10") == (3, 1, 4)
    small["model"] = "qwen3-8b"
    small["server"] = {"tp": 1, "sglang_version": "0.4.4"}
    with pytest.raises(InputError) as err:
        _resolve(small)
    assert err.value.key == "model" and "Qwen3ForCausalLM" in str(err.value)


def test_fp8_moe_swap_ab_arrives_on_the_h20_in_0_5_8_and_on_every_hopper_in_0_5_9():
    """fused_moe_triton_kernels.should_enable_swap_ab: absent before 0.5.8; 0.5.8 checks for "H20" but not "H200"
    in the device name; 0.5.9 enables it on any SM90 part."""
    from simspec.scenario.releases import fp8_moe_swaps_ab

    h20, h200 = presets.gpus()["h20"].display_name, presets.gpus()["h200-sxm"].display_name
    assert not fp8_moe_swaps_ab((4, 6), h20) and not fp8_moe_swaps_ab((4, 4), h20)
    assert fp8_moe_swaps_ab((5, 8), h20) and not fp8_moe_swaps_ab((5, 8), h200)
    assert fp8_moe_swaps_ab((5, 9), h200) and fp8_moe_swaps_ab((5, 10), h20)


def test_h20_fp8_small_tile_configs_by_shape():
    """The H20's block-FP8 config files, read under nearest-key lookup: E 128 (Qwen3-30B-A3B at TP 1 and TP 2) up to
    192 tokens, DeepSeek-V3's fused 256 + 8 experts at TP 8 up to 384 (0.4.6.post1); no file for Qwen3-235B at TP 8
    (N 192) and no 0.4.4 file; the 0.5.3-0.5.7 wheels ship 0.5.8's files, which carry the same ranges."""
    from simspec.scenario.releases import fused_shared_expert_copies
    from simspec.timing.forward import moe_grid

    models = presets.models()
    qwen, big, deepseek = models["qwen3-30b-a3b-fp8"], models["qwen3-235b-a22b-fp8"], models["deepseek-v3"]

    def small_tile_tokens(model, tp, release):
        copies = fused_shared_expert_copies(release[:2], "H20 (96 GB)", model.architecture, model.num_routed_experts,
                                            model.num_shared_experts, tp, True)
        grid = moe_grid("h20", model, target_stack(model, tp, shared_expert_copies=copies), release)
        return grid.small_tile_tokens() if grid else 0

    assert small_tile_tokens(qwen, 1, (4, 6)) == 192 and small_tile_tokens(qwen, 2, (4, 6)) == 192
    assert small_tile_tokens(deepseek, 8, (4, 6)) == 384
    assert small_tile_tokens(big, 8, (4, 6)) == 0
    assert small_tile_tokens(qwen, 1, (4, 4)) == 0
    assert small_tile_tokens(qwen, 1, (5, 5, 0)) == 192 and small_tile_tokens(qwen, 1, (5, 8)) == 192
