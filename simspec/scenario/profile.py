"""Calibration profiles: measured time-model coefficients for one box, as data.

A profile is YAML written by `simspec calibrate` or checked in under calibration/profiles/. Every field is
optional: what a profile leaves out falls back to the interconnect preset (collectives) or to
simspec/presets/defaults.yaml (coefficients), and the prediction reports which source each figure came from.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CollectiveCurve(_Strict):
    """All-reduce time against message size, measured on `measured_gpus` GPUs (see timing/collectives.py)."""

    measured_gpus: int = Field(ge=2)
    points_bytes_us: list[tuple[float, float]] = Field(min_length=1)
    bus_bandwidth_gbps: float | None = Field(default=None, gt=0)
    source: str

    @model_validator(mode="after")
    def _sorted(self) -> CollectiveCurve:
        sizes = [s for s, _ in self.points_bytes_us]
        if sizes != sorted(sizes) or any(s <= 0 or t <= 0 for s, t in self.points_bytes_us):
            raise ValueError("points_bytes_us must be positive (bytes, us) pairs sorted by size")
        times = [t for _, t in self.points_bytes_us]
        if times != sorted(times):
            raise ValueError("all-reduce time must not fall as the message grows")
        return self


class Coefficient(_Strict):
    value: float = Field(ge=0)
    source: str


class Provenance(_Strict):
    date: str | None = None
    host: str | None = None
    sglang_version: str | None = None
    method: str | None = None


class MeasuredOn(_Strict):
    """The box a profile was measured on. A scenario that points at the profile must match it, or the
    profile's collective curve would silently describe different hardware."""

    gpu: str
    interconnect: str
    tp: int = Field(ge=1)
    model: str | None = None


class Profile(_Strict):
    name: str
    description: str = ""
    measured_on: MeasuredOn | None = None
    fitted_to: list[str] = Field(default_factory=list, description="measurements this profile was fitted to")
    provenance: Provenance = Provenance()
    all_reduce: CollectiveCurve | None = None
    coefficients: dict[str, Coefficient] = Field(default_factory=dict)
    draft_forward_ms: Coefficient | None = Field(
        default=None, description="measured time of one draft forward (communication included); replaces the"
                                  " modelled draft cost, which is then reported as draft compute")
