"""Cost of one forward pass of a decoder stack over a batch shape, on one GPU of the TP group.

Each weight group costs max(bytes / achievable bandwidth, FLOPs / achievable compute) (a roofline per
group), routed experts are charged for the DISTINCT experts the batch touches, attention for the KV cache it
reads, and every forward pays fixed launch overhead plus its tensor-parallel collectives.

A GEMM's FLOPs count the rows the tensor cores actually run: the tokens rounded up to the GPU's smallest MMA
(gpus.yaml mma_rows: 64 on Hopper, whose GEMMs issue wgmma .m64), and for the routed experts at least one block
of Triton's fused MoE per touched expert (a lower bound: tokens are not split per expert). At small batch this
is what bounds a compute-starved part such as the H20.

Where a release's tuned config gives FP8 experts 16-row blocks (MoeGrid.small_tile_tokens), narrower
than Hopper's 64-row wgmma, Triton runs them on warp-level MMA unless the kernel swaps A and B
(releases.fp8_moe_swaps_ab). Where that path's rate was measured (gpus.yaml moe_small_tile_tflops: the H20), those
expert GEMMs run at it: on the H20 it makes them compute-bound (74 TFLOPS against 4 TB/s).

The fused MoE's grid is sized by its alignment buffer, not by the blocks the routing fills (MoeGrid,
releases.fused_moe_padded_rows): before SGLang 0.5.7 a one-token call launches ~121 row blocks of which 8 hold
tokens, and every program of the other 113 starts, reads the padded count and returns. Each costs
moe_empty_block_us of the call (defaults.yaml), a fixed time per layer that no bandwidth sets.

The programs whose row block holds tokens (MoeGrid.working_programs) each stream one expert's K x BLOCK_SIZE_N slice,
and one program draws only moe_program_gbps: a call with few of them (one token of DeepSeek-V3 at TP 8: 9 experts x
4 column tiles of w13) streams at programs x that rate, below the GPU's bandwidth. Each GEMM of the fused MoE is
charged its bytes at the smaller of the two; the tiles are the release's (w2's from its own down file where the
release loads one).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from simspec import presets
from simspec.presets import GpuPreset, ModelPreset
from simspec.scenario import releases
from simspec.timing.collectives import Collectives
from simspec.timing.stack import ACTIVATION_BYTES, Stack

# Rows of one routed expert's tile in SGLang's Triton fused-MoE kernel at decode batch sizes: BLOCK_SIZE_M 16,
# the smallest tl.dot accepts (fused_moe_triton get_default_config and the tuned configs/ for small M)
MOE_BLOCK_ROWS = 16


def padded_rows(tokens: int, mma_rows: int) -> int:
    """Rows a GEMM over `tokens` runs on the tensor cores: a whole number of the GPU's smallest MMA."""
    return math.ceil(tokens / mma_rows) * mma_rows if tokens > 0 else 0


@dataclass(frozen=True, slots=True)
class ForwardShape:
    """A batch as one forward pass sees it."""

    num_seqs: int  # sequences in the kernel launch (CUDA-graph padded)
    tokens: int  # tokens in the kernel launch (padded): sets GEMM size and collective payloads
    real_seqs: int  # sequences that carry real tokens: set which experts are touched
    real_tokens: int
    logit_tokens: int  # tokens whose logits are computed and all-gathered
    graph: bool  # replayed from a CUDA graph
    extend: bool = False  # consumes target hidden states (runs EAGLE's fc)
    prefill: bool = False  # new prompt tokens: activations past the L2 (Stack.elementwise_bytes_per_token)


@dataclass(frozen=True, slots=True)
class ForwardCost:
    compute_ms: float  # GPU time in kernels and launch gaps
    comm_ms: float  # GPU time in TP collectives
    roofline_ms: float  # bytes / peak bandwidth: the floor with free communication and no overhead


