"""`simspec optimize`: the chosen setting is the best of the grid it searched, under the latency bound, and
acceptance is never invented for a setting the scenario does not describe."""

from __future__ import annotations

import json

import pytest
import yaml

from simspec.analysis.metrics import summarize
from simspec.cli import main
from simspec.scenario.loader import load_scenario
from simspec.simulate import run
from simspec.studies import optimize as study
from tests.conftest import SCENARIOS, cli_runner

POSITIONAL = [0.7, 0.1, 0.05, 0.03]


def _write(tmp_path, data, name="s.yaml") -> str:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.fixture
def tree(tmp_path, small) -> str:
    """Llama-3.1-8B + EAGLE-3 whose acceptance is given per rank: every tree in the grid is defined."""
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"positional_rates": POSITIONAL, "source": "assumed for the test"}
    return _write(tmp_path, small)


def _run(path: str, **kw) -> dict:
    plan_kw = {k: kw.pop(k) for k in ("concurrencies", "algorithms", "setups_path", "max_steps", "overrides")
               if k in kw}
    overrides = plan_kw.pop("overrides", None)
    return study.optimize(study.plan(path, overrides, **plan_kw), **kw)


def _independent(path: str, pt: dict, concurrency: int) -> dict:
    """Simulate a grid point the way `simspec predict --set` would, apart from the optimizer."""
    sets = [f"workload.arrival={{type: closed, concurrency: {concurrency}}}",
            f"workload.num_requests={max(2, concurrency)}"]
    if pt["algorithm"] == "none":
        sets += ["speculative={algorithm: none}", "acceptance="]
    else:
        sets += [f"speculative.num_steps={pt['num_steps']}", f"speculative.topk={pt['topk']}",
                 f"speculative.num_draft_tokens={pt['num_draft_tokens']}"]
    return summarize(run(load_scenario(path, sets)))


def test_choice_is_no_worse_than_every_grid_point(tree):
    """The winner beats or ties every point it considered (re-simulated independently), the runner-up is the
    best of the rest, and the margin is their difference in %."""
    out = _run(tree, concurrencies=[1, 4], max_steps=2, objective="throughput")
    assert out["grid"]["eagle3"]["points"] == len(study.tree_settings(2, len(POSITIONAL))) + 1  # + the own (3,1,4)
    for g in out["concurrencies"]:
        w, r, pts = g["winner"], g["runner_up"], g["points"]
        labels = {pt["label"] for pt in pts}
        assert "eagle3 (3, 1, 4)" in labels and "none" in labels  # the scenario's own setting and the baseline
        assert g["evaluated"] + len(g["rejected"]) == out["grid"]["eagle3"]["points"] + 1
        assert any("topk" in rej["reason"] for rej in g["rejected"])  # e.g. topk 4 with 4 draft tokens
        for pt in pts:
            again = _independent(tree, pt, g["concurrency"])
            assert again["throughput_tokens_per_s"] == pytest.approx(pt["throughput_tokens_per_s"])
            assert w["throughput_tokens_per_s"] >= again["throughput_tokens_per_s"] - 1e-9
        rest = [pt for pt in pts if pt is not w]
        assert r["value"] == max(pt["value"] for pt in rest)
        assert g["margin_pct"] == pytest.approx(100 * (w["value"] - r["value"]) / r["value"])
        assert g["margin_pct"] >= 0


def test_per_request_objective_ranks_by_tokens_per_s(tree):
    out = _run(tree, concurrencies=[4], max_steps=2, objective="per_request")
    g = out["concurrencies"][0]
    assert out["metric"] == "tokens_per_s"
    assert g["winner"]["tokens_per_s"] == max(pt["tokens_per_s"] for pt in g["points"])


def test_latency_bound_is_respected(tree):
    free = _run(tree, concurrencies=[4], max_steps=2)["concurrencies"][0]["points"]
    itls = sorted(pt["itl_ms"]["p99"] for pt in free)
    bound = (itls[0] + itls[-1]) / 2
    g = _run(tree, concurrencies=[4], max_steps=2, max_itl_ms=bound)["concurrencies"][0]
    assert g["winner"]["itl_ms"]["p99"] <= bound
    feasible = [pt for pt in g["points"] if pt["itl_ms"]["p99"] <= bound]
    assert g["winner"]["value"] == max(pt["value"] for pt in feasible)
    assert g["over_bound"] == sum(pt["itl_ms"]["p99"] > bound for pt in g["points"]) > 0


def test_unreachable_bound_says_no_feasible_point(tree):
    res = cli_runner().invoke(main, ["optimize", tree, "--max-steps", "1", "--max-tpot-ms", "0.001"])
    assert res.exit_code == 0, res.output
    assert "no feasible point: none of the" in res.stdout and "TPOT p99 <= 0.001 ms" in res.stdout
    out = json.loads(cli_runner().invoke(main, ["optimize", tree, "--max-steps", "1", "--max-tpot-ms", "0.001",
                                             "--json"]).stdout)
    assert out["concurrencies"][0]["winner"] is None


def test_accept_length_keeps_the_scenarios_tree():
    """M1's EAGLE-3 gives only a mean accept length: no other tree is searched, and none wins (it is faster)."""
    out = _run(str(SCENARIOS / "eagle3.yaml"), overrides=["workload.num_requests=2",
                                                          "workload.output_tokens.value=64"])
    assert out["grid"]["eagle3"]["points"] == 1 and "kept" in out["grid"]["eagle3"]["note"]
    g = out["concurrencies"][0]
    assert [pt["label"] for pt in g["points"]] == ["none", "eagle3 (3, 1, 4)"]
    assert g["winner"]["label"] == "none" and g["margin_pct"] > 0


