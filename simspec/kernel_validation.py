"""Kernel tables: published microbenchmark timings of one kernel, predicted by the time model's own cost of it.

An end-to-end case (validation.py) tests every part of the model at once, so its error says little about which
part is wrong. A kernel table isolates one part on GPUs and shapes nothing was fitted to. Four kinds today.

The all-reduce across a TP group (`kernel: all_reduce`): nccl-tests bus bandwidths measured on one box at two GPU
counts; the model takes the box's curve at one count, as a calibration profile would carry it, and predicts the
other through its TP scaling (timing/collectives.py), the what-if "TP 4 instead of 8 on this box" asks.

The Triton fused MoE that SGLang and vLLM run for routed experts (`kernel: fused_moe`), as their tuning scripts
time it (vLLM benchmarks/kernels/benchmark_moe.py, SGLang's fused_moe_triton/tuning_fused_moe_triton.py): ten calls
captured in one CUDA graph, random gating (uniform routing on average), the mean per call. The model prices such a
call with the terms a decode forward charges per MoE layer (ForwardModel.fused_moe_call_us): each kernel's roofline
over the experts the tokens touch, and the boundaries and floors of the kernels the call launches
(presets/kernels.yaml). Where a table states the kernel's grid (`grid`: SGLang's alignment rule and the tile
its config printed), the programs that find their row block empty are charged too (forward.MoeGrid).

A table simspec measured itself (calibration/fused_moe_bench.py: SGLang's own fused_experts_impl from a release
wheel) times only the w13 and w2 GEMM kernels, each a table of its own (`timed: w13` / `w2`: its roofline and
boundary are compared; their sum would let the two kernels' errors cancel),
reads a different copy of the experts in every call (`rotates_weights`: no point runs from L2), and names the tile
its release loaded at each size (`grid.tiles`, `grid.down_tiles`), which sets how many programs stream the experts
(forward.MoeGrid.working_programs).

The scripts replay the same routing ten times in a row. When the experts one call touches fit in the GPU's L2
cache, the later calls read them from L2, which serving never does (every layer has its own experts). Those
points are listed but not compared: a table names its GPU's L2 size and its source.

The dense GEMM of a linear layer at decode batch sizes (`kernel: gemm`), x[M, K] @ W[N, K].T as torch runs it
(cuBLAS; FP8 through torch._scaled_mm with per-tensor scales), timed inside a CUDA graph over distinct weights that
together far exceed the L2, so that each GEMM streams its weight from DRAM as a decode forward does
(calibration/kernel_floor_bench.py). The model prices such a call as a forward prices a weight group
(ForwardModel.linear_call_us): the roofline of its weights and FLOPs, one kernel boundary, and the fixed part of a
streaming kernel (streaming_kernel_us). SGLang runs these kernels for BF16 linears (torch F.linear); its FP8
linears run other kernels (CUTLASS, DeepGEMM, Triton), for which the FP8 table is a proxy.

The decode attention kernel (`kernel: attention_decode`) over a paged KV cache, as the attention libraries'
benchmarks time one call (FlashInfer's, vLLM's): a batch of requests each with `context` cached tokens and
`q_tokens` new ones. The model prices a call as a decode forward prices one layer's attention
(ForwardModel.attention_call_us): the KV entries read at the achievable bandwidth or the query-key pairs at the BF16
peak, whichever is longer, one kernel boundary and the fixed part of a streaming kernel. The model preset and TP
degree give the per-GPU heads; `backend` names the kernel, which the model does not tell apart.

validation/kernels/*.yaml hold the tables; `simspec validate` reports them apart from the end-to-end cases, and
validation/recorded.yaml keeps their mean error as a second CI gate. A table a coefficient was fitted to
(`fitted: true`) is reported apart and left out of that mean.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal, NamedTuple

from pydantic import Field, StrictBool, StrictFloat, StrictInt, model_validator

from simspec.calibration.collectives import time_from_bus_bandwidth_us
from simspec.errors import InputError
from simspec.presets import ModelPreset, WeightFormat, default_coefficients, gpus, models
from simspec.scenario.profile import CollectiveCurve
from simspec.scenario.reading import read_yaml
from simspec.scenario.schema import StrictModel
from simspec.timing.collectives import Collectives
from simspec.timing.forward import Efficiencies, ForwardModel, MoeGrid, distinct_experts
from simspec.timing.stack import WEIGHT_FORMATS, part_kernels, target_stack, with_kv_cache_dtype
from simspec.validation import Source, load_named, signed_error_pct

KERNELS_DIR = "kernels"


class KernelCount(NamedTuple):
    boundaries: int  # kernels launched (each a boundary inside the graph)
    small: int  # of which move almost no bytes


# Kernels of kernels.yaml's `moe` part that a fused-MoE benchmark does not launch, or launches only when it
# times the routing: the router GEMM (its input is the gating output, made outside the call) and the top-k.
ROUTER_GEMM = KernelCount(boundaries=1, small=0)
TOP_K = KernelCount(boundaries=1, small=1)
MOE_GEMMS = ("w13", "w2")  # forward.ForwardModel.moe_kernels' GEMMs


class MoeShape(StrictModel):
    experts: int = Field(ge=1)
    experts_per_token: int = Field(ge=1)
    hidden_size: int = Field(ge=1)
    intermediate_per_gpu: int = Field(ge=1, description="N of the config file name: one expert's intermediate "
                                                        "columns on one GPU")
    weights: WeightFormat

    @model_validator(mode="after")
    def _top_k_within_experts(self) -> MoeShape:
        if self.experts_per_token > self.experts:
            raise ValueError("experts_per_token cannot exceed experts")
        return self


class _Table(StrictModel):
    id: str
    title: str
    source: Source
    assumptions: list[str] = Field(default_factory=list)
    missing_mechanism: str | None = None
    fitted: StrictBool = Field(default=False, description="a coefficient was fitted to this table: its points are "
                                                         "reported apart from the mean (kernel_mape_pct)")


# (tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) of one tuned-config entry
TileEntry = tuple[Annotated[StrictInt, Field(ge=1)], Annotated[StrictInt, Field(ge=1, le=256)],
                  Annotated[StrictInt, Field(ge=1, le=256)]]


class KernelGrid(StrictModel):
    """The benchmarked kernel's launch grid where the table's source shows it: SGLang's Triton fused MoE before 0.5.7
    sizes it for the worst case (releases.fused_moe_padded_rows), with the tile its config printed. The worst-case
    rule is 0.4.x's, numel + E (BLOCK_SIZE_M - 1) rows; 0.4.10-0.5.6 pad with E + 1, one row block more per column
    tile (for a 128-expert table ~35 programs, ~0.07 us a call: not told apart)."""

    rows: Literal["worst_case", "tight"] = Field(description="SGLang's alignment rule: before 0.5.7 or from it")
    block_m: StrictInt | None = Field(default=None, ge=1, le=256, description="the tile at every size")
    block_n: StrictInt | None = Field(default=None, ge=1, le=256)
    tiles: list[TileEntry] | None = Field(default=None, min_length=1,
                                          description="(tokens, BLOCK_SIZE_M, BLOCK_SIZE_N) of the w13 call at each "
                                                      "size, where the config's tile changes with size")
    down_tiles: list[TileEntry] | None = Field(default=None, min_length=1, description="the same for the w2 call, "
                                                                                       "where the release loaded a "
                                                                                       "down config")

    @model_validator(mode="after")
    def _one_tile_rule(self) -> KernelGrid:
        blocks = (self.block_m, self.block_n)
        if (self.tiles is None and None in blocks) or (self.tiles is not None and blocks != (None, None)):
            raise ValueError("give block_m and block_n (one tile at every size) or tiles (one per size), not both")
        return self

    def tile_entries(self) -> tuple[tuple[int, int, int], ...]:
        """MoeGrid's tiles: one entry stands for every size."""
        if self.tiles is not None:
            return tuple(self.tiles)
        assert self.block_m is not None and self.block_n is not None
        return ((1, self.block_m, self.block_n),)


