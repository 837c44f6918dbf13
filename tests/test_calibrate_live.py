"""The live-server client (simspec/calibration/live.py) against the fake SGLang server (tests/fake_sglang.py).

Known parameters go into the fake (step time = fixed + per request x batch, chain acceptance rates); the
client must recover them from the stream alone. Tolerances: step times within 10% at the batch sizes a
concurrency holds most of the time. Client and server share this process (and 2 cores with whatever else
runs): chunk delivery jitters by ~1 ms, several under load; segments of consecutive chunks average that
out to ~1-3% with 8 ms + 2 ms/request steps, measured with two CPU hogs running (at 4 + 1 ms errors
reached 15% under that load). The accept-length
histogram exactly; chunk-derived accept lengths exactly step by step (as a sub-multiset of the fake's
draws); the population mean within 8% (~3 standard errors of ~250 seeded draws).
"""

from __future__ import annotations

import json
import socket
import statistics
from collections import Counter
from pathlib import Path

import pytest

from simspec.calibration.live import (
    LiveServerError,
    accept_lengths_from_records,
    algorithm_name,
    describe_server,
    description_from_server_info,
    load_prompts,
    measure,
    normalise_base_url,
    parse_prometheus,
    prepare_prompts,
    requests_at,
    run_workload,
    server_step_times,
    step_times_from_records,
)
from simspec.calibration.measurements import Measurements, RequestRecord
from simspec.errors import InputError
from tests.fake_sglang import VERSIONS, FakeSGLang, Faults


@pytest.fixture(autouse=True)
def _timed(no_long_gc_pauses):
    """These tests time a live fake server in this process (tests/conftest.py no_long_gc_pauses)."""


FAST = {"progress": False, "warmup": 0, "backoff_s": 0.01, "timeout": 5.0}


@pytest.fixture(scope="module")
def prompts() -> list[dict]:
    return load_prompts()  # the shipped prompts: 40 chat conversations


def _best(meas: Measurements, batch_size: int):
    return max((s for s in meas.step_times if s.batch_size == batch_size), key=lambda s: s.samples)


