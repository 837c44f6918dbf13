"""`acceptance: {ngram_replay: ...}`: a scenario's n-gram acceptance replayed from real outputs."""

from __future__ import annotations

import json

import pytest
import yaml
from click.testing import CliRunner

from simspec.cli import main
from simspec.ngram import NgramConfig, load_corpus, replay
from simspec.predict import predict
from simspec.scenario.loader import load_scenario
from tests.conftest import ROOT, SMALL

CORPUS = ROOT / "tests" / "data" / "ngram" / "outputs.jsonl"


def _scenario(tmp_path, **acceptance):
    data = dict(SMALL, speculative={"algorithm": "ngram", "num_draft_tokens": 8},
                acceptance={"ngram_replay": {"corpus": str(CORPUS)}} | acceptance)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_the_replayed_histogram_drives_the_prediction(tmp_path):
    rs = load_scenario(_scenario(tmp_path))
    expected = replay(load_corpus(CORPUS)[0], NgramConfig(num_draft_tokens=8), concurrency=1)
    assert list(rs.replayed.histogram) == [float(c) for c in expected.histogram]
    result = predict(rs)
    assert "n-gram replay of outputs.jsonl" in result["sources"]["acceptance"]
    # the engine samples from the replayed distribution: its mean accept length lands near the replay's
    assert result["accept_length"] == pytest.approx(expected.mean_accept_length, rel=0.15)


def test_tree_and_chain_come_from_the_same_text(tmp_path):
    tree = load_scenario(_scenario(tmp_path))
    chain = load_scenario(_scenario(tmp_path), ["speculative.ngram={min_bfs_breadth: 1, max_bfs_breadth: 1}"])
    assert tree.replayed.histogram != chain.replayed.histogram
    assert "breadth 1-1" in chain.replayed.source and "breadth 1-10" in tree.replayed.source


def test_the_corpus_is_read_relative_to_the_scenario(tmp_path):
    (tmp_path / "corpus.jsonl").write_text(CORPUS.read_text())
    path = _scenario(tmp_path)
    data = yaml.safe_load(path.read_text())
    data["acceptance"]["ngram_replay"]["corpus"] = "corpus.jsonl"
    path.write_text(yaml.safe_dump(data))
    assert load_scenario(path).replayed is not None


@pytest.mark.parametrize(("change", "needle"), [
    ({"speculative": {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"}}, "acceptance.ngram_replay"),
    ({"acceptance": {"ngram_replay": {"corpus": "nope.jsonl"}}}, "not found"),
    ({"acceptance": {"ngram_replay": {"corpus": str(CORPUS)}, "accept_length": 2.0}}, "exactly one"),
    ({"acceptance": {"ngram_replay": {"corpus": str(CORPUS), "concurrency": 0}}}, "concurrency"),
])
def test_bad_replay_settings_exit_2(tmp_path, change, needle):
    data = dict(SMALL, speculative={"algorithm": "ngram"}, acceptance={"ngram_replay": {"corpus": str(CORPUS)}})
    data |= change
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["predict", str(path)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "Traceback" not in res.output


def test_shipped_replay_scenarios_predict(tmp_path):
    for name in ("ngram_tree_replay.yaml", "ngram_chain_replay.yaml"):
        res = CliRunner().invoke(main, ["predict", str(ROOT / "scenarios" / name), "--json",
                                        "--set", "workload.num_requests=1", "--set", "workload.output_tokens.value=64"])
        assert res.exit_code == 0, res.output
        assert "n-gram replay" in json.loads(res.output)["sources"]["acceptance"]
