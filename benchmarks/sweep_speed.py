"""How fast a sweep runs: 1,000 points of 200-request scenarios through the discrete-event engine.

    python benchmarks/sweep_speed.py [--jobs N] [--repeats 1] [--concurrency 8,16,32,64] [--output-tokens 128]
    python benchmarks/sweep_speed.py --profile 20      # cProfile 20 points in this process instead
    python benchmarks/sweep_speed.py --fast            # the analytic fast path (simspec.fastpath) instead

The sweep: EAGLE-3 on Llama-3.1-8B, 1 x H100 (SGLang's auto tree (5, 4, 8)), closed loop, 200 requests of 512
prompt and --output-tokens output tokens each; grid = concurrency (4 values) x accept length (10 values,
1.5 to 6.0) x seed (25 values) = 1,000 points, each predicted with its no-speculation baseline, exactly as
`simspec sweep` does (simspec.studies.sweep.run_sweep, local process pool). Reports wall time and points/s
(the median over --repeats), against the 60 s target on this 2-core machine.

The cost of a point is the engine's ~25 us per iteration times the iterations of BOTH runs (speculative and
baseline): at concurrency 1 a 200 x 128-token point is ~34,000 iterations (~0.9 s), at 64 about 850 (~0.05 s).
So the target holds for batched sweeps and not for single-stream ones; `--concurrency 1` shows the latter.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from simspec.studies import sweep as S

TARGET_S = 60.0
ACCEPT_LENGTHS = [1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0, 5.5, 6.0]


def _cpu_s() -> float:
    """CPU seconds used by this process and its finished children (the pool's workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def sweep_spec(concurrency: list[int], output_tokens: int, points: int) -> dict:
    seeds = max(1, points // (len(concurrency) * len(ACCEPT_LENGTHS)))
    return {
        "name": "sweep-speed",
        "scenario": {
            "name": "bench", "hardware": {"gpu": "h100-sxm", "num_gpus": 1, "interconnect": "nvlink4-nccl"},
            "model": "llama-3.1-8b", "server": {"tp": 1},
            "speculative": {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"},
            "acceptance": {"accept_length": 3.0},
            "workload": {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 200,
                         "input_tokens": {"dist": "fixed", "value": 512},
                         "output_tokens": {"dist": "fixed", "value": output_tokens}},
        },
        "grid": {"workload.arrival.concurrency": concurrency, "acceptance.accept_length": ACCEPT_LENGTHS,
                 "seed": list(range(seeds))},
    }


def profile(path: Path, n: int) -> None:
    """cProfile the first n points in this process, and split their time into speculative and baseline runs."""
    from simspec.analysis.metrics import summarize
    from simspec.scenario.loader import parse_scenario, resolve
    from simspec.simulate import baseline_of, run

    sweep = S.load_sweep(path)
    tasks = S._tasks(sweep, fast=False)
    step = max(1, len(tasks) // n)
    picked = tasks[::step][:n]  # spread over the grid: every concurrency shows up
    S._warm_up(False)
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    for t in picked:
        S._run_task(t)
    prof.disable()
    total = time.perf_counter() - t0
    spec_s = base_s = 0.0
    for t in picked:
        rs = resolve(parse_scenario(S.apply_changes(t.data, t.overrides, t.label), t.label), t.base_path)
        a = time.perf_counter()
        summarize(run(rs))
        b = time.perf_counter()
        summarize(run(baseline_of(rs)))
        spec_s, base_s = spec_s + b - a, base_s + time.perf_counter() - b
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(30)
    print(out.getvalue())
    print(json.dumps({"profiled_points": len(picked), "seconds": round(total, 3),
                      "s_per_point": round(total / len(picked), 4),
                      "speculative_run_share": round(spec_s / (spec_s + base_s), 3),
                      "baseline_run_share": round(base_s / (spec_s + base_s), 3)}, indent=2))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=os.cpu_count())
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--points", type=int, default=1000)
    ap.add_argument("--concurrency", default="8,16,32,64", help="comma-separated concurrency values (4 by default)")
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--profile", type=int, default=0, metavar="N", help="profile N points serially instead")
    ap.add_argument("--fast", action="store_true", help="the analytic fast path instead of the engine")
    args = ap.parse_args()
    concurrency = [int(c) for c in args.concurrency.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sweep.yaml"
        path.write_text(yaml.safe_dump(sweep_spec(concurrency, args.output_tokens, args.points)))
        if args.profile:
            profile(path, args.profile)
            return
        times, cpu, n, failed = [], [], 0, 0
        for _ in range(args.repeats):
            c0 = _cpu_s()
            t0 = time.perf_counter()
            df = S.run_sweep(path, jobs=args.jobs, fast=args.fast)
            times.append(time.perf_counter() - t0)
            cpu.append(_cpu_s() - c0)
            n, failed = len(df), int(df["error"].notna().sum())
    med, med_cpu = statistics.median(times), statistics.median(cpu)
    print(json.dumps({
        "points": n, "failed_points": failed, "method": "fast path" if args.fast else "engine",
        "jobs": args.jobs, "cpu_count": os.cpu_count(),
        "concurrency": concurrency, "requests_per_point": 200, "output_tokens": args.output_tokens,
        "median_wall_s": round(med, 2), "runs_s": [round(t, 2) for t in times],
        "points_per_s": round(n / med, 2), "target_s": TARGET_S, "ratio_to_target": round(med / TARGET_S, 3),
        # CPU seconds of this process and its workers: what the sweep costs whatever else the machine runs
        "cpu_s": round(med_cpu, 1), "cpu_ms_per_point": round(med_cpu / n * 1e3, 1),
        "wall_s_if_jobs_cores_were_free": round(med_cpu / args.jobs, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }, indent=2))


if __name__ == "__main__":
    main()
