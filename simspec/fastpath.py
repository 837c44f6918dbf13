"""The analytic fast path: closed-form steady state of a closed-loop workload, for sweeps of many points.

It asks the same time model (IterationModel) as the engine and replaces only the event loop:
  - C = min(concurrency, max_running_requests) requests decode together, all of them held in the KV cache
    whole (where they would not fit, SGLang's admission estimate and retractions set the batch: the engine's job);
  - a request needs E[N] verify steps for its output - 1 decode tokens, where each step emits X = 1 + accepted
    drafts tokens (X from the acceptance distribution, the last step cut at the output length): E[N] is the
    renewal count, computed exactly by a recursion for outputs up to RENEWAL_EXACT tokens and extended
    linearly (slope 1 / E[X]) beyond;
  - a decode step costs IterationModel.decode(C, C x mean context, C x tokens per step), the mean context of a
    request over its life being prompt + 1 + (output - 1) / 2 (cost is linear in context between SGLang's
    attention regimes);
  - prefills: requests that finish in the same iteration are prefilled together (within the chunked-prefill
    budget). Without speculation they stay in lockstep; with it, random accept lengths scatter finishes a
    little more each generation (renewal variance), which prefill_groups() turns into an expected group size;
  - a group that is not the whole batch waits for the scheduler's next receive while the others decode: one
    decode iteration, two with overlap scheduling (engine/engine.py); the whole batch finishing together finds
    the engine idle and waits for none. The slots so kept empty shrink the mean decoding batch.
Where it applies (closed loop, fixed lengths, many requests per slot) it agrees with the engine within ~2%
on tok/s, throughput and speedup and ~3% on the mean step, whose engine figure holds the final drain (tests/
test_fastpath.py, benchmarks/fastpath_agreement.py). Elsewhere it raises InputError, never guesses.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.signal import lfilter
from scipy.stats import norm

from simspec.acceptance.models import ContextAcceptance
from simspec.analysis.metrics import compare, compare_to_itself
from simspec.errors import InputError
from simspec.predict import describe, sources
from simspec.scenario.loader import ResolvedScenario
from simspec.simulate import acceptance_for, baseline_of, decode_tokens
from simspec.timing.iteration import BREAKDOWN_KEYS, IterationModel

RENEWAL_EXACT = 4096


def expected_steps(tokens: int, probabilities: np.ndarray | None) -> float:
    """E[verify steps] to emit `tokens` tokens when a step emits 1 + k tokens with probability p[k], the last
    step cut short (the engine's min(sample + 1, remaining)). f(n) = 1 + sum_k p[k] f(n - 1 - k), f(<=0) = 0."""
    if tokens <= 0:
        return 0.0
    if probabilities is None or len(probabilities) == 1:
        return float(tokens)
    p = np.asarray(probabilities, dtype=float)
    kmax = len(p)
    n = min(tokens, RENEWAL_EXACT)
    # the recursion is a linear recurrence driven by ones: an IIR filter, run in C by scipy
    f = np.concatenate([[0.0], lfilter([1.0], np.concatenate([[1.0], -p]), np.ones(n))])
    if tokens <= n:
        return float(f[tokens])
    mean_x = 1.0 + float(np.dot(np.arange(kmax), p))
    return float(f[n] + (tokens - n) / mean_x)


def _check_applies(rs: ResolvedScenario) -> tuple[int, int, int]:
    w = rs.scenario.workload
    if w.arrival.type != "closed":
        raise InputError("the fast path covers closed-loop workloads only (arrival.type: closed); run the engine",
                         file=rs.path, key="workload.arrival.type")
    if w.shared_prefix_tokens:
        raise InputError("the fast path prefills whole prompts; a shared prefix served from the radix cache"
                         " (shared_prefix_tokens) needs the engine", file=rs.path, key="workload.shared_prefix_tokens")
    if w.arrival.turns > 1:
        raise InputError("the fast path hands out independent requests; conversations (arrival.turns > 1) change"
                         " how the run drains: run the engine", file=rs.path, key="workload.arrival.turns")
    acc = rs.scenario.acceptance
    if acc is not None and acc.accept_length_by_context is not None:
        raise InputError("the fast path draws every verify step from one acceptance distribution;"
                         " accept_length_by_context changes it with each request's context: run the engine",
                         file=rs.path, key="acceptance.accept_length_by_context")
    lengths = []
    for key in ("input_tokens", "output_tokens"):
        d = getattr(w, key)
        if d.dist != "fixed":
            raise InputError(f"the fast path needs fixed lengths (got dist: {d.dist}); run the engine",
                             file=rs.path, key=f"workload.{key}.dist")
        lengths.append(int(d.value))
    prompt, output = lengths
    per_request_kv = prompt + output
    slots = min(w.arrival.concurrency, rs.max_running_requests, w.num_requests)
    # the whole batch, with room for each request's next decode step (the tokens a step allocates)
    need = slots * (per_request_kv + decode_tokens(rs))
    if need > rs.kv_capacity_tokens:
        # SGLang admits against an estimate of the outputs still to come and retracts when it was wrong
        # (engine/admission.py): which batch that settles at is the engine's to find, not a closed form's
        raise InputError(f"the KV cache binds: {slots} requests need {need:,} tokens (with their next decode"
                         f" step's) but it holds {rs.kv_capacity_tokens:,}; SGLang's admission estimate and retractions"
                         " then set the batch, which the fast path does not model: run the engine (without --fast)",
                         file=rs.path, key="workload.arrival.concurrency")
    return prompt, output, max(slots, 1)


def _finish_spread(probs: np.ndarray | None, tokens: int) -> float:
    """Standard deviation of the verify steps one request needs (renewal theory: n Var(X) / E[X]^3)."""
    if probs is None or len(probs) == 1 or tokens <= 0:
        return 0.0
    x = np.arange(1, len(probs) + 1)
    mean = float(np.dot(x, probs))
    var = float(np.dot((x - mean) ** 2, probs))
    return math.sqrt(tokens * var / mean ** 3)


def prefill_groups(c: int, generations: int, spread: float) -> list[float]:
    """Expected number of prefill groups for each generation of the c slots.

    All c slots start together (the first wave: one group). The requests of generation g + 1 start when those
    of generation g finish. A slot's g-th finish lies at the sum of g runs' steps, so two slots finish g-th in
    the same iteration with probability p = P(D = 0), D ~ N(0, 2 g spread^2) rounded:
    1 / (2 spread sqrt(pi g)), capped at 1 (lockstep when spread is ~0, e.g. without speculation). Each of the
    other c - 1 slots joins a request's group with probability p, so its group has 1 + B members, B ~
    Binomial(c - 1, p), and the c requests form c E[1 / (1 + B)] = (1 - (1 - p)^c) / p groups."""
    out = [1.0]
    for g in range(1, generations):
        p = 1.0 if spread < 1e-9 else min(1.0, 1.0 / (2.0 * spread * math.sqrt(math.pi * g)))
        out.append((1.0 - (1.0 - p) ** c) / p)
    return out


def steady_state(rs: ResolvedScenario) -> dict:
    """The figures `simspec predict` reports for one run, from the steady state of its closed loop."""
    prompt, output, c = _check_applies(rs)
    model = IterationModel(rs)
    dist = acceptance_for(rs)
    assert not isinstance(dist, ContextAcceptance)  # _check_applies sends context-dependent acceptance to the engine
    probs = dist.probabilities if dist is not None else None
    steps = expected_steps(output - 1, probs)
    context = prompt + 1 + (output - 1) / 2
    generations = max(1, rs.scenario.workload.num_requests // c)
    groups = prefill_groups(c, generations, _finish_spread(probs, output - 1))
    # decode iterations a finished slot's next request waits to be received (engine/engine.py), averaged over the
    # generations' groups: none for a group that is the whole batch (the engine is idle then)
    lag = (2 if rs.overlap else 1) * sum(1.0 - 1.0 / n for n in groups) / len(groups)
    batch = c * steps / (steps + lag) if steps else float(c)
    lo, hi = max(1, math.floor(batch)), max(1, math.ceil(batch))
    per_token = (output - 1) / steps if steps else 0.0
    dec_lo = model.decode(lo, lo * context, lo * per_token)
    dec_hi = dec_lo if hi == lo else model.decode(hi, hi * context, hi * per_token)
    frac = batch - lo if hi > lo else 0.0

    def at_batch(field: str) -> float:
        """A figure of the decode step at the fractional mean batch: linear between the whole batches around it."""
        low = getattr(dec_lo, field)
        return low + frac * (getattr(dec_hi, field) - low)

    t_dec = at_batch("total_ms")
    # Prefills. Requests finishing in the same iteration are prefilled together, at most `per_chunk` prompts
    # per prefill iteration (the chunked-prefill budget). A group of m needs J = ceil(m / per_chunk)
    # iterations; per cycle of one slot every slot is prefilled once, so the cycle holds c / m groups; a
    # request's own decode window excludes, on average, (J + 1) / 2 of its group's iterations.
    per_chunk = max(1, rs.chunked_prefill_size // prompt) if prompt <= rs.chunked_prefill_size else 1
    prefill_cost: dict[int, float] = {}

    def prefill(n: float) -> float:
        """One prefill iteration of n prompts (n may be fractional: linear between whole counts)."""
        lo, hi = math.floor(n), math.ceil(n)
        for k in {lo, hi} - set(prefill_cost):
            prefill_cost[k] = _prefill_ms(model, prompt, k, rs.chunked_prefill_size) if k > 0 else 0.0
        return prefill_cost[lo] + (n - lo) * (prefill_cost[hi] - prefill_cost[lo])

    cycle_prefill = own_prefill = 0.0
    for n_groups in groups:
        m = c / n_groups  # mean group size
        full, rest = divmod(m, per_chunk)
        group_ms = full * prefill(per_chunk) + prefill(rest)
        j = full + (1 if rest > 1e-9 else 0)  # prefill iterations of one group
        cycle_prefill += n_groups * group_ms
        own_prefill += group_ms * (j + 1) / (2 * j)
    cycle_prefill /= len(groups)
    own_prefill /= len(groups)
    cycle = (steps + lag) * t_dec + cycle_prefill
    window = cycle - own_prefill - lag * t_dec
    # throughput is output over the makespan of the whole run: `generations` cycles, then the wait for the
    # last of the final generation's c requests, whose finishes have drifted apart by spread x sqrt(G) steps
    # (the expected maximum of c normals, Blom's approximation)
    spread = _finish_spread(probs, output - 1) * math.sqrt(generations)
    z_max = float(norm.ppf((c - 0.375) / (c + 0.25))) if c > 1 else 0.0
    makespan = generations * cycle + spread * z_max * t_dec
    throughput = c * generations * output / makespan * 1e3
    accept_length = (output - 1) / steps if steps else 1.0
    parts = {key: at_batch(f"{key}_ms") for key in ("draft_compute", "draft_comm", "verify_compute", "verify_comm",
                                                     "cpu")}
    assert set(parts) == set(BREAKDOWN_KEYS)
    roofline_ms = at_batch("roofline_ms")
    return {
        "tokens_per_s": (output - 1) / window * 1e3 if window > 0 else 0.0,
        "throughput_tokens_per_s": throughput,
        "accept_length": accept_length,
        "iteration_ms": t_dec,
        "breakdown_ms": parts,
        "roofline_tokens_per_s": accept_length / roofline_ms * 1e3 if roofline_ms > 0 else 0.0,
        "mean_batch_size": float(batch),
    }


def _prefill_ms(model: IterationModel, prompt: int, seqs: int, chunk: int) -> float:
    """A prefill as the engine runs it: several prompts in one iteration, one long prompt in chunks."""
    if seqs > 1 or prompt <= chunk:
        return model.prefill([prompt] * seqs).total_ms
    total, done = 0.0, 0
    while done < prompt:
        step = min(chunk, prompt - done)
        total += model.prefill([step], [float(done)]).total_ms
        done += step
    return total


def predict_fast(rs: ResolvedScenario) -> dict:
    """Like simspec.predict.predict, from the steady state: the same keys for the figures a sweep tabulates."""
    spec = steady_state(rs)
    result = {"setup": describe(rs), **spec, "method": "analytic steady state (--fast)"}
    if rs.speculative:
        base = steady_state(baseline_of(rs))
        result |= compare(spec, base)
        result["baseline"] = base
    else:
        result |= compare_to_itself(spec)
    result["sources"] = sources(rs)
    return result