class FusedMoeTable(_Table):
    kernel: Literal["fused_moe"]
    gpu: str
    shape: MoeShape
    routing_timed: StrictBool = Field(description="the top-k over the gating output runs inside the timed calls")
    config: Literal["default", "tuned"] = Field(description="the script's default tile heuristic, or a tuned config "
                                                            "file for this shape and GPU (the tile the model charges "
                                                            "is `grid`'s; with `default`, a 64 x 64 tile of it runs at "
                                                            "the GPU's moe_default_tile_tflops)")
    grid: KernelGrid | None = Field(default=None, description="the kernel's grid, where the source shows it; none: "
                                                            "the programs that exit at once are not charged (vLLM's "
                                                            "kernel clamps its grid under BLOCK_SIZE_M tokens)")
    l2_cache_mb: float = Field(gt=0, description="the GPU's L2: points whose touched experts fit are not compared")
    l2_source: str = Field(description="where the L2 size comes from (informational)")
    points: list[tuple[int, float]] = Field(min_length=1, description="(tokens, microseconds per call)")
    timed: Literal["call", "w13", "w2"] = Field(
        default="call", description="call: the whole call, as the tuning scripts time it; w13, w2: that GEMM kernel "
                                    "alone (its duration in a profiler trace)")
    rotates_weights: StrictBool = Field(default=False, description="each call reads its own copy of the experts "
                                                                   "(none runs from L2: every point is compared)")