# ------------------------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("version", VERSIONS)
def test_round_trip_recovers_step_times_and_acceptance(version, prompts, tmp_path):
    save = tmp_path / "meas.json"
    with FakeSGLang(version, algorithm="eagle3", chain_rates=[0.8, 0.6, 0.4], step_fixed_s=0.008,
                    step_per_request_s=0.002, seed=1) as fake:
        meas = run_workload(fake.url, prompts, [1, 4], max_new_tokens=48, num_requests=6, save_path=save, **FAST)
        draws = list(fake.accepted)

    s = meas.server
    assert (s.sglang_version, s.algorithm, s.num_steps, s.topk, s.num_draft_tokens, s.tp) == (
        version, "eagle3", 3, 1, 4, 1)
    assert s.cuda_graph is True and s.cuda_graph_max_bs == 256 and s.max_running_requests == 48
    assert s.overlap_schedule is (version == "0.5.23")  # 0.5.8/0.5.10 turn overlap off for EAGLE (v1 workers)
    assert s.raw["version"] == version

    # the fake itself: every decode iteration scheduled for exactly its configured time; as run, one record per
    # iteration, back to back (each starts where the previous ended, unless the thread idled), none ending
    # before its deadline
    assert all(end - start == pytest.approx(fake.step_time(b), abs=1e-9)
               for start, end, b, kind in fake.iterations if kind == "decode")
    pairs = list(zip(fake.realised, fake.iterations, strict=True))
    assert pairs and all(real[0] <= real[1] and real[1] >= planned[1] and real[2:] == planned[2:]
                         for real, planned in pairs)
    chained = [now[0] == before[1] for before, now in zip(fake.realised, fake.realised[1:], strict=False)]
    assert len(chained) - sum(chained) <= 12  # the thread idles at most once per request (12 requests)

    # step time per running batch size, from the chunk timing alone: the steps as the fake's thread ran them
    # (its configured times on an idle machine; a loaded one wakes the thread late)
    for bs in (1, 4):
        got = _best(meas, bs)
        assert got.source == "live" and got.samples >= 10
        assert got.seconds == pytest.approx(fake.realised_step_time(bs), rel=0.10), (bs, got, fake.step_time(bs))

    # every request, every token
    assert len(meas.requests) == 12 and meas.done_concurrencies == [1, 4]
    assert sorted(Counter(r.concurrency for r in meas.requests).items()) == [(1, 6), (4, 6)]
    for r in meas.requests:
        assert r.completion_tokens == 48 and len(r.output_ids) == 48 and sum(r.chunk_tokens) == 48
        assert r.finish_reason == "length" and r.spec_verify_ct == len(r.chunk_tokens) - 1
        assert r.chunk_tokens[0] == 1 and len(r.chunk_times) == len(r.chunk_tokens)
        assert r.prompt_tokens > 0 and r.e2e_latency is not None and r.e2e_latency > 0

    # acceptance: the histogram where the version has one, exactly
    hists = [r.accept_histogram for r in meas.requests]
    if version == "0.5.8":
        assert all(h is None for h in hists)
    else:
        total: Counter = Counter()
        for h in hists:
            total.update(h)
        assert {k: v for k, v in total.items() if v} == Counter(draws)
    # per-step accept lengths from chunk sizes: each one a step the fake drew (first and last chunks left out)
    assert len(meas.accept_lengths) == sum(len(r.chunk_tokens) - 2 for r in meas.requests)
    assert not Counter(int(a) - 1 for a in meas.accept_lengths) - Counter(draws)
    assert statistics.mean(meas.accept_lengths) == pytest.approx(1 + statistics.mean(draws), rel=0.03)
    assert statistics.mean(meas.accept_lengths) == pytest.approx(fake.expected_accept_length(), rel=0.08)

    # whole-run figures
    tp1 = next(t for t in meas.throughput if t.concurrency == 1)
    at1 = [r for r in meas.requests if r.concurrency == 1]
    expect = statistics.mean((r.completion_tokens - 1) / (r.spec_verify_ct * fake.realised_step_time(1)) for r in at1)
    assert tp1.tokens_per_s == pytest.approx(expect, rel=0.10)
    assert tp1.accept_length == pytest.approx(sum(r.completion_tokens for r in at1)
                                              / sum(r.spec_verify_ct for r in at1))
    tp4 = next(t for t in meas.throughput if t.concurrency == 4)
    assert tp4.throughput_tokens_per_s > tp1.throughput_tokens_per_s

    # /metrics before and after each concurrency, and the latest values under bare names
    assert meas.prometheus["sglang:num_requests_total"] == 12
    key = 'sglang:num_requests_total{engine_type="unified",model_name="fake-org/Fake-Llama-3-8B-Instruct",' \
          'pp_rank="0",simspec_concurrency="4",simspec_point="before",tp_rank="0"}'
    assert meas.prometheus[key] == 6
    assert ("sglang:spec_verify_calls_total" in meas.prometheus) is (version == "0.5.23")
    assert meas.prometheus["sglang:spec_accept_length"] > 1

    # provenance and the saved copy
    assert f"live:{fake.url}" in meas.sources
    how = " ".join(meas.sources)
    assert ("server's own chat template" in how) if version == "0.5.23" else ("generic 'llama3' template" in how)
    assert Measurements.load(save) == meas


def test_baseline_server_without_speculation(prompts):
    with FakeSGLang("0.5.10", algorithm="none", step_fixed_s=0.008, step_per_request_s=0.002) as fake:
        meas = run_workload(fake.url, prompts, [2], max_new_tokens=32, num_requests=4, **FAST)
    assert meas.server.algorithm == "none" and meas.server.num_steps is None
    assert meas.server.overlap_schedule is True
    assert meas.accept_lengths == []
    assert all(r.spec_verify_ct is None and r.accept_histogram is None for r in meas.requests)
    assert all(set(r.chunk_tokens) == {1} and r.completion_tokens == 32 for r in meas.requests)
    assert meas.throughput[0].accept_length is None
    assert _best(meas, 2).seconds == pytest.approx(fake.realised_step_time(2), rel=0.10)


@pytest.mark.parametrize("version", ["0.5.8", "0.5.23"])
def test_incremental_streaming_output_is_assembled(version, prompts):
    with FakeSGLang(version, algorithm="mtp", chain_rates=[0.7], incremental=True) as fake:
        meas = run_workload(fake.url, prompts[:2], [1], max_new_tokens=20, num_requests=2, **FAST)
    assert meas.server.algorithm == "mtp"  # NEXTN shows as EAGLE with the target as its own draft model
    assert meas.server.raw.get("stream_output", meas.server.raw.get("incremental_streaming_output")) is True
    for r in meas.requests:
        assert len(r.output_ids) == r.completion_tokens == 20 == sum(r.chunk_tokens)
        assert max(r.chunk_tokens) <= 2


