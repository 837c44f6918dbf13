"""How fast the discrete-event engine simulates: 1,000 requests / 1M output tokens.

    python benchmarks/engine_speed.py [--repeats 3]

Reports the median wall time of `simspec.simulate.run` (the speculative run alone, no baseline) for:
  - EAGLE-3 on Llama-3.1-8B, 1 x H100, closed loop at concurrency 64 (max_running_requests 64), 1,000 requests
    x 1,000 output tokens: the issue's 1M-token target (about 2 s or less on one core);
  - the same at concurrency 1, 100 requests x 1,000 tokens (one event per iteration, so single-stream runs
    cost more per token; reported per million tokens).
Machines here are shared and noisy: figures are medians, compared as ratios to the target.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from simspec.scenario.loader import parse_scenario, resolve
from simspec.simulate import run

TARGET_S = 2.0


def scenario(concurrency: int, requests: int) -> dict:
    return {
        "name": f"bench-c{concurrency}",
        "hardware": {"gpu": "h100-sxm", "num_gpus": 1, "interconnect": "nvlink4-nccl"},
        "model": "llama-3.1-8b",
        "server": {"tp": 1, "max_running_requests": max(concurrency, 1)},
        "speculative": {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"},
        "acceptance": {"accept_length": 3.0},
        "workload": {"arrival": {"type": "closed", "concurrency": concurrency}, "num_requests": requests,
                     "input_tokens": {"dist": "fixed", "value": 512},
                     "output_tokens": {"dist": "fixed", "value": 1000}},
    }


def measure(d: dict, repeats: int) -> dict:
    rs = resolve(parse_scenario(d, "<benchmark>"))
    times, iterations, tokens = [], 0, 0
    for _ in range(repeats):
        t0 = time.perf_counter()
        res = run(rs)
        times.append(time.perf_counter() - t0)
        iterations, tokens = len(res.iterations), int(res.requests.output_tokens.sum())
    med = statistics.median(times)
    return {"median_s": round(med, 3), "runs_s": [round(t, 3) for t in times], "iterations": iterations,
            "output_tokens": tokens, "us_per_iteration": round(med / iterations * 1e6, 2),
            "s_per_million_tokens": round(med / tokens * 1e6, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    batch = measure(scenario(64, 1000), args.repeats)
    batch["ratio_to_2s_target"] = round(batch["median_s"] / TARGET_S, 3)
    single = measure(scenario(1, 100), args.repeats)
    print(json.dumps({"concurrency_64_1M_tokens": batch, "concurrency_1_100k_tokens": single}, indent=2))


if __name__ == "__main__":
    main()
