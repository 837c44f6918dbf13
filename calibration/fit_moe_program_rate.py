"""Fit the rate at which one program of the Triton fused MoE streams expert weights, and check the fit.

    python calibration/fit_moe_program_rate.py           # print the fitted value (set it in defaults.yaml)
    python calibration/fit_moe_program_rate.py --check   # exit 1 unless defaults.yaml holds the fitted value

SGLang's Triton fused MoE runs one program per (row block, BLOCK_SIZE_N columns) of each expert GEMM; a program with
tokens streams its expert's K x BLOCK_SIZE_N slice of weights through its K loop. At decode the row blocks are the
experts the call touches, so a one-token call of DeepSeek-V3's experts at TP 8 (9 experts, w13 512 columns wide)
runs 36 programs of w13 at 0.5.7's 128-column tile, 72 at 0.5.12's 64-column one, on a GPU of 132 SMs. simspec's
own H200 measurement of both releases' kernels (calibration/fused_moe_bench.py; validation/kernels/
simspec-h200-fused-moe-*) shows what that costs: w13 over 9 experts (33 MB) takes 35.0 us with 36 programs and 18.3
us with 72, ~26-29 GB/s per program either way, where DRAM would take 8.6 us at the bandwidth the large calls reach.
The time model charges a GEMM of the fused MoE its bytes at the smaller of the achievable bandwidth and its working
programs x moe_program_gbps (forward.MoeGrid.working_programs). The fit: the one value that minimises the squared
log error over 0.5.7's DeepSeek-V3 w13 table (marked fitted; the kernel the floor binds on: w2, 7,168 columns wide,
has hundreds of programs), every other coefficient at its default. 0.5.12's w13 table of the same shape (another
tile, so other program counts) and the other per-kernel tables are the kernel-level test; the DeepSeek-V3/R1 cases
on H200 at small batch are the end-to-end one.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from kernel_table_fit import TableFit

ROOT = Path(__file__).resolve().parent.parent
FIT = TableFit(
    name="moe_program_gbps",
    table=ROOT / "validation" / "kernels" / "simspec-h200-fused-moe-dsv3-tp8-sglang057-w13.yaml",
    bounds=(1.0, 1000.0),  # 1 TB/s a program would be a whole GPU's bandwidth from a few SMs
    decimals=1, check_step=0.1, unset=math.inf,
    coarse_grid=True)  # above the rate at which the smallest call's programs fill DRAM the objective is flat

if __name__ == "__main__":
    sys.exit(FIT.main(__doc__.splitlines()[0]))
