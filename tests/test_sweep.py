"""Sweeps: the table's rows and columns, failing points, bad sweep files, the interconnect ordering, Ray.

Every sweep here is small: tiny workloads on the M1 box (scenarios/baseline.yaml and its calibration profile)
or on one H100, so the whole file runs in well under a minute on two cores.
"""

from __future__ import annotations

import copy
import json
import sys
import types
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simspec.cli import main
from simspec.predict import predict
from simspec.scenario.loader import load_scenario
from simspec.studies import sweep as S
from tests.conftest import SCENARIOS, cli_runner

SWEEPS = SCENARIOS / "sweeps"
BASELINE = SCENARIOS / "baseline.yaml"
FIGURES = ["tokens_per_s", "throughput_tokens_per_s", "accept_length", "iteration_ms", "breakdown_ms.draft_compute",
           "breakdown_ms.draft_comm", "breakdown_ms.verify_compute", "breakdown_ms.verify_comm", "breakdown_ms.cpu",
           "baseline_tokens_per_s", "speedup", "break_even_accept_length", "ttft_ms.p50", "ttft_ms.p99",
           "itl_ms.p50", "itl_ms.p99", "max_running_requests", "concurrency", "allreduce_token_us",
           "allreduce_verify_us"]
TINY = {"workload.num_requests": [4], "workload.output_tokens.value": [24]}
EAGLE3 = {"speculative": {"algorithm": "eagle3", "drafter": "eagle3-kimi-k2.5", "num_steps": 3, "topk": 1,
                          "num_draft_tokens": 4}, "acceptance": {"accept_length": 1.8}}
NGRAM = {"speculative": {"algorithm": "ngram", "num_draft_tokens": 4}, "acceptance": {"accept_length": 1.4}}


def _write(tmp_path: Path, spec: dict, name: str = "sweep.yaml") -> str:
    p = tmp_path / name
    p.write_text(yaml.safe_dump(spec, sort_keys=False))
    return str(p)


def _m1_sweep(**parts) -> dict:
    return {"base": str(BASELINE), **parts}


# ------------------------------------------------------------------------------------------ rows and columns


def test_rows_are_setups_x_points_x_grid_in_order_with_varied_columns(tmp_path):
    spec = _m1_sweep(
        setups={"baseline": {}, "eagle3": EAGLE3, "ngram_chain": NGRAM},
        points=[{"hardware.interconnect": "pcie5-nccl"},
                {"hardware.interconnect": "nvlink4-nccl", "calibration": None}],
        grid={"workload.arrival.concurrency": [1, 2], **TINY},
    )
    df = S.run_sweep(_write(tmp_path, spec), jobs=1)
    assert len(df) == 3 * 2 * 2 * 1 * 1
    inputs = ["point", "setup", "hardware.interconnect", "calibration", "workload.arrival.concurrency",
              "workload.num_requests", "workload.output_tokens.value"]
    assert list(df.columns[:len(inputs) + 1]) == inputs + ["error"]
    assert set(FIGURES) <= set(df.columns)
    assert df["point"].tolist() == list(range(12))
    assert df["setup"].tolist() == ["baseline"] * 4 + ["eagle3"] * 4 + ["ngram_chain"] * 4
    assert df["workload.arrival.concurrency"].tolist() == [1, 2] * 6  # the last grid key varies fastest
    assert df["hardware.interconnect"].tolist() == (["pcie5-nccl"] * 2 + ["nvlink4-nccl"] * 2) * 3
    # the value each point actually used: the base's calibration where the point does not clear it
    profile = yaml.safe_load(BASELINE.read_text())["calibration"]
    assert [v if isinstance(v, str) else None for v in df["calibration"][:4]] == [profile] * 2 + [None] * 2
    assert df["error"].isna().all()
    assert (df["algorithm"] == ["none"] * 4 + ["eagle3"] * 4 + ["ngram"] * 4).all()
    # RTX PRO 6000 cards have no NVLink: the NVLink points say they are a what-if, the PCIe ones do not
    flagged = df["hypothetical_interconnect"].notna().tolist()
    assert flagged == ([False] * 2 + [True] * 2) * 3
    assert "NVLink 4" in df["hypothetical_interconnect"][2]
    assert (df["concurrency"] == df["workload.arrival.concurrency"]).all()
    assert df[FIGURES].notna().all().all()
    base = df[df.setup == "baseline"]
    assert (base["speedup"] == 1.0).all() and (base["tokens_per_s"] == base["baseline_tokens_per_s"]).all()
    # cost columns: 8 GPUs at the preset's price, $ per million tokens from each row's own throughput
    price = df["price_per_gpu_hour_usd"][0]
    assert (df["box_usd_per_hour"] == 8 * price).all()
    expected = df["box_usd_per_hour"] / (df["throughput_tokens_per_s"] * 3600 / 1e6)
    assert (abs(df["usd_per_mtok"] / expected - 1) < 1e-9).all()
    assert ((df["saving_usd_per_mtok"] > 0) == (df["throughput_speedup"] > 1)).all()


