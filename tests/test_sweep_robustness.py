"""Sweeps and bad input / lost work: self-referencing YAML anchors, Ctrl-C keeping the finished points, the cap on
how many points a sweep may expand to, and point errors naming the sweep key a bad value came from."""

from __future__ import annotations

import multiprocessing
import time

import pandas as pd
import pytest

from simspec.cli import main
from simspec.studies import sweep as S
from tests.conftest import SCENARIOS, cli_runner

EAGLE3 = SCENARIOS / "eagle3.yaml"


def _sweep(tmp_path, body: str) -> str:
    p = tmp_path / "sweep.yaml"
    p.write_text(f"name: r\nbase: {EAGLE3}\n{body}\n")
    return str(p)


def _refused(res, tmp_path, key: str, *words: str) -> str:
    assert res.exit_code == 2, (res.exit_code, res.output, res.stderr)
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "Traceback" not in res.output + res.stderr
    assert f"sweep.yaml: {key}: " in err, err
    for word in words:
        assert word in err, err
    assert not (tmp_path / "t.csv").exists()
    return err


# ------------------------------------------------------------------------------------------ 1: anchors


@pytest.mark.parametrize(("body", "key"), [
    (f"base: {EAGLE3}\ngrid: {{seed: &g [1, *g]}}", "grid.seed"),
    (f"base: {EAGLE3}\npoints: [{{workload: &w {{num_requests: *w}}}}]", "points[0].workload"),
    ("scenario: &s {name: x, hardware: *s}\ngrid: {seed: [1, 2]}", "scenario"),
    (f"name: &n [*n]\nbase: {EAGLE3}\ngrid: {{seed: [1, 2]}}", "name"),
])
def test_a_self_referencing_anchor_is_refused_naming_the_key(tmp_path, body, key):
    path = tmp_path / "sweep.yaml"
    path.write_text(body + "\n")
    res = cli_runner().invoke(main, ["sweep", str(path), "--out", str(tmp_path / "t.csv"), "--fast"])
    _refused(res, tmp_path, key, "refers to itself")


def test_an_alias_of_an_earlier_value_is_fine(tmp_path):
    path = _sweep(tmp_path, "setups: {a: &c {workload.num_requests: 4}, b: *c}\ngrid: {seed: [1, 2]}")
    assert len(S.load_sweep(path).points) == 4


# ------------------------------------------------------------------------------------------ 2: Ctrl-C


_calls = {"n": 0}


def _interrupt_on_third(task):
    _calls["n"] += 1
    if _calls["n"] == 3:
        raise KeyboardInterrupt
    return _real_run_task(task)


_real_run_task = S._run_task


def test_ctrl_c_writes_the_finished_points_and_exits_130(tmp_path, monkeypatch):
    _calls["n"] = 0
    monkeypatch.setattr(S, "_run_task", _interrupt_on_third)
    path = _sweep(tmp_path, "grid: {seed: [0, 1, 2, 3, 4]}")
    out, pq = tmp_path / "t.csv", tmp_path / "t.parquet"
    pytest.importorskip("pyarrow")
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(out), "--parquet", str(pq), "--fast", "--jobs", "1"])
    assert res.exit_code == 130, (res.output, res.stderr)
    assert "Traceback" not in res.output + res.stderr
    assert "interrupted" in res.stderr and "2 of 5 points" in res.stderr and str(out) in res.stderr
    for table in (pd.read_csv(out), pd.read_parquet(pq)):
        assert table["point"].tolist() == [0, 1]
        assert table["seed"].tolist() == [0, 1]
        assert table["tokens_per_s"].notna().all()


def test_an_interrupted_pool_keeps_its_finished_points_and_stops_its_workers(tmp_path):
    spec = S.load_sweep(_sweep(tmp_path, "grid: {seed: [" + ", ".join(map(str, range(200))) + "]}"))

    def stop_after_three(done, total):
        if done == 3:
            raise KeyboardInterrupt

    before = set(multiprocessing.active_children())  # another test's children are not this pool's workers
    with pytest.raises(S.SweepInterrupted) as info:
        S.run_points(spec, jobs=2, fast=True, progress=stop_after_three)
    table = info.value.table
    assert info.value.total == 200 and info.value.signum == 2
    assert 3 <= len(table) < 200
    assert table["point"].is_unique and table["point"].is_monotonic_increasing
    assert table["tokens_per_s"].notna().all()
    assert (table["seed"] == table["point"]).all()
    # the workers are terminated and joined before run_points returns; the pool's own management thread may reap
    # one at the same moment, and then multiprocessing notices it gone only on its next look: give that a moment
    deadline = time.monotonic() + 5.0
    while set(multiprocessing.active_children()) - before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not set(multiprocessing.active_children()) - before


# ------------------------------------------------------------------------------------------ 3: giant grids


def test_a_sweep_over_the_cap_is_refused_before_it_is_expanded(tmp_path):
    axis = ", ".join(map(str, range(1, 201)))
    path = _sweep(tmp_path, f"grid: {{seed: [{axis}], workload.num_requests: [{axis}], "
                            f"workload.arrival.concurrency: [{axis}]}}")
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(tmp_path / "t.csv"), "--fast"])
    _refused(res, tmp_path, "grid", "8,000,000 points", "100,000", "--max-points")
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(tmp_path / "t.csv")])
    _refused(res, tmp_path, "grid", "10,000", "--max-points")


def test_max_points_sets_the_cap(tmp_path):
    path = _sweep(tmp_path, "setups: {a: {seed: 0}, b: {seed: 1}}\ngrid: {workload.num_requests: [1, 2, 3]}")
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(tmp_path / "t.csv"), "--max-points", "5"])
    _refused(res, tmp_path, "grid", "6 points (2 setups x 3 grid.workload.num_requests)", "5")
    assert len(S.load_sweep(path, max_points=6).points) == 6
    assert "--max-points" in cli_runner().invoke(main, ["sweep", "--help"]).output


# ------------------------------------------------------------------------------------------ 4: blame


def test_a_point_error_from_a_sweep_value_names_the_sweep_key(tmp_path):
    path = _sweep(tmp_path, "points: [{speculative.num_draft_tokens: 64}]\ngrid: {server.tp: [8, 3]}")
    df = S.run_sweep(path, jobs=1, fast=True)
    errors = df["error"].tolist()
    assert errors[0].startswith(f"{path}: points[0].speculative.num_draft_tokens: "), errors[0]
    assert errors[1].startswith(f"{path}: grid.server.tp[1]: "), errors[1]


def test_a_section_replaced_by_a_setup_is_blamed_on_the_setup(tmp_path):
    path = _sweep(tmp_path, "setups: {big: {speculative: {algorithm: eagle3, drafter: eagle3-kimi-k2.5, num_steps: 3,"
                            " topk: 1, num_draft_tokens: 64}}}")
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(tmp_path / "t.csv"), "--fast"])
    assert res.exit_code == 2 and "Traceback" not in res.output + res.stderr
    assert "sweep.yaml: setups.big.speculative.num_draft_tokens: " in res.stderr, res.stderr
