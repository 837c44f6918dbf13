"""The SimPy engine: arrivals, admission, batching and what it records."""

from __future__ import annotations

import numpy as np
import pytest

from simspec.analysis.metrics import summarize
from simspec.scenario.loader import parse_scenario, resolve
from simspec.simulate import run
from simspec.timing import IterationModel


def _run(d):
    return run(resolve(parse_scenario(d, "t.yaml"), "t.yaml"))


def test_single_stream_decode_time_is_the_sum_of_iterations(small):
    small["workload"]["num_requests"] = 1
    res = _run(small)
    it = res.iterations
    assert list(it.kind) == ["prefill"] + ["decode"] * 63  # the first token comes from prefill
    model = IterationModel(res.resolved)
    # each decode iteration lasts what the time model says for its context
    for k, row in enumerate(it[it.kind == "decode"].itertuples()):
        assert row.end_ms - row.start_ms == pytest.approx(model.decode(1, 128 + 1 + k).total_ms)
    assert res.requests.finish_ms[0] == pytest.approx(it.end_ms.iloc[-1])


def test_closed_loop_keeps_concurrency_requests_running(small):
    small["workload"].update(num_requests=12, arrival={"type": "closed", "concurrency": 4})
    res = _run(small)
    dec = res.iterations[res.iterations.kind == "decode"]
    assert dec.batch_size.max() == 4
    assert (res.requests.first_token_ms >= res.requests.arrival_ms).all()
    # a client sends its next request when its previous one finishes
    finishes = sorted(res.requests.finish_ms)[:8]
    later_arrivals = sorted(res.requests.arrival_ms)[4:]
    assert later_arrivals == pytest.approx(finishes)


def test_closed_loop_conversations_send_their_turns_in_order(small):
    """turns 2: requests 2c and 2c+1 are conversation c. A client sends turn 2 when turn 1 finishes and takes the
    next unstarted conversation only after its own conversation's last turn."""
    small["workload"].update(num_requests=8, arrival={"type": "closed", "concurrency": 2, "turns": 2})
    small["workload"]["output_tokens"] = {"dist": "uniform", "low": 16, "high": 96}
    req = _run(small).requests
    assert req.arrival_ms[0] == 0 and req.arrival_ms[2] == 0  # two clients open conversations 0 and 1
    assert req.arrival_ms[1] == pytest.approx(req.finish_ms[0])  # second turns follow their first turns
    assert req.arrival_ms[3] == pytest.approx(req.finish_ms[2])
    # conversation 2 starts when the first conversation ends, conversation 3 when the other one does
    ends = sorted([req.finish_ms[1], req.finish_ms[3]])
    assert [req.arrival_ms[4], req.arrival_ms[6]] == pytest.approx(ends)
    assert req.arrival_ms[5] == pytest.approx(req.finish_ms[4]) and req.arrival_ms[7] == pytest.approx(req.finish_ms[6])


def test_conversations_that_do_not_divide_among_clients_drain_longer(small):
    """8 clients, 20 two-turn conversations, equal lengths: half the clients run 3 conversations (6 requests) and
    half 2, so the run lasts ~6 request lengths; 40 independent requests take ~5 (each client runs 5)."""
    small["workload"].update(num_requests=40, arrival={"type": "closed", "concurrency": 8, "turns": 2})
    grouped = _run(small)
    small["workload"]["arrival"] = {"type": "closed", "concurrency": 8}
    independent = _run(small)
    assert grouped.makespan_ms / independent.makespan_ms == pytest.approx(6 / 5, rel=0.05)


def test_max_running_requests_caps_the_batch(small):
    small["workload"].update(num_requests=10, arrival={"type": "closed", "concurrency": 10})
    small["server"] = {"tp": 1, "max_running_requests": 3}
    res = _run(small)
    assert res.iterations.batch_size.max() == 3
    assert summarize(res)["ttft_ms"]["p99"] > summarize(res)["ttft_ms"]["p50"]  # queued requests wait


def test_poisson_arrivals_follow_the_rate(small):
    small["workload"].update(num_requests=400, arrival={"type": "poisson", "rate_per_s": 50.0},
                             output_tokens={"dist": "fixed", "value": 4})
    res = _run(small)
    gaps = np.diff(res.requests.arrival_ms.to_numpy()) / 1e3
    assert gaps.mean() == pytest.approx(1 / 50.0, rel=0.15)