@dataclass(frozen=True, slots=True)
class Efficiencies:
    memory_bandwidth: float
    compute: float
    routing_locality: float
    forward_overhead_ms: float
    kernel_gap_graph_us: float
    small_kernel_us: float
    layer_overhead_eager_us: float
    moe_empty_block_us: float = 0.0
    streaming_kernel_us: float = 0.0
    moe_program_gbps: float = math.inf  # no limit unless the coefficients give one
    routing_spread: float = 0.0  # expert popularity's squared coefficient of variation (distinct_experts)

    @classmethod
    def from_coefficients(cls, coefficient: Callable[[str], float]) -> Efficiencies:
        """The efficiencies from a coefficient lookup by defaults.yaml name (a scenario's profile or the defaults)."""
        return cls(memory_bandwidth=coefficient("memory_bandwidth_efficiency"),
                   compute=coefficient("compute_efficiency"), routing_locality=coefficient("moe_routing_locality"),
                   forward_overhead_ms=coefficient("forward_overhead_ms"),
                   kernel_gap_graph_us=coefficient("kernel_gap_graph_us"),
                   small_kernel_us=coefficient("small_kernel_us"),
                   layer_overhead_eager_us=coefficient("layer_overhead_eager_us"),
                   moe_empty_block_us=coefficient("moe_empty_block_us"),
                   streaming_kernel_us=coefficient("streaming_kernel_us"),
                   moe_program_gbps=coefficient("moe_program_gbps"),
                   routing_spread=coefficient("moe_routing_spread"))


SMALL_TILE_ROWS = 16  # BLOCK_SIZE_M of the tiles that Hopper cannot run on wgmma (.m64) unless A and B are swapped
ALL_CALLS = 1 << 30  # SmallTiles.max_tokens when every call size runs 16-row tiles


@dataclass(frozen=True, slots=True)
class SmallTiles:
    """Routed-expert GEMMs of calls up to max_tokens tokens run in 16-row tiles on warp-level MMA, at tflops."""

    tflops: float
    max_tokens: int


def moe_small_tiles(gpu: GpuPreset, stack: Stack, grid: MoeGrid | None,
                    version: tuple[int, int]) -> SmallTiles | None:
    """When the routed experts' GEMMs do not run at the dense peak: FP8 experts whose release has a tuned config
    with 16-row tiles for their shape on this GPU (the grid's tiles, up to the most tokens nearest-key lookup still
    maps to a 16-row entry), does not swap those tiles onto wgmma, and whose GPU's small-tile rate was measured."""
    if gpu.moe_small_tile_tflops is None or stack.expert_compute != "fp8" or not stack.num_moe_layers:
        return None
    if grid is None or releases.fp8_moe_swaps_ab(version, gpu.display_name):
        return None
    max_tokens = grid.small_tile_tokens()
    return SmallTiles(gpu.moe_small_tile_tflops, max_tokens) if max_tokens else None


# get_default_config's tile for BF16 calls over more tokens than experts (BLOCK_SIZE_M, BLOCK_SIZE_N)
DEFAULT_WIDE_TILE = (64, 64)


def default_moe_tile(tokens: int, experts: int, weights: str) -> tuple[int, int]:
    """(BLOCK_SIZE_M, BLOCK_SIZE_N) of SGLang's Triton fused MoE without a tuned config for the shape and GPU
    (fused_moe_triton get_default_config, the same in 0.4.6.post1 and 0.5.8): 16 x 32 for BF16 calls of at most E
    tokens, else 64 x 64; per-tensor FP8 64 x 128 up to E tokens, else 128 x 256; block FP8 64 x the block (128)."""
    if weights == "fp8-block128":
        return 64, 128
    if weights == "fp8":
        return (64, 128) if tokens <= experts else (128, 256)
    return (16, 32) if tokens <= experts else DEFAULT_WIDE_TILE


