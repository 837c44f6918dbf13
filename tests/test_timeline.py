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


def test_draft_extend_gathers_one_token_of_logits_per_request():
    """A v1 draft extend keeps one position's logits per request (SGLang prunes the rest): its all-gather is
    one vocabulary row, while each draft step's gathers topk rows and the verify's num_draft_tokens rows."""
    rs = load_scenario(SCENARIOS / "eagle3.yaml", SHORT)
    _, sim = predict_with_run(rs)
    spans = _spans(chrome_trace(sim, detail_iterations=1))
    first = next(e for e in spans if e["tid"] == 1 and e["cat"] == "decode")
    gathers = [k for k in _children(spans, first) if k["name"].startswith("all_gather")]
    sizes = [g["args"]["bytes"] for g in gathers]
    # draft steps (num_steps - 1 = 2, topk 1), the extend (1 token), then the verify (4 tokens of the target)
    assert len(sizes) == 4
    assert sizes[0] == sizes[1] == sizes[2]  # one row each: topk 1 and the extend's single position
    assert sizes[3] == 4 * 163_840 * 2  # the verify: num_draft_tokens rows of Kimi-K2.5's vocabulary
    assert sizes[0] == rs.drafter.draft_vocab_size * 2  # one row of the drafter's 32,000-token vocabulary
