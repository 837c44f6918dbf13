"""Fit the M1 box's calibration profile to M1's component figures and write it.

    python calibration/fit_m1.py            # rewrite calibration/profiles/m1-kimi-k25-8x-rtxpro6000-pcie.yaml
    python calibration/fit_m1.py --check    # exit 1 if the checked-in profile differs from a fresh fit

M1 (shared/reference/measurements.md) gives, for Kimi-K2.5 on 8 x RTX PRO 6000 over PCIe at batch 1:
  - no speculation decodes ~82 tok/s: one decode step takes 1000/82 = 12.2 ms;
  - "one verify step takes ~30 ms, of which ~25 ms is NCCL all-reduce".
We read "verify step" as SGLang counts it (spec_verify_ct, the denominator of accept length): one whole
speculative iteration, draft included. M1's own EAGLE-3 figures support that reading: ~52 tok/s at accept
length ~1.5 is 28.8 ms per verify step, which could not be if the target verify alone took 30 ms.

M1 recorded no accept length for the EAGLE-3 drafter in service (~60 tok/s) or for n-gram (~41 tok/s). The
script also infers, with the fitted profile, the accept length each needs to produce its measured tok/s;
scenarios/eagle3.yaml and ngram_tree.yaml carry those values, marked as inferred, and --check verifies them.

What is fitted: the all-reduce time at the two message sizes those steps send (1 x 7168 x 2 B for a decode
token, 4 x 7168 x 2 B for the EAGLE-3 (3, 1, 4) verify), so that the time model reproduces 12.2 ms and
30 ms. Past the larger size the curve goes on as NCCL's protocol choice says (timing/collectives.py): LL at its
own bandwidth term up to NCCL's switch to Simple (~1.5 MB), then Simple at the bus bandwidth measured on another
8 x RTX PRO 6000 box; the logits' all-gather (half of 1 x 163,840 x 2 B, past both points) follows that
continuation, so the points are solved again in turn until neither moves (calibration/fit.py). Everything else
(bandwidth and compute efficiency, overheads, CPU time, uniform expert routing) keeps its documented default. The
~25 ms NCCL figure is not fitted: it is printed as a check, since a profiler's NCCL kernel time also holds the
wait for the slowest rank.
"""

from __future__ import annotations

import argparse
import sys
from datetime import date
from pathlib import Path

import yaml

from simspec.calibration.fit import Anchor, fit_all_reduce, iteration_cost
from simspec.calibration.fitting import write_fitted_profile
from simspec.scenario.loader import ResolvedScenario, load_scenario
from simspec.scenario.profile import CollectiveCurve
from simspec.simulate import baseline_of

ROOT = Path(__file__).resolve().parent.parent
PROFILE = ROOT / "calibration" / "profiles" / "m1-kimi-k25-8x-rtxpro6000-pcie.yaml"
BASELINE_TOK_S = 82.0  # M1: no speculation
VERIFY_STEP_MS = 30.0  # M1: one verify step of the EAGLE-3 setup
VERIFY_NCCL_MS = 25.0  # M1: of which NCCL (a check, not fitted)
LARGE_MESSAGE_BUSBW_GBPS = 39.6  # busbw 37.6-41.7 GB/s measured on 8 x RTX PRO 6000 (hardware-and-models.md)


def mean_decode_context(rs: ResolvedScenario) -> float:
    """A request's mean context over its decode, for the M1 scenarios' fixed prompt and output lengths."""
    wl = rs.scenario.workload
    assert wl.input_tokens.value is not None and wl.output_tokens.value is not None
    return wl.input_tokens.value + wl.output_tokens.value / 2


