"""From what users know about acceptance to P(k drafts accepted in one verify step), k = 0..max_drafts.

Accept length counts the bonus token, as SGLang does: accept_length = 1 + E[k].
- accept_length: a chain with one constant conditional rate a per position, solved so that
  1 + sum_{i=1..m} a^i equals the given mean (m = the deepest draft the setup can accept).
- chain_rates: conditional rates a_i = P(draft i accepted | drafts < i accepted); E[k] = sum_i prod_{j<=i} a_j.
- cumulative_rates: marginal c_i = P(draft i accepted), as papers publish them; a_i = c_i / c_{i-1}.
- positional_rates (EAGLE trees): p_r = P(the target's next token is the draft's rank-r candidate). The
  tree is grown as SGLang's EAGLE worker grows it: each draft step expands only the topk best nodes of the
  previous step (a beam; select_top_k_tokens) into topk children each, and the final tree keeps the
  num_draft_tokens - 1 candidates of highest path score (prod of p_r along the path, standing in for the
  draft's own probabilities). The target then walks down while its token is among the kept children. A
  wider tree accepts more at the cost of verifying more tokens.
- histogram: SGLang's spec_accept_histogram (verify steps that accepted k drafts), normalised.
- accept_length_by_context: the accept_length form's chain at each of two or more context lengths (the request's
  prompt + generated tokens at the verify step). A drafter trained on short sequences accepts less as the context
  grows: vLLM speculators PR #684 measured a Qwen3-8B EAGLE-3 head at 2.30 tokens a step at 2k context, 2.04 at
  4k, 1.69 at 8k and 1.09 at 16k (LongBench-v2, temperature 0). Between two points a verify step draws from
  one point's distribution or the other's with the linear weights, so its expected accept length is linear in
  the context; beyond the ends it keeps the end point's (ContextAcceptance).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brentq

from simspec.scenario.schema import Acceptance


@dataclass(frozen=True)
class AcceptanceDistribution:
    probabilities: np.ndarray  # P(k accepted drafts), k = 0..len-1

    @property
    def mean_accept_length(self) -> float:
        return 1.0 + float(np.dot(np.arange(len(self.probabilities)), self.probabilities))

    @property
    def max_drafts(self) -> int:
        return len(self.probabilities) - 1


@dataclass(frozen=True)
class ContextAcceptance:
    """Acceptance that depends on each request's context: one distribution per point of
    acceptance.accept_length_by_context, mixed linearly between neighbouring points."""

    contexts: np.ndarray  # increasing context lengths, tokens
    points: tuple[AcceptanceDistribution, ...]  # one per context, all over k = 0..max_drafts

    @property
    def max_drafts(self) -> int:
        return self.points[0].max_drafts

    def bracket(self, context: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per context: the index of the point at or below it (the first and the last but one at the ends) and
        the weight of the point above, 0..1 (0 below the first point, 1 beyond the last)."""
        c = np.asarray(context, dtype=float)
        idx = np.clip(np.searchsorted(self.contexts, c, side="right") - 1, 0, len(self.contexts) - 2)
        lo, hi = self.contexts[idx], self.contexts[idx + 1]
        return idx, np.clip((c - lo) / (hi - lo), 0.0, 1.0)

    def at(self, context: float) -> AcceptanceDistribution:
        """The distribution a verify step at this context draws from."""
        idx, w = self.bracket(np.asarray([context]))
        i, weight = int(idx[0]), float(w[0])
        return AcceptanceDistribution((1.0 - weight) * self.points[i].probabilities
                                      + weight * self.points[i + 1].probabilities)


def chain_distribution(conditional: list[float] | np.ndarray) -> np.ndarray:
    """P(k) for a chain: reach depth k with prod a_1..a_k, stop there with 1 - a_{k+1}."""
    a = np.asarray(conditional, dtype=float)
    reach = np.concatenate([[1.0], np.cumprod(a)])  # P(accepted >= k)
    stop = np.concatenate([1.0 - a, [1.0]])
    return reach * stop


def constant_rate_for(accept_length: float, depth: int) -> float:
    """The constant conditional rate a with 1 + sum_{i=1..depth} a^i = accept_length."""
    target = accept_length - 1.0
    if target <= 0 or depth == 0:
        return 0.0
    if target >= depth - 1e-12:
        return 1.0
    return float(brentq(lambda a: sum(a ** i for i in range(1, depth + 1)) - target, 0.0, 1.0, xtol=1e-14))


def cumulative_to_conditional(cumulative: list[float]) -> list[float]:
    out, prev = [], 1.0
    for c in cumulative:
        out.append(0.0 if prev <= 0 else min(1.0, c / prev))
        prev = c
    return out


