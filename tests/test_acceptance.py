"""Accept-length models: conversions, trees and sampling."""

from __future__ import annotations

import numpy as np
import pytest

from simspec.acceptance.models import (
    AcceptanceDistribution,
    AcceptanceSampler,
    ContextAcceptance,
    acceptance_distribution,
    chain_distribution,
    constant_rate_for,
    cumulative_to_conditional,
    tree_distribution,
)
from simspec.errors import InputError
from simspec.scenario.loader import parse_scenario, resolve
from simspec.scenario.schema import Acceptance


def test_chain_distribution_by_hand():
    assert chain_distribution([0.5, 0.5]).tolist() == pytest.approx([0.5, 0.25, 0.25])
    assert chain_distribution([1.0, 0.0]).tolist() == pytest.approx([0.0, 1.0, 0.0])


def test_conditional_rates_give_the_expected_accept_length():
    """E[accepted] = sum_i prod_{j<=i} a_j: 0.8 + 0.8*0.5 = 1.2, accept length 2.2."""
    assert AcceptanceDistribution(chain_distribution([0.8, 0.5])).mean_accept_length == pytest.approx(2.2)


def test_cumulative_rates_convert_to_conditional():
    """Papers publish P(draft i accepted); 1 + their sum is the accept length."""
    cumulative = [0.8, 0.6, 0.3]
    assert cumulative_to_conditional(cumulative) == pytest.approx([0.8, 0.75, 0.5])
    dist = acceptance_distribution(Acceptance(cumulative_rates=cumulative), max_drafts=3)
    assert dist.mean_accept_length == pytest.approx(1 + sum(cumulative))


def test_constant_rate_reproduces_the_mean():
    a = constant_rate_for(1.8, 3)
    assert a + a**2 + a**3 == pytest.approx(0.8)
    dist = acceptance_distribution(Acceptance(accept_length=1.8), max_drafts=3)
    assert dist.mean_accept_length == pytest.approx(1.8)
    assert constant_rate_for(1.0, 3) == 0.0 and constant_rate_for(4.0, 3) == 1.0


def test_tree_by_hand():
    """Ranks accepted with p = (0.6, 0.2). Two nodes: (0) and (0,0): ends at depth 0 w.p. 0.4, depth 1 w.p.
    0.6 * 0.4, depth 2 w.p. 0.36 -> accept length 1.96. A third node adds the rank-2 sibling (0.2 > 0.12)."""
    two = tree_distribution([0.6, 0.2], num_steps=2, topk=2, num_nodes=2)
    assert two.tolist() == pytest.approx([0.4, 0.24, 0.36])
    three = tree_distribution([0.6, 0.2], num_steps=2, topk=2, num_nodes=3)
    assert three.tolist() == pytest.approx([0.2, 0.44, 0.36])
    assert AcceptanceDistribution(three).mean_accept_length == pytest.approx(2.16)


def test_tree_of_width_one_is_a_chain():
    assert tree_distribution([0.7], num_steps=3, topk=1, num_nodes=3).tolist() == pytest.approx(
        chain_distribution([0.7, 0.7, 0.7]).tolist())


def test_wider_tree_accepts_more():
    narrow = AcceptanceDistribution(tree_distribution([0.5, 0.2, 0.1], 5, 3, 5)).mean_accept_length
    wide = AcceptanceDistribution(tree_distribution([0.5, 0.2, 0.1], 5, 3, 31)).mean_accept_length
    assert wide > narrow


def test_histogram_is_normalised_and_truncated_to_the_setup():
    dist = acceptance_distribution(Acceptance(histogram=[10, 30, 60]), max_drafts=2)
    assert dist.probabilities.tolist() == pytest.approx([0.1, 0.3, 0.6])
    assert dist.mean_accept_length == pytest.approx(2.5)


def test_sampler_matches_its_distribution():
    dist = AcceptanceDistribution(np.array([0.2, 0.3, 0.5]))
    s = AcceptanceSampler(dist, np.random.default_rng(7))
    draws = np.concatenate([s.sample(1000) for _ in range(200)])  # crosses block refills
    assert set(np.unique(draws)) <= {0, 1, 2}
    freq = np.bincount(draws, minlength=3) / len(draws)
    assert freq == pytest.approx([0.2, 0.3, 0.5], abs=0.005)  # > 5 standard errors at n = 200,000


