#!/usr/bin/env python3
"""Kernel tables (validation/kernels) from a kernel_floor_bench.py result: its dense GEMMs, one table per format.

    python calibration/kernel_floor_tables.py calibration/measurements/h200-kernel-floors-2026-12-04.json \
        --gpu h200-sxm --prefix simspec-h200 --out validation/kernels

Each table holds the GEMMs at batch 1, 64 and 256: two points in the weight-streaming regime and one where the
arithmetic starts to count, for every measured shape (all measured batches stay in the JSON). The tables are data:
they say where they come from and carry no prediction. Bad input (a result without its environment or GEMMs, an
unknown GPU preset) is refused with exit code 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from table_inputs import build_or_refuse, common_arguments

BATCHES = (1, 64, 256)
ENVIRONMENT_KEYS = ("gpu", "date", "torch", "cuda")


class BadResult(ValueError):
    pass


def tables(result: dict, gpu: str, prefix: str, source: str) -> dict[str, dict]:
    env = result.get("environment")
    if not isinstance(env, dict) or any(k not in env for k in ENVIRONMENT_KEYS):
        raise BadResult(f"environment: needs {', '.join(ENVIRONMENT_KEYS)} (kernel_floor_bench.py writes them)")
    replays = result.get("replays", "repeated")
    l2 = f"{env['l2_bytes'] / 2**20:.0f} MiB" if env.get("l2_bytes") else "not read"
    out = {}
    for key, weights in (("gemm_bf16", "bf16"), ("gemm_fp8", "fp8")):
        rows = [r for r in result.get(key, []) if "us" in r and r.get("m") in BATCHES]
        if not rows:
            continue
        width = 2 if weights == "bf16" else 1
        streamed = sorted(r["copies"] * r["k"] * r["n"] * width / 1e9 for r in rows if "copies" in r)
        per_graph = f"{streamed[0]:.2f}-{streamed[-1]:.2f} GB" if streamed else "not recorded"
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
                f"each time is the median of {replays} replays of a graph that runs the GEMM once per distinct copy "
                f"of its weight ({per_graph} of weights a graph, the L2 being {l2}), divided by the copies: every "
                "GEMM reads its weight from DRAM, as a decode forward reads each layer's. The graph's own start "
                "(~5 us) is spread over the copies: ~1% of a GEMM where only two copies fit (the LM head)",
                "random normal weights and activations (never zeros); the input is already in the weight's format "
                "(no activation quantisation is timed)",
                "shapes are linear layers of Llama-3.1-8B (whole), Llama-3.1-70B, Qwen3-32B and DeepSeek-V3 (per "
                "TP rank), two squares and Llama-3's LM head; the FP8 table is a proxy for SGLang's FP8 linears, "
                "which run CUTLASS, DeepGEMM or Triton kernels rather than cuBLASLt",
            ],
            "points": [{"k": r["k"], "n": r["n"], "m": r["m"], "us": round(float(r["us"]), 3)} for r in rows],
        }
    if not out:
        raise BadResult(f"gemm_bf16 / gemm_fp8: no timed GEMM at batch {', '.join(map(str, BATCHES))}")
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_arguments(p, "kernel_floor_bench.py", "folder to write the tables to")
    p.add_argument("--prefix", required=True, help="table id prefix")
    args = p.parse_args(argv)
    written = build_or_refuse(args, "kernel_floor_bench.py",
                              lambda result, source: tables(result, args.gpu, args.prefix, source))
    if written is None:
        return 2
    for name, table in written.items():
        out = Path(args.out) / f"{name}.yaml"
        head = {k: v for k, v in table.items() if k != "points"}
        points = "".join(f"- {{k: {q['k']}, n: {q['n']}, m: {q['m']}, us: {q['us']}}}\n" for q in table["points"])
        out.write_text(yaml.safe_dump(head, sort_keys=False, width=116) + "points:  # microseconds per GEMM\n"
                       + points)
        print(f"wrote {out} ({len(table['points'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