class BusBandwidthCurve(StrictModel):
    gpus: int = Field(ge=2)
    busbw_gbps: list[tuple[int, float]] = Field(min_length=1, description="(message bytes, nccl-tests busbw GB/s)")


class AllReduceTable(_Table):
    kernel: Literal["all_reduce"]
    link: Literal["pcie", "nvlink"]
    reference: BusBandwidthCurve = Field(description="the box's curve the model is given")
    measured: BusBandwidthCurve = Field(description="the same box at another GPU count, to predict")

    @model_validator(mode="after")
    def _two_group_sizes(self) -> AllReduceTable:
        if self.reference.gpus == self.measured.gpus:
            raise ValueError("measured.gpus must differ from reference.gpus: the table tests the scaling between them")
        return self


MAX_GEMM_DIM = 1 << 24  # 16M features: a vocabulary-sized LM head is ~256k; more is not a linear layer
MAX_GEMM_TOKENS = 1 << 20  # a million rows: far above any forward's batch or prefill chunk


class GemmPoint(StrictModel):
    k: StrictInt = Field(ge=1, le=MAX_GEMM_DIM, description="input features (the weight's columns)")
    n: StrictInt = Field(ge=1, le=MAX_GEMM_DIM, description="output features (the weight's rows)")
    m: StrictInt = Field(ge=1, le=MAX_GEMM_TOKENS, description="tokens (the activation's rows)")
    us: StrictFloat = Field(gt=0, allow_inf_nan=False, description="microseconds per GEMM")


class GemmTable(_Table):
    kernel: Literal["gemm"]
    gpu: str
    weights: Literal["bf16", "fp8"] = Field(description="the weight's (and activation's) format")
    points: list[GemmPoint] = Field(min_length=1)


MAX_CONTEXT = 1 << 24  # 16M tokens of context for one request: beyond any model's window


class AttentionPoint(StrictModel):
    batch: StrictInt = Field(ge=1, le=MAX_GEMM_TOKENS, description="requests in the call")
    context: StrictInt = Field(ge=1, le=MAX_CONTEXT, description="KV-cache tokens each request attends to")
    q_tokens: StrictInt = Field(default=1, ge=1, le=64, description="query tokens a request brings (1: decode; "
                                                                   "more: a speculative verify)")
    us: StrictFloat = Field(gt=0, allow_inf_nan=False, description="microseconds per call")


class AttentionDecodeTable(_Table):
    kernel: Literal["attention_decode"]
    gpu: str
    model: str = Field(description="a model preset whose attention the kernel runs (heads, head dim, MLA ranks)")
    tp: StrictInt = Field(default=1, ge=1, description="the TP degree whose per-GPU heads one call holds")
    kv_cache_dtype: Literal["bf16", "fp8"] = Field(description="the KV cache's format (fp8: one byte an element)")
    backend: str = Field(description="the kernel timed (informational: the model has one attention cost for all)")
    timed: str = Field(description="what one timed call covers (informational)")
    points: list[AttentionPoint] = Field(min_length=1)