def _curve(*points: tuple[int, float]) -> Acceptance:
    return Acceptance(accept_length_by_context=[{"context_tokens": c, "accept_length": a} for c, a in points])


def test_context_curve_is_linear_between_its_points_and_flat_beyond():
    curve = acceptance_distribution(_curve((1000, 3.0), (3000, 2.0), (5000, 1.5)), max_drafts=3)
    assert isinstance(curve, ContextAcceptance)
    for context, want in [(0, 3.0), (1000, 3.0), (2000, 2.5), (3000, 2.0), (4500, 1.625), (9000, 1.5)]:
        assert curve.at(context).mean_accept_length == pytest.approx(want), context


def test_a_flat_context_curve_is_the_constant_accept_length():
    flat = acceptance_distribution(_curve((0, 2.2), (8000, 2.2)), max_drafts=4)
    const = acceptance_distribution(Acceptance(accept_length=2.2), max_drafts=4)
    assert isinstance(flat, ContextAcceptance) and isinstance(const, AcceptanceDistribution)
    assert flat.at(3000).probabilities.tolist() == pytest.approx(const.probabilities.tolist())


def test_context_sampler_draws_each_request_at_its_own_context():
    curve = acceptance_distribution(_curve((1000, 3.0), (3000, 1.5)), max_drafts=3)
    s = AcceptanceSampler(curve, np.random.default_rng(3))
    assert s.context_dependent
    context = np.array([500, 2000] * 500)
    draws = np.concatenate([s.sample(len(context), context) for _ in range(100)])  # crosses block refills
    short, mid = draws[0::2], draws[1::2]
    assert 1 + short.mean() == pytest.approx(3.0, abs=0.02)  # 50,000 draws each (fixed seed): ~3.5 standard errors
    assert 1 + mid.mean() == pytest.approx(2.25, abs=0.02)
    assert set(np.unique(draws)) <= {0, 1, 2, 3}
    with pytest.raises(ValueError, match="context"):
        s.sample(3)


@pytest.mark.parametrize("points, needle", [
    ([(1000, 2.0)], "at least 2"),
    ([(2000, 2.0), (1000, 1.5)], "must increase"),
    ([(1000, 2.0), (1000, 1.5)], "must increase"),
    ([(1000, 0.5), (2000, 1.5)], "greater than or equal to 1"),
])
def test_context_curve_refuses_bad_points(points, needle):
    with pytest.raises(ValueError, match=needle):
        _curve(*points)


def test_context_curve_is_one_form_among_the_others():
    with pytest.raises(ValueError, match="exactly one"):
        Acceptance(accept_length=2.0, accept_length_by_context=[{"context_tokens": 0, "accept_length": 2.0},
                                                                 {"context_tokens": 10, "accept_length": 2.0}])


def _eagle3(small: dict, acceptance: dict) -> dict:
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = acceptance
    return small


def test_context_curve_point_above_what_the_setup_reaches_is_refused(small):
    d = _eagle3(small, {"accept_length_by_context": [{"context_tokens": 0, "accept_length": 2.0},
                                                     {"context_tokens": 100, "accept_length": 4.5}]})
    with pytest.raises(InputError, match="above the 4") as err:
        resolve(parse_scenario(d, "t.yaml"), "t.yaml")
    assert err.value.key == "acceptance.accept_length_by_context[1].accept_length"


def test_engine_commits_what_the_curve_gives_along_each_request(small):
    """A request's verify steps follow its growing context: from a 1,000-token prompt to 3,000 tokens the curve
    falls linearly from 3.0 to 1.5, so its ~2,000 decode tokens take about the integral of dc / AL(c),
    (2000 / 1.5) ln 2 = 924 steps, an accept length of ~2.16, below the curve's mean of its two ends (2.25)."""
    from simspec.simulate import run

    small["workload"].update(num_requests=4, input_tokens={"dist": "fixed", "value": 1000},
                             output_tokens={"dist": "fixed", "value": 2000})
    d = _eagle3(small, {"accept_length_by_context": [{"context_tokens": 1000, "accept_length": 3.0},
                                                     {"context_tokens": 3000, "accept_length": 1.5}]})
    req = run(resolve(parse_scenario(d, "t.yaml"), "t.yaml")).requests
    realised = (req.output_tokens - 1).sum() / req.verify_steps.sum()  # the prefill commits each first token
    expected = 1999 / ((2000 / 1.5) * np.log(2.0))
    assert realised == pytest.approx(expected, rel=0.03)
    assert realised < 2.2