def test_cumulative_or_incremental_guessed_when_the_server_does_not_say(prompts):
    """No streaming flag in /server_info: told apart by comparing output_ids with completion_tokens."""
    for incremental in (False, True):
        with FakeSGLang("0.5.10", algorithm="eagle", chain_rates=[0.9, 0.9], incremental=incremental) as fake:
            desc = describe_server(fake.url)
            desc.raw.pop("incremental_streaming_output")
            meas = run_workload(fake.url, prompts[:1], [1], max_new_tokens=16, num_requests=1, server=desc, **FAST)
        assert [len(r.output_ids) for r in meas.requests] == [16]


def test_progress_bar_created_or_passed_in(prompts):
    from rich.console import Console
    from rich.progress import Progress

    with FakeSGLang("0.5.10") as fake:
        run_workload(fake.url, prompts[:1], [1], max_new_tokens=4, num_requests=1,
                     **{**FAST, "progress": True})
        console = Console(record=True, width=100, file=open("/dev/null", "w"))  # noqa: SIM115
        with Progress(console=console) as bar:
            run_workload(fake.url, prompts[:1], [1, 2], max_new_tokens=4, num_requests=2, **{**FAST, "progress": bar})
            descriptions = [t.description for t in bar.tasks]
    assert descriptions == ["concurrency 1: 2 requests, up to 4 tokens each",
                            "concurrency 2: 2 requests, up to 4 tokens each"]


# ------------------------------------------------------------------------------------------ robustness


def test_transient_errors_are_retried(prompts):
    faults = Faults(http_status={2: 503, 3: 429}, drop_connection=(5, 2))
    with FakeSGLang("0.5.10", faults=faults) as fake:
        meas = run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=3, **FAST)
        calls = fake.calls
    assert len(meas.requests) == 3 and all(r.completion_tokens == 8 for r in meas.requests)
    assert calls == 6  # 3 requests + 2 refusals + 1 dropped stream, each retried


def test_persistent_5xx_gives_up_after_bounded_retries(prompts, tmp_path):
    save = tmp_path / "m.json"
    with FakeSGLang("0.5.10", faults=Faults(http_status={1: 500, 2: 500, 3: 500})) as fake:
        with pytest.raises(LiveServerError) as ei:
            run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=2, save_path=save, **FAST)
        assert fake.calls == 3
    msg = str(ei.value)
    assert f"POST {fake.url}/generate failed 3 times: HTTP 500: Internal Server Error" in msg
    assert f"saved to {save}" in msg and ei.value.saved_to == str(save) and ei.value.status == 500
    assert Measurements.load(save).done_concurrencies == []


@pytest.mark.parametrize("version", ["0.5.10", "0.5.23"])
def test_4xx_is_not_retried_and_says_why(version, prompts):
    with FakeSGLang(version, faults=Faults(http_status={1: 400})) as fake:
        with pytest.raises(LiveServerError) as ei:
            run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=2, **FAST)
        assert fake.calls == 1
    msg = str(ei.value)
    assert msg.startswith(f"POST {fake.url}/generate answered HTTP 400: Input length (40000 tokens) exceeds")
    assert "not saved: no save path given" in msg
    assert isinstance(ei.value, InputError) and ei.value.endpoint == "/generate" and ei.value.status == 400


def test_malformed_chunk_names_the_endpoint_and_what_came(prompts):
    with FakeSGLang("0.5.23", faults=Faults(malformed_chunk=(1, 2))) as fake:
        with pytest.raises(LiveServerError) as ei:
            run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=1, **FAST)
    msg = str(ei.value)
    assert f"POST {fake.url}/generate sent a stream chunk that is not JSON" in msg
    assert '{"text": "oops", "meta_info": {"completion_tok' in msg


def test_error_sent_inside_the_stream(prompts):
    with FakeSGLang("0.5.23", faults=Faults(stream_error=1)) as fake:
        with pytest.raises(LiveServerError, match="reported an error mid-stream: The prompt is too long"):
            run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=1, **FAST)


