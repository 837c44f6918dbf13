"""Offline calibration sources on samples of each SGLang version's formats (tests/data/sglang/README.md)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from simspec.calibration.measurements import Measurements
from simspec.calibration.sources import (
    map_algorithm,
    parse_server_args_text,
    read_bench,
    read_decode_log,
    read_metrics,
    server_description_from_args,
)
from simspec.calibration.sources.log import parse_decode_body, parse_log_lines
from simspec.calibration.sources.metrics import (
    gauge,
    gen_throughput,
    gpu_busy_seconds,
    histogram,
    histogram_mean,
    parse_metrics_text,
    spec_accept_length,
    split_key,
)
from simspec.errors import InputError

DATA = Path(__file__).parent / "data" / "sglang"


def _roundtrip(m: Measurements, tmp_path: Path) -> None:
    """Every Measurements a source returns must survive the JSON save/load that --resume relies on."""
    p = tmp_path / "m.json"
    m.save(p)
    assert Measurements.load(p) == m


# ---------------------------------------------------------------- decode logs


def test_log_058_eagle3(tmp_path):
    m = read_decode_log(DATA / "sglang-0.5.8-eagle3-tp8.log")
    s = m.server
    assert (s.model_path, s.tp, s.algorithm, s.num_steps, s.topk, s.num_draft_tokens) == (
        "moonshotai/Kimi-K2.5", 8, "eagle3", 3, 1, 4)
    assert (s.cuda_graph, s.cuda_graph_max_bs, s.max_running_requests, s.mem_fraction_static) == (True, 8, 48, 0.85)
    assert (s.overlap_schedule, s.attention_backend, s.host) == (False, "flashinfer", "0.0.0.0")
    assert s.raw["speculative_draft_model_path"] == "lightseekorg/kimi-k2.5-eagle3"
    steps = {st.batch_size: st for st in m.step_times}
    assert steps[1].seconds == pytest.approx(0.030, rel=2e-3) and steps[1].samples == 5
    assert steps[4].seconds == pytest.approx(0.034, rel=2e-3) and steps[4].samples == 4
    points = {p.concurrency: p for p in m.throughput}
    assert points[1].tokens_per_s == pytest.approx(50.0, rel=2e-3) and points[1].accept_length == pytest.approx(1.5)
    assert points[4].throughput_tokens_per_s == pytest.approx(4 * points[4].tokens_per_s)
    assert len(m.accept_lengths) == 11 and all(1.4 < a < 1.6 for a in m.accept_lengths)
    assert any("sglang-0.5.8-eagle3-tp8.log" in x and "11 decode lines" in x for x in m.sources)
    assert m.server.startup_free_gib == 93.21  # the smallest over the eight ranks' 'Load weight begin' lines
    assert not any("skipped" in x for x in m.sources)
    _roundtrip(m, tmp_path)


def test_log_0510_no_speculation_ms_timestamps_tp1(tmp_path):
    path = DATA / "sglang-0.5.10-nospec-tp1-logms.log"
    m = read_decode_log(path)
    assert (m.server.algorithm, m.server.tp, m.server.cuda_graph_max_bs, m.server.overlap_schedule) == (
        "none", 1, 256, True)
    assert {st.batch_size: round(st.seconds * 1e3, 2) for st in m.step_times} == {1: 6.3, 8: 7.1}
    assert m.accept_lengths == [] and all(p.accept_length is None for p in m.throughput)
    assert m.server.startup_free_gib == 78.50  # 'Load weight begin. avail mem=78.50 GB'
    decodes, args, prefills, skipped, _ = parse_log_lines(path)
    assert args["model_path"] == "meta-llama/Llama-3.1-8B-Instruct" and prefills == 8 and not skipped
    first = decodes[0]
    assert first.rank == "" and first.time.microsecond == 77000 and not first.clean  # carries the prefill
    assert first.fields["est. decode TFLOPS/s (per GPU)"] == pytest.approx(2.54)
    _roundtrip(m, tmp_path)


def test_log_0523_mtp_dp_attention(tmp_path):
    m = read_decode_log(DATA / "sglang-0.5.23-mtp-dp2.log")
    s = m.server
    assert s.algorithm == "mtp"  # NEXTN is logged as EAGLE with the model itself as the draft
    assert (s.tp, s.cuda_graph_max_bs, s.num_draft_tokens, s.overlap_schedule) == (8, 64, 4, True)
    assert s.raw["cuda_graph_config"]["decode"]["bs"][-1] == 64
    assert [(st.batch_size, st.samples) for st in m.step_times] == [(16, 6)]
    assert m.step_times[0].seconds == pytest.approx(0.022, rel=2e-3)
    ranks = sorted(p.source.split(" rank ")[1].split(" (")[0] for p in m.throughput)
    assert ranks == ["DP0 TP0 EP0", "DP1 TP4 EP4"]
    assert len(m.accept_lengths) == 8
    decodes, *_ = parse_log_lines(DATA / "sglang-0.5.23-mtp-dp2.log")
    assert decodes[-2].fields["cap len"] == pytest.approx(3.2)
    assert decodes[-2].fields["block accept len"] == pytest.approx(2.9)
    assert decodes[-2].fields["fwd occupancy"] == "91.20%"
    _roundtrip(m, tmp_path)


def test_decode_line_variants():
    # 0.5.8: trailing ", "; hybrid SWA pools; cpu graph off CUDA
    body = ("#running-req: 3, #full token: 120, full token usage: 0.01, #swa token: 80, swa token usage: 0.02, "
            "accept len: 2.00, accept rate: 0.50, cpu graph: False, gen throughput (token/s): 12.50, #queue-req: 1, ")
    f = parse_decode_body(body)
    assert f["#running-req"] == 3 and f["#full token"] == 120 and f["cpu graph"] is False and f["#queue-req"] == 1
    with pytest.raises(ValueError):
        parse_decode_body("#running-req 3, gen throughput (token/s): 1.0")


def test_log_prefixes_ray_actor_and_gzip(tmp_path):
    lines = [
        "(SchedulerActor pid=4242) [2026-03-01 10:00:00 DP0 TP0] Prefill batch, #new-seq: 2, #new-token: 64, "
        "#cached-token: 0, token usage: 0.00, #running-req: 0, #queue-req: 0, ",
        "(SchedulerActor pid=4242) [2026-03-01 10:00:01 DP0 TP0] Decode batch, #running-req: 2, #token: 70, "
        "token usage: 0.00, cuda graph: True, gen throughput (token/s): 10.00, #queue-req: 0, ",
        "(SchedulerActor pid=4242) [2026-03-01 10:00:02 DP0 TP0] Decode batch, #running-req: 2, #token: 150, "
        "token usage: 0.00, cuda graph: True, gen throughput (token/s): 200.00, #queue-req: 0, ",
    ]
    p = tmp_path / "server.log.gz"
    with gzip.open(p, "wt") as fh:
        fh.write("\n".join(lines) + "\n")
    decodes, args, prefills, _, _ = parse_log_lines(p)
    assert decodes[0].rank == "(SchedulerActor pid=4242) DP0 TP0" and prefills == 1 and args is None
    m = read_decode_log(p)
    assert [(st.batch_size, st.seconds) for st in m.step_times] == [(2, pytest.approx(0.01))]
    assert m.server.cuda_graph is True  # from the lines when there is no server_args
    custom = tmp_path / "custom.log"  # SGLANG_LOGGING_CONFIG_PATH with another format: no [..] prefix
    custom.write_text("".join(f"2026-03-01 10:00:0{i},{i}12 INFO scheduler TP0: " + lines[i].split("] ", 1)[1] + "\n"
                              for i in range(3)))
    decodes, *_ = parse_log_lines(custom)
    assert decodes[0].rank == "TP0" and decodes[0].time is None
    assert [(st.batch_size, st.samples) for st in read_decode_log(custom).step_times] == [(2, 1)]


def test_log_clean_intervals_exclude_batch_changes(tmp_path):
    def line(n, gen):
        return (f"[2026-03-01 10:00:00 TP0] Decode batch, #running-req: {n}, #token: 1, token usage: 0.00, "
                f"cuda graph: True, gen throughput (token/s): {gen}, #queue-req: 0")
    p = tmp_path / "a.log"
    p.write_text("\n".join([line(4, 100.0), line(4, 400.0), line(3, 250.0), line(3, 300.0)]) + "\n")
    m = read_decode_log(p)
    assert [(st.batch_size, st.samples) for st in m.step_times] == [(3, 1), (4, 1)]
    assert {st.batch_size: st.seconds for st in m.step_times} == {3: pytest.approx(0.01), 4: pytest.approx(0.01)}


def test_log_malformed_lines_are_counted(tmp_path):
    good = ("[2026-03-01 10:00:00 TP0] Decode batch, #running-req: 1, #token: 1, token usage: 0.00, "
            "cuda graph: True, gen throughput (token/s): 100.00, #queue-req: 0")
    bad_number = good.replace("100.00", "fast")
    no_running = good.replace("#running-req: 1, ", "")
    truncated = "[2026-03-01 09:59:00] server_args=ServerArgs(model_path='m', tp_size=8, speculative_alg"
    p = tmp_path / "b.log"
    p.write_text("\n".join([truncated, good, bad_number, good, no_running, "unrelated line"]) + "\n")
    m = read_decode_log(p)
    note = next(x for x in m.sources if "skipped" in x)
    assert "skipped 3 malformed" in note and "line 1" in note and "line 3" in note and "line 5" in note
    assert [(st.batch_size, st.samples) for st in m.step_times] == [(1, 1)]


def test_log_errors(tmp_path):
    with pytest.raises(InputError) as e:
        read_decode_log(tmp_path / "missing.log")
    assert "no such file" in str(e.value)
    empty = tmp_path / "empty.log"
    empty.write_text("hello\nworld\n")
    with pytest.raises(InputError) as e:
        read_decode_log(empty)
    assert e.value.file == str(empty) and "Decode batch" in e.value.message
    only_bad = tmp_path / "bad.log"
    only_bad.write_text("x\n[2026-03-01 10:00:00] Decode batch, #running-req: two, gen throughput (token/s): 1\n")
    with pytest.raises(InputError) as e:
        read_decode_log(only_bad)
    assert e.value.key == "line 2" and "#running-req" in e.value.message
    dflash = tmp_path / "dflash.log"
    dflash.write_text("[2026-03-01 10:00:00] server_args={'model_path': 'm', 'speculative_algorithm': 'DFLASH'}\n")
    with pytest.raises(InputError) as e:
        read_decode_log(dflash)
    assert e.value.key == "server_args.speculative_algorithm" and "EAGLE3" in e.value.message


def test_server_args_text_and_algorithms():
    args = parse_server_args_text("ServerArgs(model_path='a, b', tp_size=2, lora_paths=None, kv=[1, (2, 3)], "
                                  "speculative_algorithm=SpeculativeAlgorithm.NGRAM, weird=<Foo at 0x1, x>, "
                                  "json_model_override_args='{\"a\": 1}')")
    assert args["model_path"] == "a, b" and args["kv"] == [1, (2, 3)] and args["weird"] == "<Foo at 0x1, x>"
    assert server_description_from_args(args).algorithm == "ngram"
    d = parse_server_args_text("{'model_path': 'm', 'tp_size': 4, 'nested': {'a': [1, 2]}, 'f': 0.5}")
    assert d == {"model_path": "m", "tp_size": 4, "nested": {"a": [1, 2]}, "f": 0.5}
    with pytest.raises(InputError):
        parse_server_args_text("ServerArgs(model_path='m', 3)")
    assert [map_algorithm(x) for x in ("EAGLE", "eagle3", "NEXTN", "STANDALONE", "NGRAM", "lookahead", None)] == [
        "eagle", "eagle3", "mtp", "standalone", "ngram", "ngram", "none"]
    old = server_description_from_args({"speculative_algorithm": "NGRAM", "speculative_ngram_branch_length": 18,
                                        "speculative_ngram_max_bfs_breadth": 10, "version": "0.5.8"})
    assert old.ngram == {"max_trie_depth": 18, "max_bfs_breadth": 10} and old.sglang_version == "0.5.8"


# ---------------------------------------------------------------- benchmark files


def test_bench_serving_058(tmp_path):
    path = DATA / "bench_serving-0.5.8.jsonl"
    m = read_bench(path)
    rec1, rec2 = (json.loads(x) for x in path.read_text().splitlines())
    assert [p.concurrency for p in m.throughput] == [1, 4]
    p1, p2 = m.throughput
    rates = [(o - 1) / sum(g) for o, g in zip(rec1["output_lens"], rec1["itls"], strict=True)]
    assert p1.tokens_per_s == pytest.approx(sum(rates) / len(rates))
    assert p1.throughput_tokens_per_s == rec1["output_throughput"] and p1.accept_length == 1.5
    assert p2.tokens_per_s == pytest.approx(1000 / rec2["mean_tpot_ms"]) and "mean_tpot_ms" in p2.source
    assert (m.server.sglang_version, m.server.algorithm, m.server.tp) == ("0.5.8", "eagle3", 8)
    assert len(m.requests) == 4 and all(r.concurrency == 1 for r in m.requests)
    r = m.requests[0]
    assert (r.prompt_tokens, r.completion_tokens, len(r.chunk_times), sum(r.chunk_tokens)) == (1024, 256, 256, 256)
    assert r.chunk_times[0] == pytest.approx(rec1["ttfts"][0])
    assert r.e2e_latency == pytest.approx(rec1["ttfts"][0] + sum(rec1["itls"][0]))
    _roundtrip(m, tmp_path)


def test_bench_serving_0523_no_cap_openai_chunks(tmp_path):
    m = read_bench(DATA / "bench_serving-0.5.23.jsonl")
    (p,) = m.throughput
    assert p.concurrency == 3 and "achieved" in p.source  # max_concurrency null: round(2.91)
    assert m.server.algorithm == "ngram" and m.server.sglang_version == "0.5.23"
    assert m.server.ngram == {"min_bfs_breadth": 1, "max_bfs_breadth": 10, "match_type": "BFS", "max_trie_depth": 18}
    assert all(r.chunk_times == [] for r in m.requests)  # chunks of several tokens: no per-token times
    assert [(s.batch_size, s.samples) for s in m.step_times] == [(3, 3)]
    assert m.step_times[0].seconds == pytest.approx(0.0081)
    _roundtrip(m, tmp_path)


@pytest.mark.parametrize("name", ["bench_one_batch_server-0.5.10.jsonl", "bench_one_batch_server-0.5.23.jsonl"])
def test_bench_one_batch_server(name, tmp_path):
    path = DATA / name
    m = read_bench(path)
    recs = [json.loads(x) for x in path.read_text().splitlines()]
    assert len(m.throughput) == len(recs)
    for p, rec in zip(m.throughput, recs, strict=True):
        assert p.concurrency == rec["batch_size"]
        assert p.tokens_per_s == pytest.approx(rec["output_throughput"] / rec["batch_size"])
        assert p.accept_length == (rec["acc_length"] if rec["acc_length"] > 0 else None)
    step8 = next(s for s in m.step_times if s.batch_size == 8)
    assert step8.seconds == pytest.approx(0.0112, rel=1e-3)
    _roundtrip(m, tmp_path)


def test_bench_one_batch(tmp_path):
    m = read_bench(DATA / "bench_one_batch-0.5.8.jsonl")
    assert [(s.batch_size, s.seconds) for s in m.step_times] == [(1, 0.00612), (16, 0.00745)]
    assert m.throughput[1].throughput_tokens_per_s == pytest.approx(16 / 0.00745)
    assert m.server.algorithm == "none"


def test_bench_mixed_and_malformed(tmp_path):
    one_batch = (DATA / "bench_one_batch-0.5.8.jsonl").read_text().splitlines()[0]
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join([one_batch, "not json", json.dumps({"hello": 1}),
                            json.dumps({"duration": None, "completed": 3, "output_throughput": 5.0}), ""]) + "\n")
    m = read_bench(p)
    assert len(m.step_times) == 1
    note = next(x for x in m.sources if "skipped" in x)
    assert "skipped 3 malformed" in note and "line 2: not JSON" in note and "has hello" in note
    assert "'duration' must be a positive number" in note
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    with pytest.raises(InputError) as e:
        read_bench(bad)
    assert e.value.file == str(bad) and e.value.key == "line 1"
    pretty = tmp_path / "pretty.json"
    pretty.write_text(json.dumps(json.loads(one_batch), indent=2))
    assert read_bench(pretty).step_times[0].batch_size == 1


# ---------------------------------------------------------------- /metrics


def test_metrics_0510(tmp_path):
    m = read_metrics(DATA / "metrics-0.5.10.prom")
    s = m.prometheus
    assert spec_accept_length(s) == pytest.approx(1.52) and gen_throughput(s) == pytest.approx(50.3)
    assert gpu_busy_seconds(s) == pytest.approx(123.75)  # gpu_execution_seconds_total, both categories
    assert histogram_mean(s, "sglang:inter_token_latency_seconds") == pytest.approx(
        (50 * 0.021 + 30 * 0.023 + 5 * 0.045) / 85)
    assert any("metrics-0.5.10.prom" in x for x in m.sources)
    _roundtrip(m, tmp_path)


def test_metrics_0523_dp2_and_deltas():
    s = read_metrics(DATA / "metrics-0.5.23-dp2.prom").prometheus
    assert spec_accept_length(s) == pytest.approx(2.75)  # mean over DP ranks
    assert gen_throughput(s) == pytest.approx(3970.0)  # summed over DP ranks
    assert gauge(s, "sglang:gen_throughput", dp_rank="1") == pytest.approx(2010.0)
    assert gpu_busy_seconds(s) == pytest.approx(247.5)  # forward_execution_seconds_total
    assert gauge(s, "sglang:spec_verify_calls_total") == 5400
    h = histogram(s, "sglang:inter_token_latency_seconds")
    assert h["count"] == 85 and dict(h["buckets"])[0.025] == 80 and dict(h["buckets"])[float("inf")] == 85
    key = next(k for k in s if k.startswith("sglang:num_running_reqs"))
    assert split_key(key)[1]["dp_rank"] in ("0", "1")
    before, _ = parse_metrics_text(
        '# TYPE sglang:inter_token_latency_seconds histogram\n'
        'sglang:inter_token_latency_seconds_bucket{le="+Inf",model_name="deepseek-ai/DeepSeek-V3"} 5.0\n'
        'sglang:inter_token_latency_seconds_sum{model_name="deepseek-ai/DeepSeek-V3"} 0.225\n'
        'sglang:inter_token_latency_seconds_count{model_name="deepseek-ai/DeepSeek-V3"} 5.0\n')
    assert histogram_mean(s, "sglang:inter_token_latency_seconds", before=before) == pytest.approx(
        (50 * 0.021 + 30 * 0.023) / 80)
    assert histogram(s, "sglang:no_such") is None and spec_accept_length({}) is None


def test_metrics_errors(tmp_path):
    bad = tmp_path / "bad.prom"
    bad.write_text("# TYPE sglang:gen_throughput gauge\nsglang:gen_throughput 1\nsglang:gen_throughput{tp_rank=0} 1\n")
    with pytest.raises(InputError) as e:
        read_metrics(bad)
    assert e.value.file == str(bad) and e.value.key == "line 3" and "Prometheus" in e.value.message
    other = tmp_path / "other.prom"
    other.write_text("# TYPE up gauge\nup 1\n")
    with pytest.raises(InputError) as e:
        read_metrics(other)
    assert "--enable-metrics" in e.value.message
    samples, dropped = parse_metrics_text("# TYPE sglang:x gauge\nsglang:x NaN\nsglang:y 2\n")
    assert samples == {"sglang:y": 2.0} and dropped == 1


def test_startup_free_memory_is_each_ranks_first_load_and_the_smallest_rank(tmp_path):
    """SGLang sizes the KV cache from the smallest free memory over ranks after CUDA/NCCL start; the draft model's
    runner logs its own 'Load weight begin' later, after the target's KV cache took the memory, and must not
    count."""
    lines = (DATA / "sglang-0.5.8-eagle3-tp8.log").read_text().splitlines()
    out = []
    for line in lines:
        if "TP3] Load weight begin" in line:
            line = line.replace("avail mem=93.21", "avail mem=92.87")  # one rank starts with less free
        out.append(line)
    # the draft worker's loads, after the target's memory pool
    out += [f"[2026-01-12 09:16:40 TP{r}] Load weight begin. avail mem=9.80 GB" for r in range(8)]
    log = tmp_path / "with-draft.log"
    log.write_text("\n".join(out) + "\n")
    m = read_decode_log(log)
    assert m.server.startup_free_gib == 92.87
