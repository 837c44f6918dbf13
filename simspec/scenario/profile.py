"""Calibration profiles: measured time-model coefficients for one box, as data.

A profile is YAML written by `simspec calibrate` or checked in under calibration/profiles/. Every field is
optional: what a profile leaves out falls back to the interconnect preset (collectives) or to
simspec/presets/defaults.yaml (coefficients), and the prediction reports which source each figure came from.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from simspec.presets import check_curve_points
from simspec.scenario.schema import StrictModel


class CollectiveCurve(StrictModel):
    """All-reduce time against message size, measured on `measured_gpus` GPUs (see timing/collectives.py)."""

    measured_gpus: int = Field(ge=2)
    points_bytes_us: list[tuple[float, float]] = Field(min_length=1)
    bus_bandwidth_gbps: float | None = Field(default=None, gt=0)
    source: str
    fallback: CollectiveCurve | None = Field(
        default=None, description="the curve of the implementation a message goes to when that is faster (a custom "
                                  "all-reduce that hands messages past its crossover to NCCL)")

    @model_validator(mode="after")
    def _check_points(self) -> CollectiveCurve:
        check_curve_points(self.points_bytes_us)
        return self


class Coefficient(StrictModel):
    value: float = Field(ge=0)
    source: str
    interval_95: tuple[float, float] | None = Field(
        default=None, description="bootstrap 95% interval of a fitted value (simspec calibrate)")


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
    tp: int = Field(ge=1)
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
