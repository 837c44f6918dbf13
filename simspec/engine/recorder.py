"""Append-only record of what the engine did. Metrics are computed afterwards (simspec.analysis.metrics)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from simspec.timing.iteration import IterationCost

ITERATION_COLUMNS = ("start_ms", "end_ms", "kind", "batch_size", "tokens", "draft_compute_ms", "draft_comm_ms",
                     "verify_compute_ms", "verify_comm_ms", "cpu_ms", "roofline_ms")


class Recorder:
    def __init__(self, num_requests: int):
        self._rows: list[tuple] = []
        n = num_requests
        self.arrival_ms = np.full(n, np.nan)
        self.first_token_ms = np.full(n, np.nan)
        self.finish_ms = np.full(n, np.nan)
        self.input_tokens = np.zeros(n, dtype=np.int64)
        self.output_tokens = np.zeros(n, dtype=np.int64)
        self.verify_steps = np.zeros(n, dtype=np.int64)
        self.retractions = np.zeros(n, dtype=np.int64)  # times SGLang's retract_decode sent it back to wait
        self.prefill_tokens = np.zeros(n, dtype=np.int64)  # prompt (and re-prefilled) tokens its prefills computed
        self.cached_tokens = np.zeros(n, dtype=np.int64)  # prompt tokens the radix cache served them instead
        self.roofline_at_first_ms = np.full(n, np.nan)
        self.roofline_at_finish_ms = np.full(n, np.nan)
        self.itl_gaps: list[tuple[float, int]] = []  # (gap between streamed chunks ms, how many requests had it)

    def iteration(self, start_ms: float, end_ms: float, kind: str, batch_size: int, tokens: int,
                  cost: IterationCost) -> None:
        self._rows.append((start_ms, end_ms, kind, batch_size, tokens, cost.draft_compute_ms, cost.draft_comm_ms,
                           cost.verify_compute_ms, cost.verify_comm_ms, cost.cpu_ms, cost.roofline_ms))

    def iterations(self) -> pd.DataFrame:
        return pd.DataFrame(self._rows, columns=list(ITERATION_COLUMNS))

    def requests(self) -> pd.DataFrame:
        return pd.DataFrame({
            "arrival_ms": self.arrival_ms, "first_token_ms": self.first_token_ms, "finish_ms": self.finish_ms,
            "input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
            "verify_steps": self.verify_steps, "retractions": self.retractions,
            "prefill_tokens": self.prefill_tokens, "cached_prompt_tokens": self.cached_tokens,
            "roofline_at_first_ms": self.roofline_at_first_ms, "roofline_at_finish_ms": self.roofline_at_finish_ms,
        })

    def inter_token_latencies_ms(self) -> tuple[np.ndarray, np.ndarray]:
        """(gap values, weights): each streamed chunk's gap since the request's previous chunk."""
        if not self.itl_gaps:
            return np.zeros(0), np.zeros(0, dtype=np.int64)
        arr = np.asarray(self.itl_gaps)
        return arr[:, 0], arr[:, 1].astype(np.int64)
