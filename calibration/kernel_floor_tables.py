#!/usr/bin/env python3
"""Kernel tables (validation/kernels) from a kernel_floor_bench.py result: its dense GEMMs, one table per format.

    python calibration/kernel_floor_tables.py calibration/measurements/h200-kernel-floors-2026-12-04.json \
        --gpu h200-sxm --prefix simspec-h200 --out validation/kernels

Each table holds the GEMMs at batch 1, 64 and 256: two points in the weight-streaming regime and one where the
arithmetic starts to count, for every measured shape (all measured batches stay in the JSON). The tables are data:
they say where they come from and carry no prediction.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import yaml

BATCHES = (1, 64, 256)


def tables(result: dict, gpu: str, prefix: str, source: str) -> dict[str, dict]:
    env = result["environment"]
    out = {}
    for key, weights in (("gemm_bf16", "bf16"), ("gemm_fp8", "fp8")):
        rows = [r for r in result.get(key, []) if "us" in r and r["m"] in BATCHES]
        if not rows:
            continue
        library = "torch.nn.functional.linear (cuBLAS)" if weights == "bf16" else \
            "torch._scaled_mm with per-tensor scales (cuBLASLt)"
        out[f"{prefix}-gemm-{weights}"] = {
            "id": f"{prefix}-gemm-{weights}",
            "title": f"Dense {weights.upper()} GEMM x[M, K] @ W[N, K].T at decode batch sizes, {library}, one "
                     f"{env['gpu']}, inside a CUDA graph, weights streamed from DRAM",
            "source": {"citation": f"measured by simspec: calibration/kernel_floor_bench.py on one {env['gpu']} "
                                   f"({env['date']}, torch {env['torch']}, CUDA {env['cuda']}, driver and clocks: "
                                   f"{env.get('nvidia_smi', 'not read')}); raw result {source}",
                       "accessed": env["date"][:10]},
            "kernel": "gemm",
            "gpu": gpu,
            "weights": weights,
            "assumptions": [
                "each time is the median of 20 replays of a graph that runs the GEMM once per distinct copy of its "
                "weight, copies adding up to at least 1.5 GB (the L2 is 60 MiB), divided by the copies: every GEMM "
                "reads its weight from DRAM, as a decode forward reads each layer's",
                "random normal weights and activations (never zeros); the input is already in the weight's format "
                "(no activation quantisation is timed)",
                "shapes are linear layers of Llama-3.1-8B (whole), Llama-3.1-70B, Qwen3-32B and DeepSeek-V3 (per "
                "TP rank), two squares and Llama-3's LM head; the FP8 table is a proxy for SGLang's FP8 linears, "
                "which run CUTLASS, DeepGEMM or Triton kernels rather than cuBLASLt",
            ],
            "points": [{"k": r["k"], "n": r["n"], "m": r["m"], "us": round(r["us"], 3)} for r in rows],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("result", help="kernel_floor_bench.py's JSON")
    p.add_argument("--gpu", required=True, help="simspec GPU preset the result was measured on")
    p.add_argument("--prefix", required=True, help="table id prefix")
    p.add_argument("--out", required=True, help="folder to write the tables to")
    args = p.parse_args(argv)
    result = json.loads(Path(args.result).read_text())
    for name, table in tables(result, args.gpu, args.prefix, args.result).items():
        path = Path(args.out) / f"{name}.yaml"
        head = {k: v for k, v in table.items() if k != "points"}
        points = "".join(f"- {{k: {q['k']}, n: {q['n']}, m: {q['m']}, us: {q['us']}}}\n" for q in table["points"])
        path.write_text(yaml.safe_dump(head, sort_keys=False, width=116) + "points:  # microseconds per GEMM\n"
                        + points)
        print(f"wrote {path} ({len(table['points'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