def test_read_timeout(prompts):
    with FakeSGLang("0.5.10", faults=Faults(hang=(1, 1), hang_s=3.0)) as fake:
        with pytest.raises(LiveServerError, match=r"/generate: no data for 0\.3 s \(read timeout"):
            run_workload(fake.url, prompts, [1], max_new_tokens=8, num_requests=1, **{**FAST, "timeout": 0.3})


def test_missing_meta_info_fields_are_tolerated(prompts):
    omit = ("completion_tokens", "prompt_tokens", "spec_verify_ct", "spec_accept_histogram", "e2e_latency")
    with FakeSGLang("0.5.10", faults=Faults(omit_meta=omit)) as fake:
        meas = run_workload(fake.url, prompts, [1], max_new_tokens=12, num_requests=2, **FAST)
    for r in meas.requests:  # the token count comes from the cumulative output_ids instead
        assert r.completion_tokens == 12 == sum(r.chunk_tokens)
        assert r.spec_verify_ct is None and r.accept_histogram is None
    assert meas.accept_lengths and meas.throughput[0].accept_length is not None  # from the chunk sizes


def test_server_without_metrics_or_new_server_info(prompts):
    with FakeSGLang("0.5.8", enable_metrics=False, server_info_paths=("/get_server_info",)) as fake:
        assert describe_server(fake.url).sglang_version == "0.5.8"
        meas = run_workload(fake.url, prompts, [1], max_new_tokens=6, num_requests=1, **FAST)
    assert meas.prometheus == {} and len(meas.requests) == 1
    with FakeSGLang("0.5.8", server_info_paths=()) as fake:
        with pytest.raises(LiveServerError, match="answers neither GET /server_info nor GET /get_server_info"):
            describe_server(fake.url)


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_host_is_an_input_error(prompts, tmp_path):
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(InputError) as ei:
        describe_server(url, retries=2, backoff_s=0.01)
    msg = str(ei.value)
    assert msg.startswith(f"cannot reach an SGLang server at {url} (GET /server_info:")
    assert "2 tries): is the server up, and are host and port right?" in msg
    save = tmp_path / "m.json"
    with pytest.raises(InputError, match="cannot reach an SGLang server"):
        run_workload(url, prompts, [1], save_path=save, **FAST)
    assert not save.exists()  # nothing was measured, nothing written


def test_server_stopping_mid_run_saves_and_resume_skips_finished_concurrencies(prompts, tmp_path):
    save = tmp_path / "meas.json"
    n1, n2 = requests_at(1, 3), requests_at(2, 3)
    with FakeSGLang("0.5.10", faults=Faults(stop_after=n1 + 1)) as fake:
        with pytest.raises(LiveServerError) as ei:
            run_workload(fake.url, prompts, [1, 2], max_new_tokens=10, num_requests=3, save_path=save, **FAST)
    msg = str(ei.value)
    assert f"cannot reach an SGLang server at {fake.url}" in msg or "failed 3 times" in msg
    assert f"concurrencies done: [1]) saved to {save}; resume from that file to continue" in msg
    saved = Measurements.load(save)
    assert saved.done_concurrencies == [1]
    assert sum(r.concurrency == 1 for r in saved.requests) == n1
    assert 1 <= sum(r.concurrency == 2 for r in saved.requests) < n2  # the unfinished level's finished ones
    assert ei.value.partial == saved

    with FakeSGLang("0.5.10") as again:
        meas = run_workload(again.url, prompts, [1, 2], max_new_tokens=10, num_requests=3, measurements=saved,
                            save_path=save, **FAST)
        assert again.calls == n2  # only concurrency 2 ran
    assert meas.done_concurrencies == [1, 2]
    assert [r for r in meas.requests if r.concurrency == 1] == [r for r in saved.requests if r.concurrency == 1]
    assert sum(r.concurrency == 2 for r in meas.requests) == n2
    assert [t.concurrency for t in meas.throughput] == [1, 2]
    assert Measurements.load(save) == meas


def test_resume_refuses_another_servers_measurements(prompts):
    with FakeSGLang("0.5.10", algorithm="eagle3") as fake:
        meas = run_workload(fake.url, prompts, [1], max_new_tokens=4, num_requests=1, **FAST)
    with FakeSGLang("0.5.10", algorithm="ngram", chain_rates=[0.5] * 5) as other:
        with pytest.raises(InputError, match=r"came from a different server \(algorithm: 'eagle3' then, 'ngram' now"):
            run_workload(other.url, prompts, [1, 2], max_new_tokens=4, measurements=meas, **FAST)