def test_speculative_requests_take_fewer_iterations(small):
    small["workload"]["num_requests"] = 1
    small["workload"]["output_tokens"] = {"dist": "fixed", "value": 400}
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"chain_rates": [1.0, 1.0, 1.0]}  # every draft accepted: 4 tokens per step
    res = _run(small)
    assert res.requests.verify_steps[0] == int(np.ceil(399 / 4))
    assert summarize(res)["accept_length"] == pytest.approx(399 / 100)


def test_output_lengths_are_respected_exactly(small):
    small["workload"].update(num_requests=20, arrival={"type": "closed", "concurrency": 5},
                             output_tokens={"dist": "uniform", "low": 5, "high": 90})
    small["speculative"] = {"algorithm": "ngram", "num_draft_tokens": 6}
    small["acceptance"] = {"accept_length": 3.0}
    res = _run(small)
    from simspec.workload import make_requests

    seq = np.random.SeedSequence(0).spawn(2)[0]
    specs = make_requests(res.resolved.scenario.workload, np.random.default_rng(seq))
    assert res.requests.output_tokens.tolist() == specs.output_tokens.tolist()


def test_a_shared_prompt_prefix_is_computed_once_then_served_from_the_cache(small):
    """shared_prefix_tokens: the first prefill computes whole prompts; later ones compute only what follows the
    prefix while attending to it, so they cost less; decode steps, which read every prompt's KV whole, do not
    change; and the KV cache holds the prefix once."""
    small["workload"].update(num_requests=6, arrival={"type": "closed", "concurrency": 2},
                             input_tokens={"dist": "fixed", "value": 1000})
    plain = _run(small)
    small["workload"]["shared_prefix_tokens"] = 900
    shared = _run(small)
    pre_plain = plain.iterations[plain.iterations.kind == "prefill"]
    pre_shared = shared.iterations[shared.iterations.kind == "prefill"]
    model = IterationModel(shared.resolved)
    # the first prefill (both clients' prompts) computes the prefix; the later ones 100 tokens each, attending to it
    first = pre_shared.iloc[0]
    assert first.end_ms - first.start_ms == pytest.approx(model.prefill([1000, 1000]).total_ms)
    later = pre_shared.iloc[1:]
    assert len(later) and all(later.end_ms - later.start_ms < 0.5 * (pre_plain.end_ms - pre_plain.start_ms).iloc[1:])
    n = int(later.batch_size.iloc[0])  # the two clients' requests finish, and are replaced, together
    assert (later.end_ms - later.start_ms).iloc[0] == pytest.approx(model.prefill([100] * n, [900.0] * n).total_ms)
    # decode steps read the same KV either way
    dec_plain = plain.iterations[plain.iterations.kind == "decode"]
    dec_shared = shared.iterations[shared.iterations.kind == "decode"]
    assert (dec_shared.end_ms - dec_shared.start_ms).sum() == pytest.approx(
        (dec_plain.end_ms - dec_plain.start_ms).sum())
    assert shared.makespan_ms < plain.makespan_ms


def test_the_kv_cache_holds_a_cached_shared_prefix_once_and_admission_counts_it(small):
    """8,500-token prompts of which 8,000 are shared, 8-token outputs, a ~9,500-token KV cache: the cache holds the
    prefix once and each request's own 508 tokens, so a few run together and nothing is retracted. Admission into
    an idle engine must count the cached prefix too (the request it admits locks it)."""
    small["server"]["mem_fraction_static"] = 0.205
    small["workload"].update(num_requests=40, arrival={"type": "closed", "concurrency": 8},
                             input_tokens={"dist": "fixed", "value": 8500}, output_tokens={"dist": "fixed", "value": 8},
                             shared_prefix_tokens=8000)
    res = _run(small)
    capacity = res.resolved.kv_capacity_tokens
    assert 8500 + 8 < capacity < 2 * (8500 + 8)  # without the shared prefix, one request at a time
    assert res.requests.retractions.sum() == 0
    decode = res.iterations[res.iterations.kind == "decode"]
    together = int(decode.batch_size.max())
    assert 1 < together <= (capacity - 8000) // (500 + 8)


