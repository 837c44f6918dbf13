"""Metrics from a SimulationResult. Names and formulas are listed in docs/metrics.md."""

from __future__ import annotations

from enum import StrEnum

import numpy as np

from simspec.simulate import SimulationResult
from simspec.timing.iteration import BREAKDOWN_KEYS


class Metric(StrEnum):
    TOKENS_PER_S = "tokens_per_s"
    THROUGHPUT = "throughput_tokens_per_s"
    ACCEPT_LENGTH = "accept_length"
    ITERATION_MS = "iteration_ms"
    ROOFLINE = "roofline_tokens_per_s"
    TTFT_MS = "ttft_ms"
    ITL_MS = "itl_ms"
    TPOT_MS = "tpot_ms"


PERCENTILES = (50, 90, 99)


def percentiles(values: np.ndarray, weights: np.ndarray | None = None) -> dict[str, float]:
    """Percentiles (inverted-CDF: the smallest value with at least p% of the weight at or below it)."""
    values = np.asarray(values, dtype=float)
    if len(values) == 0:
        return {f"p{p}": float("nan") for p in PERCENTILES} | {"mean": float("nan")}
    w = np.ones(len(values)) if weights is None else np.asarray(weights, dtype=float)
    order = np.argsort(values, kind="stable")
    v, cw = values[order], np.cumsum(w[order])
    out = {f"p{p}": float(v[min(np.searchsorted(cw, p / 100 * cw[-1]), len(v) - 1)]) for p in PERCENTILES}
    out["mean"] = float(np.dot(values, w) / w.sum())
    return out


def summarize(res: SimulationResult) -> dict:
    """Every figure `simspec predict` reports for one simulation."""
    req, it = res.requests, res.iterations
    decode_tokens = req.output_tokens - 1  # the first token comes from prefill
    decode_time = req.finish_ms - req.first_token_ms
    ok = (decode_tokens > 0) & (decode_time > 0)
    per_request = decode_tokens[ok] / decode_time[ok] * 1e3
    roof_time = req.roofline_at_finish_ms - req.roofline_at_first_ms
    roof_rate = decode_tokens[ok] / roof_time[ok] * 1e3
    dec = it[it.kind == "decode"]
    steps = req.verify_steps.sum()
    # a retracted request's second prefill streams a token no verify step produced
    verified = decode_tokens - req.retractions
    accept_length = float(verified.sum() / steps) if steps else 1.0
    breakdown = {k: float(dec[f"{k}_ms"].mean()) if len(dec) else 0.0 for k in BREAKDOWN_KEYS}
    first_arrival = float(req.arrival_ms.min())
    return {
        Metric.TOKENS_PER_S.value: float(per_request.mean()) if len(per_request) else 0.0,
        Metric.THROUGHPUT.value: float(req.output_tokens.sum() / (req.finish_ms.max() - first_arrival) * 1e3),
        Metric.ACCEPT_LENGTH.value: accept_length,
        Metric.ITERATION_MS.value: float((dec.end_ms - dec.start_ms).mean()) if len(dec) else 0.0,
        "breakdown_ms": breakdown,
        Metric.ROOFLINE.value: float(roof_rate.mean()) if len(roof_rate) else 0.0,
        "mean_batch_size": float(dec.batch_size.mean()) if len(dec) else 0.0,
        Metric.TTFT_MS.value: percentiles((req.first_token_ms - req.arrival_ms).to_numpy()),
        Metric.ITL_MS.value: percentiles(res.itl_gaps_ms, res.itl_weights),
        Metric.TPOT_MS.value: percentiles((decode_time[ok] / decode_tokens[ok]).to_numpy()),
        "requests": int(len(req)),
        "output_tokens": int(req.output_tokens.sum()),
        "decode_iterations": int(len(dec)),
        "retractions": int(req.retractions.sum()),
        "prefill_tokens": int(req.prefill_tokens.sum()),  # prompt tokens prefills computed
        "cached_prompt_tokens": int(req.cached_prompt_tokens.sum()),  # prompt tokens the radix cache served
        "simulated_ms": float(res.makespan_ms),
    }


def compare(spec: dict, base: dict) -> dict:
    """Speedup over the baseline and the accept length at which speculation breaks even.

    Per-request rate = accept length / iteration time, so the break-even accept length is
    accept_length x baseline rate / speculative rate (the accept length that would equal the baseline at
    this setup's iteration time).
    """
    tps, base_tps = spec[Metric.TOKENS_PER_S], base[Metric.TOKENS_PER_S]
    return {
        "baseline_tokens_per_s": base_tps,
        "baseline_throughput_tokens_per_s": base[Metric.THROUGHPUT],
        "speedup": tps / base_tps if base_tps else float("nan"),
        "throughput_speedup": spec[Metric.THROUGHPUT] / base[Metric.THROUGHPUT] if base[Metric.THROUGHPUT] else
        float("nan"),
        "break_even_accept_length": spec[Metric.ACCEPT_LENGTH] * base_tps / tps if tps else float("nan"),
    }


def compare_to_itself(spec: dict) -> dict:
    """compare() for a run without speculation: it is its own baseline."""
    return {"baseline_tokens_per_s": spec[Metric.TOKENS_PER_S], "baseline_throughput_tokens_per_s":
            spec[Metric.THROUGHPUT], "speedup": 1.0, "throughput_speedup": 1.0, "break_even_accept_length": 1.0}
