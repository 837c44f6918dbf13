"""GPU memory as SGLang lays it out: size-dependent defaults, the static fraction, KV capacity, request cap."""

from __future__ import annotations

import pytest

from simspec import presets
from simspec.scenario.loader import parse_scenario, resolve
from simspec.scenario.memory import default_mem_fraction_static


def test_sglang_memory_tier_defaults(small):
    """cuda_graph_max_bs and chunked_prefill_size follow GPU memory and tp (server_args, 0.5.10)."""
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")  # H100 80 GB, tp 1
    assert (rs.cuda_graph_max_bs, rs.chunked_prefill_size) == (256, 8192)
    small["hardware"] = {"gpu": "b200", "num_gpus": 1, "interconnect": "nvlink5-nccl"}
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    assert (rs.cuda_graph_max_bs, rs.chunked_prefill_size) == (512, 16384)
    small["hardware"] = {"gpu": "l40s", "num_gpus": 4, "interconnect": "pcie4-nccl"}
    small["server"] = {"tp": 4}
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    assert (rs.cuda_graph_max_bs, rs.chunked_prefill_size) == (160, 4096)


def test_max_running_requests_follow_sglang(small):
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    pool = max(min(int(rs.kv_capacity_tokens / 131072 * 512), 4096), 2048)
    assert rs.max_running_requests == min(pool, rs.kv_capacity_tokens // 2)
    small["speculative"] = {"algorithm": "ngram"}
    small["acceptance"] = {"accept_length": 1.5}
    assert resolve(parse_scenario(small, "t.yaml"), "t.yaml").max_running_requests == 48


def test_default_static_fraction_by_hand():
    """H100 (81,559 MiB as the driver reports it), tp 1, Llama (no MLA), no drafter: reserve 512 + 8192 x 1.5
    + 256 x 2 + 1/8 x 1024 + 58 piecewise graphs x 8 = 13,904 MiB -> (81,559 - 13,904) / 81,559 = 0.830."""
    h100 = presets.gpus()["h100-sxm"]
    assert h100.memory_mib == 81_559
    assert default_mem_fraction_static(h100, 1, 8192, 256, mla=False, algorithm="none") == 0.830
    # M1's box (97,887 MiB), tp 8, MLA, no drafter: 512 + 12,288 + 1,024 + 1,024 + 1,536 (MLA piecewise graphs)
    rtx = presets.gpus()["rtx-pro-6000-server"]
    assert default_mem_fraction_static(rtx, 8, 8192, 512, mla=True, algorithm="none") == 0.833
    # speculation turns piecewise graphs off before the reserve is computed (0.5.10 _handle_piecewise_cuda_graph):
    # an EAGLE head reserves 4 GiB instead, n-gram nothing, a standalone draft model 6 GiB
    assert default_mem_fraction_static(rtx, 8, 8192, 512, mla=True, algorithm="eagle3") == 0.806
    assert default_mem_fraction_static(rtx, 8, 8192, 512, mla=True, algorithm="ngram") == 0.848
    assert default_mem_fraction_static(rtx, 8, 8192, 512, mla=True, algorithm="standalone") == 0.786


def test_default_static_fraction_follows_the_sglang_version():
    """0.5.8 and 0.5.9 capture no piecewise CUDA graphs by default (enable_piecewise_cuda_graph=False) and reserve
    2 GiB for an EAGLE head; 0.5.10 turned piecewise graphs on (8 MiB per captured size: 58 sizes up to 8,192
    tokens) and reserves 4 GiB for the head."""
    h100 = presets.gpus()["h100-sxm"]
    older = default_mem_fraction_static(h100, 1, 8192, 256, mla=False, algorithm="none", version=(5, 8))
    newer = default_mem_fraction_static(h100, 1, 8192, 256, mla=False, algorithm="none", version=(5, 10))
    assert (older, newer) == (round((81_559 - 13_440) / 81_559, 3), round((81_559 - 13_904) / 81_559, 3))
    assert default_mem_fraction_static(h100, 1, 8192, 256, mla=False, algorithm="eagle3", version=(5, 9)) == round(
        (81_559 - 13_440 - 2_048) / 81_559, 3)
    assert default_mem_fraction_static(h100, 1, 8192, 256, mla=False, algorithm="eagle3", version=(5, 23)) == round(
        (81_559 - 13_440 - 4_096) / 81_559, 3)


def test_kv_capacity_grows_with_the_older_default(small):
    """The scenario's sglang_version reaches the default: 0.5.8 keeps the piecewise-graph reserve for the KV cache."""
    small["server"] = {"tp": 1, "sglang_version": "0.5.8"}
    older = resolve(parse_scenario(small, "t.yaml"), "t.yaml").kv_capacity_tokens
    small["server"] = {"tp": 1, "sglang_version": "0.5.10"}
    newer = resolve(parse_scenario(small, "t.yaml"), "t.yaml").kv_capacity_tokens
    assert older > newer


def test_kv_capacity_is_what_the_static_fraction_leaves_after_weights(small):
    small["server"] = {"tp": 1, "mem_fraction_static": 0.5}
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    from simspec.timing.stack import target_stack

    s = target_stack(rs.model, 1)
    # the H100's total as the driver reports it (not its marketed 80e9 bytes), less what is in use when SGLang
    # measures the free memory it sizes the pool from
    startup = presets.default_coefficients()["startup_memory_mib"].value
    assert startup > 0
    memory = (81_559 - startup) * 2**20
    assert rs.kv_capacity_tokens == int((memory * 0.5 - s.weight_bytes_per_gpu) / s.kv_bytes_per_token_per_gpu)


def test_multi_gpu_servers_start_with_more_memory_in_use(small):
    """With tp > 1 NCCL and the custom all-reduce buffers are in place before SGLang measures: the tp-8
    coefficient applies, and the pool per GPU follows the same formula."""
    from simspec.timing.stack import target_stack

    small["model"] = "llama-3.1-70b"
    small["hardware"] = {"gpu": "h100-sxm", "num_gpus": 8, "interconnect": "nvlink4-nccl"}
    small["server"] = {"tp": 8, "mem_fraction_static": 0.8}
    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    c = presets.default_coefficients()
    startup = c["startup_memory_multi_gpu_mib"].value
    assert startup > c["startup_memory_mib"].value
    s = target_stack(rs.model, 8)
    memory = (81_559 - startup) * 2**20
    assert rs.kv_capacity_tokens == int((memory * 0.8 - s.weight_bytes_per_gpu) / s.kv_bytes_per_token_per_gpu)


def test_kv_pool_matches_a_logged_sglang_server():
    """SGLang PR #4760's log (Llama-3.1-8B, one 80 GB Hopper GPU, mem_fraction_static 0.88): 'Load weight
    begin' found 78.59 GiB free (its weight-end line: 63.48 GiB free, 15.11 GiB used) and the pool got 442,750
    tokens. Given that free memory, simspec's pool is within 0.5% of it (the loader holds ~0.15 GiB beyond the
    weights simspec counts)."""
    from simspec.scenario.memory import plan_memory
    from simspec.scenario.schema import Server
    from simspec.timing.stack import target_stack

    gpu = presets.gpus()["h100-sxm"]
    model = presets.models()["llama-3.1-8b"]
    target = target_stack(model, 1)
    startup = gpu.memory_mib - 78.59 * 1024
    plan = plan_memory(gpu, "llama-3.1-8b", model, target, None, Server(tp=1, mem_fraction_static=0.88),
                       "none", "t.yaml", startup)
    assert plan.kv_capacity_tokens == pytest.approx(442_750, rel=0.005)
    # without the startup memory the pool would be ~2% larger than the server's
    plain = plan_memory(gpu, "llama-3.1-8b", model, target, None, Server(tp=1, mem_fraction_static=0.88),
                        "none", "t.yaml")
    assert plain.kv_capacity_tokens > 442_750 * 1.015


def test_k25_with_a_drafter_fits_sglangs_default_fraction_on_96_gb_with_less_kv(small):
    from simspec.errors import InputError
    from simspec.scenario.loader import load_scenario
    from tests.conftest import SCENARIOS

    default = load_scenario(SCENARIOS / "eagle3.yaml", ["server.mem_fraction_static=null"])
    raised = load_scenario(SCENARIOS / "eagle3.yaml")  # 0.92
    assert 0 < default.kv_capacity_tokens < raised.kv_capacity_tokens / 2
    with pytest.raises(InputError, match="does not fit.*mem_fraction_static 0.7, set by the scenario"):
        load_scenario(SCENARIOS / "eagle3.yaml", ["server.mem_fraction_static=0.7"])


def test_a_profile_sets_the_memory_in_use_at_startup(small, tmp_path):
    """A calibration profile's startup_memory_mib replaces the default in the KV sizing."""
    import yaml

    from simspec.timing.stack import target_stack

    (tmp_path / "p.yaml").write_text(yaml.safe_dump(
        {"name": "p", "coefficients": {"startup_memory_mib": {"value": 3000, "source": "a log"}}}))
    small["server"] = {"tp": 1, "mem_fraction_static": 0.5}
    small["calibration"] = "p.yaml"
    rs = resolve(parse_scenario(small, str(tmp_path / "s.yaml")), str(tmp_path / "s.yaml"))
    s = target_stack(rs.model, 1)
    assert rs.kv_capacity_tokens == int(((81_559 - 3000) * 2**20 * 0.5 - s.weight_bytes_per_gpu)
                                        / s.kv_bytes_per_token_per_gpu)