def test_a_long_prompt_after_a_cached_prefix_runs_in_chunks_that_attend_to_it(small):
    small["server"]["chunked_prefill_size"] = 512
    small["workload"].update(num_requests=2, input_tokens={"dist": "fixed", "value": 2000},
                             shared_prefix_tokens=900)
    res = _run(small)
    model = IterationModel(res.resolved)
    pre = res.iterations[res.iterations.kind == "prefill"]
    took = list(pre.end_ms - pre.start_ms)
    first = sum(model.prefill([512], [float(done)]).total_ms for done in range(0, 2000, 512)[:3]) + model.prefill(
        [2000 - 3 * 512], [float(3 * 512)]).total_ms
    assert sum(took[:4]) == pytest.approx(first)  # the first request computes its whole prompt, prefix included
    # the second computes the 1,100 tokens after the prefix, each chunk attending to the prefix and the chunks before
    assert took[4:] == pytest.approx([model.prefill([512], [900.0]).total_ms, model.prefill([512], [1412.0]).total_ms,
                                      model.prefill([76], [1924.0]).total_ms])


@pytest.mark.parametrize("dist, shortest", [
    ({"dist": "fixed", "value": 10}, 10),
    ({"dist": "fixed", "value": 10, "min": 20}, 20),  # samples are clipped to [min, max]
    ({"dist": "fixed", "value": 100, "max": 50}, 50),
    ({"dist": "uniform", "low": 50, "high": 90}, 50),
    ({"dist": "uniform", "low": 5, "high": 90, "min": 8}, 8),
    ({"dist": "lognormal", "mean": 500, "std": 100}, 1),
    ({"dist": "normal", "mean": 500, "std": 100, "min": 300}, 300),
    ({"dist": "bench_serving_random", "value": 1000}, 1),
    ({"dist": "bench_serving_random", "value": 1000, "range_ratio": 0.5}, 500),
])
def test_shortest_length_a_distribution_can_draw(dist, shortest):
    from simspec.scenario.schema import LengthDistribution
    from simspec.workload import bench_serving_random_lengths, sample_lengths

    d = LengthDistribution.model_validate(dist)
    assert d.shortest == shortest
    if d.dist == "bench_serving_random":
        drawn = bench_serving_random_lengths(d, d, 2000)[0]
    else:
        drawn = sample_lengths(d, 2000, np.random.default_rng(0))
    assert drawn.min() >= shortest


# Totals SGLang's bench_serving printed for `--dataset-name random --random-input-len 1000 --random-output-len 1000`
# at its default seed and range ratio (the SGLang cookbook's Qwen3 page, client 0.5.6, and its Llama 3.1 page, a
# client with 0.5.8's compute_random_lens; the 8000-token prompts are the Llama page's): a replay must give them.
@pytest.mark.parametrize("prompt_len, n, zero_floor, totals", [
    (1000, 10, True, (6101, 4210)),
    (1000, 80, True, (39668, 40725)),
    (1000, 10, False, (6101, 4220)),
    (1000, 500, False, (249831, 252662)),
    (8000, 320, False, (1273893, 170000)),
])
def test_bench_serving_random_lengths_replay_the_clients_draws(prompt_len, n, zero_floor, totals):
    from simspec.scenario.schema import Workload
    from simspec.workload import make_requests

    w = Workload.model_validate({
        "arrival": {"type": "closed", "concurrency": 1}, "num_requests": n,
        "input_tokens": {"dist": "bench_serving_random", "value": prompt_len},
        "output_tokens": {"dist": "bench_serving_random", "value": 1000, "zero_floor": zero_floor}})
    spec = make_requests(w, np.random.default_rng(123))  # the scenario's own generator plays no part
    assert (int(spec.input_tokens.sum()), int(spec.output_tokens.sum())) == totals
    assert spec.input_tokens.min() >= 1 and spec.input_tokens.max() <= prompt_len
    assert spec.output_tokens.min() >= 1 and spec.output_tokens.max() <= 1000


def test_a_zero_output_draw_is_clipped_to_one_token():
    """bench_serving before 0.5.8 can draw a 0-token output (500 prompts at seed 1 draw one); simspec runs it as 1."""
    from simspec.scenario.schema import LengthDistribution
    from simspec.workload import bench_serving_random_lengths

    d = LengthDistribution(dist="bench_serving_random", value=1000)
    raw = np.random.RandomState(1)
    raw.randint(1, 1001, size=500)
    drawn = raw.randint(0, 1001, size=500)
    assert (drawn == 0).sum() == 1
    _, outputs = bench_serving_random_lengths(d, d.model_copy(update={"zero_floor": True}), 500)
    assert outputs.sum() == drawn.sum() + 1 and outputs.min() == 1


