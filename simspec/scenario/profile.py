"""Calibration profiles: measured time-model coefficients for one box, as data.

A profile is YAML written by `simspec calibrate` or checked in under calibration/profiles/. Every field is
optional: what a profile leaves out falls back to the interconnect preset (collectives) or to
simspec/presets/defaults.yaml (coefficients), and the prediction reports which source each figure came from.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field, StrictFloat, StrictInt, model_validator

from simspec.presets import NcclRingModel, check_curve_points, check_nccl_ring
from simspec.scenario.schema import MAX_GPUS, StrictModel

# Plausibility bounds of what a profile may say. The coefficients a fit solves for take the fit's own bounds
# (simspec/calibration/fitting.py BOUNDS: the edge of what a healthy server can be); the others, and the
# all-reduce curve, have these generous physical limits, each far outside any measured or published figure:
OTHER_COEFFICIENT_BOUNDS: dict[str, tuple[float, float, str]] = {
    # us per kernel boundary inside a CUDA graph: ~1.3 us measured on H100 (defaults.yaml); 100 us is a launch
    # slower than an eager one
    "kernel_gap_graph_us": (0.0, 100.0, "a CUDA-graph kernel boundary costs ~1.3 us on an H100"),
    "small_kernel_us": (0.0, 1000.0, "a kernel that moves almost no bytes takes 2-4 us on an H100"),
    "streaming_kernel_us": (0.0, 1000.0, "a GEMM's fixed part is ~3 us beyond its boundary on an H200"),
    "layer_overhead_eager_us": (0.0, 100_000.0, "eager dispatch costs 60 us to ~1.9 ms per layer in the profiles"),
    "graph_launch_us": (0.0, 100_000.0, "a CUDA graph's launch takes a few us of host time besides its nodes"),
    "graph_launch_per_node_us": (0.0, 1000.0, "a branched CUDA graph's launch costs the host ~1 us a node"),
    "tp_request_broadcast_us": (0.0, 100_000.0, "a gloo broadcast of a small object takes ~150 us"),
    "spec_cpu_per_verified_token_us": (0.0, 10_000.0, "host work per verified token is ~10 us (defaults.yaml)"),
    "ngram_cpu_per_request_us": (0.0, 100_000.0, "an n-gram trie lookup per request takes tens of us"),
    "host_per_output_token_us": (0.0, 100_000.0, "host time per output token is 0.2-0.9 ms in the profiles"),
    "moe_empty_block_us": (0.0, 10.0, "a program that returns at once costs a few ns of its call (defaults.yaml)"),
    "moe_program_gbps": (0.1, 10_000.0, "one fused-MoE program streams ~27 GB/s on an H200 (defaults.yaml)"),
    "moe_routing_locality": (0.0, 1.0, "a fraction"),
    # a gamma law's 1 / shape: 10 puts nine tenths of the choices on a few experts, beyond any measured layer
    "moe_routing_spread": (0.0, 10.0, "the measured figures are 0.55-0.83, one kind of text alone up to 2.6"),
    # MiB in use before SGLang sizes its KV cache: the loader also holds it to 25% of the scenario's GPU
    "startup_memory_mib": (0.0, 1_048_576.0, "no GPU has 1 TiB of memory"),
    "startup_memory_multi_gpu_mib": (0.0, 1_048_576.0, "no GPU has 1 TiB of memory"),
}
MAX_DRAFT_FORWARD_MS = 1000.0  # one draft step forward: a few ms; a second is slower than a 1T-parameter target step
# a figure derived from the table: its largest sizes may still be latency-bound (gloo over TCP, a short sweep),
# so only a positive floor; a link speed floor would refuse real tables
MIN_BUS_BANDWIDTH_GBPS = 1e-6
MAX_BUS_BANDWIDTH_GBPS = 10_000.0  # NVLink 5 moves 1.8 TB/s per GPU; 10 TB/s is above any GPU link
MAX_MESSAGE_BYTES = 2**40  # an all-reduce of 1 TiB exceeds any GPU's memory
MAX_ALL_REDUCE_US = 1e7  # 10 s: an all-reduce that slow is a hung collective, not a curve point


def coefficient_bounds(name: str) -> tuple[float, float, str] | None:
    """(low, high, why) a profile's coefficient `name` must lie within, None for a name the loader refuses."""
    from simspec.calibration.fitting import BOUNDS  # imported here: fitting imports the loader, which imports this

    if name in BOUNDS:
        lo, hi = BOUNDS[name]
        return lo, hi, "the range simspec calibrate fits it within (simspec/calibration/fitting.py BOUNDS)"
    return OTHER_COEFFICIENT_BOUNDS.get(name)