def test_a_row_is_what_predict_set_gives(tmp_path):
    """The sweep changes a scenario exactly as `simspec predict --set` does, and reports its figures."""
    spec = {"base": "../eagle3.yaml", "grid": {"workload.arrival.concurrency": [2], **TINY}}
    path = tmp_path / "sweeps" / "s.yaml"
    path.parent.mkdir()
    # a base relative to the sweep file: copy the scenario next to it with its profile path still valid
    data = yaml.safe_load((SCENARIOS / "eagle3.yaml").read_text())
    data["calibration"] = str((SCENARIOS / data["calibration"]).resolve())
    (tmp_path / "eagle3.yaml").write_text(yaml.safe_dump(data))
    path.write_text(yaml.safe_dump(spec))
    row = S.run_sweep(path, jobs=1).iloc[0]
    sets = ["workload.arrival.concurrency=2", "workload.num_requests=4", "workload.output_tokens.value=24"]
    expected = predict(load_scenario(tmp_path / "eagle3.yaml", sets))
    assert row["tokens_per_s"] == pytest.approx(expected["tokens_per_s"], rel=1e-12)
    assert row["breakdown_ms.verify_comm"] == pytest.approx(expected["breakdown_ms"]["verify_comm"], rel=1e-12)
    assert row["baseline.iteration_ms"] == pytest.approx(expected["baseline"]["iteration_ms"], rel=1e-12)
    assert row["max_running_requests"] == expected["setup"]["max_running_requests"]
    # string overrides (the --set form) and structured ones land on the same scenario
    by_string = S._predict_point(str(tmp_path / "eagle3.yaml"), sets, False)
    by_value = S._predict_point(str(tmp_path / "eagle3.yaml"), [("workload.arrival.concurrency", 2),
                                                                ("workload.num_requests", 4),
                                                                ("workload.output_tokens.value", 24)], False)
    assert by_string == by_value


def test_structured_values_replace_sections_and_show_as_json(tmp_path):
    spec = _m1_sweep(
        setups={"mtp": {"speculative": {"algorithm": "mtp", "hypothetical_mtp_head": True, "num_steps": 2,
                                        "topk": 1, "num_draft_tokens": 3}}},
        grid={"acceptance": [{"chain_rates": [0.85]}, {"chain_rates": [0.9, 0.6]}, {"accept_length": 2.0}], **TINY},
    )
    df = S.run_sweep(_write(tmp_path, spec), jobs=1)
    assert df["error"].isna().all(), df["error"].tolist()
    assert json.loads(df["acceptance"][1]) == {"chain_rates": [0.9, 0.6]}
    assert df["accept_length"][0] < df["accept_length"][1]  # a second accepted position accepts more


def test_points_x_grid_and_process_pool_match_serial(tmp_path):
    spec = _m1_sweep(setups={"eagle3": EAGLE3},
                     points=[{"workload.arrival.concurrency": 1}, {"workload.arrival.concurrency": 4}],
                     grid={"acceptance.accept_length": [1.5, 2.5], **TINY})
    path = _write(tmp_path, spec)
    serial = S.run_sweep(path, jobs=1)
    pooled = S.run_sweep(path, jobs=2)
    assert len(serial) == 4
    pd.testing.assert_frame_equal(serial, pooled)


def test_the_shipped_sweeps_load():
    nv = S.load_sweep(SWEEPS / "nvlink_vs_pcie.yaml")
    assert len(nv.points) == 5 * 3 * 7
    assert {p.setup for p in nv.points} == {"baseline", "eagle3", "ngram_tree", "ngram_chain", "mtp"}
    assert {p.inputs["hardware.interconnect"] for p in nv.points} == {"pcie5-nccl", "pcie5-custom-allreduce",
                                                                       "nvlink4-nccl"}
    assert sorted({p.inputs["workload.arrival.concurrency"] for p in nv.points}) == [1, 2, 4, 8, 16, 32, 64]
    heat = S.load_sweep(SWEEPS / "draft_budget_heatmap.yaml")
    assert {"speculative.num_draft_tokens", "acceptance.accept_length"} <= set(heat.fields)


# ------------------------------------------------------------------------------------------ what the sweep says


