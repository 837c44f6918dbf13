"""Bad input found by fuzzing: `simspec validate`'s record and check, sweep files and --address, YAML files with a
key given twice, quoted numbers, and flags that would silently do nothing. Each exits 2 with one line naming the
file and the field or flag, never a traceback, and writes nothing."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from simspec.cli import main
from tests.conftest import ROOT, SMALL, assert_refused, cli_runner

# this file's refusals: stdout may hold what ran first (validate's table); not held to one line
_refused = functools.partial(assert_refused, stdout_empty=False, one_line=False)

CORPUS = ROOT / "scenarios" / "corpora" / "sample_outputs.jsonl"


def _run(*args: str):
    return cli_runner().invoke(main, [str(a) for a in args])


def _scenario(tmp_path: Path, name: str = "small.yaml", **changes: Any) -> Path:
    data = copy.deepcopy(SMALL) | changes
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _case(suite: Path, case_id: str, **changes: Any) -> Path:
    d = suite / "cases"
    d.mkdir(parents=True, exist_ok=True)
    data = {"id": case_id, "title": "small", "source": {"citation": "test"}, "fitted": False,
            "measured": {"metric": "tokens_per_s", "value": 100.0}, "scenario": copy.deepcopy(SMALL)} | changes
    path = d / f"{case_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


# ------------------------------------------------------------------------------------------------ validate


def test_check_without_a_recorded_figure_is_bad_input(tmp_path):
    _case(tmp_path, "a")
    res = _run("validate", tmp_path, "--check")
    _refused(res, "recorded.yaml", "--check", "no recorded figure", "--record")
    assert not (tmp_path / "recorded.yaml").exists()


def test_record_refuses_when_a_case_fails_and_writes_nothing(tmp_path):
    _case(tmp_path, "good")
    _case(tmp_path, "broken", scenario=dict(SMALL, model="no-such-model"))
    res = _run("validate", tmp_path, "--record")
    _refused(res, "--record", "broken.yaml", "scenario.model", "no-such-model", "nothing was written")
    assert not (tmp_path / "recorded.yaml").exists()
    # an existing record is kept as it was
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 1.0\n")
    _refused(_run("validate", tmp_path, "--record"), "broken.yaml")
    assert (tmp_path / "recorded.yaml").read_text() == "mape_not_fitted_pct: 1.0\n"


def test_recorded_file_with_an_unknown_key_lists_the_allowed_ones(tmp_path):
    _case(tmp_path, "a")
    (tmp_path / "recorded.yaml").write_text("mape_not_fited_pct: 3\n")
    _refused(_run("validate", tmp_path), "recorded.yaml", "mape_not_fited_pct", "unknown key",
                      "mape_not_fitted_pct", "kernel_mape_pct")


def test_a_case_that_cannot_be_predicted_exits_2_without_check(tmp_path):
    _case(tmp_path, "good")
    _case(tmp_path, "broken", scenario=dict(SMALL, model="no-such-model"))
    res = _run("validate", tmp_path)
    _refused(res, "broken.yaml", "scenario.model", "no-such-model")
    assert "failed" in res.stdout  # the table still prints, the good case with it
    res = _run("validate", tmp_path, "--json")
    _refused(res, "broken.yaml", "scenario.model")


# ------------------------------------------------------------------------------------------------ sweep


def _sweep(tmp_path: Path, spec: dict[str, Any]) -> Path:
    _scenario(tmp_path, "base.yaml")
    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump({"base": "base.yaml"} | spec, sort_keys=False))
    return path


@pytest.mark.parametrize(("spec", "key", "needle"), [
    ({"grid": {"name": [1]}}, "grid.name[0]", "valid string"),
    ({"grid": {"workload.num_requests": [2, "3"]}}, "grid.workload.num_requests[1]", "without quotes"),
    ({"grid": {"server.sglang_version": [0.5]}}, "grid.server.sglang_version[0]", "0.5.23"),
    ({"points": [{"server.tp": 0}]}, "points[0].server.tp", "greater than or equal to 1"),
    ({"setups": {"a": {"workload.arrival": {"type": "poisson", "rate_per_s": 0}}}}, "setups.a.workload.arrival",
     "rate_per_s"),
])
def test_sweep_values_are_checked_against_the_schema_before_anything_runs(tmp_path, spec, key, needle):
    path = _sweep(tmp_path, spec)
    out = tmp_path / "w.csv"
    res = _run("sweep", path, "--out", out)
    _refused(res, "w.yaml", key, needle)
    assert not out.exists()


def test_sweep_values_of_the_right_type_still_run(tmp_path):
    """A union member's own field (arrival.type of either loop) and null for an optional section are values."""
    from simspec.studies.sweep import load_sweep

    path = _sweep(tmp_path, {"points": [{"workload.arrival.type": "poisson", "workload.arrival.rate_per_s": 2.0},
                                        {"workload.arrival.type": "closed"}],
                             "grid": {"acceptance": [None]}})
    assert len(load_sweep(path).points) == 2


@pytest.mark.parametrize("address", ["not a host", "ray://", "host:", ":6379", "host:99999", "host:port"])
def test_malformed_ray_address_is_bad_input(tmp_path, address):
    path = _sweep(tmp_path, {"grid": {"workload.num_requests": [1]}})
    res = _run("sweep", path, "--backend", "ray", "--address", address, "--out", tmp_path / "w.csv")
    _refused(res, "--address", repr(address), "host:port", "'auto'")
    assert not (tmp_path / "w.csv").exists()