# ------------------------------------------------------------------------------------------ pieces


def test_server_info_field_names_per_version():
    assert [algorithm_name(a) for a in ("EAGLE", "EAGLE3", "NEXTN", "STANDALONE", "NGRAM", "LOOKAHEAD", None)] == [
        "eagle", "eagle3", "mtp", "standalone", "ngram", "ngram", "none"]
    assert algorithm_name("EAGLE", model_path="deepseek-ai/DeepSeek-V3",
                          draft_model_path="deepseek-ai/DeepSeek-V3") == "mtp"
    old = FakeSGLang("0.5.8", algorithm="ngram", chain_rates=[0.5] * 7).server_info()
    d = description_from_server_info(old)
    assert d.algorithm == "ngram" and d.num_draft_tokens == 8
    assert d.ngram == {"min_bfs_breadth": 1, "max_bfs_breadth": 10, "max_trie_depth": 18, "match_type": "BFS",
                       "capacity": 10_000_000, "min_match_window_size": 1, "max_match_window_size": 12}
    new = FakeSGLang("0.5.23").server_info()
    new["cuda_graph_config"]["decode"]["backend"] = "disabled"
    d = description_from_server_info(new)
    assert d.cuda_graph is False and d.overlap_schedule is True and d.attention_backend == "fa3"
    assert description_from_server_info({"version": "0.5.10", "disable_cuda_graph": True}).cuda_graph is False
    fp8 = description_from_server_info({"version": "0.5.12", "kv_cache_dtype": "fp8_e4m3"})
    assert fp8.kv_cache_dtype == "fp8_e4m3"
    assert description_from_server_info({"version": "0.5.12"}).kv_cache_dtype is None
    with pytest.raises(LiveServerError, match="not a JSON object"):
        description_from_server_info([1, 2])  # type: ignore[arg-type]


def test_normalise_base_url():
    assert normalise_base_url("localhost") == "http://localhost:30000"
    assert normalise_base_url("10.0.0.2:8000/") == "http://10.0.0.2:8000"
    assert normalise_base_url("https://box.example/sglang/") == "https://box.example/sglang"
    for bad in ("", "ftp://x:1"):
        with pytest.raises(InputError):
            normalise_base_url(bad)


def test_prompts_file_errors_name_file_and_line(tmp_path):
    shipped = load_prompts()
    assert len(shipped) == 40 and all(p["messages"][-1]["role"] == "user" for p in shipped)
    cases = {
        '{"text": "ok"}\n{"text": ': "line 2: not a JSON object",
        '{"text": "a", "input_ids": [1]}\n': "line 1: needs exactly one of `text`, `input_ids`, `messages` (found: "
                                             "text, input_ids)",
        '{"input_ids": [1, -2]}\n': "line 1: `input_ids` must be a non-empty list of token ids",
        '\n{"messages": [{"role": "robot", "content": "hi"}]}\n': "line 2: messages[0] must be",
        '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]}\n':
            "line 1: the last message must be the user's",
        "\n\n": "holds no prompts",
    }
    for text, expected in cases.items():
        f = tmp_path / "p.jsonl"
        f.write_text(text)
        with pytest.raises(InputError) as ei:
            load_prompts(f)
        assert str(ei.value).startswith(f"{f}: ") and expected in str(ei.value), str(ei.value)
    with pytest.raises(InputError, match="cannot read the prompts file"):
        load_prompts(tmp_path / "missing.jsonl")
    ok = tmp_path / "ok.jsonl"
    ok.write_text('{"text": "hello"}\n{"input_ids": [1, 2, 3]}\n')
    assert load_prompts(ok) == [{"text": "hello"}, {"input_ids": [1, 2, 3]}]


