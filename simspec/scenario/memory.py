"""GPU memory as SGLang lays it out: its size-dependent defaults, the weights, and the KV cache left.

server_args.py picks chunked_prefill_size and cuda_graph_max_bs by GPU memory and tp (the same tiers in 0.5.3
through 0.5.10 but for the 20-35 GiB tier's graph cap before 0.5.4.post1: tier_defaults), then
mem_fraction_static from a reserve for activations, CUDA graphs and the drafter, which changed between versions
(default_mem_fraction_static); the KV cache gets what that fraction of the memory free at startup leaves after the
weights, and the running-request cap follows from the KV capacity (model_runner_kv_cache_mixin._resolve_max_num_reqs).
The 0.4 releases simspec models (releases.py) had simpler rules, kept in early_tier_defaults and
early_mem_fraction_static; the pool and the request cap follow the same formulas there (0.4.4 / 0.4.6.post1
model_runner.init_memory_pool, managers/tp_worker.py), except that a 0.4 target sizes its pool before the draft
worker loads (the drafter's weights and KV then come out of the reserve, where simspec subtracts them from the pool:
~1 GB) and adds the draft tokens' slots to it; neither is modelled.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simspec.errors import InputError
from simspec.presets import GpuPreset, ModelPreset
from simspec.scenario import releases
from simspec.scenario.schema import Server

if TYPE_CHECKING:
    from simspec.timing.stack import Stack

# GPU memory in MiB below which (chunked_prefill_size, cuda_graph_max_bs if tp < 4, cuda_graph_max_bs if
# tp >= 4) apply (server_args._handle_gpu_memory_settings)
SMALL_GPU_TIER_MIB = 35 * 1024
MEMORY_TIERS_MIB = (
    (20 * 1024, (2048, 8, 8)),
    (SMALL_GPU_TIER_MIB, (2048, 24, 80)),
    (60 * 1024, (4096, 32, 160)),
    (160 * 1024, (8192, 256, 512)),
    (float("inf"), (16384, 512, 512)),
)


@dataclass(frozen=True, slots=True)
class MemoryPlan:
    chunked_prefill_size: int
    cuda_graph_max_bs: int
    mem_fraction_static: float
    weight_bytes_per_gpu: float
    kv_capacity_tokens: int
    max_running_requests: int


def plan_memory(gpu: GpuPreset, model_name: str, model: ModelPreset, target: Stack, draft: Stack | None,
                server: Server, algorithm: str, file: str, startup_mib: float = 0.0,
                tree: tuple[int, int, int] = (0, 0, 1)) -> MemoryPlan:
    """SGLang's memory defaults for this box, and what they leave for the KV cache; InputError if the weights
    do not fit. startup_mib: memory already in use when SGLang measures the free memory the KV cache is sized
    from (model_runner_kv_cache_mixin.profile_max_num_token): the pool is (total - startup) x
    mem_fraction_static - weights, while the default fraction itself is computed from the total. tree: the
    speculative (num_steps, topk, num_draft_tokens), for the draft headroom 0.5.3-0.5.6 add to the pool
    (releases.draft_kv_headroom)."""
    tp = server.tp
    version = server.version_minor_patch
    early = releases.is_early(version)
    weights = target.weight_bytes_per_gpu + (draft.weight_bytes_per_gpu if draft else 0.0)
    chunk, graph_bs = early_tier_defaults(gpu, tp, version) if early else tier_defaults(gpu, tp, server.release)
    if server.chunked_prefill_size is not None:
        chunk = server.chunked_prefill_size
    if server.cuda_graph_max_bs is not None:
        graph_bs = server.cuda_graph_max_bs
    fraction = server.mem_fraction_static
    if fraction is None and early:
        fraction = early_mem_fraction_static(gpu, tp, version)
    elif fraction is None:
        fraction = default_mem_fraction_static(gpu, tp, chunk, graph_bs, model.attention.kind == "mla", algorithm,
                                               version)
    budget = (gpu_mib(gpu) - startup_mib) * 2**20 * fraction
    if weights >= budget:
        how = "set by the scenario" if server.mem_fraction_static is not None else "SGLang's default here"
        raise InputError(f"{model_name} does not fit: {weights / 1e9:.1f} GB of weights per GPU at tp {tp}"
                         f" (drafter included) vs {budget / 1e9:.1f} GB usable (({gpu.memory_mib:,} MiB -"
                         f" {startup_mib:,.0f} MiB in use at startup) x mem_fraction_static {fraction:g}, {how});"
                         " raise tp, pick a larger GPU or raise"
                         " server.mem_fraction_static", file=file, key="model")
    kv_per_token = target.kv_bytes_per_token_per_gpu + (draft.kv_bytes_per_token_per_gpu if draft else 0.0)
    kv_capacity = int((budget - weights) / kv_per_token)
    requested = server.max_running_requests
    if requested is None and algorithm != "none":
        requested = releases.spec_default_max_running(version)
    mrr = max_running_requests(requested, kv_capacity, model.context_length)
    # the request pool that sizes the headroom is the one set before it: the cap asked for, else the pool formula
    pool = requested if requested is not None else request_pool(kv_capacity, model.context_length)
    kv_capacity += releases.draft_kv_headroom(version, algorithm, pool, *tree)
    return MemoryPlan(chunk, graph_bs, fraction, weights, kv_capacity, mrr)


def gpu_mib(gpu: GpuPreset) -> float:
    """The memory SGLang sizes its defaults by: nvidia-smi's total, not the marketed capacity read as 1e9 bytes
    (an "80 GB" H100 is 81,559 MiB = 85.5e9 bytes)."""
    return float(gpu.memory_mib)


def tier_defaults(gpu: GpuPreset, tp: int, release: tuple[int, int, int] = (5, 10, 0)) -> tuple[int, int]:
    """SGLang's (chunked_prefill_size, cuda_graph_max_bs) for this GPU's memory and TP degree (0.5 releases: the
    20-35 GiB tier's cap at tp < 4 was 16 until 0.5.4.post1, releases.SMALL_GPU_GRAPH_BS_24_FROM)."""
    for limit, (chunk, small_tp, large_tp) in MEMORY_TIERS_MIB:
        if gpu_mib(gpu) < limit:
            if limit == SMALL_GPU_TIER_MIB and release < releases.SMALL_GPU_GRAPH_BS_24_FROM:
                small_tp = 16
            return chunk, small_tp if tp < 4 else large_tp
    raise AssertionError("the last tier has no upper limit")


def _piecewise_graph_sizes(max_tokens: int) -> int:
    """How many token counts SGLang captures piecewise CUDA graphs for (_generate_piecewise_cuda_graph_tokens)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return len([s for s in sizes if s <= max_tokens])


def default_mem_fraction_static(gpu: GpuPreset, tp: int, chunk: int, graph_bs: int, mla: bool,
                                algorithm: str, version: tuple[int, int] = (5, 10)) -> float:
    """SGLang's mem_fraction_static when the user sets none: (memory - reserve) / memory, the reserve in MiB
    covering attention metadata, prefill activations, decode CUDA graphs, large-TP padding, piecewise (prefill)
    CUDA graphs and the drafter (server_args._handle_gpu_memory_settings; data-parallel attention and
    multimodal adjustments are not modelled). What changed by version, read from the wheels:
    - 0.5.3 through 0.5.9: piecewise CUDA graphs are off unless --enable-piecewise-cuda-graph, so nothing is reserved
      for them; an EAGLE-family drafter reserves 2 GiB.
    - 0.5.10 on: piecewise graphs are on by default and reserve 8 MiB per captured size (a flat 1.5 GiB with
      MLA), except that _handle_piecewise_cuda_graph, which runs first, turns them off under any speculative
      algorithm; an EAGLE-family drafter reserves 4 GiB. 0.5.23 restructured this (arg_groups/memory_hook.py)
      and is approximated by 0.5.10's rule.
    Either way a standalone draft model reserves 6 GiB and n-gram nothing."""
    mib = gpu_mib(gpu)
    reserve = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp / 8 * 1024
    piecewise = version >= (5, 10) and algorithm == "none"
    if piecewise:
        reserve += 1.5 * 1024 if mla else _piecewise_graph_sizes(chunk) * 8  # MLA: a flat 1.5 GiB instead
    if mib > 60 * 1024:
        reserve = max(reserve, 10 * 1024)
    if algorithm == "standalone":
        reserve += 6 * 1024
    elif algorithm not in ("none", "ngram"):
        reserve += (4 if version >= (5, 10) else 2) * 1024
    return round((mib - reserve) / mib, 3)


def request_pool(kv_capacity: int, context_length: int) -> int:
    """The request pool SGLang sizes when no cap is set: capacity / context_length x 512, within [2048, 4096]."""
    return max(min(int(kv_capacity / context_length * 512), 4096), 2048)


def max_running_requests(requested: int | None, kv_capacity: int, context_length: int) -> int:
    """SGLang's cap on running requests: a pool of capacity / context_length x 512 requests, clamped to
    [2048, 4096]; without a setting (the user's, or the one a speculative server makes: releases.py) also at
    most capacity // 2."""
    pool = request_pool(kv_capacity, context_length)
    if requested is not None:
        return max(1, min(requested, pool))
    return max(1, min(pool, kv_capacity // 2))


EARLY_SMALL_GPU_MIB = 25_000  # 0.4.x: below this, chunked_prefill_size 2048 and cuda_graph_max_bs 8 / 80
EARLY_TP_FRACTIONS = ((16, 0.79), (8, 0.81), (4, 0.85), (2, 0.87), (1, 0.88))  # tp at least -> fraction


def early_tier_defaults(gpu: GpuPreset, tp: int, version: tuple[int, int]) -> tuple[int, int]:
    """(chunked_prefill_size, cuda_graph_max_bs) in 0.4.4 / 0.4.6 (server_args.__post_init__): 2048 and 8 (tp < 4)
    or 80 below 25,000 MiB, else 8192 and 160. 0.4.6 sets no cap above 25,000 MiB; its capture list then ends
    at 160, or 256 on GPUs above 81,920 MiB (cuda_graph_runner.get_batch_sizes_to_capture)."""
    if gpu_mib(gpu) < EARLY_SMALL_GPU_MIB:
        return 2048, 8 if tp < 4 else 80
    if version == (4, 6) and gpu_mib(gpu) > 81920:
        return 8192, 256
    return 8192, 160


def early_mem_fraction_static(gpu: GpuPreset, tp: int, version: tuple[int, int]) -> float:
    """mem_fraction_static in 0.4.4 / 0.4.6 (server_args.__post_init__), whatever the drafter: 0.79 / 0.81 / 0.85 /
    0.87 / 0.88 for tp >= 16 / 8 / 4 / 2 / 1; 0.4.6 keeps these tiers up to 81,920 MiB and above that leaves
    13 GiB free: (memory - 13,312 MiB) / memory."""
    mib = gpu_mib(gpu)
    if version == (4, 6) and mib > 81920:
        return (mib - 13 * 1024) / mib
    return next(f for least, f in EARLY_TP_FRACTIONS if tp >= least)