def test_nvlink_never_predicts_fewer_tokens_per_s_than_pcie(tmp_path):
    """The shipped interconnect sweep, cut down to three concurrencies and short requests, plus the PCIe NCCL
    preset without M1's profile: NVLink is at least as fast as PCIe NCCL for every setup and load."""
    spec = yaml.safe_load((SWEEPS / "nvlink_vs_pcie.yaml").read_text())
    spec["base"] = str((SWEEPS / spec["base"]).resolve())
    spec["points"].append({"hardware.interconnect": "pcie5-nccl", "calibration": None})
    spec["grid"] = {"workload.arrival.concurrency": [1, 16, 64], "workload.num_requests": [64],
                    "workload.output_tokens.value": [16]}
    df = S.run_sweep(_write(tmp_path, spec), jobs=2)
    assert df["error"].isna().all(), df["error"].dropna().tolist()
    assert len(df) == 5 * 4 * 3
    df["box"] = df["hardware.interconnect"] + df["calibration"].isna().map({True: "", False: "+m1"})
    tps = df.pivot_table(index=["setup", "concurrency"], columns="box", values="tokens_per_s")
    for pcie in ("pcie5-nccl+m1", "pcie5-nccl"):
        slower = tps[tps["nvlink4-nccl"] < tps[pcie]]
        assert slower.empty, f"NVLink slower than {pcie}:\n{slower}"


# ------------------------------------------------------------------------------------------ failures


def test_a_failing_point_is_reported_and_the_others_run(tmp_path):
    spec = _m1_sweep(setups={"eagle3": EAGLE3}, grid={"acceptance.accept_length": [1.5, 9.0, 2.0], **TINY})
    path = _write(tmp_path, spec)
    df = S.run_sweep(path, jobs=1)
    assert df["error"].isna().tolist() == [True, False, True]
    assert "accept length 9.0 is above" in df["error"][1] and "acceptance.accept_length" in df["error"][1]
    assert df["tokens_per_s"].isna().tolist() == [False, True, False]

    out = tmp_path / "t.csv"
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(out), "--jobs", "1"])
    assert res.exit_code == 0, res.output + res.stderr
    assert "warning" in res.stderr and "point 1" in res.stderr and "accept length 9.0" in res.stderr
    table = pd.read_csv(out)
    assert len(table) == 3 and table["error"].notna().sum() == 1


def test_every_point_failing_exits_2(tmp_path):
    spec = _m1_sweep(setups={"eagle3": EAGLE3}, grid={"acceptance.accept_length": [8.0, 9.0]})
    res = cli_runner().invoke(main, ["sweep", _write(tmp_path, spec), "--out", str(tmp_path / "t.csv"), "--jobs", "1"])
    assert res.exit_code == 2
    assert "every point failed" in res.stderr and "sweep.yaml" in res.stderr


BAD_SWEEPS = [
    ({"base": str(BASELINE), "grid": {"seed": [0]}, "gird": {}}, "gird", "allowed keys in a sweep file"),
    ({"grid": {"seed": [0, 1]}}, "base", "exactly one of"),
    ({"base": "nowhere.yaml", "grid": {"seed": [0]}}, "base", "not found"),
    ({"base": str(BASELINE), "scenario": {}, "grid": {"seed": [0]}}, "base", "exactly one of"),
    ({"base": str(BASELINE), "grid": {"workload.arival.concurrency": [1]}}, "grid.workload.arival.concurrency",
     "unknown scenario field 'arival'"),
    ({"base": str(BASELINE), "grid": {"model.name": ["x"]}}, "grid.model.name", "not a section"),
    ({"base": str(BASELINE), "grid": {}}, "grid", "non-empty mapping"),
    ({"base": str(BASELINE), "grid": {"seed": []}}, "grid.seed", "non-empty list"),
    ({"base": str(BASELINE), "grid": {"seed": 3}}, "grid.seed", "non-empty list"),
    ({"base": str(BASELINE), "points": []}, "points", "non-empty list"),
    ({"base": str(BASELINE), "points": [{"seed": 1}], "grid": {"seed": [2]}}, "grid.seed", "both"),
    ({"base": str(BASELINE), "setups": ["a", "b"]}, "setups", "mapping of setup names"),
    ({"base": str(BASELINE), "setups": {"x": {"speculative.algoritm": "ngram"}}}, "setups.x.speculative.algoritm",
     "allowed there"),
    ({"base": str(BASELINE)}, None, "nothing to sweep"),
]


@pytest.mark.parametrize(("spec", "key", "message"), BAD_SWEEPS, ids=[str(i) for i in range(len(BAD_SWEEPS))])
def test_bad_sweep_files_exit_2_naming_file_and_key(tmp_path, spec, key, message):
    path = _write(tmp_path, spec)
    res = cli_runner().invoke(main, ["sweep", path, "--out", str(tmp_path / "t.csv")])
    assert res.exit_code == 2, res.output
    err = res.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert "sweep.yaml" in err and message in err
    if key:
        assert f": {key}:" in err
    assert "Traceback" not in res.output + res.stderr
    assert not (tmp_path / "t.csv").exists()


