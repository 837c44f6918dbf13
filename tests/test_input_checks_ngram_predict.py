"""Bad input to `simspec ngram` and `simspec predict`: bounds on the n-gram settings, a workload with no decode
step, a trace path in a missing folder, corpora with nothing to replay. Each is one line on stderr, exit 2, no
traceback, naming the file, flag or key and what is allowed."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import yaml

from simspec.cli import main
from simspec.ngram.config import MAX_BFS_BREADTH, MAX_DRAFT_TOKENS, MAX_TRIE_DEPTH
from simspec.scenario.schema import NgramSettings, Speculative
from tests.conftest import assert_refused, cli_runner

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"
EAGLE3 = SCENARIOS / "eagle3.yaml"
NGRAM_REPLAY = SCENARIOS / "ngram_tree_replay.yaml"
OUTPUTS = Path(__file__).resolve().parent / "data" / "ngram" / "outputs.jsonl"
SMALL = ("--set", "workload.num_requests=1", "--set", "workload.input_tokens.value=64")


def invoke(*args: str):
    return cli_runner().invoke(main, list(args))


# ---------------------------------------------------------------- 1. bounds: ngram flags = scenario schema


@pytest.mark.parametrize(("args", "flag", "allowed"), [
    (("--max-bfs-breadth", "1000000000000"), "--max-bfs-breadth", f"1 .. {MAX_BFS_BREADTH}"),
    (("--num-draft-tokens", "10000000000"), "--num-draft-tokens", f"2 .. {MAX_DRAFT_TOKENS}"),
    (("--num-draft-tokens", "100000000"), "--num-draft-tokens", f"2 .. {MAX_DRAFT_TOKENS}"),
    (("--num-draft-tokens", "1"), "--num-draft-tokens", f"2 .. {MAX_DRAFT_TOKENS}"),
    (("--sweep", "num_draft_tokens=4,1"), "--sweep num_draft_tokens=4,1", "2 .. "),
    (("--sweep", "max_bfs_breadth=1,2000"), "--sweep max_bfs_breadth=1,2000", f"1 .. {MAX_BFS_BREADTH}"),
    (("--max-trie-depth", "5000"), "--max-trie-depth", f"2 .. {MAX_TRIE_DEPTH}"),
])
def test_ngram_flags_out_of_range(args, flag, allowed):
    line = assert_refused(invoke("ngram", str(OUTPUTS), *args), flag, allowed)
    assert "--capacity" not in line


def test_huge_trie_depth_blames_the_depth_not_the_default_capacity():
    # 4. capacity was not given: the depth, not --capacity, is what is out of range
    line = assert_refused(invoke("ngram", str(OUTPUTS), "--max-trie-depth", "10000000000"), "--max-trie-depth",
               f"2 .. {MAX_TRIE_DEPTH}")
    assert "--capacity" not in line


@pytest.mark.parametrize(("key", "value"), [
    ("speculative.ngram.max_bfs_breadth", "1000000000000"),
    ("speculative.ngram.min_bfs_breadth", "2000"),
    ("speculative.ngram.max_trie_depth", "10000000000"),
    ("speculative.num_draft_tokens", "10000000000"),
])
def test_scenario_ngram_settings_out_of_range(key, value):
    assert_refused(invoke("predict", str(NGRAM_REPLAY), "--set", f"{key}={value}"), "ngram_tree_replay.yaml", key,
                   "1024")


def test_schema_and_ngram_command_share_their_bounds():
    fields = NgramSettings.model_fields
    le = {name: next(m.le for m in fields[name].metadata if hasattr(m, "le")) for name in
          ("min_bfs_breadth", "max_bfs_breadth", "max_trie_depth")}
    assert le == {"min_bfs_breadth": MAX_BFS_BREADTH, "max_bfs_breadth": MAX_BFS_BREADTH,
                  "max_trie_depth": MAX_TRIE_DEPTH}
    nd = Speculative.model_fields["num_draft_tokens"].metadata
    assert next(m.le for m in nd if hasattr(m, "le")) == MAX_DRAFT_TOKENS
    assert next(m.ge for m in nd if hasattr(m, "ge")) == 2


# ---------------------------------------------------------------- 2. one output token: no decode step


def test_one_output_token_is_refused():
    assert_refused(invoke("predict", str(EAGLE3), *SMALL, "--set", "workload.output_tokens.value=1"),
        "eagle3.yaml", "workload.output_tokens", "at least 2")


def test_one_output_token_is_refused_with_json():
    assert_refused(invoke("predict", str(EAGLE3), *SMALL, "--set", "workload.output_tokens.value=1", "--json"),
        "workload.output_tokens")


def test_a_distribution_that_can_draw_more_than_one_token_still_predicts():
    result = invoke("predict", str(EAGLE3), "--set", "workload.num_requests=8", "--set",
                    "workload.input_tokens.value=64", "--set",
                    'workload.output_tokens={"dist": "uniform", "low": 1, "high": 3}', "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)
    assert out["tokens_per_s"] > 0


FIXED_ONE = "this distribution draws no other length"
DRAWN_ONE = "(the distribution can draw more)"


@pytest.mark.parametrize("dist", [
    '{"dist": "fixed", "value": 1}',
    '{"dist": "fixed", "value": 5, "max": 1}',
    '{"dist": "uniform", "low": 1, "high": 5, "max": 1}',
    '{"dist": "normal", "mean": 1.2, "std": 0}',
    '{"dist": "lognormal", "mean": 200, "std": 30, "max": 1}',
])
def test_a_distribution_of_only_one_token_is_refused_without_blaming_the_seed(dist):
    line = assert_refused(invoke("predict", str(EAGLE3), *SMALL, "--set", f"workload.output_tokens={dist}"),
                          "eagle3.yaml: workload.output_tokens: every request has 1 output token", FIXED_ONE,
                          "allowed: lengths that can reach at least 2 output tokens")
    assert "seed" not in line and DRAWN_ONE not in line


def test_a_distribution_that_drew_only_one_token_this_run_says_it_depends_on_the_seed():
    """A normal around 1 token with a tiny spread can draw 2 (its tail is unbounded) but in practice never does:
    every seed draws 1-token outputs, and the message says so and what to change."""
    dist = '{"dist": "normal", "mean": 1, "std": 0.01}'
    line = assert_refused(invoke("predict", str(EAGLE3), "--set", "workload.num_requests=3", "--set",
                                 "workload.input_tokens.value=64", "--set", f"workload.output_tokens={dist}",
                                 "--set", "seed=7"),
                          "eagle3.yaml: workload.output_tokens: seed 7 drew 1 output token for each of the 3 requests",
                          DRAWN_ONE, "depends on the drawn lengths", "raise the output tokens",
                          "workload.output_tokens.min=2", "workload.num_requests", "change seed")
    assert FIXED_ONE not in line


def test_bench_serving_lengths_that_drew_one_token_name_their_own_seed():
    """bench_serving_random draws with workload.output_tokens.seed, not the scenario's seed: pick one of its seeds
    that draws a 1-token output for the only request (value 2 draws 1 or 2)."""
    from simspec.scenario.schema import LengthDistribution
    from simspec.workload import bench_serving_random_lengths

    def dist(seed: int) -> LengthDistribution:
        return LengthDistribution(dist="bench_serving_random", value=2, seed=seed)

    seed = next(s for s in range(100) if bench_serving_random_lengths(dist(s), dist(s), 1)[1][0] == 1)
    lengths = f'{{"dist": "bench_serving_random", "value": 2, "seed": {seed}}}'
    line = assert_refused(invoke("predict", str(EAGLE3), "--set", "workload.num_requests=1", "--set",
                                 f"workload.input_tokens={lengths}", "--set", f"workload.output_tokens={lengths}"),
                          f"workload.output_tokens.seed {seed} drew 1 output token for the only request", DRAWN_ONE,
                          "change workload.output_tokens.seed")
    assert FIXED_ONE not in line


def _strict_loads(text: str):
    def refuse(name: str):
        raise AssertionError(f"non-standard JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


def test_predict_json_never_emits_nan_or_infinity(monkeypatch):
    import simspec.cli as cli_module
    import simspec.predict as predict_module

    real = predict_module.predict_with_run

    def with_non_finite(rs):
        result, sim = real(rs)
        result = dict(result)
        result["speedup"] = float("nan")
        result["break_even_accept_length"] = float("inf")
        result["itl_ms"] = {"p50": float("nan"), "p99": -float("inf")}
        result["extra"] = (1.0, float("nan"))
        return result, sim

    monkeypatch.setattr(predict_module, "predict_with_run", with_non_finite)
    result = invoke("predict", str(EAGLE3), *SMALL, "--set", "workload.output_tokens.value=8", "--json")
    assert result.exit_code == 0, result.output
    out = _strict_loads(result.stdout)
    assert out["speedup"] is None and out["break_even_accept_length"] is None
    assert out["itl_ms"] == {"p50": None, "p99": None}
    assert out["extra"] == [1.0, None]
    assert math.isfinite(out["tokens_per_s"])
    assert cli_module.null_non_finite([float("nan")]) == [None]


# ---------------------------------------------------------------- 3. a trace in a missing folder


def test_trace_in_a_missing_folder_is_refused_before_predicting(tmp_path, monkeypatch):
    import simspec.predict as predict_module

    def must_not_run(rs):
        raise AssertionError("predicted before checking the trace path")

    monkeypatch.setattr(predict_module, "predict_with_run", must_not_run)
    target = tmp_path / "no" / "such" / "dir" / "t.json"
    assert_refused(invoke("predict", str(EAGLE3), *SMALL, "--trace", str(target)), str(target), "--trace",
                   "does not exist")


# ---------------------------------------------------------------- 5. corpora with nothing to replay


def _corpus(tmp_path: Path, *lines: dict) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps(obj) + "\n" for obj in lines))
    return path


def _replay_scenario(tmp_path: Path, corpus: Path) -> Path:
    data = yaml.safe_load(NGRAM_REPLAY.read_text())
    data.pop("calibration", None)
    data["acceptance"] = {"ngram_replay": {"corpus": str(corpus)}}
    path = tmp_path / "replay.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.parametrize("empty", [{"output_ids": []}, {"text": ""}])
def test_an_empty_output_is_refused_by_ngram_and_by_the_scenario_alike(tmp_path, empty):
    corpus = _corpus(tmp_path, {"output_ids": [1, 2, 3, 1, 2, 3]}, empty)
    field = next(iter(empty))
    assert_refused(invoke("ngram", str(corpus)), str(corpus), "line 2", field)
    assert_refused(invoke("predict", str(_replay_scenario(tmp_path, corpus))), str(corpus), "line 2", field)


def test_a_corpus_of_one_token_outputs_says_why_there_is_nothing_to_replay(tmp_path):
    corpus = _corpus(tmp_path, {"output_ids": [5]}, {"output_ids": [6], "prompt_ids": [1, 2]})
    line = assert_refused(invoke("ngram", str(corpus)), str(corpus), "nothing to replay", "2 tokens")
    assert "no output tokens" not in line
    assert_refused(invoke("predict", str(_replay_scenario(tmp_path, corpus))), str(corpus), "nothing to replay")


def test_output_ids_win_over_text_as_documented():
    from simspec.commands.ngram import ngram
    from simspec.ngram import corpus

    assert "whatever `text` it also carries" in (corpus.__doc__ or "")
    assert "read as its `output_ids`" in (ngram.help or "")
