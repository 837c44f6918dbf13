"""Hardware, interconnect, model and drafter presets: data files shipped in the package, validated on load.

Each preset carries a `source` saying where its figures come from. Code never hard-codes these figures.
"""

from __future__ import annotations

import typing
from functools import cache
from importlib import resources
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, computed_field, model_validator

WeightFormat = Literal["bf16", "fp8", "fp8-block128", "int4-g32"]
GpuLinks = Literal["pcie4", "pcie5", "nvlink3", "nvlink4", "nvlink5"]


class _Preset(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    display_name: str
    source: str


class SustainedTensorFraction(BaseModel):
    """Per compute type, the fraction of its datasheet dense peak a card sustains in a compute-bound GEMM, relative
    to the same chip in a form its power does not hold back (for the H100 PCIe: a stock H100 SXM) running the same
    kernel: a card whose power cap holds its clock under tensor load below the boost clock the datasheet's peak
    assumes. A compute type left out: no shortfall measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    bf16: float | None = Field(default=None, gt=0, le=1)
    fp8: float | None = Field(default=None, gt=0, le=1)
    source: str

    @model_validator(mode="after")
    def _says_something(self) -> SustainedTensorFraction:
        if self.bf16 is None and self.fp8 is None:
            raise ValueError("sustained_tensor_fraction gives neither bf16 nor fp8")
        return self


class GpuPreset(_Preset):
    memory_gb: float = Field(gt=0, description="marketed capacity, for listings; memory_mib sizes the KV cache")
    memory_mib: int = Field(gt=0, description="total memory nvidia-smi reports, in MiB: what SGLang's memory"
                                                  " defaults and fractions apply to")
    memory_bandwidth_gbps: float = Field(gt=0)
    bf16_tflops: float = Field(gt=0)
    fp8_tflops: float | None = Field(default=None, gt=0)
    fp4_tflops: float | None = Field(default=None, gt=0)
    links: GpuLinks
    nvlink_bridge: GpuLinks | None = Field(
        default=None, description="the NVLink a two-card bridge gives a PCIe card, where one exists: a TP-2 pair"
        " of such cards talks over it")
    p2p: bool = Field(default=True, description="whether the stock driver lets two cards copy to each other"
                                               " directly (GeForce cards: no)")
    mma_rows: int = Field(ge=1, le=256, description="rows of the smallest tensor-core MMA its GEMMs issue")
    moe_small_tile_tflops: float | None = Field(
        default=None, gt=0, description="measured rate of Triton fused-MoE FP8 tiles narrower than mma_rows that"
        " run without swap-AB (warp-level MMA); None where not measured: such tiles then run at the dense peak")
    moe_default_tile_tflops: float | None = Field(
        default=None, gt=0, description="rate of the Triton fused MoE's default wide tile (64 x 64, BLOCK_SIZE_K 32,"
        " Triton's own warps and stages), which SGLang runs for BF16 experts over more tokens than experts where no"
        " tuned config exists; None where neither measured nor derived: such calls run at the dense rate")
    sustained_tensor_fraction: SustainedTensorFraction | None = Field(
        default=None, description="where measured: the part of its datasheet dense peak the card sustains under its"
        " power cap, per compute type (None: the datasheet's peak)")
    tdp_w: float = Field(gt=0)
    price_per_hour_usd: float = Field(gt=0)

    def tensor_unit(self, compute: str) -> Literal["bf16", "fp8"]:
        """The tensor units a compute type runs on here: FP8 falls back to BF16 on GPUs without FP8 units."""
        return "fp8" if compute == "fp8" and self.fp8_tflops else "bf16"

    def peak_tflops(self, compute: str) -> float:
        """Dense tensor peak for a compute type (tensor_unit's)."""
        return self.fp8_tflops if self.tensor_unit(compute) == "fp8" else self.bf16_tflops  # type: ignore[return-value]

    def sustained_tflops(self, compute: str) -> float:
        """The dense peak a compute-bound GEMM of this compute type can draw on here: the datasheet's, less what the
        card's power cap takes (sustained_tensor_fraction). compute_efficiency applies on top of it."""
        fraction = getattr(self.sustained_tensor_fraction, self.tensor_unit(compute), None)
        return self.peak_tflops(compute) * (1.0 if fraction is None else fraction)


def check_curve_points(points: list[tuple[float, float]]) -> None:
    """An all-reduce curve: positive (bytes, us) pairs, sorted by size, whose time never falls as size grows."""
    sizes = [s for s, _ in points]
    times = [t for _, t in points]
    if sizes != sorted(sizes) or any(s <= 0 or t <= 0 for s, t in points):
        raise ValueError("points_bytes_us must be positive (bytes, us) pairs sorted by size")
    if times != sorted(times):
        raise ValueError("all-reduce time must not fall as the message grows")


def check_nccl_ring(nccl_ring: NcclRingModel | None, bus_bandwidth_gbps: float | None) -> None:
    """A curve derived from NCCL's ring model prices its Simple protocol at the curve's bus bandwidth: it needs one."""
    if nccl_ring is not None and bus_bandwidth_gbps is None:
        raise ValueError("a curve derived from NCCL's ring model needs bus_bandwidth_gbps (the Simple protocol's)")


class NcclRingModel(BaseModel):
    """NCCL's own cost model of a ring all-reduce, for a curve derived from it rather than measured: each message
    runs the ring protocol the model makes fastest (timing/collectives.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ll_max_bus_bandwidth_gbps: float = Field(
        gt=0, description="NCCL's cap on the LL protocol's bus bandwidth inside one node, by GPU generation"
                          " (tuning.cc llMaxBws)")
    ll128: bool = Field(description="whether NCCL runs the LL128 protocol on these links (by default over NVLink only)")


class InterconnectPreset(_Preset):
    links: GpuLinks = Field(description="the GPU links (GpuPreset.links) the curve was measured or derived on")
    p2p: bool = Field(default=True, description="whether the curve's GPUs copied to each other directly")
    implementation: Literal["nccl", "custom"]
    measured_gpus: int = Field(ge=2)
    points_bytes_us: list[tuple[float, float]] = Field(min_length=1)
    bus_bandwidth_gbps: float | None = Field(default=None, gt=0)
    fallback: str | None = Field(default=None, description="an NCCL preset on the same link that the implementation"
                                                           " hands a message to whenever that is faster")
    nccl_ring: NcclRingModel | None = Field(
        default=None, description="a curve derived from NCCL's tuning model: its points are the LL protocol's latency"
                                  " and bus_bandwidth_gbps the Simple protocol's")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def link(self) -> Literal["pcie", "nvlink"]:
        """The kind of link, which sets NCCL's per-hop latency (timing/collectives.py): read off `links`."""
        return "nvlink" if self.links.startswith("nvlink") else "pcie"

    @model_validator(mode="after")
    def _check_points(self) -> InterconnectPreset:
        check_curve_points(self.points_bytes_us)
        check_nccl_ring(self.nccl_ring, self.bus_bandwidth_gbps)
        return self


def _split_links(links: str) -> tuple[str, int]:
    kind = links.rstrip("0123456789")
    return kind, int(links[len(kind):])


def _link_text(links: str) -> str:
    kind, gen = _split_links(links)
    return f"{'NVLink' if kind == 'nvlink' else 'PCIe'} {gen}"


def interconnect_mismatch(gpu_name: str, gpu: GpuPreset, ic_name: str, ic: InterconnectPreset,
                          tp: int) -> str | None:
    """Why `tp` of these GPUs cannot talk over this interconnect as it stands, or None where they can.

    A what-if may pair them on purpose (the GPU kept, the interconnect changed, to isolate what the interconnect
    costs); the prediction then says the pairing is hypothetical rather than refuse it. Real, and not flagged: one
    GPU (nothing crosses the interconnect), a card in an older PCIe slot (it runs at the slot's rate), and two PCIe
    cards joined by the NVLink bridge their data sheet names."""
    if tp <= 1:
        return None
    (gpu_kind, gpu_gen), (ic_kind, ic_gen) = _split_links(gpu.links), _split_links(ic.links)
    if ic_kind == gpu_kind == "pcie" and ic.p2p and not gpu.p2p:
        return (f"{gpu_name} has no peer-to-peer copies on its stock driver; {ic_name} is a curve with them (a"
                " patched driver that enables them is not a preset)")
    if ic.links == gpu.links or (tp == 2 and ic.links == gpu.nvlink_bridge):
        return None
    if gpu_kind == ic_kind == "pcie" and gpu_gen > ic_gen:
        return None
    have, curve = _link_text(gpu.links), _link_text(ic.links)
    if ic_kind == "nvlink":
        bridge = f" (its {_link_text(gpu.nvlink_bridge)} bridge joins two cards)" if gpu.nvlink_bridge else ""
        return (f"{gpu_name} has {have} links{bridge}, not {curve} ({ic_name}) at TP {tp}: its compute and"
                " memory with that all-reduce, a box that does not exist")
    if gpu_kind == "nvlink":
        return f"{gpu_name} talks over {have}; {ic_name} is a {curve} curve: as if NVLink were off"
    return f"{gpu_name}'s {have} link cannot reach {ic_name}'s {curve} rates"


class MlaAttention(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["mla"]
    num_heads: int = Field(ge=1)
    q_lora_rank: int = Field(ge=1)
    kv_lora_rank: int = Field(ge=1)
    qk_rope_head_dim: int = Field(ge=1)
    qk_nope_head_dim: int = Field(ge=1)
    v_head_dim: int = Field(ge=1)


class GqaAttention(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["gqa"]
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)


class ModelWeights(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    attention: WeightFormat
    dense_mlp: WeightFormat = "bf16"
    shared_experts: WeightFormat = "bf16"
    routed_experts: WeightFormat = "bf16"
    embedding: WeightFormat
    lm_head: WeightFormat


class RoutingLocality(BaseModel):
    """A model's measured expert-routing locality, with where it was measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float = Field(ge=0, lt=1, description="fraction of a token's routed experts that the previous token of"
                                                  " the same sequence also used (per layer, averaged)")
    source: str


class RoutingSpread(BaseModel):
    """A model's measured expert popularity spread, with where and how it was measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float = Field(ge=0, le=10, description="squared coefficient of variation of the routed experts' selection"
                                                  " frequencies within a layer (a gamma law's 1 / shape)")
    source: str


class ModelPreset(_Preset):
    architecture: str
    context_length: int = Field(ge=1)
    num_layers: int = Field(ge=1)
    num_dense_layers: int = Field(ge=0)
    hidden_size: int = Field(ge=1)
    dense_intermediate_size: int = Field(default=0, ge=0)
    moe_intermediate_size: int = Field(default=0, ge=0)
    num_routed_experts: int = Field(default=0, ge=0)
    experts_per_token: int = Field(default=0, ge=0)
    num_shared_experts: int = Field(default=0, ge=0)
    attention: MlaAttention | GqaAttention = Field(discriminator="kind")
    vocab_size: int = Field(ge=1)
    tie_word_embeddings: bool
    mtp_layers: int = Field(ge=0)
    weights: ModelWeights
    published_params_b: float = Field(gt=0)
    # Measured for this model, or carried from a sibling of the same routing design with its source saying so:
    # replaces defaults.yaml's uniform-routing 0, and a calibration profile replaces it
    moe_routing_locality: RoutingLocality | None = None
    # Measured for this model on served text: replaces defaults.yaml's uniform 0, and a calibration profile replaces it
    moe_routing_spread: RoutingSpread | None = None

    @property
    def num_moe_layers(self) -> int:
        return self.num_layers - self.num_dense_layers

    def measured_routing(self) -> dict[str, RoutingLocality | RoutingSpread]:
        """The routing figures this preset measures (or carries), by their defaults.yaml coefficient name."""
        figures = {"moe_routing_locality": self.moe_routing_locality, "moe_routing_spread": self.moe_routing_spread}
        return {name: figure for name, figure in figures.items() if figure is not None}

    @model_validator(mode="after")
    def _check(self) -> ModelPreset:
        if self.num_dense_layers > self.num_layers:
            raise ValueError("num_dense_layers exceeds num_layers")
        if self.num_moe_layers and not (self.num_routed_experts and self.experts_per_token
                                        and self.moe_intermediate_size):
            raise ValueError("MoE layers need num_routed_experts, experts_per_token, moe_intermediate_size")
        if self.num_dense_layers and not self.dense_intermediate_size:
            raise ValueError("dense layers need dense_intermediate_size")
        measured = self.measured_routing()
        if measured and not self.num_moe_layers:
            raise ValueError(f"{next(iter(measured))} needs MoE layers")
        return self


class DrafterPreset(_Preset):
    algorithm: Literal["eagle", "eagle3"]
    target: str
    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_heads: int = Field(ge=1)
    num_kv_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    draft_vocab_size: int = Field(ge=1)
    fc_input_multiplier: int = Field(ge=1)
    weights: WeightFormat


class DefaultCoefficient(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    value: float
    unit: str
    source: str


def _load(name: str) -> dict[str, Any]:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return yaml.safe_load(text)


@cache
def gpus() -> dict[str, GpuPreset]:
    return {k: GpuPreset(**v) for k, v in _load("gpus.yaml").items()}


@cache
def interconnects() -> dict[str, InterconnectPreset]:
    out = {k: InterconnectPreset(**v) for k, v in _load("interconnects.yaml").items()}
    for name, ic in out.items():
        fb = out.get(ic.fallback) if ic.fallback else None
        if ic.fallback and (fb is None or fb.implementation != "nccl" or fb.links != ic.links or fb.fallback):
            raise ValueError(f"interconnect {name}: fallback {ic.fallback!r} must be an NCCL preset on the same link"
                             " (links) without a fallback of its own")
    return out


@cache
def models() -> dict[str, ModelPreset]:
    return {k: ModelPreset(**v) for k, v in _load("models.yaml").items()}


@cache
def drafters() -> dict[str, DrafterPreset]:
    return {k: DrafterPreset(**v) for k, v in _load("drafters.yaml").items()}


@cache
def default_coefficients() -> dict[str, DefaultCoefficient]:
    return {k: DefaultCoefficient(**v) for k, v in _load("defaults.yaml").items()}


class FusedMoeTileFile(BaseModel):
    """One tuned fused-MoE config file of an SGLang release, as calibration/read_fused_moe_tiles.py read it."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    gpu: str
    experts: int = Field(ge=1)
    n: int = Field(ge=1)
    weights: str
    file: str
    tiles: list[tuple[int, int, int]] = Field(min_length=1, description="(tokens key, BLOCK_SIZE_M, BLOCK_SIZE_N)")
    since: str | None = Field(default=None, pattern=r"^0\.\d+\.\d+(\.post\d+)?$",
                              description="0.5.8's files: the first release read that ships it with these tiles")
    down_file: str | None = None
    down_tiles: list[tuple[int, int, int]] | None = Field(
        default=None, min_length=1, description="the w2 (down) GEMM's own file's entries, where the release has one")


TileKey = tuple[str, int, int, str]  # (GPU preset, E, N, expert weights)


def _tile_file(release: str, f: dict) -> FusedMoeTileFile:
    out = FusedMoeTileFile(**f)
    # a name no preset uses would never be looked up: the default tile would stand in silently
    if out.gpu not in gpus() or out.weights not in typing.get_args(WeightFormat):
        raise ValueError(f"fused_moe_tiles.yaml {release} {out.file}: GPU {out.gpu!r} or weights {out.weights!r}"
                         " is not a simspec preset name")
    return out


@cache
def fused_moe_tiles() -> dict[str, dict[TileKey, FusedMoeTileFile]]:
    """Per release read ("0.4.6", "0.5.8", then each later release whose tiles changed): (GPU preset, E, N, expert
    weights) -> the tuned config file a call of that shape loads, with its tiles by tokens, its down file's where it
    has one and, for 0.5.8's files, the first release that ships it (`since`). A later section lists what changed
    from the one before it; here each is whole."""
    out: dict[str, dict[TileKey, FusedMoeTileFile]] = {}
    previous: dict[TileKey, FusedMoeTileFile] = {}
    for release, body in _load("fused_moe_tiles.yaml").items():
        release = str(release)
        if "files" in body:
            files = {}
        else:  # changed from the section before
            files = dict(previous)
            for gone in body.get("removed", []):
                files.pop((gone["gpu"], gone["experts"], gone["n"], gone["weights"]))
        for f in (_tile_file(release, f) for f in body.get("files", body.get("changed", []))):
            files[(f.gpu, f.experts, f.n, f.weights)] = f
        out[release] = previous = files
    return out


class KernelCount(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    kernels: int = Field(ge=0)
    small: int = Field(ge=0)


PartName = Literal["norms", "gqa_attention", "qk_norm", "mla_attention", "dense_mlp", "moe", "shared_experts"]


class KernelRelease(BaseModel):
    """An SGLang release whose kernels differ from the per_layer counts (kernels.yaml `releases`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    per_layer: dict[PartName, KernelCount] = {}  # replaces per_layer's count for that part
    small_from_two_rows: dict[PartName, int] = {}  # small copies a part adds once a forward has 2+ query rows
    source: str


class FusedKvStore(BaseModel):
    """Architectures whose rotary kernel also stores K and V, from release `since` (kernels.yaml fused_kv_store)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    architectures: list[str]
    since: str
    gqa_attention: KernelCount


class UnfusedRouter(BaseModel):
    """Architectures whose router top-k no fused gate serves while their shared expert runs fused (kernels.yaml
    unfused_router): the kernels it launches beyond the one per_layer's moe counts."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    architectures: list[str]
    kernels: int = Field(ge=0)
    small: int = Field(ge=0)


class KernelCounts(BaseModel):
    """Kernels SGLang launches per decode forward, by part of the model (kernels.yaml)."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    per_layer: dict[PartName, KernelCount]
    fp8_quant_per_linear: dict[Literal["gqa_attention", "mla_attention", "dense_mlp", "moe", "shared_experts"],
                               int]
    per_forward: KernelCount
    heads: dict[Literal["eagle", "eagle3", "mtp"], KernelCount]
    qk_norm_architectures: list[str]
    mla_rope_apart: KernelCount
    fused_kv_store: FusedKvStore
    unfused_router: UnfusedRouter
    releases: dict[str, KernelRelease] = {}  # "0.4.6": counts of that release


@cache
def kernel_counts() -> KernelCounts:
    return KernelCounts(**_load("kernels.yaml"))


def catalog() -> dict[str, dict[str, Any]]:
    """Every preset by kind, for `simspec presets`."""
    return {"gpus": gpus(), "interconnects": interconnects(), "models": models(), "drafters": drafters()}