def test_unreachable_or_foreign_ray_address_fails_fast(tmp_path):
    """Nothing listening, or something that is not a Ray head: an InputError within the stated timeout, not
    minutes of ray.init retrying (checked before ray is touched)."""
    import socket
    import time

    import simspec.studies.sweep as S

    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        port = free.getsockname()[1]
    with pytest.raises(S.InputError) as err:
        S._probe_ray_head(f"127.0.0.1:{port}")
    assert err.value.key == "--address" and "nothing answers" in str(err.value)
    with socket.socket() as silent:  # accepts connections, answers nothing
        silent.bind(("127.0.0.1", 0))
        silent.listen(1)
        t0 = time.monotonic()
        old = S.RAY_CONNECT_TIMEOUT_S
        S.RAY_CONNECT_TIMEOUT_S = 0.5
        try:
            with pytest.raises(S.InputError) as err:
                S._probe_ray_head(f"127.0.0.1:{silent.getsockname()[1]}")
        finally:
            S.RAY_CONNECT_TIMEOUT_S = old
        assert time.monotonic() - t0 < 5
    assert err.value.key == "--address" and "not as a Ray head" in str(err.value)


# ------------------------------------------------------------------------------------------------ YAML, --set


def test_a_key_given_twice_is_bad_input(tmp_path):
    path = _scenario(tmp_path)
    path.write_text(path.read_text() + "name: again\n")
    res = _run("predict", path)
    _refused(res, "small.yaml", "name", "twice", "line 1", f"line {len(path.read_text().splitlines())}")


def test_a_nested_key_given_twice_in_a_sweep_file_is_bad_input(tmp_path):
    path = _sweep(tmp_path, {})
    path.write_text(path.read_text() + "grid:\n  workload.num_requests: [1]\n  workload.num_requests: [2]\n")
    _refused(_run("sweep", path, "--out", tmp_path / "w.csv"), "w.yaml", "workload.num_requests", "twice")


def test_yaml_merge_keys_are_not_duplicates(tmp_path):
    from simspec.scenario.reading import read_yaml

    path = tmp_path / "m.yaml"
    path.write_text("a: &x {b: 1, c: 2}\nd:\n  <<: *x\n  b: 3\n")
    assert read_yaml(path) == {"a": {"b": 1, "c": 2}, "d": {"b": 3, "c": 2}}


@pytest.mark.parametrize(("override", "key"), [
    ('workload.output_tokens.value="16"', "workload.output_tokens.value"),
    ('server.mem_fraction_static="0.8"', "server.mem_fraction_static"),
    ('server.cuda_graph="false"', "server.cuda_graph"),
])
def test_a_quoted_value_is_not_a_number(tmp_path, override, key):
    res = _run("predict", _scenario(tmp_path), "--set", override)
    _refused(res, "small.yaml", key, "without quotes")


def test_a_quoted_accept_length_is_not_a_number(tmp_path):
    path = ROOT / "scenarios" / "eagle3.yaml"
    res = _run("predict", path, "--set", 'acceptance.accept_length="1.5"', "--set", "workload.num_requests=1")
    _refused(res, "eagle3.yaml", "acceptance.accept_length", "without quotes")


@pytest.mark.parametrize("version", ["0.5", "latest"])
def test_a_bad_sglang_version_lists_the_modelled_ones(tmp_path, version):
    res = _run("predict", _scenario(tmp_path), "--set", f"server.sglang_version={version}")
    _refused(res, "small.yaml", "server.sglang_version", "0.4.4", "0.5.3 through 0.5.23")


# ------------------------------------------------------------------------------------------------ flags


@pytest.mark.parametrize("value", ["1e9", "0"])
def test_cost_blames_gen_concurrency_not_the_scenario(tmp_path, value):
    res = _run("cost", _scenario(tmp_path), "--gen-concurrency", value)
    _refused(res, "small.yaml", "--gen-concurrency", "100,000")
    assert "workload." not in res.stderr


def test_cost_gen_concurrency_too_many_requests_for_the_turns(tmp_path):
    data = copy.deepcopy(SMALL)
    data["workload"]["arrival"] = dict(data["workload"]["arrival"], turns=1000)
    data["workload"]["num_requests"] = 1000
    path = tmp_path / "turns.yaml"
    path.write_text(yaml.safe_dump(data))
    _refused(_run("cost", path, "--gen-concurrency", "20000"), "turns.yaml", "--gen-concurrency",
                      "10,000,000")


def test_optimize_latency_stat_needs_a_bound(tmp_path):
    res = _run("optimize", _scenario(tmp_path), "--latency-stat", "p50", "--algorithms", "none")
    _refused(res, "--latency-stat", "--max-itl-ms", "--max-tpot-ms")


@pytest.mark.parametrize("args", [
    ["--max-match-window-size", "5"],
    ["--min-match-window-size", "2", "--sglang-version", "0.5.23"],
    ["--sweep", "max-match-window-size=3,5"],
])
def test_ngram_window_sizes_without_0_5_8_are_refused(args):
    res = _run("ngram", CORPUS, "--requests", "0", *args)
    _refused(res, "match-window-size" if args[0] != "--sweep" else "max_match_window_size", "0.5.8")