def tree_distribution(positional: list[float], num_steps: int, topk: int, num_nodes: int) -> np.ndarray:
    """P(k accepted) for the `num_nodes`-node tree (root excluded) that a topk-wide beam of num_steps steps
    proposes, scored by positional rates."""
    p = list(positional[:topk]) + [0.0] * max(0, topk - len(positional))
    candidates: dict[tuple[int, ...], float] = {}
    beam: list[tuple[tuple[int, ...], float]] = [((), 1.0)]
    for _ in range(num_steps):
        children = [(path + (r,), score * p[r]) for path, score in beam for r in range(topk)]
        candidates.update(children)
        beam = heapq.nlargest(topk, children, key=lambda c: c[1])
    # ties broken by shallower first, then rank order, so a kept node's parent is always kept
    order = sorted(candidates.items(), key=lambda c: (-c[1], len(c[0]), c[0]))
    kept = dict(order[:num_nodes])
    # P(the walk ends at depth d): reach a kept node at depth d, then miss all of its kept children
    probs = np.zeros(num_steps + 1)
    probs[0] = 1.0 - sum(p[r] for r in range(topk) if (r,) in kept)
    for path, value in kept.items():
        children_p = sum(p[r] for r in range(topk) if path + (r,) in kept)
        probs[len(path)] += value * (1.0 - children_p)
    return np.clip(probs, 0.0, None) / max(probs.sum(), 1e-300)


def acceptance_distribution(acc: Acceptance, *, max_drafts: int, num_steps: int = 0, topk: int = 1,
                            num_draft_tokens: int = 0) -> AcceptanceDistribution | ContextAcceptance:
    """The distribution for a validated acceptance section and a resolved speculative setup (one per context
    point for accept_length_by_context)."""
    def constant_chain(accept_length: float) -> np.ndarray:
        return chain_distribution([constant_rate_for(accept_length, max_drafts)] * max_drafts)

    if acc.accept_length_by_context is not None:
        points = tuple(AcceptanceDistribution(constant_chain(p.accept_length)) for p in acc.accept_length_by_context)
        contexts = np.asarray([p.context_tokens for p in acc.accept_length_by_context], dtype=float)
        return ContextAcceptance(contexts, points)
    if acc.accept_length is not None:
        probs = constant_chain(acc.accept_length)
    elif acc.chain_rates is not None:
        probs = chain_distribution(acc.chain_rates)
    elif acc.cumulative_rates is not None:
        probs = chain_distribution(cumulative_to_conditional(acc.cumulative_rates))
    elif acc.positional_rates is not None:
        probs = tree_distribution(acc.positional_rates, max(num_steps, 1), max(topk, 1), num_draft_tokens - 1)
    else:
        counts = np.asarray(acc.histogram, dtype=float)[: max_drafts + 1]
        probs = counts / counts.sum()
    return AcceptanceDistribution(np.asarray(probs, dtype=float))


class AcceptanceSampler:
    """Vectorised sampling of accepted drafts for a whole batch, drawing uniforms in blocks. With a
    ContextAcceptance each request's draw depends on its context (context_dependent: pass the contexts)."""

    BLOCK = 1 << 16

    def __init__(self, dist: AcceptanceDistribution | ContextAcceptance, rng: np.random.Generator):
        self.context_dependent = isinstance(dist, ContextAcceptance)
        if isinstance(dist, ContextAcceptance):
            self._curve = dist
            self._cdfs = np.cumsum(np.stack([p.probabilities for p in dist.points]), axis=1)
            self._cdfs[:, -1] = 1.0
        else:
            self._cdf = np.cumsum(dist.probabilities)
            self._cdf[-1] = 1.0
        self._rng = rng
        self._buf = rng.random(self.BLOCK)
        self._pos = 0

    def _uniforms(self, n: int) -> np.ndarray:
        if self._pos + n > len(self._buf):
            self._buf = self._rng.random(max(self.BLOCK, n))
            self._pos = 0
        u = self._buf[self._pos:self._pos + n]
        self._pos += n
        return u

    def sample(self, n: int, context: np.ndarray | None = None) -> np.ndarray:
        """Accepted drafts for n requests (per request context, in tokens, when context_dependent)."""
        if not self.context_dependent:
            return np.searchsorted(self._cdf, self._uniforms(n), side="right")
        if context is None or len(context) != n:
            raise ValueError("a context-dependent acceptance needs each request's context")
        u = self._uniforms(2 * n)
        idx, weight = self._curve.bracket(context)
        rows = self._cdfs[idx + (u[:n] < weight)]
        return (rows <= u[n:, None]).sum(axis=1)
