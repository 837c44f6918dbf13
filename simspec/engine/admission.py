"""How SGLang decides whether the KV cache has room: admission against an estimate, retraction when wrong.

SGLang does not reserve a request's whole output at admission. Its PrefillAdder (managers/schedule_policy.py)
admits a waiting request when

    extend tokens + min(max_new_tokens - generated, CLIP)  <  free KV - sum over running requests of
                                                                 new_token_ratio x min(max_new - generated, CLIP)

(requests admitted in the same round count their whole clipped output). new_token_ratio starts at
SGLANG_INIT_NEW_TOKEN_RATIO x --schedule-conservativeness and decays linearly every decode step to a floor,
so a long-running server bets that requests stop early and packs more of them. When a decode step finds no
room for the next tokens (ScheduleBatch.check_decode_mem), retract_decode() evicts requests from the batch,
frees their KV, puts them back in the waiting queue and raises the ratio to what the survivors have shown. It
retracts until the survivors' next step fits (check_decode_mem over the remaining requests: SGLang PR #9989,
September 2025, with the speculative multiplier since PR #14939, December 2025); before that it kept 20 tokens
per survivor free, a figure that now only feeds the new ratio.

The constants are SGLang's defaults (python/sglang/srt/environ.py; managers/scheduler.py), the same from 0.5.8
through 0.5.23.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

INIT_NEW_TOKEN_RATIO = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
MIN_NEW_TOKEN_RATIO_FACTOR = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR: floor = init x this
NEW_TOKEN_RATIO_DECAY_STEPS = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS: decode steps from init to floor
RETRACT_DECODE_STEPS = 20  # SGLANG_RETRACT_DECODE_STEPS: decode steps per survivor the new ratio allows for
CLIP_MAX_NEW_TOKENS = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION: cap on one request's output estimate


@dataclass
class NewTokenRatio:
    """The scheduler's running estimate of the fraction of max_new_tokens a request still to decode will use."""

    init: float
    floor: float
    decay: float
    value: float

    @classmethod
    def for_server(cls, conservativeness: float) -> NewTokenRatio:
        # Scheduler.__init__: init = min(1, INIT x conservativeness), floor = min(init, init x FACTOR)
        init = min(1.0, INIT_NEW_TOKEN_RATIO * conservativeness)
        floor = min(init, init * MIN_NEW_TOKEN_RATIO_FACTOR)
        return cls(init=init, floor=floor, decay=(init - floor) / NEW_TOKEN_RATIO_DECAY_STEPS, value=init)

    def decode_step(self) -> None:
        """A decode step that found room for its tokens (update_running_batch's else branch)."""
        self.value = max(self.value - self.decay, self.floor)

    def idle(self) -> None:
        """Nothing running and nothing waiting: the scheduler resets the estimate (self_check_during_idle)."""
        self.value = self.init

    def after_retraction(self, generated: np.ndarray, max_new: np.ndarray) -> None:
        """retract_decode's new estimate from the requests that stay: what they decoded plus a margin of
        RETRACT_DECODE_STEPS each, over their max_new_tokens (+ 1, as SGLang guards the division)."""
        self.value = min(1.0, (float(generated.sum()) + RETRACT_DECODE_STEPS * len(generated))
                         / (float(max_new.sum()) + 1.0))


def output_estimate(remaining: np.ndarray | int) -> np.ndarray | int:
    """min(max_new_tokens - generated, CLIP): the output a request is assumed still to need."""
    return np.minimum(remaining, CLIP_MAX_NEW_TOKENS)


def decode_tokens_per_request(algorithm: str, num_steps: int, topk: int, num_draft_tokens: int,
                              ngram_max_bfs_breadth: int = 0) -> int:
    """Free KV tokens one request needs for the next decode step (Scheduler.decode_mem_cache_buf_multiplier):
    one without speculation; with it num_draft_tokens + topk x num_steps, where n-gram runs with topk = its
    maximum BFS breadth and one step (server_args sets speculative_eagle_topk so)."""
    if algorithm == "none":
        return 1
    if algorithm == "ngram":
        return num_draft_tokens + max(ngram_max_bfs_breadth, 1)
    return num_draft_tokens + max(topk, 1) * max(num_steps, 1)