@pytest.mark.parametrize("change, message", [
    ({"input_tokens": {"dist": "fixed", "value": 10}}, "give it for both"),
    ({"output_tokens": {"dist": "bench_serving_random", "value": 100, "seed": 2}}, "share seed and range_ratio"),
    ({"input_tokens": {"dist": "bench_serving_random", "value": 100, "zero_floor": True}}, "output_tokens only"),
    ({"input_tokens": {"dist": "fixed", "value": 10, "seed": 3},
      "output_tokens": {"dist": "fixed", "value": 10}}, "belong to dist 'bench_serving_random' only"),
])
def test_bench_serving_random_lengths_are_checked(change, message):
    from pydantic import ValidationError

    from simspec.scenario.schema import Workload

    base = {"arrival": {"type": "closed", "concurrency": 1}, "num_requests": 4,
            "input_tokens": {"dist": "bench_serving_random", "value": 100},
            "output_tokens": {"dist": "bench_serving_random", "value": 100}}
    with pytest.raises(ValidationError, match=message):
        Workload.model_validate(base | change)


def test_followup_turns_carry_the_conversation_so_far():
    """arrival.followup_tokens: a later turn's prompt is the previous turn's prompt and output, then its new message;
    the carried part is what the radix cache holds for it. Without follow-ups the draws are those of before."""
    from simspec.scenario.schema import Workload
    from simspec.workload import make_requests

    base = {"arrival": {"type": "closed", "concurrency": 2, "turns": 3}, "num_requests": 12,
            "input_tokens": {"dist": "uniform", "low": 100, "high": 200},
            "output_tokens": {"dist": "uniform", "low": 50, "high": 80}}
    plain = make_requests(Workload.model_validate(base), np.random.default_rng(7))
    carried = dict(base, arrival=dict(base["arrival"], followup_tokens={"dist": "uniform", "low": 10, "high": 20}))
    spec = make_requests(Workload.model_validate(carried), np.random.default_rng(7))
    assert (spec.output_tokens == plain.output_tokens).all()
    first = np.arange(0, 12, 3)
    assert (spec.input_tokens[first] == plain.input_tokens[first]).all() and (spec.carried_tokens[first] == 0).all()
    for rid in range(12):
        if rid % 3:
            assert spec.carried_tokens[rid] == spec.input_tokens[rid - 1] + spec.output_tokens[rid - 1]
            assert 10 <= spec.input_tokens[rid] - spec.carried_tokens[rid] <= 20
    assert plain.carried_tokens is None


def test_a_followup_turn_prefills_its_new_message_attending_to_the_conversation(small):
    small["workload"].update(num_requests=2, arrival={"type": "closed", "concurrency": 1, "turns": 2,
                                                      "followup_tokens": {"dist": "fixed", "value": 30}},
                             input_tokens={"dist": "fixed", "value": 500},
                             output_tokens={"dist": "fixed", "value": 200})
    res = _run(small)
    model = IterationModel(res.resolved)
    pre = res.iterations[res.iterations.kind == "prefill"]
    took = list(pre.end_ms - pre.start_ms)
    assert took == pytest.approx([model.prefill([500]).total_ms, model.prefill([30], [700.0]).total_ms])
    assert list(res.requests.input_tokens) == [500, 730]
    # its decode steps read the whole conversation: the last one attends to 730 + 199 tokens
    last = res.iterations[res.iterations.kind == "decode"].iloc[-1]
    assert last.end_ms - last.start_ms == pytest.approx(model.decode(1, 730 + 199).total_ms)


def test_admitting_a_followup_turn_counts_the_conversation_it_locks(small):
    """Two conversations whose second turns each hold ~6,000 KV tokens, a ~9,500-token cache: the second turns
    must run one at a time (admission counts the carried conversation, not just the new message), unretracted."""
    small["server"]["mem_fraction_static"] = 0.205
    small["workload"].update(num_requests=4, arrival={"type": "closed", "concurrency": 2, "turns": 2,
                                                      "followup_tokens": {"dist": "fixed", "value": 50}},
                             input_tokens={"dist": "fixed", "value": 3000},
                             output_tokens={"dist": "fixed", "value": 3000})
    res = _run(small)
    assert 6050 + 3000 < res.resolved.kv_capacity_tokens < 2 * 6050
    assert res.requests.retractions.sum() == 0
    second = res.requests.iloc[[1, 3]]
    overlap = min(second.finish_ms) - max(second.first_token_ms)
    assert overlap <= 0  # the two second turns never decode together


