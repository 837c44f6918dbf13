#!/usr/bin/env python3
"""A fused-MoE kernel table of one GEMM kernel (validation/kernels, `timed: w13` or `w2`) from a fused_moe_bench.py
result.

    python calibration/fused_moe_tables.py calibration/measurements/RESULT.json --gpu h200-sxm --kernel w13 \
        --id simspec-h200-fused-moe-...-w13 --out validation/kernels

Each point is that kernel's median duration over the calls at that token count (in a profiler trace). The table says
where it comes from and carries no prediction. Bad input is refused with exit code 2.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

import yaml
from table_inputs import build_or_refuse, common_arguments

from simspec.scenario.releases import release_key, tight_moe_align

KEYS = ("wheel", "gpu", "torch", "triton", "date", "shape", "points", "copies", "calls")


def timed_points(result: dict) -> list[dict]:
    """The calls whose two GEMM kernels were both timed."""
    return [p for p in result["points"] if len(p.get("gemm_us", [])) == 2]


def grid(result: dict, timed: list[dict]) -> dict:
    """The kernel's grid as the release sized it: its alignment rule (tight from 0.5.7) and the w13 tile each timed
    call's config gave, and the w2 call's where the release loaded a down config."""
    match = re.match(r"sglang-(\d+\.\d+\.\d+(?:\.post\d+)?)-", result["wheel"])
    if match is None:
        raise ValueError(f"wheel: {result['wheel']!r} is not an SGLang wheel's file name")
    tight = tight_moe_align(release_key(match.group(1))[:2])
    tiles = [[p["tokens"], p["config"]["BLOCK_SIZE_M"], p["config"]["BLOCK_SIZE_N"]] for p in timed]
    downs = [[p["tokens"], p["down_config"]["BLOCK_SIZE_M"], p["down_config"]["BLOCK_SIZE_N"]] for p in timed
             if p.get("down_config")]
    return {"rows": "tight" if tight else "worst_case", "tiles": tiles, **({"down_tiles": downs} if downs else {})}


KERNELS = ("w13", "w2")  # gemm_us's order in a fused_moe_bench.py point


def table(result: dict, gpu: str, table_id: str, source: str, l2_mb: float, kernel: str,
          fitted_by: str | None = None, config: str = "tuned") -> dict:
    missing = [k for k in KEYS if k not in result]
    if missing:
        raise ValueError(f"missing {', '.join(missing)} (fused_moe_bench.py writes them)")
    shape = result["shape"]
    bf16 = shape.get("weights") == "bf16"  # fused_moe_bench.py --dtype bf16; block FP8 otherwise
    timed = timed_points(result)
    points = [(p["tokens"], round(p["gemm_us"][KERNELS.index(kernel)], 3)) for p in timed]
    if not points:
        raise ValueError("points: no call with its two GEMM kernels timed")
    configs = sorted({json.dumps(p.get("config"), sort_keys=True) for p in result["points"] if p.get("config")})
    downs = sorted({json.dumps(p.get("down_config"), sort_keys=True) for p in result["points"]
                    if p.get("down_config")})
    shared = " (the last a fused shared expert every token routes to)" if shape.get("fused_shared_expert") else ""
    return {
        "id": table_id,
        "title": f"SGLang's Triton fused MoE, its {kernel} GEMM kernel, {result['wheel']}'s code and configs, E "
                 f"{shape['experts']}, top {shape['top_k']}, hidden {shape['hidden']}, N {shape['intermediate']}, "
                 f"{'BF16' if bf16 else 'block FP8'}, one {result['gpu']}",
        "source": {"citation": f"measured by simspec: calibration/fused_moe_bench.py on one {result['gpu']} "
                               f"({result['date']}, torch {result['torch']}, Triton {result['triton']}); raw result "
                               f"{source}",
                   "accessed": result["date"][:10]},
        "kernel": "fused_moe",
        "gpu": gpu,
        "shape": {"experts": shape["experts"], "experts_per_token": shape["top_k"], "hidden_size": shape["hidden"],
                  "intermediate_per_gpu": shape["intermediate"], "weights": "bf16" if bf16 else "fp8-block128"},
        "routing_timed": False,
        "config": config,
        "grid": grid(result, timed),
        "timed": kernel,
        "rotates_weights": True,
        "l2_cache_mb": l2_mb,
        "l2_source": ("measured: CUDA reports 62,914,560 bytes of L2 on one H200 (calibration/kernel_floor_bench.py); "
                      "not used here: every call reads its own copy of the experts" if gpu == "h200-sxm" else
                      f"given (--l2-mb {l2_mb:g}); not used here: every call reads its own copy of the experts"),
        "assumptions": [
            f"{shape['experts']} experts{shared}; each call routes every token at random over its own copy of all "
            f"experts' weights ({result['copies']} copies in turn), so the experts it touches are read from DRAM; "
            f"median over {result['calls']} calls",
            "the release's fused_experts_impl from its wheel, with SGLang's server imports replaced by stand-ins "
            "(sgl_kernel's alignment, activation quantisation, SiLU and sum as torch code, not timed here)",
            "configs the release loaded: " + "; ".join(configs) + ("; down: " + "; ".join(downs) if downs else ""),
            "the model's touched experts assume uniform routing over all experts; with a fused shared expert the "
            "real count is a few percent lower at 16-64 tokens",
            *([f"fitted: {fitted_by} fits a coefficient to this table; its points are reported apart"]
              if fitted_by else []),
        ],
        **({"fitted": True} if fitted_by else {}),
        "points": points,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_arguments(p, "fused_moe_bench.py", "folder to write the table to")
    p.add_argument("--id", required=True, help="table id (and file name)")
    p.add_argument("--kernel", required=True, choices=KERNELS, help="the GEMM kernel the table times")
    p.add_argument("--l2-mb", type=float, default=62.9, help="the GPU's L2 (informational here)")
    p.add_argument("--fitted-by", metavar="SCRIPT", help="mark the table fitted: SCRIPT fits a coefficient to it")
    p.add_argument("--config", choices=("tuned", "default"), default="tuned",
                   help="tuned: the release loaded a config file for the shape; default: its tile heuristic ran (no "
                        "file for the shape and GPU: the loaded configs the table lists are the heuristic's)")
    args = p.parse_args(argv)
    data = build_or_refuse(args, "fused_moe_bench.py",
                           lambda result, source: table(result, args.gpu, args.id, source, args.l2_mb, args.kernel,
                                                           args.fitted_by, args.config))
    if data is None:
        return 2
    keys = list(data)
    cut = keys.index("grid")
    before, after = ({k: data[k] for k in part} for part in (keys[:cut], keys[cut + 1:-1]))
    out = Path(args.out) / f"{args.id}.yaml"
    out.write_text(yaml.safe_dump(before, sort_keys=False, width=116)
                   + yaml.safe_dump({"grid": data["grid"]}, sort_keys=False, width=116, default_flow_style=None)
                   + yaml.safe_dump(after, sort_keys=False, width=116)
                   + "points: [" + ", ".join(f"[{t}, {us}]" for t, us in data["points"]) + "]  # (tokens, us)\n")
    print(f"wrote {out} ({len(data['points'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
