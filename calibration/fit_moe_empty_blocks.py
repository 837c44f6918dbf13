"""Fit the cost of a fused-MoE program that finds its row block empty, and check the fit.

    python calibration/fit_moe_empty_blocks.py           # print the fitted value (set it in defaults.yaml)
    python calibration/fit_moe_empty_blocks.py --check   # exit 1 unless defaults.yaml holds the fitted value

SGLang's Triton fused MoE launches cdiv(max_num_tokens_padded, BLOCK_SIZE_M) x cdiv(N, BLOCK_SIZE_N) programs per
expert GEMM. Before 0.5.7 the alignment buffer is sized for the worst case, numel + E (BLOCK_SIZE_M - 1) rows
(releases.fused_moe_padded_rows): a one-token call of Qwen3-30B-A3B's experts (E 128, top 8) at the default tile
(16 x 32) launches 121 x 112 programs, of which the 8 row blocks the routing fills do work and the other 12,656
load num_tokens_post_padded and return. The A100 table of SGLang PR #6825 (validation/kernels/sglang6825-*, the
"before" timings at that default tile) shows the floor this leaves: 109 us at one token where the experts' bytes
take ~55 us at the bandwidth the larger calls reach. The fit: the one value of moe_empty_block_us (us per empty
program, charged for the whole chip) that minimises the squared log error over the table's compared points, every
other coefficient at its default. The table is marked fitted; the cases that run a release before 0.5.7 at small
batch (Qwen3-30B-A3B on one H200 or H20 at batch 1, Qwen3-235B on 8 H20, DeepSeek-V3 on 8 H20) are the test.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import replace
from pathlib import Path

import yaml
from scipy.optimize import minimize_scalar

from simspec import kernel_validation as kv
from simspec.calibration.fitting import check_minimum

ROOT = Path(__file__).resolve().parent.parent
NAME = "moe_empty_block_us"
TABLE = ROOT / "validation" / "kernels" / "sglang6825-qwen3-30b-a3b-bf16-a100-pcie-40gb.yaml"
DEFAULTS = ROOT / "simspec" / "presets" / "defaults.yaml"
BOUND_US = 0.1  # 100 ns an empty program would be a full kernel launch per program, not an early return
DECIMALS = 4
CHECK_STEP = 0.0002  # --check: the checked-in value must beat its neighbours this far away


def objective(value: float, table: kv.FusedMoeTable) -> float:
    """Sum over the table's compared points of log(predicted / measured)^2 with the coefficient at `value`."""
    if not 0.0 <= value <= BOUND_US:
        return math.inf
    eff = replace(kv.default_efficiencies(), moe_empty_block_us=value)
    result = kv.predict_table(table, eff=eff)
    return sum(math.log(p.predicted_us / p.measured_us) ** 2 for p in result.compared)


def checked_in() -> float:
    return float(yaml.safe_load(DEFAULTS.read_text())[NAME]["value"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true",
                    help="verify that defaults.yaml's value minimises the fit objective (cheap: three evaluations)")
    args = ap.parse_args()
    table = kv.load_table(TABLE)
    assert isinstance(table, kv.FusedMoeTable) and table.grid is not None and table.fitted
    if args.check:
        return check_minimum(lambda x: objective(x[0], table), (NAME,), (checked_in(),), (CHECK_STEP,), DEFAULTS,
                             "rerun this script and set the value it prints")
    res = minimize_scalar(lambda x: objective(x, table), bounds=(0.0, BOUND_US), method="bounded",
                          options={"xatol": 1e-6})
    value = round(float(res.x), DECIMALS)
    for label, x in (("unset (0)", 0.0), (f"fitted {value}", value)):
        eff = replace(kv.default_efficiencies(), moe_empty_block_us=x)
        errors = " / ".join(f"{p.error_pct:+.1f}%" for p in kv.predict_table(table, eff=eff).compared)
        print(f"{label}: squared log error {objective(x, table):.4f}; errors by size {errors}")
    print(f"{NAME}: {value}  (set it in {DEFAULTS.relative_to(ROOT)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
