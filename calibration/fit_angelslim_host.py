"""Fit the host time per output token of the box behind AngelSlim issue #163 to its no-speculation runs, and check it.

    python calibration/fit_angelslim_host.py           # rewrite calibration/profiles/angelslim163-4xh100-host.yaml
    python calibration/fit_angelslim_host.py --check   # exit 1 unless the checked-in profile is the fit's minimum

AngelSlim issue #163 (validation/cases/angelslim163-*) ran Qwen3-30B-A3B at TP 4 on "H100*4" with SpecForge's
bench_eagle3, at batch 1 to 64, with and without EAGLE-3. Against the model with stock coefficients, every run of
that table, from batch 4 up, takes the same extra time per output token: 0.53-0.77 ms, with EAGLE-3 (2.55 tokens a
step) as without (one), at batch 4 as at 64. Time the GPU would spend grows with the tokens a step verifies (16 a
request with EAGLE-3, 1 without), and host work per iteration or per request would be shared by the 2.55 tokens an
EAGLE-3 step commits; only a cost per committed token, on the critical path, is the same in both. That is what
host_per_output_token_us charges (defaults.yaml; 0 by default, SGLang's per-token work being taken to lie within
the per-request terms). Its cause on this box is not stated (a slow or contended host, the tokenizer or
detokenizer path, the client): the fit measures it, it does not explain it.

The five no-speculation runs (batch 1, 4, 8, 32, 64) fit the one coefficient, minimising the squared log error of
their measured throughput; they are marked fitted. The eight EAGLE-3 runs use the profile and stay the test of
the mechanism: a per-token cost carries over to them unchanged, which no per-iteration or per-request cost would.
The same reporter's TP-2 runs (SpecForge #339, validation/cases/specforge339-*) show ~0.1-0.2 ms per token beyond
the model, not 0.6: a different box or setup, so the profile is not applied there.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from scipy.optimize import minimize_scalar

from simspec.calibration.fitting import (
    check_minimum,
    log_misfit,
    predicted_with,
    published_cases,
    write_fitted_profile,
)
from simspec.scenario.loader import ResolvedScenario

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "calibration" / "profiles" / "angelslim163-4xh100-host.yaml"
CASES = sorted((ROOT / "validation" / "cases").glob("angelslim163-qwen3-30b-a3b-4xh100-baseline-bs*.yaml"),
               key=lambda p: int(p.stem.rsplit("-bs", 1)[1]))
NAME = "host_per_output_token_us"
METRIC = "throughput_tokens_per_s"
GRID_US = 10.0  # --check: the checked-in value must beat its neighbours this far away
MAX_US = 3000.0


def objective(values: tuple[float, ...], cases: list[tuple[ResolvedScenario, float]]) -> float:
    """Sum over the cases of log(predicted throughput / measured throughput)^2 with the coefficient at values[0]."""
    return log_misfit(cases, (NAME,), values, METRIC)


def fit(cases: list[tuple[ResolvedScenario, float]]) -> float:
    """Bounded scalar minimisation over [0, MAX_US], rounded to 1 us."""
    res = minimize_scalar(lambda x: objective((x,), cases), bounds=(0.0, MAX_US), method="bounded",
                          options={"xatol": 0.5})
    return float(round(res.x))


def profile_for(value: float, cases: list[tuple[ResolvedScenario, float]]) -> dict:
    errs = ", ".join(f"batch {p.stem.rsplit('-bs', 1)[1]}: "
                     f"{(predicted_with(rs, (NAME,), (value,), METRIC) / measured - 1) * 100:+.1f}%"
                     for p, (rs, measured) in zip(CASES, cases, strict=True))
    source = ("fitted by calibration/fit_angelslim_host.py to the no-speculation throughput of AngelSlim #163's"
              f" TP-4 box at batch 1-64 (validation/cases/angelslim163-*-baseline-*, marked fitted; error after"
              f" the fit: {errs})")
    return {
        "name": "angelslim163-4xh100-host",
        "description": ("Host time per output token of the box behind Tencent/AngelSlim issue #163 ('H100*4', TP 4,"
                        " SpecForge bench_eagle3, December 2025). Only host_per_output_token_us is fitted; every"
                        " other coefficient keeps its default. What spends it on that box is not known."),
        "fitted_to": [f"{p.stem}: throughput_tokens_per_s {c[1]}" for p, c in zip(CASES, cases, strict=True)],
        "provenance": {"host": "the AngelSlim #163 reporter's box (published figures, not profiled by simspec)",
                       "sglang_version": "0.5.5 (SpecForge's pin at the time; the cases model 0.5.8)",
                       "method": "calibration/fit_angelslim_host.py"},
        "coefficients": {NAME: {"value": value, "source": source}},
    }


def checked_in() -> float:
    return float(yaml.safe_load(PROFILE.read_text())["coefficients"][NAME]["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify that the checked-in profile's value beats its grid neighbours (cheap)")
    args = ap.parse_args()
    cases = published_cases(CASES, without_profile=True)
    if args.check:
        return check_minimum(lambda x: objective(x, cases), (NAME,), (checked_in(),), (GRID_US,), PROFILE,
                             "rerun calibration/fit_angelslim_host.py")
    v = fit(cases)
    write_fitted_profile(PROFILE, profile_for(v, cases), "calibration/fit_angelslim_host.py")
    print(f"{NAME} = {v}: wrote {PROFILE.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