class CollectiveCurve(StrictModel):
    """All-reduce time against message size, measured on `measured_gpus` GPUs (see timing/collectives.py)."""

    measured_gpus: StrictInt = Field(ge=2, le=MAX_GPUS)
    points_bytes_us: list[tuple[Annotated[StrictFloat, Field(le=MAX_MESSAGE_BYTES)],
                                Annotated[StrictFloat, Field(le=MAX_ALL_REDUCE_US)]]] = Field(min_length=1)
    bus_bandwidth_gbps: StrictFloat | None = Field(default=None, ge=MIN_BUS_BANDWIDTH_GBPS,
                                                   le=MAX_BUS_BANDWIDTH_GBPS)
    source: str
    fallback: CollectiveCurve | None = Field(
        default=None, description="the curve of the implementation a message goes to when that is faster (a custom "
                                  "all-reduce that hands messages past its crossover to NCCL)")
    nccl_ring: NcclRingModel | None = Field(
        default=None, description="set on a curve derived from NCCL's tuning model (an interconnect preset), not on a "
                                  "measured one: each message is priced at NCCL's fastest ring protocol")

    @model_validator(mode="after")
    def _check_points(self) -> CollectiveCurve:
        check_curve_points(self.points_bytes_us)
        check_nccl_ring(self.nccl_ring, self.bus_bandwidth_gbps)
        return self


class Coefficient(StrictModel):
    value: StrictFloat = Field(ge=0)
    source: str
    interval_95: tuple[StrictFloat, StrictFloat] | None = Field(
        default=None, description="bootstrap 95% interval of a fitted value (simspec calibrate): [low, high],"
                                  " low <= value <= high")

    @model_validator(mode="after")
    def _interval_holds_value(self) -> Coefficient:
        if self.interval_95 is not None:
            lo, hi = self.interval_95
            if not lo <= self.value <= hi:
                raise ValueError(f"interval_95 [{lo:g}, {hi:g}] must be [low, high] with low <= value ({self.value:g})"
                                 " <= high")
        return self


class Provenance(StrictModel):
    date: str | None = None
    host: str | None = None
    sglang_version: str | None = None
    method: str | None = None
    server_args: dict[str, Any] = Field(default_factory=dict, description="the server's arguments, as it reported them")


class MeasuredOn(StrictModel):
    """The box a profile was measured on. A scenario that points at the profile must match it, or the
    profile's collective curve would silently describe different hardware."""

    gpu: str
    interconnect: str
    tp: StrictInt = Field(ge=1, le=MAX_GPUS)
    model: str | None = None


class Profile(StrictModel):
    name: str
    description: str = ""
    measured_on: MeasuredOn | None = None
    fitted_to: list[str] = Field(default_factory=list, description="measurements this profile was fitted to")
    provenance: Provenance = Provenance()
    all_reduce: CollectiveCurve | None = None
    coefficients: dict[str, Coefficient] = Field(default_factory=dict)
    draft_forward_ms: Coefficient | None = Field(
        default=None, description="measured time of one draft step forward (communication and launch included);"
                                  " replaces the modelled draft steps, reported as draft compute. The draft"
                                  " extend stays modelled.")

    @model_validator(mode="after")
    def _plausible(self) -> Profile:
        for name, coef in self.coefficients.items():
            bounds = coefficient_bounds(name)
            if bounds is None:
                continue  # an unknown coefficient: the loader names the allowed ones
            lo, hi, why = bounds
            _within(coef, lo, hi, f"coefficients.{name}", why)
        if self.draft_forward_ms is not None:
            _within(self.draft_forward_ms, 0.0, MAX_DRAFT_FORWARD_MS, "draft_forward_ms",
                    "one draft step forward takes a few ms; a second is slower than any target's whole step")
        return self


def _within(coef: Coefficient, lo: float, hi: float, key: str, why: str) -> None:
    figures = [("value", coef.value)] + ([("interval_95", v) for v in coef.interval_95] if coef.interval_95 else [])
    for field, v in figures:
        if not lo <= v <= hi:
            raise ValueError(f"{key}.{field}: {v:g} is outside the plausible range; allowed: {lo:g} to {hi:g} ({why})")