def test_chain_rates_search_chains_as_deep_as_the_rates(tmp_path, small):
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"chain_rates": [0.8, 0.6, 0.4]}
    p = study.plan(_write(tmp_path, small), max_steps=5)
    eagle = [c for c in p.groups[0].valid if c.algorithm == "eagle3"]
    assert [c.label for c in eagle] == ["eagle3 (1, 1, 2)", "eagle3 (2, 1, 3)", "eagle3 (3, 1, 4)"]
    assert eagle[1].raw["acceptance"]["chain_rates"] == [0.8, 0.6]  # a shorter chain keeps the first rates


def test_other_algorithms_come_from_a_setups_file(tmp_path, tree):
    setups = _write(tmp_path, {"ngram": {"speculative": {"num_draft_tokens": 3},
                                         "acceptance": {"chain_rates": [0.5, 0.3]}}}, "setups.yaml")
    out = _run(tree, setups_path=setups, algorithms=["ngram", "none"])
    assert out["algorithms"] == ["ngram", "none"]
    labels = [pt["label"] for pt in out["concurrencies"][0]["points"]]
    assert sorted(labels) == ["ngram N=2", "ngram N=3", "none"]


def test_parallel_jobs_give_the_same_choice(tree):
    one = _run(tree, concurrencies=[1], max_steps=1)
    two = _run(tree, concurrencies=[1], max_steps=1, jobs=2)
    assert one["concurrencies"][0]["points"] == two["concurrencies"][0]["points"]


def test_cli_json_and_table(tree):
    res = cli_runner().invoke(main, ["optimize", tree, "--concurrency", "1,2", "--max-steps", "1", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert [g["concurrency"] for g in out["concurrencies"]] == [1, 2]
    table = cli_runner().invoke(main, ["optimize", tree, "--max-steps", "1"])
    assert table.exit_code == 0, table.output
    for text in ("winner", "runner-up", "margin", "eagle3: "):
        assert text in table.stdout, text


def test_a_box_that_does_not_exist_is_named_in_the_notes(tree):
    assert not any("hypothetical" in n for n in study.plan(tree, []).notes)
    what_if = ["hardware.num_gpus=2", "server.tp=2", "hardware.interconnect=pcie5-nccl"]
    notes = study.plan(tree, what_if).notes
    assert any(n.startswith("hypothetical interconnect: h100-sxm talks over NVLink 4") for n in notes), notes


@pytest.mark.parametrize("args, says", [
    (["--concurrency", "1,,8"], "--concurrency"), (["--concurrency", "a"], "--concurrency"),
    (["--concurrency", "0"], "--concurrency"), (["--concurrency", "2,2"], "twice"),
    (["--objective", "speed"], "unknown objective"), (["--algorithms", "eagle9"], "unknown algorithm"),
    (["--algorithms", "ngram"], "needs its own acceptance"), (["--max-itl-ms", "-1"], "--max-itl-ms"),
    (["--max-itl-ms", "5", "--max-tpot-ms", "5"], "not both"), (["--latency-stat", "p42"], "--latency-stat"),
    (["--max-steps", "0"], "--max-steps"), (["--jobs", "x"], "--jobs"),
    (["--setups", "missing.yaml"], "file not found"),
])
def test_bad_input_exits_2_with_one_line(tree, args, says):
    res = cli_runner().invoke(main, ["optimize", tree, *args])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error:") and says in res.stderr, res.stderr
    assert len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.output


def test_bad_setups_file_exits_2(tmp_path, tree):
    bad = _write(tmp_path, {"ngram": {"acceptance": {"accept_length": 0.5}}}, "setups.yaml")
    res = cli_runner().invoke(main, ["optimize", tree, "--setups", bad])
    assert res.exit_code == 2
    assert "algorithm ngram as set up in" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_missing_scenario_exits_2(tmp_path):
    res = cli_runner().invoke(main, ["optimize", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2 and "file not found" in res.stderr


def test_replayed_ngram_acceptance_searches_the_draft_budget():
    """With acceptance replayed from a corpus every num_draft_tokens has a defined accept length, so the
    optimizer searches N (each point replays the drafter at that budget)."""
    res = cli_runner().invoke(main, ["optimize", str(SCENARIOS / "ngram_chain_replay.yaml"), "--concurrency", "1",
                                  "--json", "--set", "workload.num_requests=1",
                                  "--set", "workload.output_tokens.value=64"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    text = json.dumps(out)
    assert "replayed from the corpus" in text
    ns = {p.get("num_draft_tokens") for c in out["concurrencies"] for p in c["points"] if p["algorithm"] == "ngram"}
    assert len(ns) >= 5


def test_a_concurrency_point_keeps_the_conversations_turns():
    _at_concurrency = study._at_concurrency
    raw = {"workload": {"arrival": {"type": "closed", "concurrency": 1, "turns": 2}, "num_requests": 10}}
    out = _at_concurrency(raw, 8)["workload"]
    assert out["arrival"] == {"type": "closed", "concurrency": 8, "turns": 2}
    assert out["num_requests"] == 16  # each of 8 clients gets a whole conversation
    raw["workload"]["arrival"] = {"type": "poisson", "rate_per_s": 2.0}
    assert _at_concurrency(raw, 3)["workload"]["num_requests"] == 10