KernelTable = FusedMoeTable | AllReduceTable | GemmTable | AttentionDecodeTable
KINDS: dict[str, type[FusedMoeTable] | type[AllReduceTable] | type[GemmTable] | type[AttentionDecodeTable]] = {
    "fused_moe": FusedMoeTable, "all_reduce": AllReduceTable, "gemm": GemmTable,
    "attention_decode": AttentionDecodeTable}


@dataclass(frozen=True)
class KernelPoint:
    size: int  # tokens (fused MoE, GEMM), message bytes (all-reduce) or KV tokens read (decode attention)
    measured_us: float
    predicted_us: float
    expert_mb: float | None  # fused MoE: weights of the experts one call touches
    compared: bool  # False when they fit in L2 (the benchmark's repeated calls hit it)
    shape: str | None = None  # GEMM: "KxN" of the weight; decode attention: batch, context and query tokens

    @property
    def error_pct(self) -> float:
        return signed_error_pct(self.predicted_us, self.measured_us)


@dataclass(frozen=True)
class TableResult:
    table: KernelTable
    file: str
    points: list[KernelPoint]

    @property
    def compared(self) -> list[KernelPoint]:
        return [p for p in self.points if p.compared]

    @property
    def mape_pct(self) -> float | None:
        errs = [abs(p.error_pct) for p in self.compared]
        return sum(errs) / len(errs) if errs else None


def kernel_files(directory: str | Path) -> list[Path]:
    """The kernel tables of a suite directory (DIR/kernels/*.yaml); none when it has no such folder."""
    d = Path(directory)
    root = d / KERNELS_DIR
    return sorted(root.glob("*.yaml")) if d.is_dir() and root.is_dir() else []


def _check_points(points: list[tuple[int, float]], what: str, path: Path, key: str) -> None:
    sizes = [m for m, _ in points]
    if sizes != sorted(set(sizes)) or any(m < 1 or v <= 0 for m, v in points):
        raise InputError(f"must be ({what} >= 1, value > 0) pairs, by rising {what}, each once",
                         file=str(path), key=key)


def load_table(path: Path) -> KernelTable:
    kind = read_yaml(path).get("kernel")
    if kind not in KINDS:
        raise InputError(f"unknown kernel {kind!r}; allowed: {', '.join(KINDS)}", file=str(path), key="kernel")
    table = load_named(path, KINDS[kind])
    if isinstance(table, AllReduceTable):
        _check_points(table.reference.busbw_gbps, "bytes", path, "reference.busbw_gbps")
        _check_points(table.measured.busbw_gbps, "bytes", path, "measured.busbw_gbps")
        return table
    if table.gpu not in gpus():
        raise InputError(f"unknown GPU preset {table.gpu!r}; allowed: {', '.join(sorted(gpus()))}",
                         file=str(path), key="gpu")
    if isinstance(table, GemmTable):
        keys = [(p.k, p.n, p.m) for p in table.points]
        if len(set(keys)) != len(keys):
            raise InputError("each (k, n, m) must appear once", file=str(path), key="points")
        return table
    if isinstance(table, AttentionDecodeTable):
        if table.model not in models():
            raise InputError(f"unknown model preset {table.model!r}; allowed: {', '.join(sorted(models()))}",
                             file=str(path), key="model")
        keys = [(p.batch, p.context, p.q_tokens) for p in table.points]
        if len(set(keys)) != len(keys):
            raise InputError("each (batch, context, q_tokens) must appear once", file=str(path), key="points")
        return table
    _check_points(table.points, "tokens", path, "points")
    return table


def _one_moe_layer(shape: MoeShape) -> ModelPreset:
    """A one-layer model whose only MoE layer has this shape at TP 1 (N is already per GPU). Its attention,
    vocabulary and embeddings are placeholders the fused-MoE cost never reads."""
    return ModelPreset(
        display_name="fused-MoE benchmark shape", source="a kernel table (validation/kernels)",
        architecture="MoeBenchmarkShape", context_length=1, num_layers=1, num_dense_layers=0,
        hidden_size=shape.hidden_size, moe_intermediate_size=shape.intermediate_per_gpu,
        num_routed_experts=shape.experts, experts_per_token=shape.experts_per_token, num_shared_experts=0,
        attention={"kind": "gqa", "num_heads": 1, "num_kv_heads": 1, "head_dim": 1}, vocab_size=1,
        tie_word_embeddings=True, mtp_layers=0,
        weights={"attention": "bf16", "routed_experts": shape.weights, "embedding": "bf16", "lm_head": "bf16"},
        published_params_b=1.0)