def test_not_yaml_and_bad_options_exit_2(tmp_path):
    bad = tmp_path / "sweep.yaml"
    bad.write_text("grid: [1, 2\n")
    res = cli_runner().invoke(main, ["sweep", str(bad)])
    assert res.exit_code == 2 and "not valid YAML" in res.stderr
    good = _write(tmp_path, _m1_sweep(grid={"seed": [0], **TINY}), "good.yaml")
    res = cli_runner().invoke(main, ["sweep", good, "--address", "ray://x:10001"])
    assert res.exit_code == 2 and "--address applies only to --backend ray" in res.stderr


def test_parquet_without_pyarrow_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # `import pyarrow` now raises ImportError
    good = _write(tmp_path, _m1_sweep(grid={"seed": [0], **TINY}))
    res = cli_runner().invoke(main, ["sweep", good, "--out", str(tmp_path / "t.csv"), "--parquet",
                                  str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and "pip install pyarrow" in res.stderr
    assert not (tmp_path / "t.csv").exists()  # checked before anything runs


def test_a_parquet_name_for_the_csv_table_is_refused(tmp_path):
    """--out writes CSV: a .parquet name would hold CSV that Parquet readers then reject."""
    good = _write(tmp_path, _m1_sweep(grid={"seed": [0], **TINY}))
    res = cli_runner().invoke(main, ["sweep", good, "--out", str(tmp_path / "t.parquet")])
    assert res.exit_code == 2 and "--out" in res.stderr and "--parquet FILE" in res.stderr, res.stderr
    assert not (tmp_path / "t.parquet").exists()  # checked before anything runs


def test_parquet_round_trip(tmp_path):
    pytest.importorskip("pyarrow", reason="pyarrow is needed for Parquet")
    spec = _m1_sweep(setups={"baseline": {}, "eagle3": EAGLE3}, grid={"seed": [0], **TINY})
    out, pq = tmp_path / "t.csv", tmp_path / "t.parquet"
    res = cli_runner().invoke(main, ["sweep", _write(tmp_path, spec), "--out", str(out), "--parquet", str(pq),
                                  "--jobs", "1"])
    assert res.exit_code == 0, res.output + res.stderr
    a, b = S.read_table(out), S.read_table(pq)
    assert a.shape == b.shape == (2, len(a.columns)) and list(a.columns) == list(b.columns)
    assert a["tokens_per_s"].tolist() == pytest.approx(b["tokens_per_s"].tolist())


# ------------------------------------------------------------------------------------------ --fast


def test_fast_goes_through_the_fast_path_hook(tmp_path, monkeypatch):
    spec = _m1_sweep(grid={"seed": [0], **TINY})
    path = _write(tmp_path, spec)
    calls = []

    def predict_fast(rs):
        calls.append(rs.scenario.seed)
        return copy.deepcopy(predict(rs)) | {"tokens_per_s": 123.0}

    fake = types.ModuleType("simspec.fastpath")
    fake.predict_fast = predict_fast  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "simspec.fastpath", fake)
    df = S.run_sweep(path, jobs=1, fast=True)
    assert calls == [0] and df["tokens_per_s"].tolist() == [123.0]


def test_fast_path_rows_and_its_refusals(tmp_path):
    spec = _m1_sweep(setups={"eagle3": EAGLE3},
                     points=[{"workload.arrival": {"type": "closed", "concurrency": 4}},
                             {"workload.arrival": {"type": "poisson", "rate_per_s": 2.0}}],
                     grid={"workload.num_requests": [64], "workload.output_tokens.value": [32]})
    df = S.run_sweep(_write(tmp_path, spec), jobs=1, fast=True)
    assert df["error"].isna().tolist() == [True, False]  # the fast path covers closed loops only, and says so
    assert "closed" in df["error"][1]
    assert df["tokens_per_s"][0] > 0 and df["concurrency"][0] == 4
    assert json.loads(df["workload.arrival"][1]) == {"type": "poisson", "rate_per_s": 2.0}


# ------------------------------------------------------------------------------------------ Ray


def test_ray_gives_the_same_table_as_the_local_backend(tmp_path):
    pytest.importorskip("ray", reason="ray is an optional extra (pip install 'simspec[ray]')")
    spec = _m1_sweep(setups={"baseline": {}, "eagle3": EAGLE3},
                     grid={"acceptance.accept_length": [1.5, 9.0], **TINY})  # 9.0 fails for eagle3 and baseline
    path = _write(tmp_path, spec)
    local = S.run_sweep(path, jobs=1)
    remote = S.run_sweep(path, jobs=1, backend="ray")
    assert local["error"].notna().sum() == 3
    pd.testing.assert_frame_equal(local, remote)
