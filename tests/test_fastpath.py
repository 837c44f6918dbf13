"""The analytic fast path against the discrete-event engine, where both apply."""

from __future__ import annotations

import numpy as np
import pytest

from simspec.errors import InputError
from simspec.fastpath import expected_steps, predict_fast
from simspec.predict import predict
from simspec.scenario.loader import load_scenario
from tests.conftest import SCENARIOS


def _reference_steps(n: int, p: list[float]) -> float:
    """The renewal recursion written out: f(i) = 1 + sum_k p[k] f(i - 1 - k), f(<= 0) = 0."""
    f = [0.0] * (n + 1)
    for i in range(1, n + 1):
        f[i] = 1.0 + sum(p[k] * f[i - 1 - k] for k in range(len(p)) if i - 1 - k > 0)
    return f[n]


@pytest.mark.parametrize("n", [1, 2, 5, 37, 400])
def test_expected_steps_matches_the_recursion(n):
    p = [0.25, 0.35, 0.3, 0.1]
    assert expected_steps(n, np.array(p)) == pytest.approx(_reference_steps(n, p), rel=1e-12)


def test_expected_steps_without_speculation_is_one_per_token():
    assert expected_steps(300, None) == 300


def test_expected_steps_extends_linearly_past_the_exact_range():
    p = np.array([0.5, 0.5])  # mean 1.5 tokens per step
    assert expected_steps(100_000, p) - expected_steps(90_000, p) == pytest.approx(10_000 / 1.5)


CASES = [(f, c) for f in ("baseline", "eagle3", "ngram_tree", "mtp") for c in (1, 16)]


@pytest.mark.parametrize(("scenario", "concurrency"), CASES)
def test_fast_path_agrees_with_the_engine_within_2_percent(scenario, concurrency):
    rs = load_scenario(SCENARIOS / f"{scenario}.yaml", [
        f"workload.arrival.concurrency={concurrency}", f"workload.num_requests={max(8, 8 * concurrency)}",
        "workload.output_tokens.value=384"])
    engine, fast = predict(rs), predict_fast(rs)
    for key in ("tokens_per_s", "throughput_tokens_per_s", "iteration_ms", "speedup"):
        assert fast[key] == pytest.approx(engine[key], rel=0.02), key


@pytest.mark.parametrize("scenario", ["baseline", "eagle3"])
def test_fast_path_charges_host_time_per_output_token_as_the_engine_does(scenario, tmp_path):
    """With host time per committed token set (the scenarios' M1 profile plus that coefficient), both paths charge
    it on the tokens each step commits."""
    import yaml

    profile = yaml.safe_load((SCENARIOS.parent / "calibration" / "profiles" /
                              "m1-kimi-k25-8x-rtxpro6000-pcie.yaml").read_text())
    profile.setdefault("coefficients", {})["host_per_output_token_us"] = {"value": 400.0, "source": "test"}
    (tmp_path / "p.yaml").write_text(yaml.safe_dump(profile))
    overrides = ["workload.arrival.concurrency=16", "workload.num_requests=128", "workload.output_tokens.value=384"]
    plain = predict_fast(load_scenario(SCENARIOS / f"{scenario}.yaml", overrides))
    rs = load_scenario(SCENARIOS / f"{scenario}.yaml", [*overrides, f"calibration={tmp_path / 'p.yaml'}"])
    engine, fast = predict(rs), predict_fast(rs)
    assert fast["iteration_ms"] > plain["iteration_ms"] + 16 * 0.4 * 0.99  # at least one token per request a step
    for key in ("tokens_per_s", "throughput_tokens_per_s", "speedup"):
        assert fast[key] == pytest.approx(engine[key], rel=0.02), key
    # the engine's mean step also holds the final drain's and the receive waits' smaller batches, which the fast
    # path's one steady-state step does not (benchmarks/fastpath_agreement.py: up to ~3% at short outputs)
    assert fast["iteration_ms"] == pytest.approx(engine["iteration_ms"], rel=0.03)


def test_fast_path_refuses_what_it_does_not_model(tmp_path):
    rs = load_scenario(SCENARIOS / "baseline.yaml", ["workload.arrival={type: poisson, rate_per_s: 1.0}"])
    with pytest.raises(InputError, match="closed-loop"):
        predict_fast(rs)
    rs = load_scenario(SCENARIOS / "baseline.yaml",
                       ["workload.output_tokens={dist: uniform, low: 10, high: 100}"])
    with pytest.raises(InputError, match="fixed lengths"):
        predict_fast(rs)
    rs = load_scenario(SCENARIOS / "baseline.yaml", ["workload.arrival={type: closed, concurrency: 2, turns: 2}"])
    with pytest.raises(InputError, match="conversations") as err:
        predict_fast(rs)
    assert err.value.key == "workload.arrival.turns"
    rs = load_scenario(SCENARIOS / "baseline.yaml", ["workload.shared_prefix_tokens=16"])
    with pytest.raises(InputError, match="radix cache") as err:
        predict_fast(rs)
    assert err.value.key == "workload.shared_prefix_tokens"


def test_fast_path_breakdown_adds_up_to_its_step_at_a_fractional_batch():
    """The receive waits leave a fractional mean batch; the step and each part of it are taken at that batch."""
    rs = load_scenario(SCENARIOS / "eagle3.yaml", ["workload.arrival.concurrency=16", "workload.num_requests=128",
                                                    "workload.output_tokens.value=384"])
    fast = predict_fast(rs)
    assert 15 < fast["mean_batch_size"] < 16
    assert sum(fast["breakdown_ms"].values()) == pytest.approx(fast["iteration_ms"], rel=1e-9)


def test_fast_path_sends_context_dependent_acceptance_to_the_engine():
    rs = load_scenario(SCENARIOS / "eagle3.yaml", [
        "acceptance={accept_length_by_context: [{context_tokens: 1024, accept_length: 2.5},"
        " {context_tokens: 5120, accept_length: 1.5}]}"])
    with pytest.raises(InputError, match="run the engine") as err:
        predict_fast(rs)
    assert err.value.key == "acceptance.accept_length_by_context"
