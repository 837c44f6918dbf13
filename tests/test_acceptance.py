"""Accept-length models: conversions, trees and sampling."""

from __future__ import annotations

import numpy as np
import pytest

from simspec.acceptance.models import (
    AcceptanceDistribution,
    AcceptanceSampler,
    acceptance_distribution,
    chain_distribution,
    constant_rate_for,
    cumulative_to_conditional,
    tree_distribution,
)
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
