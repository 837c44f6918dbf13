"""Fit the host work SGLang's v1 speculative worker spends per request and verified token, and check it.

    python calibration/fit_spec_overhead.py           # print the fitted value and the cases before / after
    python calibration/fit_spec_overhead.py --check   # exit 1 unless defaults.yaml holds the fitted value

The mechanism (simspec/timing/iteration.py, coefficient spec_cpu_per_verified_token_us): without overlap
scheduling (SGLang's v1 EAGLE / n-gram workers), every speculative iteration spends host time that grows with
the batch and the verified tokens: verify() copies the accept indices and predictions to the host
(`.tolist()`, sized batch x num_draft_tokens), builds the next tree's positions and masks, and walks every
request's accepted tokens in Python (eagle_info.py verify, SGLang 0.5.10). No public per-operation figure was
found, so the one coefficient is fitted here to one published series and validated on the others.

Data: the GPUStack performance lab's Qwen3-8B-FP8 + EAGLE-3 (4, 4, 16) runs on one H100 at concurrency 1, 2,
4 and 8 (validation/cases/gpustack-qwen3-8b-fp8-h100-eagle3-c{1,2,4,8}.yaml, marked fitted there), whose
accept lengths come from the runs' own streaming statistics. The fit minimises the squared log error of
their output throughput. M2, M3, M1 and the other speculative cases stay unfitted: they are the test.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

import yaml
from scipy.optimize import minimize_scalar

from simspec.predict import predict
from simspec.scenario.loader import Coefficient, parse_scenario, resolve
from simspec.validation import load_case

ROOT = Path(__file__).resolve().parent.parent
NAME = "spec_cpu_per_verified_token_us"
CASES = [ROOT / "validation" / "cases" / f"gpustack-qwen3-8b-fp8-h100-eagle3-c{c}.yaml" for c in (1, 2, 4, 8)]
DEFAULTS = ROOT / "simspec" / "presets" / "defaults.yaml"
BOUNDS_US = (0.0, 200.0)
CHECK_STEP_US = 0.5  # --check: the checked-in value must beat its neighbours this far away


def _cases() -> list[tuple[object, float]]:
    out = []
    for path in CASES:
        case = load_case(path)
        out.append((resolve(parse_scenario(case.scenario, str(path)), str(path)), case.measured.value))
    return out


def objective(value_us: float, cases: list[tuple[object, float]]) -> float:
    """Sum over the cases of log(predicted / measured)^2 with the coefficient at value_us."""
    total = 0.0
    for rs, measured in cases:
        coefficients = rs.coefficients | {NAME: Coefficient(value_us, "fit")}
        predicted = predict(dataclasses.replace(rs, coefficients=coefficients))["throughput_tokens_per_s"]
        total += math.log(predicted / measured) ** 2
    return total


def fit(cases: list[tuple[object, float]]) -> float:
    res = minimize_scalar(objective, bounds=BOUNDS_US, args=(cases,), method="bounded", options={"xatol": 0.05})
    return round(float(res.x), 1)


def checked_in() -> float:
    return float(yaml.safe_load(DEFAULTS.read_text())[NAME]["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify that defaults.yaml's value minimises the fit objective (cheap: three evaluations)")
    args = ap.parse_args()
    cases = _cases()
    if args.check:
        v = checked_in()
        here, below, above = (objective(x, cases) for x in (v, max(0.0, v - CHECK_STEP_US), v + CHECK_STEP_US))
        if here <= below and here <= above:
            print(f"{NAME} = {v} us minimises the fit objective ({here:.5f}; +/-{CHECK_STEP_US} us: "
                  f"{below:.5f}, {above:.5f})")
            return 0
        print(f"{NAME} = {v} us in {DEFAULTS} does not minimise the fit objective: rerun this script and set the "
              f"value it prints", file=sys.stderr)
        return 1
    v = fit(cases)
    for label, x in (("unset (0 us)", 0.0), (f"fitted ({v} us)", v)):
        errs = []
        for rs, measured in cases:
            coefficients = rs.coefficients | {NAME: Coefficient(x, "fit")}
            p = predict(dataclasses.replace(rs, coefficients=coefficients))["throughput_tokens_per_s"]
            errs.append(f"{(p - measured) / measured * 100:+.1f}%")
        print(f"{label}: concurrency 1 / 2 / 4 / 8 errors {' / '.join(errs)}")
    print(f"{NAME}: {v}  (set it in {DEFAULTS.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
