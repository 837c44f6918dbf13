"""Fit the host time of an eager prefill layer on the SGLang cookbook's B200 box, per model, and check the fits.

    python calibration/fit_eager_prefill.py                        # rewrite every profile
    python calibration/fit_eager_prefill.py --page qwen3-235b      # rewrite one
    python calibration/fit_eager_prefill.py --check                # exit 1 unless each checked-in profile is its fit

The SGLang cookbook's DeepSeek-R1 page (validation/cases/cookbook-deepseek-r1-*) runs DeepSeek-R1-0528 on eight
B200s at TP 8 (SGLang 0.5.6.post1). With stock coefficients the model gets its decode step right (median ITL within
12%) and its one-request runs within 4%, but the box's time to first token hardly depends on the prompt: 153 / 126 /
166 ms at one request for ~610 / ~610 / ~4,200-token prompts, where the model's prefill takes 25 / 25 / 73 ms. A
fixed ~100-140 ms a prefill that the model lacks; at 16-100 clients every prefill stalls the running decode
(SGLang does not mix them by default), so the runs at 16 and more fall 17-48% short of the model. The model's term
for host time a prefill spends regardless of its tokens is layer_overhead_eager_us (prefill runs without CUDA
graphs in the modelled releases: Python dispatch and kernel launches per layer; defaults.yaml's 60 us is an
assumption). The three one-request runs' mean time to first token fits it (the page prints it beside each
throughput), minimising the squared log error; the three runs are marked fitted all the same, their throughput
resting on the same first tokens. The six runs at 16-100 clients use the profile and are the test: a fixed
prefill cost reaches them only through the decode it stalls. What the box spends the time on is not known.

The figure is per model: a layer's host time is that model's SGLang code path. The cookbook's Qwen3 page (Qwen3-235B-
A22B-Instruct-2507 on eight B200s, SGLang 0.5.6, validation/cases/cookbook-qwen3-235b-*) gets its own, fitted the
same way to its one-request 1000/1000 run's mean TTFT (99 ms, modelled 23); its runs at 16 and 100 clients are the
test, and so are the page's six 1000/8000 and 8000/1000 runs (one-request ones included), added to the suite after
the fit and left out of it.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

from simspec.calibration.fitting import (
    check_minimum,
    fit_scalar,
    prediction_with,
    published_cases,
    write_fitted_profile,
)
from simspec.scenario.loader import ResolvedScenario

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = "calibration/fit_eager_prefill.py"
NAME = "layer_overhead_eager_us"
METRIC = "throughput_tokens_per_s"
GRID_US = 10.0  # --check: the checked-in value must beat its neighbours this far away
MAX_US = 5000.0


@dataclass(frozen=True)
class Page:
    """One cookbook page: the one-request runs fitted (with each run's quoted "Mean TTFT (ms)") and the profile."""

    key: str
    profile_name: str
    fitted: tuple[str, ...]
    ttft_ms: tuple[float, ...]
    label: str
    model: str
    sglang_version: str

    @property
    def profile(self) -> Path:
        return ROOT / "calibration" / "profiles" / f"{self.profile_name}.yaml"


PAGES = {
    "deepseek-r1": Page(
        key="deepseek-r1", profile_name="cookbook-8xb200-deepseek-r1-host",
        fitted=("cookbook-deepseek-r1-8xb200-random-1000-1000-c1", "cookbook-deepseek-r1-8xb200-random-1000-8000-c1",
                "cookbook-deepseek-r1-8xb200-random-8000-1000-c1"),
        ttft_ms=(153.00, 125.76, 165.91), label="DeepSeek-R1", model="DeepSeek-R1-0528",
        sglang_version="0.5.6.post1 (as the cases model it)"),
    "qwen3-235b": Page(
        key="qwen3-235b", profile_name="cookbook-8xb200-qwen3-235b-host",
        fitted=("cookbook-qwen3-235b-a22b-8xb200-random-1000-1000-c1",), ttft_ms=(99.03,), label="Qwen3",
        model="Qwen3-235B-A22B-Instruct-2507", sglang_version="0.5.6 (as the cases model it)"),
}


def cases(page: Page) -> list[tuple[ResolvedScenario, float]]:
    return published_cases([ROOT / "validation" / "cases" / f"{c}.yaml" for c in page.fitted], without_profile=True)


def mean_ttft_ms(rs: ResolvedScenario, value: float) -> float:
    return prediction_with(rs, (NAME,), (value,))["ttft_ms"]["mean"]


def objective(values: tuple[float, ...], page: Page, fitted: list[tuple[ResolvedScenario, float]]) -> float:
    """Sum over the one-request runs of log(modelled / measured mean TTFT)^2 with the coefficient at values[0]."""
    return sum(math.log(mean_ttft_ms(rs, values[0]) / t) ** 2
               for (rs, _), t in zip(fitted, page.ttft_ms, strict=True))


def fit(page: Page, fitted: list[tuple[ResolvedScenario, float]]) -> float:
    """Bounded scalar minimisation over [0, MAX_US], rounded to 1 us."""
    return fit_scalar(lambda x: objective((x,), page, fitted), MAX_US)


def profile_for(page: Page, value: float, fitted: list[tuple[ResolvedScenario, float]]) -> dict:
    after = [prediction_with(rs, (NAME,), (value,)) for rs, _ in fitted]  # one prediction a run serves both figures
    errs = ", ".join(f"{name.split('random-')[1]}: mean TTFT {p['ttft_ms']['mean']:.0f} ms against {t}, throughput"
                     f" {(p[METRIC] / m - 1) * 100:+.1f}%"
                     for name, (_, m), t, p in zip(page.fitted, fitted, page.ttft_ms, after, strict=True))
    return {
        "name": page.profile_name,
        "description": (f"Host time of an eager prefill layer on the box behind the SGLang cookbook's {page.label}"
                        f" page (8 x B200, TP 8, SGLang {page.sglang_version.split(' ')[0]}, {page.model}). Only"
                        " layer_overhead_eager_us is fitted; every other coefficient keeps its default. A per-layer"
                        " figure of this model's SGLang code path on that box: not carried to other models. What"
                        " spends it is not known."),
        "fitted_to": [f"{name}: mean TTFT {t} ms" for name, t in zip(page.fitted, page.ttft_ms, strict=True)],
        "provenance": {"host": "the SGLang cookbook's B200 box (published figures, not profiled by simspec)",
                       "sglang_version": page.sglang_version, "method": SCRIPT},
        "coefficients": {NAME: {"value": value, "source": (
            f"fitted by {SCRIPT} to the mean time to first token of the one-request runs of the SGLang cookbook's"
            f" {page.label} page on 8 x B200 ({', '.join(page.fitted)}, marked fitted; after the fit: {errs})")}},
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--page", choices=sorted(PAGES), help="fit or check this page's profile only (default: all)")
    ap.add_argument("--check", action="store_true",
                    help="verify that each checked-in profile's value beats its grid neighbours (cheap)")
    args = ap.parse_args()
    status = 0
    for page in [PAGES[args.page]] if args.page else PAGES.values():
        fitted = cases(page)
        if args.check:
            value = float(yaml.safe_load(page.profile.read_text())["coefficients"][NAME]["value"])
            status |= check_minimum(lambda x, p=page, f=fitted: objective(x, p, f), (NAME,), (value,), (GRID_US,),
                                    page.profile, f"rerun {SCRIPT} --page {page.key}")
            continue
        v = fit(page, fitted)
        write_fitted_profile(page.profile, profile_for(page, v, fitted), SCRIPT)
        print(f"{page.key}: {NAME} = {v}: wrote {page.profile.relative_to(ROOT)}")
    return status


if __name__ == "__main__":
    sys.exit(main())
