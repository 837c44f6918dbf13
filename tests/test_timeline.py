"""`simspec predict --trace`: a valid Chrome trace whose spans add up to the simulated iterations."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from simspec.analysis.timeline import chrome_trace
from simspec.cli import main
from simspec.predict import predict_with_run
from simspec.scenario.loader import load_scenario
from tests.conftest import SCENARIOS

SHORT = ["workload.num_requests=2", "workload.output_tokens.value=40", "workload.input_tokens.value=64"]


def _spans(trace):
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def _children(spans, it):
    return [e for e in spans if e["tid"] != it["tid"] and e["args"]["iteration"] == it["args"]["index"]]


@pytest.mark.parametrize("scenario", ["eagle3", "ngram_tree", "baseline"])
def test_spans_add_up_to_each_iteration_and_the_prediction(scenario):
    rs = load_scenario(SCENARIOS / f"{scenario}.yaml", SHORT)
    result, sim = predict_with_run(rs)
    trace = chrome_trace(sim, detail_iterations=5)
    spans = _spans(trace)
    iterations = [e for e in spans if e["tid"] == 1]
    assert len(iterations) == len(sim.iterations)
    for it in iterations:
        kids = _children(spans, it)
        assert kids, it
        assert sum(k["dur"] for k in kids) == pytest.approx(it["dur"], rel=1e-4, abs=0.05)
        for k in kids:  # children stay inside their iteration
            assert k["ts"] + k["dur"] <= it["ts"] + it["dur"] + 0.05
    decode = [e["dur"] for e in iterations if e["cat"] == "decode"]
    assert sum(decode) / len(decode) / 1e3 == pytest.approx(result["iteration_ms"], rel=1e-4)


def test_detailed_iterations_show_every_collective():
    rs = load_scenario(SCENARIOS / "baseline.yaml", SHORT)
    _, sim = predict_with_run(rs)
    spans = _spans(chrome_trace(sim, detail_iterations=1))
    first_decode = next(e for e in spans if e["tid"] == 1 and e["cat"] == "decode")
    kids = _children(spans, first_decode)
    all_reduces = [k for k in kids if k["name"] == "all_reduce"]
    # Kimi-K2.5 at TP 8: 2 all-reduces per decoder layer (61) + the embedding's, and the logits all-gather
    assert len(all_reduces) == 2 * 61 + 1
    assert sum(k["name"].startswith("all_gather") for k in kids) == 1
    assert all(k["args"]["bytes"] == 7168 * 2 for k in all_reduces)  # one token x hidden x bf16
    later = [e for e in spans if e["tid"] == 1 and e["cat"] == "decode"][1]
    assert len(_children(spans, later)) <= 3  # phase totals only


def test_cli_writes_a_loadable_trace(tmp_path):
    out = tmp_path / "run.json"
    args = ["predict", str(SCENARIOS / "ngram_chain.yaml"), "--trace", str(out)]
    for s in SHORT:
        args += ["--set", s]
    res = CliRunner().invoke(main, args)
    assert res.exit_code == 0, res.output
    trace = json.loads(out.read_text())
    assert {"traceEvents", "displayTimeUnit"} <= set(trace)
    for e in trace["traceEvents"]:
        assert e["ph"] in ("X", "M")
        if e["ph"] == "X":
            assert {"name", "ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0


def test_unwritable_trace_path_is_bad_input(tmp_path):
    res = CliRunner().invoke(main, ["predict", str(SCENARIOS / "baseline.yaml"), "--trace",
                                    str(tmp_path / "missing-dir" / "t.json")] + sum((["--set", s] for s in SHORT), []))
    assert res.exit_code == 2
    assert "--trace" in res.output and "Traceback" not in res.output
