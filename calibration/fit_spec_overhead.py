"""Fit the host work SGLang's v1 speculative worker spends per iteration on trees and per request and verified
token, and check it.

    python calibration/fit_spec_overhead.py           # print the fitted values and the cases before / after
    python calibration/fit_spec_overhead.py --check   # exit 1 unless defaults.yaml holds the fitted values

The mechanisms (simspec/timing/iteration.py), both exposed without overlap scheduling (SGLang's v1 EAGLE /
n-gram workers):
  - spec_cpu_per_verified_token_us: host time that grows with the batch and the verified tokens: verify()
    copies the accept indices and predictions to the host (`.tolist()`, sized batch x num_draft_tokens), builds
    the next tree's positions and masks, and walks every request's accepted tokens in Python (eagle_info.py
    verify, SGLang 0.5.10);
  - spec_tree_cpu_ms: a fixed cost per iteration when topk > 1, the tree work that runs eagerly between the
    CUDA graphs: organize_draft_results' top-k over the steps x topk x topk candidates and its sort,
    build_tree_kernel_efficient, and the verify's custom attention mask (eagle_utils.py / eagle_worker.py).
    Chains (topk 1) skip it; the cases with topk 1 (PR #11398, M3, M4, PR #12128) are what tell the two apart.
No public per-operation figure was found, so the two coefficients are fitted here to one published series and
validated on the others.

Data: the GPUStack performance lab's Qwen3-8B-FP8 + EAGLE-3 (4, 4, 16) runs on one H100 at concurrency 1, 2,
4 and 8 (validation/cases/gpustack-qwen3-8b-fp8-h100-eagle3-c{1,2,4,8}.yaml, marked fitted there), whose
accept lengths come from the runs' own streaming statistics. The fit minimises the squared log error of
their output throughput. M2, M3, M1 and the other speculative cases stay unfitted: they are the test (M2's
EAGLE-2 and EAGLE-3 runs have topk 8, the rest topk 1).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import yaml
from scipy.optimize import minimize

from simspec.calibration.fitting import check_minimum, log_misfit, predicted_with, published_cases
from simspec.scenario.loader import ResolvedScenario

ROOT = Path(__file__).resolve().parent.parent
NAMES = ("spec_tree_cpu_ms", "spec_cpu_per_verified_token_us")
CASES = [ROOT / "validation" / "cases" / f"gpustack-qwen3-8b-fp8-h100-eagle3-c{c}.yaml" for c in (1, 2, 4, 8)]
DEFAULTS = ROOT / "simspec" / "presets" / "defaults.yaml"
BOUNDS = ((0.0, 20.0), (0.0, 200.0))  # ms, us
ROUNDING = (2, 1)  # decimals each value is kept to
CHECK_STEPS = (0.05, 0.5)  # --check: the checked-in values must beat their neighbours this far away


def objective(values: tuple[float, float], cases: list[tuple[ResolvedScenario, float]]) -> float:
    """Sum over the cases of log(predicted / measured)^2 with the coefficients at `values`."""
    if any(not lo <= v <= hi for v, (lo, hi) in zip(values, BOUNDS, strict=True)):
        return math.inf
    return log_misfit(cases, NAMES, values, "throughput_tokens_per_s")


def fit(cases: list[tuple[ResolvedScenario, float]]) -> tuple[float, float]:
    res = minimize(lambda x: objective(tuple(x), cases), x0=(1.0, 15.0), method="Nelder-Mead",
                   options={"xatol": 0.01, "fatol": 1e-7})
    return tuple(round(float(v), d) for v, d in zip(res.x, ROUNDING, strict=True))  # type: ignore[return-value]


def checked_in() -> tuple[float, float]:
    data = yaml.safe_load(DEFAULTS.read_text())
    return tuple(float(data[n]["value"]) for n in NAMES)  # type: ignore[return-value]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify that defaults.yaml's values minimise the fit objective (cheap: five evaluations)")
    args = ap.parse_args()
    cases = published_cases(CASES, without_profile=False)
    if args.check:
        return check_minimum(lambda x: objective(x, cases), NAMES, checked_in(), CHECK_STEPS, DEFAULTS,
                             "rerun this script and set the values it prints")
    v = fit(cases)
    for label, x in (("unset (0, 0)", (0.0, 0.0)), (f"fitted {v}", v)):
        predicted = [predicted_with(rs, NAMES, x, "throughput_tokens_per_s") for rs, _ in cases]
        errs = [f"{(p - measured) / measured * 100:+.1f}%" for p, (_, measured) in zip(predicted, cases, strict=True)]
        print(f"{label}: concurrency 1 / 2 / 4 / 8 errors {' / '.join(errs)}")
    for name, value in zip(NAMES, v, strict=True):
        print(f"{name}: {value}  (set it in {DEFAULTS.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
