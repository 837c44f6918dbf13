"""`simspec calibrate` end to end: a fake SGLang server with known step times and acceptance -> calibrate ->
profile + scenario -> prediction. Also the offline sources and what the user sees when input is bad."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simspec.cli import main
from tests.conftest import ROOT
from tests.fake_sglang import FakeSGLang

DATA = ROOT / "tests" / "data" / "sglang"
BOX = ["--gpu", "h100-sxm", "--interconnect", "nvlink4-nccl", "--model", "llama-3.1-8b"]


@pytest.fixture(autouse=True)
def _timed(no_long_gc_pauses):
    """These tests time a live fake server in this process (tests/conftest.py no_long_gc_pauses)."""


def _calibrate(args: list[str]) -> tuple[int, dict | str]:
    res = CliRunner().invoke(main, ["calibrate", *args])
    if res.exit_code != 0:
        return res.exit_code, res.output
    return 0, json.loads(res.output)


@pytest.mark.parametrize(("algorithm", "rates"), [("eagle3", [0.8, 0.6, 0.4]), ("none", [])])
def test_round_trip_recovers_the_server_and_predicts_it(tmp_path, algorithm, rates):
    out = tmp_path / "p.yaml"
    # known parameters: 8 ms + 2 ms per running request per step, the chain rates, and a 7 ms prefill (a
    # physical one: a prefill reads the 16 GB of weights once, >= 4.8 ms on an H100; calibrate does not fit
    # prefill, so the fake's must be one the time model can share)
    with FakeSGLang("0.5.10", algorithm=algorithm, chain_rates=rates, step_fixed_s=0.008,
                    step_per_request_s=0.002, prefill_s=0.007, seed=1) as fake:
        code, res = _calibrate(["--host", fake.url, "--concurrency", "1,2,4", "--max-new-tokens", "96",
                                "--bootstrap", "20", "--out", str(out), "--json", *BOX])
        assert code == 0, res
        # recovered: the step time at each concurrency the run mostly held, as the fake's thread ran it
        # (tolerance 10%: timing jitter on a shared 2-core machine, tests/test_calibrate_live.py)
        fitted = {s["batch_size"]: s["fitted_ms"] for s in res["step_times"]}
        for b in (1, 2, 4):
            assert fitted[b] == pytest.approx(fake.realised_step_time(b) * 1e3, rel=0.10), b
        scenario = yaml.safe_load((tmp_path / "p.scenario.yaml").read_text())
        if algorithm == "none":
            assert "speculative" not in scenario
        else:
            hist = scenario["acceptance"]["histogram"]
            mean = 1 + sum(k * n for k, n in enumerate(hist)) / sum(hist)
            assert mean == pytest.approx(fake.expected_accept_length(), rel=0.08)
            assert scenario["speculative"]["algorithm"] == "eagle3"
        # the written scenario predicts what was measured
        assert len(res["comparison"]) == 3
        for row in res["comparison"]:
            assert abs(row["error_pct"]) <= 5.0, row
    profile = yaml.safe_load(out.read_text())
    assert profile["measured_on"] == {"gpu": "h100-sxm", "interconnect": "nvlink4-nccl", "tp": 1,
                                      "model": "llama-3.1-8b"}
    assert profile["provenance"]["sglang_version"] == "0.5.10"
    assert profile["provenance"]["server_args"]["speculative_algorithm"] in ("EAGLE3", None)
    for c in profile["coefficients"].values():
        assert "interval_95" in c and "fitted by simspec calibrate" in c["source"]
    assert (tmp_path / "p.measurements.json").exists()
    # the outputs are a corpus n-gram replay reads
    from simspec.ngram import load_corpus
    sequences, _ = load_corpus(tmp_path / "p.outputs.jsonl")
    assert len(sequences) >= 3 and all(len(s.output_ids) == 96 for s in sequences)
    # the scenario points at the profile and predicts on its own
    res = CliRunner().invoke(main, ["predict", str(tmp_path / "p.scenario.yaml"), "--json"])
    assert res.exit_code == 0, res.output


def test_offline_log_calibrates_and_refuses_to_overwrite(tmp_path):
    out = tmp_path / "log.yaml"
    args = ["--from-log", str(DATA / "sglang-0.5.10-nospec-tp1-logms.log"), "--out", str(out), "--bootstrap", "10",
            "--json", *BOX]
    code, res = _calibrate(args)
    assert code == 0, res
    assert res["parameters"] and (tmp_path / "log.scenario.yaml").exists()
    first = out.read_text()
    code, msg = _calibrate(args)
    assert code == 2 and "exists" in msg and "--force" in msg
    assert out.read_text() == first  # nothing lost
    code, _ = _calibrate(args + ["--force"])
    assert code == 0


def test_a_held_out_concurrency_is_predicted_not_fitted_and_becomes_a_validation_case(tmp_path):
    """--hold-out measures a concurrency without fitting to it; --cases writes every concurrency as a case that
    `simspec validate` predicts as the comparison did. The fake's step is 8 ms + 2 ms a request up to batch 3,
    then 22 ms more: the fit sees batches 1-3 only (the runs at 1, 2 and 3 clients), enough for its per-request
    slope, and cannot know the jump, so the held-out run at 6 comes out far too fast."""
    def step(b: int) -> float:
        return 0.008 + 0.002 * b + (0.022 if b > 3 else 0.0)

    out, cases = tmp_path / "h.yaml", tmp_path / "cases"
    with FakeSGLang("0.5.10", algorithm="eagle3", chain_rates=[0.8, 0.6, 0.4], step_time=step, prefill_s=0.007,
                    seed=3) as fake:
        code, res = _calibrate(["--host", fake.url, "--concurrency", "1,2,3,6", "--hold-out", "6", "--cases",
                                str(cases), "--max-new-tokens", "96", "--bootstrap", "0", "--out", str(out),
                                "--json", *BOX])
        step_at_1_ms = fake.realised_step_time(1) * 1e3
    assert code == 0, res
    assert res["held_out"] == [6]
    # the fit saw the runs at 1-3 only: none of the held-out run's batches (6, and 5 and 4 as it drained)
    assert {s["batch_size"] for s in res["step_times"]} <= {1, 2, 3}
    rows = {r["concurrency"]: r for r in res["comparison"]}
    assert [rows[c]["held_out"] for c in (1, 2, 3, 6)] == [False, False, False, True]
    for c in (1, 2, 3):
        assert abs(rows[c]["error_pct"]) <= 10.0, rows[c]
    assert rows[6]["error_pct"] > 50.0, rows[6]  # ~42 ms a step measured, ~20 ms on the fitted line

    ids = [f"h-c{c}" for c in (1, 2, 3, 6)]  # the profile's file name and the concurrency
    assert res["cases"] == [str(cases / f"{i}.yaml") for i in ids]
    assert sorted(p.stem for p in cases.glob("*.yaml")) == sorted(ids)
    case6 = yaml.safe_load((cases / "h-c6.yaml").read_text())
    assert case6["fitted"] is False and case6["measured"]["metric"] == "tokens_per_s"
    assert case6["scenario"]["workload"]["arrival"]["concurrency"] == 6
    assert "histogram" in case6["scenario"]["acceptance"]
    assert (cases / case6["scenario"]["calibration"]).resolve() == out.resolve()
    # the run's latencies as predict names them; alone at one client each streamed chunk is one iteration, and
    # a request's first chunk comes after its own prefill (7 ms), within a step or two of it
    case1 = yaml.safe_load((cases / "h-c1.yaml").read_text())
    latencies = {a["metric"]: a["value"] for a in case1["also_measured"]}
    assert set(latencies) == {f"{m}.{k}" for m in ("ttft_ms", "tpot_ms", "itl_ms") for k in ("mean", "p50")}
    assert latencies["itl_ms.p50"] == pytest.approx(step_at_1_ms, rel=0.10)
    assert latencies["tpot_ms.mean"] < latencies["itl_ms.mean"] / 2  # a chunk carries a verify's ~2.5 tokens
    assert 7.0 <= latencies["ttft_ms.p50"] <= 7.0 + 2 * step_at_1_ms

    res = CliRunner().invoke(main, ["validate", str(cases), "--json"])
    assert res.exit_code == 0, res.output
    report = json.loads(res.output)
    assert report["summary"]["not_fitted"] == 1 and report["summary"]["fitted"] == 3
    by_id = {c["id"]: c for c in report["cases"]}
    for c, case_id in zip((1, 2, 3, 6), ids, strict=True):
        case, row = by_id[case_id], rows[c]
        assert case["fitted"] is (c != 6)
        assert case["measured"] == pytest.approx(row["measured_tokens_per_s"], rel=1e-4)
        assert case["predicted"] == pytest.approx(row["predicted_tokens_per_s"], rel=1e-9)
    assert report["summary"]["mape_not_fitted_pct"] == pytest.approx(rows[6]["error_pct"], rel=1e-3)
    # the profile predicts its own box's decode latencies at one client (the fake's step, fitted)
    also = {a["metric"]: a for a in by_id["h-c1"]["also_measured"]}
    for metric in ("itl_ms.mean", "tpot_ms.mean"):
        assert abs(also[metric]["error_pct"]) <= 15.0, also[metric]


def test_a_trace_of_a_held_out_run_stays_out_of_the_fit(tmp_path):
    """--profile-steps traces the largest fitted concurrency and records it; a trace of a run that a later
    --resume holds out (here the only trace, taken at 2) is left out, so no draft step time comes from it."""
    traces, out = tmp_path / "traces", tmp_path / "p.yaml"
    base = ["--concurrency", "1,2", "--max-new-tokens", "48", "--profile-steps", "4", "--trace-dir", str(traces),
            "--bootstrap", "0", "--out", str(out), "--json", *BOX]
    with FakeSGLang("0.5.10", algorithm="eagle3", chain_rates=[0.8, 0.6, 0.4], prefill_s=0.007, seed=2) as fake:
        code, res = _calibrate(["--host", fake.url, *base])
        assert code == 0, res
        assert "draft_forward_ms" in yaml.safe_load(out.read_text())
        saved = json.loads((tmp_path / "p.measurements.json").read_text())
        assert saved["kernel_splits"] and {k["concurrency"] for k in saved["kernel_splits"]} == {2}
        assert {g["concurrency"] for g in saved["graph_launches"]} <= {2}
        code, res = _calibrate(["--host", fake.url, "--concurrency", "1,2", "--max-new-tokens", "48", "--bootstrap",
                                "0", "--out", str(out), "--json", *BOX, "--resume", "--hold-out", "2"])
        assert code == 0, res
        assert "draft_forward_ms" not in yaml.safe_load(out.read_text())


def test_the_fit_sees_nothing_of_a_held_out_concurrency():
    """_for_fit drops the held-out runs' requests, iteration times and throughput and the whole-run /metrics
    counters; an iteration time that names no run (a log's, or one saved by an older simspec) is refused."""
    from simspec.calibration.measurements import (
        GraphLaunch,
        KernelSplit,
        Measurements,
        RequestRecord,
        StepTime,
        ThroughputPoint,
    )
    from simspec.commands.calibrate import _for_fit
    from simspec.errors import InputError

    def req(c: int) -> RequestRecord:
        return RequestRecord(concurrency=c, prompt_tokens=10, completion_tokens=5, chunk_times=[0.0, 0.1, 0.2, 0.3],
                             chunk_tokens=[1, 2, 1, 1])

    def traced(c: int | None) -> dict:
        return {"kernel_splits": [KernelSplit(phase="draft", category_ms={"other": 1.0}, iterations=4, source="trace",
                                              concurrency=c)],
                "graph_launches": [GraphLaunch(phase="decode", nodes=100, host_us=20.0, launches=4, source="trace",
                                               concurrency=c)]}

    meas = Measurements(
        server={"algorithm": "eagle3", "num_steps": 3, "topk": 1, "num_draft_tokens": 4},
        requests=[req(1), req(4)], accept_lengths=[2.0, 1.0, 2.0, 1.0],
        step_times=[StepTime(batch_size=1, seconds=0.01, source="live", concurrency=1),
                    StepTime(batch_size=3, seconds=0.03, source="live", concurrency=4),
                    StepTime(batch_size=4, seconds=0.04, source="live", concurrency=4)],
        throughput=[ThroughputPoint(concurrency=c, tokens_per_s=100.0, source="live") for c in (1, 4)],
        prometheus={"sglang:spec_accept_length": 2.5}, **traced(4))
    kept = _for_fit(meas, frozenset({4}))
    assert kept.kernel_splits == [] and kept.graph_launches == []
    assert len(_for_fit(meas.model_copy(update=traced(1)), frozenset({4})).kernel_splits) == 1
    assert [r.concurrency for r in kept.requests] == [1]
    assert [(o.batch_size, o.concurrency) for o in kept.step_times] == [(1, 1)]
    assert [t.concurrency for t in kept.throughput] == [1]
    assert kept.accept_lengths == [2.0, 1.0] and kept.prometheus == {}  # the kept request's middle chunks
    assert _for_fit(meas, frozenset()) is meas

    with pytest.raises(InputError) as err:
        _for_fit(meas, frozenset({8}))
    assert err.value.key == "--hold-out" and "nothing was measured at concurrency 8 (measured: 1, 4)" in str(err.value)
    old = meas.model_copy(update={"step_times": [StepTime(batch_size=1, seconds=0.01, source="live")]})
    with pytest.raises(InputError) as err:
        _for_fit(old, frozenset({4}))
    assert err.value.key == "--hold-out" and "live do not" in str(err.value)
    with pytest.raises(InputError) as err:  # a trace file's records name no run either
        _for_fit(meas.model_copy(update=traced(None)), frozenset({4}))
    assert err.value.key == "--hold-out" and "trace do not" in str(err.value)


def test_a_concurrency_without_a_measured_rate_gets_no_case_and_a_note(tmp_path):
    from simspec.calibration.measurements import Measurements
    from simspec.commands.calibrate import _write_cases

    scenario = tmp_path / "p.scenario.yaml"
    scenario.write_text(yaml.safe_dump({"hardware": {"gpu": "h100-sxm", "num_gpus": 1, "interconnect": "nvlink4-nccl"},
                                        "model": "llama-3.1-8b", "server": {"tp": 1},
                                        "workload": {"arrival": {"type": "closed", "concurrency": 1}}}))
    row = {"concurrency": 2, "source": "live", "held_out": True, "measured_tokens_per_s": 0.0,
           "measured_accept_length": None, "measured_iteration_ms": None}
    notes: list[str] = []
    written = _write_cases(tmp_path / "cases", "p", [row], scenario, tmp_path / "p.yaml",
                           tmp_path / "p.measurements.json", Measurements(), "node:30000", notes)
    assert written == [] and notes == ["no case for concurrency 2: no request there decoded past its first chunk,"
                                       " so no per-request decode rate was measured"]


def test_cases_from_a_benchmark_file_number_the_points_of_one_concurrency(tmp_path):
    """A benchmark file with two points at one concurrency gives two cases, neither replacing the other; the
    profile's own directory is refused (validate would read its scenario as a case)."""
    args = ["--from-bench", str(DATA / "bench_one_batch_server-0.5.10.jsonl"), "--tp", "1", "--bootstrap", "0",
            "--out", str(tmp_path / "b.yaml"), "--json", *BOX]
    code, msg = _calibrate([*args, "--cases", str(tmp_path)])
    assert code == 2 and "--cases" in msg and "a directory of their own" in msg, msg
    code, res = _calibrate([*args, "--cases", str(tmp_path / "cases")])
    assert code == 0, res
    assert [r["concurrency"] for r in res["comparison"]] == [1, 1, 8, 32]
    assert [Path(p).stem for p in res["cases"]] == ["b-c1-1", "b-c1-2", "b-c8", "b-c32"]
    values = {yaml.safe_load(Path(p).read_text())["measured"]["value"] for p in res["cases"][:2]}
    assert len(values) == 2
    # the same profile name written elsewhere: its cases would replace these, so not without --force
    again = [a if a != str(tmp_path / "b.yaml") else str(tmp_path / "other" / "b.yaml") for a in args]
    code, msg = _calibrate([*again, "--cases", str(tmp_path / "cases")])
    assert code == 2 and "b-c1-1.yaml" in msg and "--force" in msg, msg
    assert not (tmp_path / "other" / "b.yaml").exists()


def test_cases_need_a_measured_throughput(tmp_path):
    """A collective table alone fits the all-reduce curve but measures no run: no case to write, exit 2."""
    table = tmp_path / "ar.csv"
    table.write_text("bytes,time_us,world_size,backend,in_cuda_graph,op\n" + _all_reduce_rows((1024, 65536)))
    code, msg = _calibrate(["--collectives", str(table), "--tp", "8", "--cases", str(tmp_path / "cases"),
                            "--out", str(tmp_path / "c.yaml"), "--gpu", "h200-sxm", "--interconnect", "nvlink4-nccl",
                            "--model", "llama-3.1-70b"])
    assert code == 2 and "--cases" in msg and "measured no throughput" in msg, msg
    assert not (tmp_path / "cases").exists() and not (tmp_path / "c.yaml").exists()


def _calibrate_log_with_table(tmp_path, rows: str) -> tuple[dict, dict]:
    """Calibrate from the shipped TP-8 EAGLE-3 log and a collective table of these rows: (profile, --json result)."""
    table = tmp_path / "ar.csv"
    table.write_text("bytes,time_us,world_size,backend,in_cuda_graph,op\n" + rows)
    out = tmp_path / "c.yaml"
    code, res = _calibrate(["--from-log", str(DATA / "sglang-0.5.8-eagle3-tp8.log"), "--collectives", str(table),
                            "--out", str(out), "--bootstrap", "0", "--json", "--gpu", "h200-sxm",
                            "--interconnect", "nvlink4-nccl"])
    if code != 0:
        pytest.fail(str(res))
    return yaml.safe_load(out.read_text()), res


def _all_reduce_rows(sizes) -> str:
    return "".join(f"{b},{10 + b / 2e4:.3f},8,nccl,1,all_reduce\n" for b in sizes)


def test_collective_table_becomes_the_profile_curve(tmp_path):
    profile, _ = _calibrate_log_with_table(tmp_path, _all_reduce_rows((1024, 4096, 65536, 1 << 20, 1 << 24)))
    assert profile["all_reduce"]["measured_gpus"] == 8
    assert len(profile["all_reduce"]["points_bytes_us"]) >= 2


@pytest.mark.parametrize(("ranks", "expected"), [(8, 212.0), (2, None)])
def test_the_tables_gloo_broadcast_sets_the_schedulers_per_turn_broadcast(tmp_path, ranks, expected):
    """collective_bench.py's `broadcast` rows (the gloo broadcast SGLang's scheduler makes every loop turn at TP > 1)
    set tp_request_broadcast_us when timed over the server's tp (8 here: the median of the rows); over another
    number of ranks they are not carried to it, and the fit says so."""
    profile, res = _calibrate_log_with_table(
        tmp_path, _all_reduce_rows((1024, 65536, 1 << 24))
        + "".join(f"8,{t},{ranks},gloo,0,broadcast\n" for t in (190.0, 212.0, 250.0)))
    coefficients = profile.get("coefficients", {})
    if expected is None:
        assert "tp_request_broadcast_us" not in coefficients
        assert any("gloo broadcast" in n and "tp 8" in n for n in res["notes"]), res["notes"]
    else:
        c = coefficients["tp_request_broadcast_us"]
        assert c["value"] == expected and "collective_bench.py" in c["source"] and "8 ranks" in c["source"]


@pytest.mark.parametrize(("args", "needle"), [
    ([], "nothing to calibrate from"),
    (["--host", "127.0.0.1:9"], "cannot reach"),
    (["--host", "127.0.0.1:9", "--concurrency", "1,x"], "--concurrency"),
    (["--from-log", "missing.log"], "missing.log"),
    (["--host", "127.0.0.1:9", "--profile-steps", "5"], "--trace-dir"),
    (["--from-log", str(DATA / "sglang-0.5.8-eagle3-tp8.log"), "--gpu", "h1000"], "--gpu"),
    # a profile is of a real box: a B200 with NVLink 4's curve is a what-if, not a box to calibrate
    (["--from-log", str(DATA / "sglang-0.5.8-eagle3-tp8.log"), "--gpu", "b200"],
     "allowed with --gpu b200 at TP 8: nvlink5-nccl"),
    # held-out concurrencies: of a live run, measured too, not all of them, and no file mixed in
    (["--from-log", str(DATA / "sglang-0.5.8-eagle3-tp8.log"), "--hold-out", "4"], "give --host too"),
    (["--host", "127.0.0.1:9", "--concurrency", "1,2", "--hold-out", "4"], "4 is not among --concurrency 1,2"),
    (["--host", "127.0.0.1:9", "--concurrency", "1,2", "--hold-out", "1,2"], "every concurrency is held out"),
    (["--host", "127.0.0.1:9", "--concurrency", "1,2", "--hold-out", "2", "--from-log",
      str(DATA / "sglang-0.5.8-eagle3-tp8.log")], "cannot be told apart by the run's concurrency"),
    (["--host", "127.0.0.1:9", "--hold-out", "x"], "--hold-out"),
])
def test_bad_input_exits_2_with_one_clear_line(tmp_path, args, needle):
    base = ["--gpu", "h100-sxm", "--interconnect", "nvlink4-nccl", "--out", str(tmp_path / "x.yaml")]
    res = CliRunner().invoke(main, ["calibrate", *base, *args])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_profile_steps_split_gpu_time_from_the_servers_traces(tmp_path):
    """--profile-steps asks the server for a torch-profiler trace of N iterations (here the fake writes one in
    SGLang 0.5.23's layout into --trace-dir), and the draft phase's GPU time becomes the draft step time."""
    traces = tmp_path / "traces"
    with FakeSGLang("0.5.10", algorithm="eagle3", chain_rates=[0.8, 0.6, 0.4], prefill_s=0.007, seed=2) as fake:
        code, res = _calibrate(["--host", fake.url, "--concurrency", "1,2", "--max-new-tokens", "48",
                                "--profile-steps", "4", "--trace-dir", str(traces), "--bootstrap", "0",
                                "--out", str(tmp_path / "p.yaml"), "--json", *BOX])
        assert code == 0, res
        assert fake.profile_requests and fake.profile_requests[0]["num_steps"] == 4
        assert fake.profile_requests[0]["output_dir"] == str(traces)
    assert list(traces.glob("*-TP-0.trace.json"))
    assert any("trace" in s for s in res["sources"])
    profile = yaml.safe_load((tmp_path / "p.yaml").read_text())
    # the fake's draft range holds 25% of each iteration's time in kernels (GEMM 20% + all-reduce 5%), over
    # num_steps - 1 = 2 draft forwards
    steps_ms = [s["measured_ms"] for s in res["step_times"]]
    draft = profile["draft_forward_ms"]["value"]
    assert min(steps_ms) * 0.25 / 2 * 0.8 <= draft <= max(steps_ms) * 0.25 / 2 * 1.2


def test_offline_calibrate_creates_its_output_directory(tmp_path):
    out = tmp_path / "new" / "sub" / "p.yaml"
    code, res = _calibrate(["--from-log", str(DATA / "sglang-0.5.10-nospec-tp1-logms.log"), "--out", str(out),
                            "--bootstrap", "0", "--json", *BOX])
    assert code == 0, res
    assert out.exists() and (out.parent / "p.measurements.json").exists()


def test_unwritable_output_and_damaged_resume_file_are_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, msg = _calibrate(["--from-log", str(DATA / "sglang-0.5.10-nospec-tp1-logms.log"),
                            "--out", str(blocker / "p.yaml"), *BOX])
    assert code == 2 and "--out" in msg and "Traceback" not in msg
    from simspec.calibration.measurements import Measurements
    from simspec.errors import InputError
    bad = tmp_path / "m.json"
    bad.write_text('{"server": {"tp": "x"')
    with pytest.raises(InputError, match="measurements"):
        Measurements.load(bad)


def test_non_finite_collective_times_are_refused(tmp_path):
    table = tmp_path / "ar.csv"
    table.write_text("bytes,time_us,world_size,backend,in_cuda_graph,op\n1024,inf,8,nccl,1,all_reduce\n")
    code, msg = _calibrate(["--collectives", str(table), "--out", str(tmp_path / "c.yaml"), "--gpu", "h200-sxm",
                            "--interconnect", "nvlink4-nccl", "--tp", "8", "--model", "llama-3.1-70b"])
    assert code == 2 and "finite" in msg and "Traceback" not in msg
