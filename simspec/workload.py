"""Arrivals x lengths: when requests come and how long their prompts and outputs are. Seeded."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.scenario.schema import BENCH_SERVING_RANDOM, LengthDistribution, Workload


def bench_serving_random_lengths(inp: LengthDistribution, out: LengthDistribution, n: int
                                 ) -> tuple[np.ndarray, np.ndarray]:
    """The prompt and output lengths SGLang's bench_serving draws for `--dataset-name random`, draw for draw.

    bench_serving seeds numpy's global generator with --seed (np.random.seed, default 1), then draws all prompt
    lengths and then all output lengths with np.random.randint(low, len + 1): low = max(int(len x ratio), 1) for
    prompts; for outputs int(len x ratio) before SGLang 0.5.8 and max(int(len x ratio), 1) from 0.5.8 on
    (compute_random_lens). Read from the 0.5.6 and 0.5.8 wheels (python/sglang/bench_serving.py,
    sample_random_requests); the legacy RandomState reproduces np.random.seed's stream. A drawn output of 0
    tokens (possible before 0.5.8) is clipped to `min` (1), as every sample is."""
    assert inp.value is not None and out.value is not None
    state = np.random.RandomState(inp.seed)
    inputs = state.randint(max(int(inp.value * inp.range_ratio), 1), inp.value + 1, size=n)
    floor = int(out.value * out.range_ratio)
    outputs = state.randint(floor if out.zero_floor else max(floor, 1), out.value + 1, size=n)
    return (np.clip(inputs, inp.min, inp.max).astype(np.int64), np.clip(outputs, out.min, out.max).astype(np.int64))


def sample_lengths(d: LengthDistribution, n: int, rng: np.random.Generator) -> np.ndarray:
    # the schema guarantees that each distribution has the parameters it needs
    if d.dist == BENCH_SERVING_RANDOM:
        raise ValueError(f"'{BENCH_SERVING_RANDOM}' lengths are drawn for prompts and outputs together"
                         " (bench_serving_random_lengths)")
    if d.dist == "fixed":
        assert d.value is not None
        raw = np.full(n, float(d.value))
    elif d.dist == "uniform":
        assert d.low is not None and d.high is not None
        raw = rng.integers(d.low, d.high + 1, size=n).astype(float)
    elif d.dist == "normal":
        assert d.mean is not None and d.std is not None
        raw = rng.normal(d.mean, d.std, size=n)
    else:  # lognormal, parameterised by its own mean and std, not the underlying normal's
        assert d.mean is not None and d.std is not None
        sigma2 = np.log1p((d.std / d.mean) ** 2)
        raw = rng.lognormal(np.log(d.mean) - sigma2 / 2, np.sqrt(sigma2), size=n)
    return np.clip(np.rint(raw), d.min, d.max).astype(np.int64)


@dataclass(frozen=True)
class RequestSpecs:
    input_tokens: np.ndarray  # whole prompts
    output_tokens: np.ndarray
    arrival_s: np.ndarray | None  # open loop: absolute arrival times; closed loop: None
    # leading prompt tokens of each request that its conversation's earlier turns left in the radix cache
    carried_tokens: np.ndarray | None = None


def whole_conversations(num_requests: int, concurrency: int, turns: int) -> int:
    """Requests for a closed loop of `concurrency` clients: at least num_requests and one conversation per client,
    rounded up to whole conversations of `turns` requests (the schema requires a multiple)."""
    wanted = max(num_requests, concurrency * turns)
    return -(-wanted // turns) * turns


def make_requests(w: Workload, rng: np.random.Generator) -> RequestSpecs:
    n = w.num_requests
    if w.input_tokens.dist == BENCH_SERVING_RANDOM:  # the schema requires it for both, with one seed
        inputs, outputs = bench_serving_random_lengths(w.input_tokens, w.output_tokens, n)
    else:
        inputs = sample_lengths(w.input_tokens, n, rng)
        outputs = sample_lengths(w.output_tokens, n, rng)
    arrivals = None
    if w.arrival.type == "poisson":
        arrivals = np.cumsum(rng.exponential(1.0 / w.arrival.rate_per_s, size=n))
    carried = None
    if w.arrival.type == "closed" and w.arrival.followup_tokens is not None:
        # drawn after everything else, so that a workload without follow-ups draws the same requests as before
        new = sample_lengths(w.arrival.followup_tokens, n, rng)
        carried = np.zeros(n, dtype=np.int64)
        for turn in range(1, w.turns):  # a later turn: the conversation so far, then its new message
            later = np.arange(turn, n, w.turns)
            carried[later] = inputs[later - 1] + outputs[later - 1]
            inputs[later] = carried[later] + new[later]
    return RequestSpecs(inputs, outputs, arrivals, carried)