def test_predict_reports_what_the_radix_cache_served(small, tmp_path):
    """Three requests in sequence whose 1,000-token prompts share 900: the first prefill computes 1,000 tokens,
    the next two 100 each; the cache serves 900 twice. predict's JSON and table say so."""
    import json

    import yaml
    from click.testing import CliRunner

    from simspec.cli import main

    small["workload"].update(num_requests=3, input_tokens={"dist": "fixed", "value": 1000}, shared_prefix_tokens=900)
    figures = summarize(_run(small))
    assert (figures["prefill_tokens"], figures["cached_prompt_tokens"]) == (1200, 1800)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(small))
    out = CliRunner().invoke(main, ["predict", str(path), "--json"])
    assert out.exit_code == 0 and json.loads(out.output)["cached_prompt_tokens"] == 1800
    table = CliRunner().invoke(main, ["predict", str(path)]).output
    assert "prompt tokens from the radix cache" in table and "1,800" in table


def _served(small, outputs, *, concurrency, overlap, recv_interval=1):
    """Run the engine itself over fixed 10-token prompts and the given outputs; (iteration kinds, recorder)."""
    import simpy

    from simspec.engine import ServingEngine
    from simspec.workload import RequestSpecs

    rs = resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    n = len(outputs)
    specs = RequestSpecs(np.full(n, 10, dtype=np.int64), np.asarray(outputs, dtype=np.int64), None)
    env = simpy.Environment()
    eng = ServingEngine(env, IterationModel(rs), specs, None, max_running=64, kv_capacity_tokens=100_000,
                        chunked_prefill_tokens=8192, concurrency=concurrency, overlap=overlap,
                        recv_interval=recv_interval)
    env.run(until=eng.done)
    return list(eng.rec.iterations().kind), eng.rec


@pytest.mark.parametrize("overlap, waits", [(False, 1), (True, 2)])
def test_a_closed_loop_clients_next_request_waits_for_the_schedulers_next_receive(small, overlap, waits):
    """A (3 tokens) finishes in the 2nd decode step while B runs on. Its client's next request, C, leaves after A's
    last token is streamed, so the turn after that step has already looked: without overlap C is received one
    step later; with overlap the turn that ends a step picked its batch as the step began, so two."""
    kinds, rec = _served(small, [3, 10, 5], concurrency=2, overlap=overlap)
    assert kinds[:3 + waits + 1] == ["prefill", "decode", "decode"] + ["decode"] * waits + ["prefill"]
    # C's time to first token is those decode steps and its own prefill
    it = rec.iterations()
    prefill_c = it.iloc[3 + waits]
    assert rec.arrival_ms[2] == pytest.approx(it.end_ms.iloc[2])
    assert rec.first_token_ms[2] - rec.arrival_ms[2] == pytest.approx(
        it.end_ms.iloc[2 + waits] - it.end_ms.iloc[2] + prefill_c.end_ms - prefill_c.start_ms)


def test_an_idle_engine_receives_a_request_at_once(small):
    """One client: when its request ends nothing runs, and the idle scheduler loop takes the next at once."""
    kinds, rec = _served(small, [3, 3], concurrency=1, overlap=True, recv_interval=30)
    assert kinds == ["prefill", "decode", "decode", "prefill", "decode", "decode"]
    assert rec.first_token_ms[1] - rec.arrival_ms[1] == pytest.approx(rec.first_token_ms[0] - rec.arrival_ms[0])


def test_scheduler_recv_interval_receives_every_n_decode_turns_and_after_a_prefill(small):
    """--scheduler-recv-interval 4: the turn after the prefill receives (weight 1000) and resets the count; the
    decode turns then count 1 each, so C (sent as the 2nd decode step ends) is received after the 4th."""
    kinds, rec = _served(small, [3, 12, 5], concurrency=2, overlap=False, recv_interval=4)
    assert kinds[:6] == ["prefill"] + ["decode"] * 4 + ["prefill"]
    every_turn, _ = _served(small, [3, 12, 5], concurrency=2, overlap=False)
    assert every_turn[:5] == ["prefill"] + ["decode"] * 3 + ["prefill"]


def test_scheduler_recv_interval_is_refused_where_it_is_not_modelled(small):
    from simspec.errors import InputError

    small["server"] = {"tp": 1, "sglang_version": "0.4.6.post1", "scheduler_recv_interval": 10}
    with pytest.raises(InputError, match="scheduler-recv-interval") as e:
        resolve(parse_scenario(small, "t.yaml"), "t.yaml")
    assert e.value.key == "server.scheduler_recv_interval"
