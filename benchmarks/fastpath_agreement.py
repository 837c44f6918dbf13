"""Fast path vs engine: error and speed over a grid of the shipped scenarios (issue 4, section 6).

Run: python benchmarks/fastpath_agreement.py [--requests-per-slot 8]
Prints, per point, the fast path's error against the engine on per-request tok/s, throughput, iteration time
and speedup, then the worst and median errors and the median time per point of each method.
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from simspec.fastpath import predict_fast
from simspec.predict import predict
from simspec.scenario.loader import load_scenario

ROOT = Path(__file__).resolve().parent.parent
KEYS = ("tokens_per_s", "throughput_tokens_per_s", "iteration_ms", "speedup")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests-per-slot", type=int, default=8)
    args = ap.parse_args()
    errors: dict[str, list[float]] = {k: [] for k in KEYS}
    t_engine, t_fast = [], []
    for name in ("baseline", "eagle3", "eagle3_k2_drafter", "ngram_tree", "ngram_chain", "mtp"):
        for c in (1, 2, 4, 8, 16, 32, 48):
            for output in (256, 1024):
                rs = load_scenario(ROOT / "scenarios" / f"{name}.yaml", [
                    f"workload.arrival.concurrency={c}", f"workload.num_requests={args.requests_per_slot * c}",
                    f"workload.output_tokens.value={output}"])
                t0 = time.perf_counter()
                e = predict(rs)
                t1 = time.perf_counter()
                f = predict_fast(rs)
                t2 = time.perf_counter()
                t_engine.append(t1 - t0)
                t_fast.append(t2 - t1)
                errs = {k: (f[k] / e[k] - 1) * 100 for k in KEYS}
                for k, v in errs.items():
                    errors[k].append(abs(v))
                print(f"{name:18s} c={c:3d} out={output:5d} " + " ".join(f"{k} {v:+.2f}%" for k, v in errs.items()))
    print()
    for k, v in errors.items():
        print(f"{k:24s} worst {max(v):.2f}%  median {statistics.median(v):.2f}%")
    print(f"median time per point: engine {statistics.median(t_engine) * 1e3:.0f} ms, fast path "
          f"{statistics.median(t_fast) * 1e3:.1f} ms (x{statistics.median(t_engine) / statistics.median(t_fast):.0f})")


if __name__ == "__main__":
    main()