def fit() -> tuple[dict, dict]:
    eagle = load_scenario(ROOT / "scenarios" / "eagle3.yaml", ["calibration=null"])
    base = baseline_of(eagle)
    context = mean_decode_context(eagle)
    hidden = eagle.model.hidden_size
    anchors = [
        Anchor("no speculation, batch 1", base, 1, context, 1000.0 / BASELINE_TOK_S, 1 * hidden * 2),
        Anchor("EAGLE-3 (3, 1, 4) verify step, batch 1", eagle, 1, context, VERIFY_STEP_MS,
               eagle.num_draft_tokens * hidden * 2),
    ]
    curve = fit_all_reduce(
        anchors, measured_gpus=8, bus_bandwidth_gbps=LARGE_MESSAGE_BUSBW_GBPS,
        source=("fitted by calibration/fit_m1.py to M1's 82 tok/s baseline and ~30 ms EAGLE-3 verify step;"
                " past them LL at half, then past NCCL's switch to Simple the whole of the 37.6-41.7 GB/s"
                " busbw measured on another 8 x RTX PRO 6000 box"),
    )
    step = iteration_cost(anchors[1], curve)
    check = {
        "eagle3_step_ms": round(step.total_ms, 3),
        "eagle3_step_communication_ms": round(step.draft_comm_ms + step.verify_comm_ms, 3),
        "m1_reported_nccl_ms": VERIFY_NCCL_MS,
    }
    profile = {
        "name": "m1-kimi-k25-8x-rtxpro6000-pcie",
        "description": (
            "Kimi-K2.5 on 8 x RTX PRO 6000 Blackwell over PCIe, TP 8, NCCL (M1). Only the all-reduce curve is"
            " fitted; every other coefficient keeps its default. Check: the fitted EAGLE-3 step spends"
            f" {check['eagle3_step_communication_ms']:.1f} ms of {check['eagle3_step_ms']:.1f} ms in collectives"
            f" where M1 reports ~{VERIFY_NCCL_MS:.0f} ms of NCCL (a profiler's NCCL time also holds waits for"
            " the slowest rank)."
        ),
        "measured_on": {"gpu": "rtx-pro-6000-server", "interconnect": "pcie5-nccl", "tp": 8, "model": "kimi-k2.5"},
        "fitted_to": [
            f"M1 no-speculation decode ~{BASELINE_TOK_S:g} tok/s at batch 1"
            f" (one step = {1000 / BASELINE_TOK_S:.2f} ms)",
            f"M1 verify step ~{VERIFY_STEP_MS:g} ms (EAGLE-3, assumed (3, 1, 4), batch 1, whole speculative step)",
        ],
        "provenance": {"date": str(date.today()), "host": "M1 box (published figures, not profiled by simspec)",
                       "sglang_version": "unknown (0.5.8-0.5.10 era assumed)", "method": "calibration/fit_m1.py"},
        "all_reduce": {
            "measured_gpus": curve.measured_gpus,
            "points_bytes_us": [[int(s), round(t, 3)] for s, t in curve.points_bytes_us],
            "bus_bandwidth_gbps": curve.bus_bandwidth_gbps,
            "source": curve.source,
        },
    }
    return profile, check


INFERRED = {"eagle3.yaml": 60.0, "ngram_tree.yaml": 41.0}  # M1 tok/s of setups with no recorded accept length


def inferred_accept_lengths(profile: dict) -> dict[str, float]:
    """The accept length at which each INFERRED scenario's decode iteration yields its measured tok/s."""
    curve = CollectiveCurve(**profile["all_reduce"])
    out = {}
    for name, tok_s in INFERRED.items():
        rs = load_scenario(ROOT / "scenarios" / name, ["calibration=null"])
        step_ms = iteration_cost(Anchor(name, rs, 1, mean_decode_context(rs), 0.0, 0), curve).total_ms
        out[name] = round(tok_s * step_ms / 1000.0, 2)
    return out


def _comparable(p: dict) -> dict:
    return {k: v for k, v in p.items() if k != "provenance"}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare with the checked-in profile instead of writing")
    args = ap.parse_args()
    profile, check = fit()
    print(f"fitted all-reduce points (bytes, us): {profile['all_reduce']['points_bytes_us']}")
    print(f"check: EAGLE-3 step {check['eagle3_step_ms']} ms, collectives {check['eagle3_step_communication_ms']} ms"
          f" (M1 reports ~{check['m1_reported_nccl_ms']} ms NCCL)")
    inferred = inferred_accept_lengths(profile)
    print(f"inferred accept lengths: {inferred}")
    if args.check:
        current = yaml.safe_load(PROFILE.read_text())
        if _comparable(current) != _comparable(profile):
            print(f"{PROFILE} differs from a fresh fit: rerun calibration/fit_m1.py", file=sys.stderr)
            return 1
        for name, value in inferred.items():
            acc = yaml.safe_load((ROOT / "scenarios" / name).read_text())["acceptance"]
            if acc.get("accept_length") != value:
                print(f"scenarios/{name}: accept_length {acc.get('accept_length')} is not the inferred {value}",
                      file=sys.stderr)
                return 1
        print("profile and inferred accept lengths match a fresh fit")
        return 0
    write_fitted_profile(PROFILE, profile, "calibration/fit_m1.py")
    print(f"wrote {PROFILE}; set the inferred accept lengths above in scenarios/ if they changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