def default_efficiencies() -> Efficiencies:
    """The time model's coefficients as simspec predicts with no calibration profile (presets/defaults.yaml), with
    uniform routing: the benchmarks draw random gating for every token (no locality, every expert equally likely)."""
    defaults = default_coefficients()
    return replace(Efficiencies.from_coefficients(lambda name: defaults[name].value), routing_locality=0.0,
                   routing_spread=0.0)


def predict_all_reduce(table: AllReduceTable, file: str = "") -> TableResult:
    """The measured GPU count's times from the reference count's curve, through the model's TP scaling."""
    ref, measured = table.reference, table.measured
    curve = CollectiveCurve(measured_gpus=ref.gpus, source=table.id,
                            points_bytes_us=[(b, time_from_bus_bandwidth_us(b, bw, ref.gpus))
                                             for b, bw in ref.busbw_gbps])
    model = Collectives(curve, measured.gpus, table.link)
    points = [KernelPoint(b, time_from_bus_bandwidth_us(b, bw, measured.gpus), model.all_reduce_us(b), None, True)
              for b, bw in measured.busbw_gbps]
    return TableResult(table, file, points)


def predict_gemm(table: GemmTable, file: str = "", eff: Efficiencies | None = None) -> TableResult:
    """Each GEMM priced as a forward prices a weight group on the table's GPU (ForwardModel.linear_call_us)."""
    bytes_per_param, compute = WEIGHT_FORMATS[table.weights]
    # the forward model reads only the GPU and the coefficients for one GEMM; the stack is a placeholder
    stack = target_stack(_one_moe_layer(MoeShape(experts=1, experts_per_token=1, hidden_size=1,
                                                 intermediate_per_gpu=1, weights=table.weights)), tp=1)
    model = ForwardModel(stack, gpus()[table.gpu], None, eff or default_efficiencies())  # type: ignore[arg-type]
    points = [KernelPoint(p.m, p.us, model.linear_call_us(p.k * p.n * bytes_per_param, 2.0 * p.k * p.n, p.m,
                                                          compute), None, True, shape=f"{p.k}x{p.n}")
              for p in table.points]
    return TableResult(table, file, points)


def predict_attention_decode(table: AttentionDecodeTable, file: str = "",
                             eff: Efficiencies | None = None) -> TableResult:
    """Each call priced as a decode forward prices one layer's attention (ForwardModel.attention_call_us): the model
    preset at the table's TP degree, its KV cache in the table's format; a call reads batch x context KV entries and
    scores batch x q_tokens x context query-key pairs."""
    stack = with_kv_cache_dtype(target_stack(models()[table.model], table.tp), table.kv_cache_dtype)
    assert stack is not None
    model = ForwardModel(stack, gpus()[table.gpu], None, eff or default_efficiencies())  # type: ignore[arg-type]
    points = [KernelPoint(p.batch * p.context, p.us,
                          model.attention_call_us(p.batch * p.context, p.batch * p.q_tokens * p.context), None, True,
                          shape=f"b{p.batch} s{p.context} q{p.q_tokens}")
              for p in table.points]
    return TableResult(table, file, points)