def test_chat_template_rendering(prompts):
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    with FakeSGLang("0.5.10", model_path="Qwen/Qwen2.5-7B-Instruct") as fake:
        out, how = prepare_prompts(fake.url, [{"messages": convo}, {"text": "raw"}], server=describe_server(fake.url))
        assert out[0] == {"text": "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi?<|im_end|>\n"
                                  "<|im_start|>assistant\n"} and out[1] == {"text": "raw"}
        assert "generic 'chatml' template" in how
        with pytest.raises(LiveServerError, match="cannot render chat messages"):
            prepare_prompts(fake.url, [{"messages": convo}], chat_template="server")
        out, _ = prepare_prompts(fake.url, [{"messages": convo}], chat_template="plain")
        assert out == [{"text": "Be brief.\n\nUser: Hi?\n\nAssistant:"}]
    with FakeSGLang("0.5.23") as fake:
        out, how = prepare_prompts(fake.url, [{"messages": convo}], chat_template="server")
        assert set(out[0]) == {"input_ids"} and "POST /v1/tokenize" in how
    with pytest.raises(InputError, match="unknown chat template 'jinja'"):
        prepare_prompts("127.0.0.1:1", [], chat_template="jinja")


def test_parse_prometheus_keeps_selected_samples():
    fake = FakeSGLang("0.5.23")
    samples = parse_prometheus(fake.metrics_text(), extra_labels={"simspec_point": "after"})
    names = {k.split("{")[0] for k in samples}
    assert "sglang:spec_verify_calls_total" in names and "sglang:e2e_request_latency_seconds_count" in names
    assert not any(n.endswith("_bucket") for n in names)
    assert all('simspec_point="after"' in k for k in samples)
    with pytest.raises(LiveServerError, match="not Prometheus exposition format"):
        parse_prometheus("sglang:x{a=1} nope\n")


def _rec(times: list[float], tokens: list[int], concurrency: int = 2) -> RequestRecord:
    return RequestRecord(concurrency=concurrency, prompt_tokens=10, completion_tokens=sum(tokens),
                         chunk_times=times, chunk_tokens=tokens)


def test_step_times_from_synthetic_chunks():
    """A alone at 10 ms steps; B's prefill (4 ms) lands in A's gap 20->38 ms; both at 14 ms; A leaves at 80."""
    a_times = [0.0, 0.010, 0.020, 0.038, 0.052, 0.066, 0.080]
    b_times = [0.024, 0.038, 0.052, 0.066, 0.080, 0.090, 0.100]
    recs = [_rec(a_times, [1, 2, 2, 2, 2, 2, 2]), _rec([t + 0.0003 for t in b_times], [1, 3, 3, 3, 3, 3, 1])]
    steps = {s.batch_size: s for s in step_times_from_records(recs, min_samples=1)}
    assert steps[1].seconds == pytest.approx(0.010, rel=0.02)  # A before B, and B after A left
    assert steps[2].seconds == pytest.approx(0.014, rel=0.02)
    assert (steps[1].samples, steps[2].samples) == (4, 4)  # gaps / batch size: 4 / 1, 7 / 2
    # a chunk with more tokens than a step can give (coalesced) is left out
    assert accept_lengths_from_records(recs, max_step_tokens=2) == [2.0] * 5
    assert accept_lengths_from_records(recs) == [2.0] * 5 + [3.0] * 5


def test_measurements_json_round_trip_keeps_histograms(tmp_path):
    m = Measurements(requests=[RequestRecord(concurrency=1, prompt_tokens=3, completion_tokens=5,
                                             accept_histogram={0: 1, 2: 3})])
    p = tmp_path / "m.json"
    m.save(p)
    assert json.loads(Path(p).read_text())["requests"][0]["accept_histogram"] == {"0": 1, "2": 3}
    assert Measurements.load(p) == m


def test_server_step_times_from_internal_states():
    raw = FakeSGLang("0.5.10").server_info()
    assert server_step_times(description_from_server_info(raw)) == []  # SGLANG_RECORD_STEP_TIME unset
    raw["internal_states"][0]["step_time_dict"] = {"4": [0.010, 0.012], "1": [0.005]}
    got = server_step_times(description_from_server_info(raw))
    assert [(s.batch_size, round(s.seconds, 4), s.samples, s.source) for s in got] == [
        (1, 0.005, 1, "server_info:step_time_dict"), (4, 0.011, 2, "server_info:step_time_dict")]


def test_measure_in_one_call(tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text('{"text": "Tell me about rivers."}\n')
    with FakeSGLang("0.5.23", algorithm="standalone", chain_rates=[0.6, 0.5]) as fake:
        meas = measure(fake.url.removeprefix("http://"), [1], prompts_path=f, max_new_tokens=8, num_requests=2,
                       **FAST)
    assert meas.server.algorithm == "standalone" and len(meas.requests) == 2
    assert "prompts: no chat prompts" in meas.sources
