"""SGLang's KV admission against an output estimate, and retraction when the estimate was wrong."""

from __future__ import annotations

import numpy as np
import pytest
import simpy

from simspec import presets
from simspec.analysis.metrics import summarize
from simspec.engine import ServingEngine
from simspec.engine.admission import (
    CLIP_MAX_NEW_TOKENS,
    NEW_TOKEN_RATIO_DECAY_STEPS,
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
    decode_tokens_per_request,
)
from simspec.errors import InputError
from simspec.fastpath import predict_fast
from simspec.scenario.loader import parse_scenario, resolve
from simspec.simulate import run
from simspec.timing import IterationModel
from simspec.timing.stack import target_stack
from simspec.workload import RequestSpecs


def _resolve(d):
    return resolve(parse_scenario(d, "t.yaml"), "t.yaml")


def _tight(small, concurrency=48, requests=96, prompt=128, output=512):
    """Llama-3.1-8B on one H100 with a KV cache of a few thousand tokens; outputs uniform in
    [output / 4, output], so that requests finish at different times (identical requests in a closed loop stay
    in lockstep, and then the whole-request reservation of each admission round is all that binds)."""
    s = target_stack(presets.models()["llama-3.1-8b"], tp=1)
    startup = presets.default_coefficients()["startup_memory_mib"].value  # in use before SGLang sizes the pool
    memory = (presets.gpus()["h100-sxm"].memory_mib - startup) * 2**20
    fraction = (s.weight_bytes_per_gpu + 8700 * s.kv_bytes_per_token_per_gpu) / memory
    small["server"] = {"tp": 1, "mem_fraction_static": round(fraction, 6)}
    small["workload"].update(num_requests=requests, arrival={"type": "closed", "concurrency": concurrency},
                             input_tokens={"dist": "fixed", "value": prompt},
                             output_tokens={"dist": "uniform", "low": output // 4, "high": output})
    return small


def test_new_token_ratio_decays_to_its_floor_and_resets_when_idle():
    r = NewTokenRatio.for_server(1.0)
    assert (r.init, r.floor) == pytest.approx((0.7, 0.7 * 0.14))
    for _ in range(NEW_TOKEN_RATIO_DECAY_STEPS // 2):
        r.decode_step()
    assert r.value == pytest.approx((0.7 + 0.098) / 2)
    for _ in range(NEW_TOKEN_RATIO_DECAY_STEPS):
        r.decode_step()
    assert r.value == pytest.approx(0.098)
    r.idle()
    assert r.value == 0.7
    assert NewTokenRatio.for_server(2.0).init == 1.0  # min(1, 0.7 x conservativeness)


def test_retraction_sets_the_ratio_from_what_the_survivors_decoded():
    r = NewTokenRatio.for_server(1.0)
    r.after_retraction(np.array([10, 30]), np.array([100, 100]))
    assert r.value == pytest.approx((40 + 2 * RETRACT_DECODE_STEPS) / 201)
    r.after_retraction(np.array([100, 100]), np.array([100, 100]))
    assert r.value == 1.0


def test_speculation_needs_room_for_its_drafts():
    assert decode_tokens_per_request("none", 0, 0, 0) == 1
    assert decode_tokens_per_request("eagle3", 4, 4, 16) == 16 + 16
    assert decode_tokens_per_request("eagle", 3, 1, 4) == 4 + 3
    # n-gram: SGLang sets topk to the BFS breadth, one step
    assert decode_tokens_per_request("ngram", 0, 0, 12, ngram_max_bfs_breadth=10) == 12 + 10


def test_admission_packs_more_requests_than_whole_reservations_would(small):
    rs = _resolve(_tight(small))
    whole = rs.kv_capacity_tokens // (128 + 512)
    assert 4 <= whole < 48  # the cache is the binding limit
    res = run(rs)
    dec = res.iterations[res.iterations.kind == "decode"]
    assert dec.batch_size.max() > whole
    assert summarize(res)["mean_batch_size"] > whole
    # every request still generates exactly its sampled output, retracted or not
    from simspec.workload import make_requests

    seq = np.random.SeedSequence(0).spawn(2)[0]
    specs = make_requests(rs.scenario.workload, np.random.default_rng(seq))
    assert res.requests.output_tokens.tolist() == specs.output_tokens.tolist()
    assert res.requests.retractions.sum() > 0


def test_the_cache_never_holds_more_than_its_capacity(small, monkeypatch):
    rs = _resolve(_tight(small, output=700))
    seen = []
    original = ServingEngine._decode

    def checked(self):
        seen.append(self.context_sum + len(self.run_ids))  # KV after this step's tokens
        assert self.context_sum + len(self.run_ids) <= self.kv_capacity or len(self.run_ids) == 1
        yield from original(self)

    monkeypatch.setattr(ServingEngine, "_decode", checked)
    res = run(rs)
    assert max(seen) > 0.9 * rs.kv_capacity_tokens  # it does run close to full
    assert res.requests.retractions.sum() > 0


def _engine(rs, inputs, outputs, *, latest_first=False, capacity=1000, decode_tokens=1):
    specs = RequestSpecs(np.asarray(inputs, dtype=np.int64), np.asarray(outputs, dtype=np.int64), None)
    env = simpy.Environment()
    eng = ServingEngine(env, IterationModel(rs), specs, None, max_running=64, kv_capacity_tokens=capacity,
                        chunked_prefill_tokens=8192, concurrency=0, retract_latest_first=latest_first,
                        decode_tokens_per_request=decode_tokens)
    return eng


def test_retraction_takes_the_request_with_fewest_tokens_generated_first(small):
    rs = _resolve(small)
    eng = _engine(rs, [100, 30, 20, 250], [400, 400, 400, 400], decode_tokens=20)
    eng.run_ids = np.arange(4)
    eng.run_remaining = np.array([100, 390, 390, 200])  # generated 300, 10, 10, 200
    eng.run_joined = np.zeros(4, dtype=np.int64)
    eng.decode_iterations = 5
    eng.context_sum = 999  # one free token, 4 x 20 needed for the next step: retract
    eng._make_room_for_decode()
    # fewest generated first, the longer prompt first between equals; then until the survivors' next step
    # fits (1 + 40 freed < 3 x 20, 1 + 40 + 30 >= 2 x 20)
    assert list(eng.waiting) == [1, 2]
    assert eng.left_at_admission[1] == 390 and eng.rec.retractions[1] == 1 and eng.rec.verify_steps[1] == 5
    assert eng.context_sum == 999 - 40 - 30
    assert eng.ratio.value == pytest.approx((300 + 200 + 2 * RETRACT_DECODE_STEPS) / 801)
    assert 0 in eng.run_ids  # the most advanced request stays


def test_speculative_batches_retract_from_the_back(small):
    rs = _resolve(small)
    eng = _engine(rs, [100, 100, 100], [400, 400, 400], latest_first=True)
    eng.run_ids = np.array([2, 0, 1])
    eng.run_remaining = np.array([390, 100, 300])
    eng.run_joined = np.zeros(3, dtype=np.int64)
    eng.decode_iterations = 5
    eng.context_sum = 999
    eng._make_room_for_decode()
    assert list(eng.waiting)[0] == 1  # the last in the batch, however far it got
    assert eng.run_ids[0] == 2


def test_a_retracted_request_resumes_where_it_stopped(small):
    small = _tight(small, concurrency=48, requests=96, output=512)
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"chain_rates": [1.0, 1.0, 1.0]}  # 4 tokens per verify step, always
    res = run(_resolve(small))
    req = res.requests
    assert req.retractions.sum() > 0
    # tokens from verify steps: 4 per step except each stint's last (cut at what is left)
    verified = req.output_tokens - 1 - req.retractions
    assert (verified <= 4 * req.verify_steps).all()
    assert (verified > 4 * (req.verify_steps - 1 - req.retractions)).all()
    assert 3.9 < summarize(res)["accept_length"] <= 4.0


def test_output_estimates_are_clipped():
    from simspec.engine.admission import output_estimate

    assert output_estimate(10_000) == CLIP_MAX_NEW_TOKENS
    assert list(output_estimate(np.array([5, 5000]))) == [5, CLIP_MAX_NEW_TOKENS]


def test_the_fast_path_leaves_a_binding_cache_to_the_engine(small):
    small = _tight(small)
    small["workload"]["output_tokens"] = {"dist": "fixed", "value": 512}
    rs = _resolve(small)
    with pytest.raises(InputError, match="KV cache binds"):
        predict_fast(rs)


def test_schedule_conservativeness_packs_fewer_requests(small):
    loose = run(_resolve(_tight(small)))
    small["server"]["schedule_conservativeness"] = 1.4
    strict = run(_resolve(small))
    assert summarize(strict)["mean_batch_size"] < summarize(loose)["mean_batch_size"]


def test_predict_reports_retractions_when_the_cache_ran_out(small, tmp_path):
    import json

    import yaml
    from click.testing import CliRunner

    from simspec.cli import main

    path = tmp_path / "tight.yaml"
    path.write_text(yaml.safe_dump(_tight(small)))
    table = CliRunner().invoke(main, ["predict", str(path)])
    assert table.exit_code == 0, table.output
    data = json.loads(CliRunner().invoke(main, ["predict", str(path), "--json"]).output)
    assert data["retractions"] > 0
    assert "retractions (KV cache full)" in table.output
    roomy = CliRunner().invoke(main, ["predict", str(path), "--set", "server.mem_fraction_static=0.8"])
    assert "retractions" not in roomy.output


@pytest.mark.parametrize("speculative", [False, True])
def test_every_streamed_chunk_of_a_retracted_request_has_one_gap(small, speculative, monkeypatch):
    """Each decode step streams a chunk to every request in it and a retracted request's second prefill one
    more: the recorded inter-token gaps count exactly those and add up to each request's streaming time, whether
    a request was retracted before or after its first decode step. With a (4, 4, 16) tree a request needs 32
    free tokens per step, so requests are retracted right after their prefill too (the `fresh` bookkeeping)."""
    if speculative:
        small = _tight(small, concurrency=32, requests=96, output=64)
        small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 4,
                                "topk": 4, "num_draft_tokens": 16}
        small["acceptance"] = {"accept_length": 2.5}
    else:
        small = _tight(small, concurrency=48, requests=144, output=700)
    unfresh = []
    original = ServingEngine._unfresh
    monkeypatch.setattr(ServingEngine, "_unfresh", lambda self, t: (unfresh.append(t), original(self, t)))
    res = run(_resolve(small))
    req = res.requests
    assert req.retractions.sum() > 0
    assert bool(unfresh) == speculative
    assert res.itl_weights.sum() == req.verify_steps.sum() + req.retractions.sum()
    assert (res.itl_gaps_ms >= 0).all()
    # and each request's gaps add up to its streaming time, waits in the queue after a retraction included
    streamed = (req.finish_ms - req.first_token_ms).sum()
    assert (res.itl_gaps_ms * res.itl_weights).sum() == pytest.approx(streamed, rel=1e-9)


def test_a_full_batch_admits_again_one_decode_step_after_it_shrinks(small):
    """SGLang sets batch_is_full when a prefill hits the request cap (or finds no room) and clears it only when
    update_running_batch next finds the batch smaller, so a request that finishes in a decode step is replaced
    after one more decode step; a batch that empties is refilled at once."""
    rs = _resolve(small)
    specs = RequestSpecs(np.array([10, 10, 10, 10]), np.array([3, 10, 5, 2]), None)
    env = simpy.Environment()
    eng = ServingEngine(env, IterationModel(rs), specs, None, max_running=2, kv_capacity_tokens=10_000,
                        chunked_prefill_tokens=8192, concurrency=4)
    env.run(until=eng.done)
    kinds = list(eng.rec.iterations().kind)
    # A and B prefill; A finishes in the 2nd decode step; the 3rd decode runs before C's prefill
    assert kinds[:5] == ["prefill", "decode", "decode", "decode", "prefill"]
    assert (eng.rec.finish_ms > 0).all()


def test_a_request_as_large_as_the_whole_cache_is_refused_up_front(small):
    """SGLang admits a request only when it needs fewer tokens than are free (NO_TOKEN on >=), so one that would
    fill the empty cache exactly could never run: the loader says so instead of the engine waiting forever."""
    small = _tight(small)
    capacity = _resolve(small).kv_capacity_tokens
    small["workload"]["output_tokens"] = {"dist": "fixed", "value": 100}
    small["workload"]["input_tokens"] = {"dist": "fixed", "value": capacity - 100}
    with pytest.raises(InputError, match="KV cache holds"):
        _resolve(small)
    small["workload"]["input_tokens"]["value"] = capacity - 101
    small["workload"]["num_requests"] = 2
    res = run(_resolve(small))
    assert (res.requests.output_tokens == 100).all()


def test_the_fast_path_answers_only_where_the_engine_never_retracts(small):
    import dataclasses

    small["workload"].update(num_requests=64, arrival={"type": "closed", "concurrency": 16},
                             input_tokens={"dist": "fixed", "value": 128},
                             output_tokens={"dist": "fixed", "value": 256})
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 4, "topk": 4,
                            "num_draft_tokens": 16}
    small["acceptance"] = {"accept_length": 2.5}
    rs = _resolve(small)
    whole = 16 * (128 + 256)  # every request held whole, but no room for a (4, 4, 16) step's 32 tokens each
    with pytest.raises(InputError, match="KV cache binds"):
        predict_fast(dataclasses.replace(rs, kv_capacity_tokens=whole))
    roomy = dataclasses.replace(rs, kv_capacity_tokens=whole + 16 * 32)
    fast = predict_fast(roomy)
    res = run(roomy)
    assert res.requests.retractions.sum() == 0
    assert fast["throughput_tokens_per_s"] == pytest.approx(summarize(res)["throughput_tokens_per_s"], rel=0.03)