def predict_table(table: KernelTable, file: str = "", eff: Efficiencies | None = None) -> TableResult:
    """Every point of a table predicted; a fused-MoE benchmark's random gating is uniform routing (locality 0).
    `eff`: the coefficients to predict with (a fit's trial values); default_efficiencies() otherwise."""
    if isinstance(table, AllReduceTable):
        return predict_all_reduce(table, file)
    if isinstance(table, GemmTable):
        return predict_gemm(table, file, eff)
    if isinstance(table, AttentionDecodeTable):
        return predict_attention_decode(table, file, eff)
    shape = table.shape
    stack = target_stack(_one_moe_layer(shape), tp=1)
    # no small-tile rate (forward.moe_small_tiles): no table is of a GPU that has one; a table on the H20 would
    # have to say which config tiles its benchmark ran
    # the tile the table's source printed, at every size
    grid = (MoeGrid(table.grid.rows == "tight", shape.experts, shape.weights, table.grid.tile_entries(),
                    down_tiles=tuple(table.grid.down_tiles or ()), heuristic=table.config == "default")
            if table.grid is not None else None)
    model = ForwardModel(stack, gpus()[table.gpu], None, eff or default_efficiencies(),  # type: ignore[arg-type]
                         moe_grid=grid)
    boundaries, small = part_kernels("moe", shape.weights)
    boundaries -= ROUTER_GEMM.boundaries + (0 if table.routing_timed else TOP_K.boundaries)
    small -= ROUTER_GEMM.small + (0 if table.routing_timed else TOP_K.small)
    only = None
    if table.timed in MOE_GEMMS:  # one GEMM kernel: its roofline and its boundary, nothing small
        boundaries, small, only = 1, 0, (table.timed,)
    points = []
    for tokens, measured in table.points:
        touched = distinct_experts(shape.experts, shape.experts_per_token, tokens, tokens, 0.0)
        expert_mb = touched * stack.expert_bytes_per_gpu / 1e6
        points.append(KernelPoint(tokens, measured, model.fused_moe_call_us(tokens, boundaries, small, only),
                                  expert_mb, compared=table.rotates_weights or expert_mb > table.l2_cache_mb))
    return TableResult(table, file, points)


def run_tables(files: list[Path]) -> list[TableResult]:
    return [predict_table(load_table(f), str(f)) for f in files]


def _mean_abs_error(points: list[KernelPoint]) -> float | None:
    return sum(abs(p.error_pct) for p in points) / len(points) if points else None


def summary(results: list[TableResult]) -> dict[str, Any]:
    """The mean error over the compared points of the tables nothing was fitted to (the gate), and apart, over
    the fitted ones."""
    compared = [p for r in results if not r.table.fitted for p in r.compared]
    fitted = [p for r in results if r.table.fitted for p in r.compared]
    return {
        "tables": len(results),
        "points_compared": len(compared),
        "points_fitted": len(fitted),
        "points_in_l2": sum(len(r.points) - len(r.compared) for r in results),
        "mape_pct": _mean_abs_error(compared),
        "mape_fitted_pct": _mean_abs_error(fitted),
        "by_table": [{"id": r.table.id, "kernel": r.table.kernel, "hardware": hardware(r.table),
                      "points_compared": len(r.compared), "mape_pct": r.mape_pct, "fitted": r.table.fitted}
                     for r in results],
    }


def kind(table: KernelTable) -> str:
    """What a table times, for listings."""
    if isinstance(table, FusedMoeTable):
        part = "" if table.timed == "call" else f" {table.timed}"
        return f"fused MoE{part}, {table.config} tiles"
    if isinstance(table, GemmTable):
        return f"dense GEMM, {table.weights}"
    if isinstance(table, AttentionDecodeTable):
        return f"decode attention, {table.backend}, {table.kv_cache_dtype} KV"
    return "all-reduce"


def hardware(table: KernelTable) -> str:
    """What a table ran on, for listings: the GPU preset, or the GPU counts of an all-reduce."""
    if isinstance(table, AllReduceTable):
        return f"{table.link}, {table.reference.gpus} -> {table.measured.gpus} GPUs"
    return table.gpu


SIZE_UNITS = {"all_reduce": "bytes", "attention_decode": "KV tokens"}  # else tokens


def as_rows(results: list[TableResult]) -> list[dict[str, Any]]:
    return [{"table": r.table.id, "kernel": r.table.kernel, "hardware": hardware(r.table), "size": p.size,
             "unit": SIZE_UNITS.get(r.table.kernel, "tokens"), "measured_us": p.measured_us,
             "predicted_us": p.predicted_us, "error_pct": p.error_pct, "expert_mb": p.expert_mb,
             "shape": p.shape, "compared": p.compared, "source": r.table.source.url or r.table.source.citation}
            for r in results for p in r.points]