@dataclass(frozen=True, slots=True)
class MoeGrid:
    """The fused-MoE kernel's launch grid, for the programs that exit at once (releases.fused_moe_padded_rows):
    the release's alignment rule (tight from 0.5.7), the experts as the kernel sees them, and the tiles by call size
    (a tuned config file's (tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) entries, the nearest key taken as SGLang takes it;
    none: default_moe_tile for `weights`)."""

    tight: bool
    experts: int
    weights: str
    tiles: tuple[tuple[int, int, int], ...] = ()
    plus_one: bool = False  # the worst-case buffer pads E + 1 experts (0.4.10-0.5.6), not E (0.4.x)
    down_tiles: tuple[tuple[int, int, int], ...] = ()  # the w2 GEMM's own config file's entries, where it has one
    # the tiles are get_default_config's (no tuned file for the shape and GPU), whether read from `tiles` (a kernel
    # table's benchmark) or from default_moe_tile (a release without a file): what runs_default_wide_tile reads
    heuristic: bool = False

    @staticmethod
    def _nearest(entries: tuple[tuple[int, int, int], ...], tokens: int) -> tuple[int, int, int]:
        """The config entry SGLang takes for a call: the nearest key, the first on a tie (min() over the keys)."""
        return min(entries, key=lambda t: abs(t[0] - tokens))

    def tile(self, tokens: int) -> tuple[int, int]:
        if not self.tiles:
            return default_moe_tile(tokens, self.experts, self.weights)
        _, bm, bn = self._nearest(self.tiles, tokens)
        return bm, bn

    def block_rows(self, tokens: int) -> int:
        """BLOCK_SIZE_M of a call over `tokens` tokens: every row block of a touched expert runs whole on the
        tensor cores, however few of its rows the routing filled."""
        return self.tile(tokens)[0]

    def runs_default_wide_tile(self, tokens: int) -> bool:
        """Whether a call over `tokens` tokens runs get_default_config's wide tile: 64 x 64 rows and columns with
        BLOCK_SIZE_K 32, GROUP_SIZE_M 8 and Triton's own warps and stages (SGLang's BF16 experts over more tokens than
        experts; vLLM's per-tensor FP8 too before its PR #34846). Its rate is the GPU's moe_default_tile_tflops."""
        return self.heuristic and self.tile(tokens) == DEFAULT_WIDE_TILE

    def down_block_n(self, tokens: int) -> int:
        """BLOCK_SIZE_N of the w2 GEMM: its own file's entry where there is one (its BLOCK_SIZE_M is w13's: SGLang
        asserts it through 0.5.12 and overrides it from 0.5.13), else w13's tile."""
        if not self.down_tiles:
            return self.tile(tokens)[1]
        return self._nearest(self.down_tiles, tokens)[2]

    def small_tile_tokens(self) -> int:
        """The most tokens a call may have and still run in 16-row tiles under the tuned config (every smaller call
        does too); 0 without a config or when its smallest call already takes wider rows. A config whose largest
        key is 16-row serves every larger call the same: ALL_CALLS."""
        if not self.tiles:
            return 0
        # nearest-key lookup is constant between the midpoints of consecutive keys: test where each key's range starts
        keys = sorted({t[0] for t in self.tiles})
        for start in [1] + [(a + b) // 2 + 1 for a, b in zip(keys, keys[1:], strict=False)]:
            if self.tile(start)[0] != SMALL_TILE_ROWS:
                return start - 1
        return ALL_CALLS

    @staticmethod
    def filled_rows(block_m: int, pairs: int, touched: float) -> float:
        """Row blocks the routing fills: a touched expert fills at least one block, and its pairs past a block more
        (about half a block of slack each): an expected count, not a draw."""
        return max(touched, pairs / block_m + touched / 2) if touched else 0.0

    def empty_programs(self, tokens: int, pairs: int, touched: float, width: int, hidden: int) -> float:
        """Programs of one MoE layer's two expert GEMMs (w13: 2 x width columns, w2: hidden) over `tokens` tokens
        whose row block the routing left empty."""
        block_m, block_n = self.tile(tokens)
        rows = releases.fused_moe_padded_rows(self.tight, pairs, self.experts, block_m, self.plus_one)
        empty_rows = max(rows - self.filled_rows(block_m, pairs, touched), 0.0)
        columns = math.ceil(2 * width / block_n) + math.ceil(hidden / self.down_block_n(tokens))
        return empty_rows * columns

    def working_programs(self, tokens: int, pairs: int, touched: float, width: int, hidden: int) -> dict[str, float]:
        """Programs of one MoE layer's w13 (2 x width columns) and w2 (hidden columns) GEMMs whose row block holds
        tokens: each streams its expert's K x BLOCK_SIZE_N slice of weights (moe_program_gbps)."""
        block_m, block_n = self.tile(tokens)
        filled = self.filled_rows(block_m, pairs, touched)
        return {"w13": filled * math.ceil(2 * width / block_n),
                "w2": filled * math.ceil(hidden / self.down_block_n(tokens))}


# expert weight formats that run SGLang's Triton fused_moe_kernel (INT4 experts run Marlin or a W4A16 kernel,
# whose grid simspec does not model)
TRITON_MOE_WEIGHTS = ("bf16", "fp8", "fp8-block128")


def moe_grid(gpu_name: str, model: ModelPreset, stack: Stack, release: tuple[int, int, int]) -> MoeGrid | None:
    """The grid of this stack's routed experts under this release (minor, patch, post) on this GPU (a preset name):
    the tiles of the release's tuned config file for the shape where it ships one (presets/fused_moe_tiles.yaml,
    from the file's `since` on), else the default."""
    weights = model.weights.routed_experts
    if not stack.num_moe_layers or weights not in TRITON_MOE_WEIGHTS:
        return None
    release = (*release, 0)[:3]  # a (minor, patch) key stands for the release without .postN
    version = release[:2]
    experts = model.num_routed_experts + stack.shared_expert_copies  # as the kernel sees them
    sections = presets.fused_moe_tiles()
    read = releases.fused_moe_tile_release(version, sections)
    key = (gpu_name, experts, model.moe_intermediate_size // stack.tp, weights)
    file = sections.get(read, {}).get(key) if read else None
    tiles = tuple(file.tiles) if file else ()
    # w2's own file: read from 0.5.8's wheel on (0.5.5-0.5.7 look one up too; theirs are not read)
    down = tuple(file.down_tiles) if file and file.down_tiles and version >= (5, 8) else ()
    if file and file.since is not None and release < releases.release_key(file.since):
        tiles = down = ()  # this release predates the file: the default tile
    return MoeGrid(releases.tight_moe_align(version), experts, weights, tiles,
                   releases.moe_align_pads_experts_plus_one(version), down, heuristic=not tiles)


def distinct_experts(num_experts: int, k: int, seqs: int, tokens: int, locality: float,
                     spread: float = 0.0) -> float:
    """Expected distinct routed experts one MoE layer loads for `tokens` tokens in `seqs` sequences.

    Uniform top-k routing: an expert escapes one token with probability 1 - k/E, so T independent tokens
    touch E (1 - (1 - k/E)^T) experts (hardware-and-models.md). With routing locality rho, a token after the
    first of its sequence brings only k (1 - rho) experts its predecessor did not use.

    Expert popularity: on served text some experts are chosen far more often than others (a layer's 32 most chosen
    of DeepSeek-V3's 256 take ~31% of its choices, not 12.5%). With each expert's chance drawn from a gamma law of
    mean k/E and squared coefficient of variation `spread`, M picks leave a fraction (1 + spread M/E)^(-1/spread) of
    the experts untouched, where uniform routing's large-E form leaves e^(-M/E); the ratio of the two scales the
    exact uniform figure above, so spread 0 keeps it, and one token still touches its k experts.
    """
    if num_experts == 0 or tokens == 0:
        return 0.0
    miss_first = 1.0 - k / num_experts
    miss_next = 1.0 - k * (1.0 - locality) / num_experts
    untouched = miss_first ** seqs * miss_next ** max(tokens - seqs, 0)
    if spread > 0.0 and untouched > 0.0:
        picks = (k * seqs + k * (1.0 - locality) * max(tokens - seqs, 0)) / num_experts  # M / E
        untouched = math.exp(math.log(untouched) + picks - math.log1p(spread * picks) / spread)
        return max(num_experts * (1.0 - untouched), float(min(k, num_experts)))
    return num_experts * (1.0 - untouched)


class ForwardModel:
    """Forward-pass cost for one stack on one GPU type. The weight part is cached per shape."""

    def __init__(self, stack: Stack, gpu: GpuPreset, collectives: Collectives, eff: Efficiencies,
                 moe_small_tiles: SmallTiles | None = None, moe_grid: MoeGrid | None = None):
        self.stack = stack
        self.eff = eff
        self.collectives = collectives
        self._bw = gpu.memory_bandwidth_gbps * 1e9  # bytes/s
        self._peak = {c: gpu.sustained_tflops(c) * 1e12 for c in ("bf16", "fp8")}
        self._mma_rows = gpu.mma_rows
        self._cache: dict[ForwardShape, tuple[float, float, float]] = {}
        self._kv_s_per_token = stack.kv_bytes_per_token_per_gpu / (self._bw * eff.memory_bandwidth)
        self._kv_roof_s_per_token = stack.kv_bytes_per_token_per_gpu / self._bw
        # The attention core (QK^T, PV) runs at the BF16 peak whatever the projections' weights are: FA3, FlashInfer
        # and FlashMLA take BF16 Q/K/V unless --kv-cache-dtype selects FP8. Charging it at the FP8 peak for
        # FP8-weight models halved long prefills. An FP8 cache (server.kv_cache_dtype) halves the bytes read here
        # (stack.with_kv_cache_dtype); whether the core then computes in FP8 depends on the backend, not modelled.
        self._attn_s_per_pair = stack.attn_flops_per_pair / (self._peak["bf16"] * eff.compute)
        # fused-MoE tiles of 16 rows on warp-level MMA: a measured, achieved rate, so no compute efficiency on top
        self._small_tiles = moe_small_tiles
        self._grid = moe_grid
        # the default heuristic's wide tile: a measured, achieved rate where the GPU has one (gpus.yaml)
        self._default_tile_flops = (gpu.moe_default_tile_tflops * 1e12 if gpu.moe_default_tile_tflops else None)
        # intermediate columns of one routed expert on this GPU (N of the fused-MoE config file)
        self._expert_width = (stack.expert_flops_per_token / (6 * stack.hidden_size * stack.experts_per_token
                                                              * stack.num_moe_layers) if stack.num_moe_layers else 0.0)

    def _time(self, nbytes: float, flops: float, compute: str) -> float:
        return self._roofline(nbytes, flops, self._peak[compute] * self.eff.compute)

    def _roofline(self, nbytes: float, flops: float, flops_per_s: float) -> float:
        """The larger of the bytes at achievable bandwidth and the FLOPs at `flops_per_s`."""
        return max(nbytes / (self._bw * self.eff.memory_bandwidth), flops / flops_per_s)

    def _weights(self, shape: ForwardShape) -> tuple[float, float, float]:
        """(compute s, comm s, roofline s) of everything but attention over the KV cache."""
        hit = self._cache.get(shape)
        if hit is not None:
            return hit
        st, eff = self.stack, self.eff
        compute = roof = 0.0
        for g in st.groups:
            if g.extend_only and not shape.extend:
                continue
            # SGLang prunes hidden states before the LM head to the tokens whose logits it needs
            tokens = shape.logit_tokens if g.name == "lm_head" else shape.tokens
            rows = padded_rows(tokens, self._mma_rows)
            compute += self._time(g.bytes_per_gpu, g.flops_per_token * rows, g.compute)
            roof += g.bytes_per_gpu / self._bw
        if st.num_moe_layers:
            t, r = self._moe(shape)
            compute += t
            roof += r
        if shape.prefill:  # the elementwise kernels between the GEMMs stream a prefill's activations from DRAM
            activations = shape.tokens * st.elementwise_bytes_per_token
            compute += activations / (self._bw * eff.memory_bandwidth)
            roof += activations / self._bw
        if shape.graph:  # every kernel boundary, and the floor of kernels that move almost no bytes
            copies = st.small_kernels_from_two_rows if shape.tokens >= 2 else 0.0  # a strided q of 2+ rows
            compute += ((st.kernels_per_forward + copies) * eff.kernel_gap_graph_us
                        + (st.small_kernels_per_forward + copies) * eff.small_kernel_us
                        + (st.kernels_per_forward - st.small_kernels_per_forward) * eff.streaming_kernel_us) * 1e-6
        else:  # host-bound: Python dispatch and launches per layer
            compute += eff.layer_overhead_eager_us * st.num_layers * 1e-6
        # the per-launch (graph replay) overhead is the caller's
        comm_us = 0.0
        if st.tp > 1:
            comm_us = st.all_reduces_per_forward * self.collectives.all_reduce_us(
                shape.tokens * st.hidden_size * ACTIVATION_BYTES)
            comm_us += self.collectives.all_gather_us(shape.logit_tokens * st.logits_vocab * ACTIVATION_BYTES)
        out = (compute, comm_us * 1e-6, roof)
        self._cache[shape] = out
        return out

    def moe_kernels(self, shape: ForwardShape) -> list[tuple[str, float, float]]:
        """(kernel, bytes, FLOPs) of the routed experts in one forward, all MoE layers, as SGLang's Triton fused
        MoE runs them (fused_moe_triton fused_experts_impl): the w13 GEMM, silu_and_mul, the w2 GEMM,
        moe_sum_reduce.

        Each GEMM moves the touched experts' weights (w13 two thirds, w2 one third) and the activations of every
        (token, expert) pair: the w13 kernel gathers each token's hidden state once per routed expert and writes
        2 x the per-GPU intermediate width, silu_and_mul halves that, the w2 kernel writes a full hidden-width row
        per pair, which moe_sum_reduce reads back to sum a token's k rows. At decode these activations are a few
        MB beside the experts' weights; in a prefill of thousands of tokens they outweigh the weights and make
        the expert GEMMs memory-bound at TP-sliced widths (Qwen3-235B at TP 8: 192 columns of each expert per
        GPU). The GEMMs read their inputs in FP8 when the experts are FP8 (fused_moe quantizes A per call);
        everything else moves BF16. Activations are counted once per pair (a tile's re-reads from L2 are free)."""
        st = self.stack
        layers, k, h = st.num_moe_layers, st.experts_per_token, st.hidden_size
        n = self._touched_experts(shape)
        width = self._expert_width
        weights = n * st.expert_bytes_per_gpu * layers
        pairs = self._pairs(shape)
        # the tensor cores run every row block a touched expert fills whole, however few of its rows hold tokens:
        # the grid's BLOCK_SIZE_M where the release's tile is known, else one 16-row block an expert at least
        if self._grid is not None:
            block_m = self._grid.block_rows(shape.tokens)
            rows = MoeGrid.filled_rows(block_m, pairs, n) * block_m
        else:
            rows = n * MOE_BLOCK_ROWS
        flops = st.expert_flops_per_token * max(pairs, rows) / k
        a = ACTIVATION_BYTES * layers  # per element, all layers
        a_in = (1 if st.expert_compute == "fp8" else ACTIVATION_BYTES) * layers  # a GEMM's input rows
        return [
            ("w13", weights * 2 / 3 + pairs * (a_in * h + a * 2 * width), flops * 2 / 3),
            ("silu_and_mul", pairs * a * 3 * width, 0.0),
            ("w2", weights / 3 + pairs * (a_in * width + a * h), flops / 3),
            ("moe_sum_reduce", pairs * a * h + shape.tokens * a * h, 0.0),
        ]

    def _pairs(self, shape: ForwardShape) -> int:
        """(token, expert) pairs of one MoE layer: each token's routed experts, and the fused shared expert."""
        st = self.stack
        return shape.tokens * (st.experts_per_token + (1 if st.shared_expert_copies else 0))

    def _touched_experts(self, shape: ForwardShape) -> float:
        """Distinct experts one MoE layer of this forward touches: the routed ones (distinct_experts), and the
        copies of a fused shared expert that its tokens route to (one each, chosen at random among the copies)."""
        st = self.stack
        routed = distinct_experts(st.num_experts, st.experts_per_token, shape.real_seqs, shape.real_tokens,
                                  self.eff.routing_locality, self.eff.routing_spread)
        if not st.shared_expert_copies:
            return routed
        return routed + distinct_experts(st.shared_expert_copies, 1, shape.real_tokens, shape.real_tokens, 0.0)

    def _moe(self, shape: ForwardShape, only: tuple[str, ...] | None = None) -> tuple[float, float]:
        """(compute s, roofline s) of the routed experts: each kernel of moe_kernels at its own roofline, the GEMMs
        at the small-tile rate where that applies (module docstring). `only`: those kernels of moe_kernels alone."""
        kernels = [k for k in self.moe_kernels(shape) if only is None or k[0] in only]
        tiles = self._small_tiles
        rate = self._peak[self.stack.expert_compute] * self.eff.compute
        if tiles is not None and shape.tokens <= tiles.max_tokens:
            rate = tiles.tflops * 1e12  # achieved: no compute efficiency (the kernels without FLOPs are unchanged)
        if (self._default_tile_flops is not None and self._grid is not None
                and self._grid.runs_default_wide_tile(shape.tokens)):
            rate = min(rate, self._default_tile_flops)  # achieved, like the small tiles'; never above the dense rate
        programs = self.working_programs(shape)
        compute = 0.0
        for name, b, f in kernels:
            t = self._roofline(b, f, rate)
            if programs.get(name):  # a grid too small to keep DRAM busy streams at its programs' rate
                t = max(t, b / (programs[name] * self.eff.moe_program_gbps * 1e9))
            compute += t
        compute += self.empty_programs(shape) * self.eff.moe_empty_block_us * 1e-6
        return compute, sum(b for _, b, _ in kernels) / self._bw

    def working_programs(self, shape: ForwardShape) -> dict[str, float]:
        """Programs of one MoE layer's w13 and w2 GEMMs that hold tokens (MoeGrid); none without a grid."""
        if self._grid is None:
            return {}
        return self._grid.working_programs(shape.tokens, self._pairs(shape), self._touched_experts(shape),
                                           round(self._expert_width), self.stack.hidden_size)

    def empty_programs(self, shape: ForwardShape) -> float:
        """Fused-MoE programs over all MoE layers of one forward that exit at once (MoeGrid); 0 without a grid."""
        if self._grid is None:
            return 0.0
        st = self.stack
        return st.num_moe_layers * self._grid.empty_programs(shape.tokens, self._pairs(shape),
                                                             self._touched_experts(shape), round(self._expert_width),
                                                             st.hidden_size)

    def fused_moe_call_us(self, tokens: int, boundaries: int, small_kernels: int,
                          only: tuple[str, ...] | None = None) -> float:
        """One call of the routed experts over `tokens` independent tokens (each its own sequence), as a
        microbenchmark of the fused MoE times it inside a CUDA graph: the four kernels of moe_kernels at their
        rooflines (or the `only` ones), plus `boundaries` kernel launches of which `small_kernels` move almost no
        bytes (the caller counts what its benchmark launches). The same terms a decode forward charges per MoE
        layer (simspec.kernel_validation)."""
        shape = ForwardShape(num_seqs=tokens, tokens=tokens, real_seqs=tokens, real_tokens=tokens,
                             logit_tokens=tokens, graph=True)
        rooflines_s, _ = self._moe(shape, only)
        eff = self.eff
        return (rooflines_s * 1e6 + boundaries * eff.kernel_gap_graph_us + small_kernels * eff.small_kernel_us
                + (boundaries - small_kernels) * eff.streaming_kernel_us)

    def linear_call_us(self, weight_bytes: float, flops_per_token: float, tokens: int, compute: str) -> float:
        """One dense linear layer's GEMM over `tokens` rows on its own, as a microbenchmark times it inside a CUDA
        graph: the roofline _weights charges a weight group (its rows padded to the MMA's), one kernel boundary, and
        the fixed part of a streaming kernel (simspec.kernel_validation's GEMM tables)."""
        roofline_s = self._time(weight_bytes, flops_per_token * padded_rows(tokens, self._mma_rows), compute)
        return roofline_s * 1e6 + self.eff.kernel_gap_graph_us + self.eff.streaming_kernel_us

    def attention_s(self, context_tokens: float, attention_pairs: float) -> float:
        """Seconds of every layer's attention over the KV cache: the KV entries read at the achievable bandwidth, or
        the query-key pairs at the BF16 peak, whichever is longer (context_tokens and attention_pairs as cost()
        takes them)."""
        return max(context_tokens * self._kv_s_per_token, attention_pairs * self._attn_s_per_pair)

    def attention_call_us(self, context_tokens: float, attention_pairs: float) -> float:
        """One layer's decode attention kernel on its own, as a microbenchmark times it inside a CUDA graph: its
        layer's share of attention_s, one kernel boundary and the fixed part of a streaming kernel
        (simspec.kernel_validation's attention tables). Nothing else: the model has no fixed time of its own for an
        attention kernel, nor kernels a backend adds around it (a split-KV merge, a scheduling pass)."""
        per_layer_s = self.attention_s(context_tokens, attention_pairs) / self.stack.num_layers
        return per_layer_s * 1e6 + self.eff.kernel_gap_graph_us + self.eff.streaming_kernel_us

    def fixed_and_rates(self, shape: ForwardShape) -> tuple[float, float, float, float, float, float]:
        """(compute ms, comm ms, roofline ms, KV ms per context token, attention ms per query-key pair,
        roofline ms per context token): the cost of `shape` as a function of its context, for hot loops.
        Excludes the per-launch overhead, which the caller charges once per CUDA-graph replay."""
        compute, comm, roof = self._weights(shape)
        return (compute * 1e3, comm * 1e3, roof * 1e3, self._kv_s_per_token * 1e3, self._attn_s_per_pair * 1e3,
                self._kv_roof_s_per_token * 1e3)

    def cost(self, shape: ForwardShape, context_tokens: float, attention_pairs: float) -> ForwardCost:
        """One forward launched on its own (its per-launch overhead included). context_tokens: KV entries read
        (summed over sequences); attention_pairs: sum over sequences of query tokens x context tokens attended."""
        compute, comm, roof = self._weights(shape)
        compute += self.eff.forward_overhead_ms * 1e-3
        compute += self.attention_s(context_tokens, attention_pairs)
        roof += context_tokens * self._kv_roof_s_per_token
        return ForwardCost(compute * 1e3, comm * 1e3, roof * 1e3)
