"""The validation suite and `simspec validate`: the CI gate on fidelity, and the command's behaviour."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simspec.cli import main
from simspec.validation import case_files, load_case
from tests.conftest import ROOT, SMALL, calibration_script

VALIDATION = ROOT / "validation"


def test_the_suite_does_not_regress_past_the_recorded_error():
    """CI's fidelity gate: every case still predicts and the non-fitted mean error has not grown."""
    res = CliRunner().invoke(main, ["validate", str(VALIDATION), "--json", "--check"])
    out = json.loads(res.output)
    s = out["summary"]
    failed = [c["id"] + ": " + c["failure"] for c in out["cases"] if c["failure"]]
    assert not failed, failed
    assert s["recorded_mape_not_fitted_pct"] is not None, "validation/recorded.yaml is missing"
    assert s["mape_not_fitted_pct"] <= s["recorded_mape_not_fitted_pct"], s
    k = out["kernels"]["summary"]  # the kernel tables' own gate, in the same run
    assert k["recorded_mape_pct"] is not None, "validation/recorded.yaml has no kernel_mape_pct"
    assert k["mape_pct"] <= k["recorded_mape_pct"], k
    assert len({row["hardware"] for row in k["by_table"] if row["kernel"] == "fused_moe"}) >= 4
    also = s["also_measured"]  # the latencies the cases' runs measured: their own gate
    assert also["recorded_mape_pct"] is not None, "validation/recorded.yaml has no also_measured_mape_pct"
    assert also["figures"] >= 40 and also["mape_pct"] <= also["recorded_mape_pct"], also
    verdicts = s["verdicts"]  # does speculation beat no speculation, as measured and as predicted: its own gate
    assert verdicts["recorded_wrong"] is not None, "validation/recorded.yaml has no verdicts_wrong"
    assert verdicts["compared"] >= 80 and len(verdicts["wrong"]) <= verdicts["recorded_wrong"], verdicts
    trends = s["trends"]  # how the figures move with the clients (issue 5: 'shapes matter'): their own gate
    assert trends["recorded_mape_pct"] is not None, "validation/recorded.yaml has no trend_mape_pct"
    assert trends["series"] >= 20 and trends["mape_pct"] <= trends["recorded_mape_pct"], trends
    assert any(t["name"] == "m3-llama31-8b-h100-eagle-chain3" and len(t["cases"]) == 9 for t in trends["by_series"])
    assert res.exit_code == 0
    # a case's note opens with the error it explains; a change that moves the case further than 1.5 points puts a dated
    # line with the new figure in front (validation/README.md), so that no note argues from a figure gone stale
    stale = []
    for c in out["cases"]:
        opening = re.match(r"\s*Predicted ([+-]?\d+(?:\.\d+)?)%", c["missing_mechanism"] or "")
        if opening and abs(float(opening.group(1)) - c["error_pct"]) > 1.5:
            stale.append(f"{c['id']}: its note opens at {opening.group(1)}%, predicted {c['error_pct']:+.1f}%")
    assert not stale, stale
    # the README's block of current figures is this run's (issue: 'the README shows the current table')
    from simspec.validation import markdown_summary

    readme = (ROOT / "README.md").read_text()
    begin, end = "<!-- simspec validate --markdown: begin -->\n", "<!-- simspec validate --markdown: end -->"
    assert begin in readme and end in readme, "README.md lost its current-figures block"
    shown = readme.split(begin, 1)[1].split(end, 1)[0]
    assert shown == markdown_summary(s, k), "README.md's figures are stale: paste `simspec validate --markdown`"


def test_cases_are_cited_and_consistent():
    files = case_files(VALIDATION)
    assert len(files) >= 20
    gpus, models = set(), set()
    for f in files:
        case = load_case(f)
        assert case.source.citation and (case.source.url or case.source.quote), f.name
        gpus.add(case.scenario["hardware"]["gpu"])
        models.add(case.scenario["model"])
        if case.scenario.get("acceptance"):
            # acceptance must say where it comes from: never inferred from the figure being validated
            assert case.scenario["acceptance"].get("source"), f.name
    assert len(gpus) >= 4, gpus


def _case(tmp_path: Path, case_id: str, **changes) -> Path:
    d = tmp_path / "cases"
    d.mkdir(exist_ok=True)
    data = {"id": case_id, "title": "small", "source": {"citation": "test"}, "fitted": False,
            "measured": {"metric": "tokens_per_s", "value": 100.0}, "scenario": dict(SMALL)} | changes
    path = d / f"{case_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_errors_are_signed_and_fitted_cases_are_kept_apart(tmp_path):
    _case(tmp_path, "a")
    _case(tmp_path, "b", fitted=True, measured={"metric": "tokens_per_s", "value": 50.0})
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    rows = {c["id"]: c for c in out["cases"]}
    predicted = rows["a"]["predicted"]
    assert predicted == rows["b"]["predicted"]  # same scenario
    assert rows["a"]["error_pct"] == pytest.approx((predicted - 100) / 100 * 100)
    assert out["summary"]["mape_not_fitted_pct"] == pytest.approx(abs(rows["a"]["error_pct"]))
    assert out["summary"]["mape_fitted_pct"] == pytest.approx(abs(rows["b"]["error_pct"]))


def test_seeds_report_what_the_draw_moves_and_leave_the_gated_figures_alone(tmp_path):
    """--seeds N predicts each case again under its next N - 1 seeds: a case whose lengths are drawn moves with the
    draw, one that leaves nothing to chance does not, and the errors, means and gate stay those of the case's own
    seed."""
    drawn = dict(SMALL, workload={"arrival": {"type": "closed", "concurrency": 4}, "num_requests": 12,
                                  "input_tokens": {"dist": "lognormal", "mean": 200.0, "std": 200.0},
                                  "output_tokens": {"dist": "lognormal", "mean": 150.0, "std": 150.0, "max": 2000}})
    _case(tmp_path, "drawn", scenario=drawn)
    _case(tmp_path, "fixed")
    plain = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--json", "--seeds", "3"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    rows = {c["id"]: c for c in out["cases"]}
    assert {c["id"]: c["error_pct"] for c in out["cases"]} == {c["id"]: c["error_pct"] for c in plain["cases"]}
    assert out["summary"]["mape_not_fitted_pct"] == plain["summary"]["mape_not_fitted_pct"]
    assert plain["summary"]["seeds"] is None and plain["cases"][0]["seed_range_pct"] is None
    for row in rows.values():
        assert len(row["reseeded"]) == 2
        low, high = row["seed_range_pct"]
        assert low <= row["error_pct"] <= high
    # the same scenario under seeds 1 and 2, predicted on its own, is what --seeds reports
    for seed, value in zip((1, 2), rows["drawn"]["reseeded"], strict=True):
        (tmp_path / "alone").mkdir(exist_ok=True)
        _case(tmp_path / "alone", "drawn", scenario=dict(drawn, seed=seed))
        alone = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path / "alone"), "--json"]).output)
        assert alone["cases"][0]["predicted"] == pytest.approx(value)
    assert len(set(rows["drawn"]["reseeded"]) | {rows["drawn"]["predicted"]}) > 1  # other lengths, other figure
    assert set(rows["fixed"]["reseeded"]) == {rows["fixed"]["predicted"]}  # nothing left to chance
    seeds = out["summary"]["seeds"]
    assert seeds["seeds"] == 3
    assert [w["id"] for w in seeds["widest"]] == ["drawn", "fixed"]
    mean = sum([rows["drawn"]["predicted"], *rows["drawn"]["reseeded"]]) / 3
    expected = (abs(mean - 100.0) + abs(rows["fixed"]["error_pct"])) / 2
    assert seeds["mape_not_fitted_over_seeds_pct"] == pytest.approx(expected)
    console = CliRunner().invoke(main, ["validate", str(tmp_path), "--seeds", "3"], env={"COLUMNS": "200"})
    assert "3 seeds" in console.output and "over 3 seeds each" in console.output
    bad = CliRunner().invoke(main, ["validate", str(tmp_path), "--seeds", "0"])
    assert bad.exit_code == 2 and "--seeds" in bad.output


def test_summary_breaks_the_error_down_by_source_worst_first(tmp_path):
    """Three non-fitted cases of one scenario: two from source A measured at the prediction and at half of it
    (0% and +100%), one from source B at 1.25 x the prediction (-20%); a fitted case of B is left out."""
    first = json.loads(CliRunner().invoke(main, ["validate", str(_case(tmp_path, "probe").parent), "--json"]).output)
    predicted = first["cases"][0]["predicted"]
    (tmp_path / "cases" / "probe.yaml").unlink()
    a, b = {"citation": "A", "url": "https://a.example"}, {"citation": "B"}
    _case(tmp_path, "a1", source=a, measured={"metric": "tokens_per_s", "value": predicted})
    _case(tmp_path, "a2", source=a, measured={"metric": "tokens_per_s", "value": predicted / 2})
    _case(tmp_path, "b1", source=b, measured={"metric": "tokens_per_s", "value": predicted * 1.25})
    _case(tmp_path, "b2", source=b, fitted=True)
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["summary"]
    assert [(row["source"], row["cases"], row["within_case_bar"]) for row in out["by_source"]] == [
        ("https://a.example", 2, 1), ("B", 1, 0)]
    assert [row["mape_pct"] for row in out["by_source"]] == pytest.approx([50.0, 20.0])
    assert out["median_abs_error_not_fitted_pct"] == pytest.approx(20.0)
    assert out["mape_not_fitted_pct"] == pytest.approx(40.0)


def test_a_case_that_no_longer_predicts_fails_the_check(tmp_path):
    _case(tmp_path, "good")
    bad = dict(SMALL, model="no-such-model")
    _case(tmp_path, "broken", scenario=bad)
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 100.0\n")  # a generous gate: the failure trips it
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1
    assert "scenario.model" in res.output and "no-such-model" in res.output


def test_record_then_check_passes_and_a_worse_model_fails(tmp_path):
    _case(tmp_path, "a")
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    assert (tmp_path / "recorded.yaml").exists()
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0
    # the same case measured elsewhere: a larger error than recorded
    _case(tmp_path, "a", measured={"metric": "tokens_per_s", "value": 10.0})
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1 and "REGRESSED" in res.output


def test_alternatives_span_the_readings_of_unstated_inputs(tmp_path):
    """A case measured at 1.5 x its H100 prediction: its reading misses (-33%); an H200 reading (the GPU unstated)
    predicts more, so the error range widens upwards and is reported per reading. Whether the measurement lies in the
    span decides which of the two miss counts the case joins."""
    probe = json.loads(CliRunner().invoke(main, ["validate", str(_case(tmp_path, "probe").parent), "--json"]).output)
    h100 = probe["cases"][0]["predicted"]
    alt = [{"why": "the source says only 'Hopper'", "set": ["hardware.gpu=h200-sxm"]}]
    _case(tmp_path, "probe", measured={"metric": "tokens_per_s", "value": 1.5 * h100}, alternatives=alt)
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    row = out["cases"][0]
    assert row["predicted"] == pytest.approx(h100)  # the case's own reading is unchanged by its alternatives
    (reading,) = row["alternatives"]
    assert reading["set"] == ["hardware.gpu=h200-sxm"] and reading["predicted"] > h100 * 1.1  # H200 streams faster
    assert reading["error_pct"] == pytest.approx((reading["predicted"] / (1.5 * h100) - 1) * 100)
    assert row["error_range_pct"] == pytest.approx([row["error_pct"], reading["error_pct"]])
    in_span = reading["error_pct"] >= -10.0
    assert row["measured_in_range"] is in_span
    s = out["summary"]
    assert (s["not_fitted_missed_within_alternatives"], s["not_fitted_missed_outside_alternatives"]) == (
        (1, 0) if in_span else (0, 1))
    # measured far above every reading: no reading explains the miss
    _case(tmp_path, "probe", measured={"metric": "tokens_per_s", "value": 5 * h100}, alternatives=alt)
    s = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["summary"]
    assert (s["not_fitted_missed_within_alternatives"], s["not_fitted_missed_outside_alternatives"]) == (0, 1)
    # a case without alternatives joins neither count
    _case(tmp_path, "probe", measured={"metric": "tokens_per_s", "value": 5 * h100})
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    assert out["cases"][0]["error_range_pct"] is None and out["cases"][0]["measured_in_range"] is None
    assert out["summary"]["not_fitted_missed_outside_alternatives"] == 0


def test_plot_draws_every_predicted_case_and_refuses_an_unknown_format(tmp_path):
    from simspec.analysis.validation_plot import error_figure
    from simspec.validation import case_files, run_cases

    _case(tmp_path, "a", alternatives=[{"why": "w", "set": ["hardware.gpu=h200-sxm"]}])
    _case(tmp_path, "b", fitted=True)
    _case(tmp_path, "broken", scenario=dict(SMALL, model="no-such-model"))
    results = run_cases(case_files(tmp_path))
    ax = error_figure(results).axes[0]
    assert [t.get_text() for t in ax.get_yticklabels()] == ["a", "b"]  # the failed case is left out...
    assert "broken" in ax.get_title()  # ...and named
    out = tmp_path / "errors.svg"
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--plot", str(out)])
    assert out.stat().st_size > 0 and "<svg" in out.read_text()[:500], res.output
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--plot", str(tmp_path / "errors.gif")])
    assert res.exit_code == 2 and "--plot" in res.output and ".gif" in res.output and "Traceback" not in res.output


def test_a_plot_that_cannot_be_written_loses_neither_the_results_nor_the_gate(tmp_path, monkeypatch):
    """The image is written last: when writing it fails, the JSON is printed, the record kept, and a regression
    still exits 1; otherwise the failed write exits 2."""
    import simspec.studies.plots as plots

    def refuse(*_args, **_kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(plots, "save", refuse)
    _case(tmp_path, "a")
    out = tmp_path / "errors.png"
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--json", "--record", "--plot", str(out)])
    assert res.exit_code == 2 and "No space left" in res.output
    assert json.loads(res.output[:res.output.rindex("}") + 1])["cases"][0]["id"] == "a"
    assert (tmp_path / "recorded.yaml").exists()
    _case(tmp_path, "a", measured={"metric": "tokens_per_s", "value": 10.0})  # now worse than recorded
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check", "--plot", str(out)])
    assert res.exit_code == 1 and "REGRESSED" in res.output


def test_an_alternative_that_does_not_predict_fails_its_case_naming_it(tmp_path):
    _case(tmp_path, "x", alternatives=[{"why": "w", "set": ["hardware.gpu=no-such-gpu"]}])
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 100.0\n")  # a generous gate: the failure trips it
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1, res.output
    assert "alternatives[0].set" in res.output and "no-such-gpu" in res.output and "Traceback" not in res.output
    # the CI gate reads --json: the failed case is a row, its readings listed unpredicted
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--json", "--check"])
    assert res.exit_code == 1, res.output
    (row,) = json.loads(res.output)["cases"]
    assert "alternatives[0].set" in row["failure"]
    assert row["alternatives"] == [{"why": "w", "set": ["hardware.gpu=no-such-gpu"], "predicted": None,
                                     "error_pct": None}]


@pytest.mark.parametrize(("change", "needle"), [
    ({"alternatives": [{"why": "w", "set": []}]}, "alternatives.0.set"),
    ({"alternatives": [{"set": ["hardware.gpu=h200-sxm"]}]}, "alternatives.0.why"),
    ({"measured": {"metric": "latency", "value": 1.0}}, "measured.metric"),
    ({"measured": {"metric": "tokens_per_s", "value": -1.0}}, "measured.value"),
    ({"fitted": "perhaps"}, "fitted"),
    ({"surprise": 1}, "surprise"),
    ({"also_measured": [{"metric": "ttft_ms.p95", "value": 1.0}]}, "also_measured.0.metric"),
    ({"also_measured": [{"metric": "tokens_per_s", "value": 1.0}]}, "also_measured.0.metric"),
    ({"also_measured": [{"metric": "tpot_ms.p50", "value": 0.0}]}, "also_measured.0.value"),
])
def test_bad_case_files_exit_2_naming_the_field(tmp_path, change, needle):
    _case(tmp_path, "x", **change)
    _assert_exit_2_naming(tmp_path, "x.yaml", needle)


def _assert_exit_2_naming(suite: Path, file_name: str, needle: str) -> None:
    res = CliRunner().invoke(main, ["validate", str(suite)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and file_name in res.output and "Traceback" not in res.output


def test_id_must_match_the_file_name(tmp_path):
    path = _case(tmp_path, "x")
    path.rename(path.with_name("y.yaml"))
    res = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert res.exit_code == 2 and "file name" in res.output


def test_missing_or_empty_directory_exits_2(tmp_path):
    assert CliRunner().invoke(main, ["validate", str(tmp_path / "nope")]).exit_code == 2
    (tmp_path / "empty").mkdir()
    res = CliRunner().invoke(main, ["validate", str(tmp_path / "empty")])
    assert res.exit_code == 2 and "no case files" in res.output


def test_record_on_a_flat_folder_keeps_the_record_out_of_the_cases(tmp_path):
    flat = tmp_path / "flat"
    flat.mkdir()
    data = {"id": "a", "title": "small", "source": {"citation": "test"}, "fitted": False,
            "measured": {"metric": "tokens_per_s", "value": 100.0}, "scenario": dict(SMALL)}
    (flat / "a.yaml").write_text(yaml.safe_dump(data))
    res = CliRunner().invoke(main, ["validate", str(flat), "--record", "--check"])
    assert res.exit_code == 0, res.output
    # recorded.yaml sits beside the cases and is not read as one
    assert CliRunner().invoke(main, ["validate", str(flat), "--check"]).exit_code == 0
    res = CliRunner().invoke(main, ["validate", str(flat / "a.yaml"), "--record"])
    assert res.exit_code == 2 and "--record" in res.output


def test_speculative_host_work_default_is_the_fit_to_its_named_cases():
    """spec_cpu_per_verified_token_us in defaults.yaml is the output of calibration/fit_spec_overhead.py, and the
    cases it was fitted to say so."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "calibration" / "fit_spec_overhead.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for c in (1, 2, 4, 8):
        assert load_case(VALIDATION / "cases" / f"gpustack-qwen3-8b-fp8-h100-eagle3-c{c}.yaml").fitted


def test_specbundle_host_profile_is_the_fit_to_its_named_cases_and_the_rest_use_it():
    """calibration/profiles/specbundle-h200-host.yaml is the output of calibration/fit_specbundle_host.py; the five
    Llama-3.1-8B MT-bench cases it was fitted to are marked fitted, and every SpecBundle case runs with the profile."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "calibration" / "fit_specbundle_host.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = sorted((VALIDATION / "cases").glob("specbundle-*.yaml"))
    assert len(cases) == 50  # five targets x five draft settings, on MT-bench and GSM8K
    for f in cases:
        case = load_case(f)
        assert case.scenario["calibration"].endswith("calibration/profiles/specbundle-h200-host.yaml"), f.name
        assert case.fitted == ("llama31-8b" in f.name and "mtbench" in f.name), f.name


@pytest.mark.parametrize(("prefix", "box", "profile", "count", "fitted_kind"), [
    ("angelslim163-", "angelslim163", "angelslim163-4xh100-host.yaml", 13, "-baseline-"),
    ("specforge339-", "specforge339", "specforge339-2xh100-host.yaml", 14, "-baseline-"),
    ("diss-", "diss-a100", "diss-1xa100-host.yaml", 18, "-nospec-"),
])
def test_host_per_token_profiles_are_the_fit_to_their_no_speculation_runs_and_their_eagle_runs_use_them(
        prefix, box, profile, count, fitted_kind):
    """Each profile calibration/fit_host_per_token.py writes is its fit's minimum; the box's no-speculation runs it
    was fitted to are marked fitted, its EAGLE-3 runs are not, and every run of the box uses that profile (the one
    reporter's two boxes each their own, and the A100 of a dissertation's runs its own)."""
    import subprocess
    import sys

    script = ROOT / "calibration" / "fit_host_per_token.py"
    proc = subprocess.run([sys.executable, str(script), "--check", "--box", box], capture_output=True, text=True,
                          cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    cases = sorted((VALIDATION / "cases").glob(f"{prefix}*.yaml"))
    assert len(cases) == count
    for f in cases:
        case = load_case(f)
        assert case.scenario["calibration"].endswith(f"calibration/profiles/{profile}"), f.name
        assert case.fitted == (fitted_kind in f.name), f.name


def test_eager_prefill_profile_is_the_fit_to_its_one_request_runs_and_the_rest_use_it():
    """The cookbook B200 box's per-model profiles are calibration/fit_eager_prefill.py's output; the runs each was
    fitted to (the script's PAGES: a page's one-request runs when it was fitted) are marked fitted, the page's other
    runs are not, and all use the profile of their model."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, str(ROOT / "calibration" / "fit_eager_prefill.py"), "--check"],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    script = calibration_script("fit_eager_prefill")
    for key, prefix, count in (("deepseek-r1", "cookbook-deepseek-r1-", 9), ("qwen3-235b", "cookbook-qwen3-235b-", 9)):
        page = script.PAGES[key]
        cases = sorted((VALIDATION / "cases").glob(f"{prefix}*.yaml"))
        assert len(cases) == count
        assert set(page.fitted) <= {f.stem for f in cases}
        for f in cases:
            case = load_case(f)
            assert case.scenario["calibration"].endswith(f"calibration/profiles/{page.profile_name}.yaml"), f.name
            assert case.fitted == (f.stem in page.fitted), f.name


# ------------------------------------------------------------------------------------------------ kernel tables

def _write_table(tmp_path: Path, table_id: str, data: dict) -> Path:
    """A kernel table in a suite beside one end-to-end case (validate needs a case to run)."""
    if not (tmp_path / "cases").exists():
        _case(tmp_path, "a")
    d = tmp_path / "kernels"
    d.mkdir(exist_ok=True)
    path = d / f"{table_id}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _table(tmp_path: Path, table_id: str, **changes) -> Path:
    """A fused-MoE kernel table."""
    data = {"id": table_id, "title": "small", "source": {"citation": "test"}, "kernel": "fused_moe",
            "gpu": "h100-sxm", "routing_timed": True, "config": "default", "l2_cache_mb": 1.0, "l2_source": "test",
            "shape": {"experts": 8, "experts_per_token": 2, "hidden_size": 1024, "intermediate_per_gpu": 512,
                      "weights": "bf16"},
            "points": [[1, 20.0]]} | changes
    return _write_table(tmp_path, table_id, data)


def test_a_fused_moe_call_is_priced_by_hand(tmp_path):
    """One token, 8 experts, top 2 on an H100 at the default coefficients: it touches 8 (1 - 6/8) = 2 experts of
    3 x 1024 x 512 BF16 weights each, plus its activations (w13 reads the hidden row per pair and writes 2 x 512,
    silu_and_mul moves 3 x 512, w2 reads 512 and writes 1024, moe_sum_reduce reads the pairs' rows and writes one),
    all at 80% of 3.35 TB/s; the benchmark launches kernels.yaml's 7 MoE kernels less the router GEMM, 4 of them
    small (1.3 us a boundary, 3 us a small kernel). Without the routing timed, the top-k kernel goes too."""
    from simspec.kernel_validation import load_table, predict_table

    weights = 2 * 3 * 1024 * 512 * 2
    pairs = 2
    acts = 2 * pairs * ((1024 + 2 * 512) + 3 * 512 + (512 + 1024) + 1024) + 2 * 1024
    roofline_us = (weights + acts) / (3350e9 * 0.80) * 1e6
    timed = predict_table(load_table(_table(tmp_path, "timed"))).points[0]
    assert timed.predicted_us == pytest.approx(roofline_us + 6 * 1.3 + 4 * 3.0)
    assert timed.expert_mb == pytest.approx(weights / 1e6)
    untimed = predict_table(load_table(_table(tmp_path, "untimed", routing_timed=False))).points[0]
    assert timed.predicted_us - untimed.predicted_us == pytest.approx(1.3 + 3.0)
    # FP8 experts: half the weight bytes, and one activation quantisation (a small kernel) before each GEMM
    fp8 = predict_table(load_table(_table(tmp_path, "fp8", shape={
        "experts": 8, "experts_per_token": 2, "hidden_size": 1024, "intermediate_per_gpu": 512,
        "weights": "fp8"}))).points[0]
    assert fp8.expert_mb == pytest.approx(weights / 2 / 1e6)
    fp8_acts = acts - pairs * 1024 - pairs * 512  # each GEMM reads its input rows in FP8 (1 byte, not 2)
    assert fp8.predicted_us == pytest.approx((weights / 2 + fp8_acts) / (3350e9 * 0.80) * 1e6 + 8 * 1.3 + 6 * 3.0)
    # streaming_kernel_us: once per kernel that is not small (the w13 and w2 GEMMs)
    from dataclasses import replace

    from simspec.kernel_validation import default_efficiencies
    ramp = replace(default_efficiencies(), streaming_kernel_us=2.0)
    ramped = predict_table(load_table(_table(tmp_path, "timed")), eff=ramp).points[0]
    assert ramped.predicted_us - timed.predicted_us == pytest.approx(2 * 2.0)


def test_a_table_of_one_gemm_kernel_is_priced_by_its_roofline_and_boundary_alone(tmp_path):
    """`timed: w13` / `w2`: that kernel of the hand-priced call above, with one boundary, no small kernels; a table
    whose calls each read their own copy of the experts compares every point, L2 or not."""
    from simspec.kernel_validation import load_table, predict_table

    weights = 2 * 3 * 1024 * 512 * 2
    pairs = 2
    w13 = weights * 2 / 3 + pairs * 2 * (1024 + 2 * 512)
    w2 = weights / 3 + pairs * 2 * (512 + 1024)
    for kernel, nbytes in (("w13", w13), ("w2", w2)):
        one = predict_table(load_table(_table(tmp_path, kernel, timed=kernel, l2_cache_mb=100.0))).points[0]
        assert one.predicted_us == pytest.approx(nbytes / (3350e9 * 0.80) * 1e6 + 1.3), kernel
        assert not one.compared  # 6.3 MB of experts in a 100 MB L2
        rotated = predict_table(load_table(_table(tmp_path, f"r{kernel}", timed=kernel, l2_cache_mb=100.0,
                                                  rotates_weights=True))).points[0]
        assert rotated.compared and rotated.predicted_us == one.predicted_us


def test_points_whose_experts_fit_in_l2_are_listed_but_not_compared(tmp_path):
    """The benchmarks replay one routing ten times: experts that fit in L2 are read from it after the first call."""
    _table(tmp_path, "t", l2_cache_mb=10.0, points=[[1, 1.0], [8, 40.0]])  # 1 token: 6.3 MB, 8 tokens: 22.6 MB
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["kernels"]
    compared = {p["size"]: p["compared"] for p in out["points"]}
    assert compared == {1: False, 8: True}
    eight = next(p for p in out["points"] if p["size"] == 8)
    assert out["summary"]["points_compared"] == 1 and out["summary"]["points_in_l2"] == 1
    assert out["summary"]["mape_pct"] == pytest.approx(abs(eight["error_pct"]))
    assert eight["error_pct"] == pytest.approx((eight["predicted_us"] - 40.0) / 40.0 * 100)


def test_kernel_tables_have_their_own_recorded_gate(tmp_path):
    _table(tmp_path, "t", points=[[8, 40.0]])
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    recorded = yaml.safe_load((tmp_path / "recorded.yaml").read_text())
    assert set(recorded) == {"mape_not_fitted_pct", "kernel_mape_pct"}
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0
    _table(tmp_path, "t", points=[[8, 4.0]])  # measured far faster: the kernel error grows, the cases' does not
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1 and "recorded kernel mean error" in res.output and "REGRESSED" in res.output


def test_an_all_reduce_table_predicts_one_group_size_from_another(tmp_path):
    """nccl-tests' bus bandwidth converts to time as algbw = busbw x n / (2(n-1)). The 8-GPU curve moves to 4 GPUs:
    its first point by NCCL's PCIe ring latency, (6.6 + 2 x 3 x 1.0) / (6.6 + 2 x 7 x 1.0) of it, and what a larger
    message adds on top by the ring's bandwidth factor, (2 x 3 / 4) / (2 x 7 / 8)."""
    if not (tmp_path / "cases").exists():
        _case(tmp_path, "a")
    (tmp_path / "kernels").mkdir()
    data = {"id": "ar", "title": "t", "source": {"citation": "test"}, "kernel": "all_reduce", "link": "pcie",
            "reference": {"gpus": 8, "busbw_gbps": [[65536, 4.0], [1048576, 16.0]]},
            "measured": {"gpus": 4, "busbw_gbps": [[65536, 8.0], [1048576, 24.0]]}}
    (tmp_path / "kernels" / "ar.yaml").write_text(yaml.safe_dump(data))
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["kernels"]
    small, large = out["points"]
    ref_small, ref_large = (b / (bw * 1e9 * 8 / 14) * 1e6 for b, bw in ((65536, 4.0), (1048576, 16.0)))
    assert small["measured_us"] == pytest.approx(65536 / (8.0e9 * 4 / 6) * 1e6)
    assert small["predicted_us"] == pytest.approx(ref_small * 12.6 / 20.6)
    assert large["predicted_us"] == pytest.approx(ref_small * 12.6 / 20.6 + (ref_large - ref_small) * 1.5 / 1.75)
    assert small["unit"] == "bytes" and small["kernel"] == "all_reduce" and small["compared"]


@pytest.mark.parametrize(("change", "needle"), [
    ({"gpu": "no-such-gpu"}, "gpu"),
    ({"points": [[8, 1.0], [4, 2.0]]}, "points"),
    ({"points": [[0, 1.0]]}, "points"),
    ({"kernel": "attention"}, "kernel"),
    ({"kernel": "all_reduce"}, "link"),
    ({"shape": {"experts": 8}}, "shape"),
    ({"shape": {"experts": 8, "experts_per_token": 9, "hidden_size": 8, "intermediate_per_gpu": 8,
                "weights": "bf16"}}, "experts_per_token"),
    ({"routing_timed": "yes"}, "routing_timed"),
    ({"timed": "kernels"}, "timed"),
    ({"rotates_weights": "yes"}, "rotates_weights"),
])
def test_bad_kernel_tables_exit_2_naming_the_field(tmp_path, change, needle):
    _table(tmp_path, "k", **change)
    _assert_exit_2_naming(tmp_path, "k.yaml", needle)


def test_a_kernel_folder_or_table_given_alone_is_an_input_error(tmp_path):
    _table(tmp_path, "t")
    for alone in (tmp_path / "kernels", tmp_path / "kernels" / "t.yaml"):
        res = CliRunner().invoke(main, ["validate", str(alone)])
        assert res.exit_code == 2 and "kernel tables" in res.output and "Traceback" not in res.output


def test_one_case_file_runs_without_the_kernel_tables(tmp_path):
    _table(tmp_path, "t")
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path / "cases" / "a.yaml"), "--json"]).output)
    assert "kernels" not in out and [c["id"] for c in out["cases"]] == ["a"]


def test_a_record_without_the_kernel_figure_is_an_input_error(tmp_path):
    """A suite with kernel tables whose recorded.yaml lacks kernel_mape_pct would run with that gate off."""
    _case(tmp_path, "a")
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0  # no tables yet
    _table(tmp_path, "t", points=[[8, 40.0]])
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 2 and "kernel_mape_pct" in res.output and "recorded.yaml" in res.output
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0


def test_the_kernel_tables_are_cited():
    """A published table carries its address and a quote; one simspec measured names its raw result, checked in."""
    from simspec.kernel_validation import kernel_files, load_table

    files = kernel_files(VALIDATION)
    assert len(files) >= 5
    for f in files:
        t = load_table(f)
        if t.source.citation.startswith("measured by simspec"):
            raw = t.source.citation.split("raw result ")[-1].strip()
            assert raw.startswith("calibration/measurements/") and (ROOT / raw).is_file(), f.name
            continue
        assert t.source.url and t.source.quote, f.name
        # a fused-MoE benchmark replays one routing: its table says how large the L2 its repeated calls hit is
        assert t.kernel != "fused_moe" or t.l2_source, f.name  # type: ignore[union-attr]


def _attention_table(tmp_path: Path, table_id: str, **changes) -> Path:
    data = {"id": table_id, "title": "t", "source": {"citation": "test"}, "kernel": "attention_decode",
            "gpu": "h200-sxm", "model": "llama-3.1-8b", "tp": 1, "kv_cache_dtype": "bf16", "backend": "fa3",
            "timed": "one call", "points": [{"batch": 1, "context": 1024, "us": 11.0},
                                            {"batch": 8, "context": 4096, "q_tokens": 4, "us": 40.0}]} | changes
    return _write_table(tmp_path, table_id, data)


def test_a_decode_attention_call_is_priced_as_a_forward_prices_one_layer_of_attention(tmp_path):
    """Llama-3.1-8B's attention at TP 1 on an H200: 8 KV heads x 128 x K and V x 2 bytes = 4,096 bytes a cached token
    and layer, read at 80% of 4.8 TB/s, plus one kernel boundary (1.3 us); four query tokens a request still read
    each entry once (at 16 FLOPs a byte the call stays memory-bound). An FP8 cache halves the bytes. DeepSeek-V3's
    MLA at TP 1 (128 heads) on a B200 scores 2 x 128 x (576 + 512) FLOPs a query-key pair: four query tokens over
    8,192 cached ones for 256 requests are compute-bound at 70% of the 2,250 TFLOP/s BF16 peak."""
    from simspec.kernel_validation import load_table, predict_table

    one, verify = predict_table(load_table(_attention_table(tmp_path, "gqa"))).points
    assert one.predicted_us == pytest.approx(1024 * 4096 / (4800e9 * 0.80) * 1e6 + 1.3)
    assert verify.predicted_us == pytest.approx(8 * 4096 * 4096 / (4800e9 * 0.80) * 1e6 + 1.3)
    assert (one.size, one.shape, verify.shape) == (1024, "b1 s1024 q1", "b8 s4096 q4")
    fp8, _ = predict_table(load_table(_attention_table(tmp_path, "f", kv_cache_dtype="fp8"))).points
    assert fp8.predicted_us == pytest.approx(1024 * 2048 / (4800e9 * 0.80) * 1e6 + 1.3)
    mla = _attention_table(tmp_path, "mla", gpu="b200", model="deepseek-v3",
                           points=[{"batch": 256, "context": 8192, "q_tokens": 4, "us": 1600.0}])
    (big,) = predict_table(load_table(mla)).points
    pairs = 256 * 4 * 8192
    assert big.predicted_us == pytest.approx(pairs * 2 * 128 * (576 + 512) / (2250e12 * 0.70) * 1e6 + 1.3)
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)["kernels"]
    row = next(p for p in out["points"] if p["table"] == "gqa")
    assert row["unit"] == "KV tokens" and row["kernel"] == "attention_decode" and row["compared"]


@pytest.mark.parametrize(("change", "needle"), [
    ({"model": "no-such-model"}, "model"),
    ({"gpu": "no-such-gpu"}, "gpu"),
    ({"kv_cache_dtype": "int4"}, "kv_cache_dtype"),
    ({"tp": 0}, "tp"),
    ({"points": [{"batch": 1, "context": 0, "us": 1.0}]}, "points"),
    ({"points": [{"batch": 1, "context": 8, "q_tokens": 0, "us": 1.0}]}, "points"),
    ({"points": [{"batch": 1, "context": 8, "us": 1.0}, {"batch": 1, "context": 8, "q_tokens": 1, "us": 2.0}]},
     "points"),
    ({"points": [{"batch": 1, "context": 8}]}, "points"),
    ({"backend": None}, "backend"),
])
def test_bad_attention_tables_exit_2_naming_the_field(tmp_path, change, needle):
    _attention_table(tmp_path, "t", **change)
    _assert_exit_2_naming(tmp_path, "t.yaml", needle)


def _gemm_table(tmp_path: Path, table_id: str, **changes) -> Path:
    data = {"id": table_id, "title": "t", "source": {"citation": "test"}, "kernel": "gemm", "gpu": "h200-sxm",
            "weights": "bf16", "points": [{"k": 4096, "n": 4096, "m": 1, "us": 14.0},
                                          {"k": 4096, "n": 4096, "m": 256, "us": 18.0}]} | changes
    return _write_table(tmp_path, table_id, data)


def test_a_gemm_is_priced_as_the_forward_prices_a_weight_group(tmp_path):
    """4096 x 4096 BF16 on an H200 at the default coefficients: one token streams 33.6 MB at 80% of 4.8 TB/s (its
    FLOPs over 64 padded rows at 70% of 989 TFLOP/s are less); 256 tokens are compute-bound. Each call pays one
    kernel boundary (1.3 us) and streaming_kernel_us (0 by default); FP8 halves the bytes and runs at the FP8 peak."""
    from simspec.kernel_validation import default_efficiencies, load_table, predict_table

    weight = 4096 * 4096
    one, many = predict_table(load_table(_gemm_table(tmp_path, "g"))).points
    assert one.predicted_us == pytest.approx(weight * 2 / (4800e9 * 0.80) * 1e6 + 1.3)
    assert many.predicted_us == pytest.approx(2 * weight * 256 / (989e12 * 0.70) * 1e6 + 1.3)
    assert one.shape == "4096x4096" and one.size == 1
    fp8_one, _ = predict_table(load_table(_gemm_table(tmp_path, "f", weights="fp8"))).points
    assert fp8_one.predicted_us == pytest.approx(weight / (4800e9 * 0.80) * 1e6 + 1.3)
    from dataclasses import replace
    ramp = replace(default_efficiencies(), streaming_kernel_us=3.0)
    ramped, _ = predict_table(load_table(_gemm_table(tmp_path, "g")), eff=ramp).points
    assert ramped.predicted_us - one.predicted_us == pytest.approx(3.0)


@pytest.mark.parametrize(("change", "needle"), [
    ({"weights": "int4"}, "weights"),
    ({"points": [{"k": 8, "n": 8, "m": 0, "us": 1.0}]}, "points"),
    ({"points": [{"k": 8, "n": 8, "m": 1, "us": 1.0}, {"k": 8, "n": 8, "m": 1, "us": 2.0}]}, "points"),
    ({"points": [{"k": 8, "n": 8, "m": 1}]}, "points"),
    ({"points": [{"k": 10**400, "n": 8, "m": 1, "us": 1.0}]}, "points"),
    ({"points": [{"k": 8, "n": 8, "m": 1, "us": True}]}, "points"),
    ({"points": [{"k": 8, "n": 8, "m": 1, "us": float("inf")}]}, "points"),
])
def test_bad_gemm_tables_exit_2_naming_the_field(tmp_path, change, needle):
    _gemm_table(tmp_path, "g", **change)
    _assert_exit_2_naming(tmp_path, "g.yaml", needle)


def test_the_checked_in_fused_moe_tables_are_what_their_converter_writes_from_the_checked_in_results(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import fused_moe_tables as conv

    measured = sorted((ROOT / "calibration" / "measurements").glob("h200-fused-moe-*.json"))
    assert len(measured) == 4
    for raw, kernel in ((raw, kernel) for raw in measured for kernel in ("w13", "w2")):
        table_id = ("simspec-h200-fused-moe-" + raw.stem.removeprefix("h200-fused-moe-").removesuffix("-2026-12-04")
                    + f"-{kernel}")
        fitted = (["--fitted-by", "calibration/fit_moe_program_rate.py"]
                  if table_id.endswith("dsv3-tp8-sglang057-w13") else [])
        assert conv.main([str(raw), "--gpu", "h200-sxm", "--kernel", kernel, "--id", table_id, "--out", str(tmp_path),
                          *fitted]) == 0
        assert (tmp_path / f"{table_id}.yaml").read_text() == (VALIDATION / "kernels" / f"{table_id}.yaml").read_text()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"wheel": "w"}))
    assert conv.main([str(bad), "--gpu", "h200-sxm", "--kernel", "w13", "--id", "x", "--out", str(tmp_path)]) == 2
    assert conv.main([str(measured[0]), "--gpu", "h999", "--kernel", "w13", "--id", "x", "--out", str(tmp_path)]) == 2
    result = json.loads(measured[0].read_text())
    del result["points"][0]["config"]
    bad.write_text(json.dumps(result))
    assert conv.main([str(bad), "--gpu", "h200-sxm", "--kernel", "w13", "--id", "x", "--out", str(tmp_path)]) == 2
    assert not (tmp_path / "x.yaml").exists()
    # the tables of one run are its kernels apart: their points add up to the call's two GEMMs
    from simspec.kernel_validation import load_table

    w13, w2 = (load_table(VALIDATION / "kernels" / f"simspec-h200-fused-moe-dsv3-tp8-sglang0512-{k}.yaml")
               for k in ("w13", "w2"))
    raw = json.loads((ROOT / "calibration" / "measurements" /
                      "h200-fused-moe-dsv3-tp8-sglang0512-2026-12-04.json").read_text())
    assert [a[1] + b[1] for a, b in zip(w13.points, w2.points, strict=True)] == pytest.approx(
        [sum(p["gemm_us"]) for p in raw["points"]], abs=1e-3)


def test_a_bf16_default_tile_fused_moe_run_converts_to_a_table_the_suite_reads(tmp_path, monkeypatch):
    """fused_moe_bench.py --dtype bf16 (GLM-4.7-Flash's shape, which runs SGLang's tile heuristic): the table says
    BF16 weights and the default config, and the suite loads it."""
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import fused_moe_tables as conv

    from simspec.kernel_validation import load_table

    result = json.loads((ROOT / "calibration" / "measurements" /
                         "h200-fused-moe-qwen3-30b-tp1-sglang0512-2026-12-04.json").read_text())
    result["shape"] |= {"experts": 65, "top_k": 5, "intermediate": 1536, "weights": "bf16"}
    raw = tmp_path / "glm.json"
    raw.write_text(json.dumps(result))
    assert conv.main([str(raw), "--gpu", "h100-sxm", "--kernel", "w13", "--id", "glm-w13", "--config", "default",
                      "--l2-mb", "50", "--out", str(tmp_path)]) == 0
    table = load_table(tmp_path / "glm-w13.yaml")
    assert table.shape.weights == "bf16" and table.config == "default" and table.shape.experts == 65
    text = (tmp_path / "glm-w13.yaml").read_text()
    assert "BF16, one" in text and "block FP8" not in text and "--l2-mb 50" in text


def test_the_checked_in_gemm_tables_are_what_the_converter_writes_from_the_checked_in_result(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import kernel_floor_tables as conv

    raw = ROOT / "calibration" / "measurements" / "h200-kernel-floors-2026-12-04.json"
    assert conv.main([str(raw), "--gpu", "h200-sxm", "--prefix", "simspec-h200", "--out", str(tmp_path)]) == 0
    for name in ("simspec-h200-gemm-bf16.yaml", "simspec-h200-gemm-fp8.yaml"):
        assert (tmp_path / name).read_text() == (VALIDATION / "kernels" / name).read_text(), name


@pytest.mark.parametrize(("result", "args", "needle"), [
    ({"gemm_bf16": []}, [], "environment"),
    ({"environment": {"gpu": "x", "date": "2026-12-04", "torch": "2", "cuda": "13"}}, [], "no timed GEMM"),
    ({"environment": {"gpu": "x", "date": "2026-12-04", "torch": "2", "cuda": "13"}}, ["--gpu", "h999"], "--gpu"),
    ([1, 2], [], "JSON object"),
])
def test_the_converter_refuses_bad_input_with_exit_2(tmp_path, monkeypatch, capsys, result, args, needle):
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import kernel_floor_tables as conv

    src = tmp_path / "r.json"
    src.write_text(json.dumps(result))
    argv = [str(src), "--gpu", "h200-sxm", "--prefix", "x", "--out", str(tmp_path), *args]
    assert conv.main(argv) == 2
    assert needle in capsys.readouterr().err
    assert not list(tmp_path.glob("*.yaml"))


def test_the_gemm_tables_are_written_from_a_bench_result_keeping_batches_1_64_256(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import kernel_floor_tables as conv

    from simspec.kernel_validation import load_table

    env = {"gpu": "NVIDIA H200", "date": "2026-12-04T00:00:00Z", "torch": "2.11", "cuda": "13.0"}
    rows = [{"shape": "s", "k": 64, "n": 128, "m": m, "us": 2.0 + m / 100} for m in (1, 2, 64, 256, 512)]
    result = {"environment": env, "gemm_bf16": rows, "gemm_fp8": rows[:1] + [{"shape": "s", "k": 64, "n": 128,
                                                                              "m": 64, "error": "boom"}]}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(result))
    assert conv.main([str(src), "--gpu", "h200-sxm", "--prefix", "x", "--out", str(tmp_path)]) == 0
    bf16 = load_table(tmp_path / "x-gemm-bf16.yaml")
    assert [p.m for p in bf16.points] == [1, 64, 256] and bf16.weights == "bf16"  # type: ignore[union-attr]
    fp8 = load_table(tmp_path / "x-gemm-fp8.yaml")
    assert [p.m for p in fp8.points] == [1] and str(src) in fp8.source.citation  # type: ignore[union-attr]


def test_the_mla_decode_tables_are_written_from_a_bench_result_one_per_head_count(tmp_path, monkeypatch, capsys):
    """calibration/mla_decode_tables.py: one attention_decode table per head count (DeepSeek-V3 at TP 128 / heads),
    rows the bench could not time left out and named; a head count that does not divide 128 and an unknown GPU exit
    2, writing nothing. (The bench itself needs a GPU and sgl-kernel: calibration/mla_decode_bench.py.)"""
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import mla_decode_tables as conv

    from simspec.kernel_validation import load_table, predict_table

    rows = [{"heads": h, "batch": b, "context": 4096, "q_tokens": 1, "kv_bytes": 1, "copies": 2,
             "kernels_per_call": 2, "us_per_call": 10.0 + b} for h in (16, 128) for b in (1, 4)]
    rows.append({"heads": 16, "batch": 64, "context": 16384, "q_tokens": 4, "kv_bytes": 1, "error": "OOM"})
    result = {"gpu": "NVIDIA H200", "torch": "2.11", "sgl_kernel": "0.4.2.post2", "l2_bytes": 62914560,
              "page_size": 64, "replays": 20, "date": "2026-12-05T00:00:00Z", "rows": rows}
    src = tmp_path / "r.json"
    src.write_text(json.dumps(result))
    out = tmp_path / "kernels"
    assert conv.main([str(src), "--gpu", "h200-sxm", "--out", str(out)]) == 0
    assert "left out: 16 heads, batch 64" in capsys.readouterr().err
    tp8 = load_table(out / "simspec-h200-mla-decode-flashmla-h16.yaml")
    assert tp8.tp == 8 and tp8.model == "deepseek-v3" and [p.us for p in tp8.points] == [11.0, 14.0]  # type: ignore
    assert load_table(out / "simspec-h200-mla-decode-flashmla-h128.yaml").tp == 1  # type: ignore[union-attr]
    assert str(src) in tp8.source.citation and len(predict_table(tp8).points) == 2
    for bad_rows, gpu in ((rows[:1] + [dict(rows[0], heads=12)], "h200-sxm"), (rows, "no-such-gpu")):
        src.write_text(json.dumps(dict(result, rows=bad_rows)))
        empty = tmp_path / f"none-{gpu}"
        assert conv.main([str(src), "--gpu", gpu, "--out", str(empty)]) == 2
        assert not empty.exists()


def test_the_sgl_kernel_benches_refuse_a_machine_without_a_gpu(monkeypatch, capsys):
    """Both sgl-kernel benches share their start (sgl_kernel_bench.start): on a machine without CUDA they exit 2
    saying so, before they look for sgl-kernel."""
    pytest.importorskip("torch")
    monkeypatch.syspath_prepend(str(ROOT / "calibration"))
    import mla_decode_bench
    import sgl_kernel_bench
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for bench in (sgl_kernel_bench, mla_decode_bench):
        assert bench.main(["--out", "never.json"]) == 2
        assert f"{bench.__name__}: no CUDA device" in capsys.readouterr().err
    assert mla_decode_bench.copies_for(10**9, 60 * 2**20) == 2  # a call larger than the L2: two copies alternate
    assert mla_decode_bench.copies_for(2**20, 60 * 2**20) == 240  # 1 MiB calls: 4 x the L2 in copies
    assert mla_decode_bench.copies_for(1, 60 * 2**20) == mla_decode_bench.MAX_COPIES


def test_markdown_prints_the_means_and_the_sources_worst_first(tmp_path):
    """`--markdown`: the README's block; a source with a '|' in its citation keeps the table's columns; with --json it
    is refused (one format at a time)."""
    _case(tmp_path, "a", source={"citation": "a | b", "quote": "q"})
    _case(tmp_path, "b", source={"citation": "test", "url": "https://example.org/x"},
          measured={"metric": "tokens_per_s", "value": 10.0})
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--markdown"])
    assert res.exit_code == 0, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith("Non-fitted cases: 2, mean |error| ") and lines[2].startswith("| source |")
    rows = lines[4:]
    assert rows[0].startswith("| <https://example.org/x> | 1 | 0 |")  # measured 10 where ~100 is predicted: worst
    assert rows[1].startswith("| a \\| b | 1 |") and len(rows) == 2
    both = CliRunner().invoke(main, ["validate", str(tmp_path), "--markdown", "--json"])
    assert both.exit_code == 2 and "--markdown" in both.output


def test_also_measured_latencies_are_compared_apart_from_the_cases_mean(tmp_path):
    """A case's TTFT and TPOT are predicted from its own run and reported with their errors; they move neither the
    case's error nor the non-fitted mean, and a fitted case's latencies stay out of their mean as its figure does."""
    placeholder = [{"metric": "ttft_ms.mean", "value": 1.0}, {"metric": "tpot_ms.p50", "value": 1.0}]
    suite = _case(tmp_path, "probe", also_measured=placeholder).parent
    probe = json.loads(CliRunner().invoke(main, ["validate", str(suite), "--json"]).output)
    (tmp_path / "cases" / "probe.yaml").unlink()
    ttft, tpot = (a["predicted"] for a in probe["cases"][0]["also_measured"])
    also = [{"metric": "ttft_ms.mean", "value": ttft * 2}, {"metric": "tpot_ms.p50", "value": tpot / 1.25}]
    _case(tmp_path, "a", also_measured=also)
    _case(tmp_path, "b", fitted=True, also_measured=[{"metric": "ttft_ms.mean", "value": ttft}])
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    rows = {c["id"]: c for c in out["cases"]}
    assert [(a["metric"], a["measured"]) for a in rows["a"]["also_measured"]] == [
        ("ttft_ms.mean", ttft * 2), ("tpot_ms.p50", tpot / 1.25)]
    assert [a["predicted"] for a in rows["a"]["also_measured"]] == pytest.approx([ttft, tpot])
    assert [a["error_pct"] for a in rows["a"]["also_measured"]] == pytest.approx([-50.0, 25.0])
    assert rows["a"]["error_pct"] == probe["cases"][0]["error_pct"]  # the case's own figure is untouched
    s = out["summary"]
    assert s["mape_not_fitted_pct"] == pytest.approx(abs(probe["cases"][0]["error_pct"]))
    also_summary = s["also_measured"]
    assert also_summary["figures"] == 2 and also_summary["mape_pct"] == pytest.approx(37.5)
    assert [(m["metric"], m["figures"]) for m in also_summary["by_metric"]] == [("tpot_ms.p50", 1), ("ttft_ms.mean", 1)]
    assert [m["mean_signed_error_pct"] for m in also_summary["by_metric"]] == pytest.approx([25.0, -50.0])
    text = CliRunner().invoke(main, ["validate", str(tmp_path)]).output
    assert "latencies the same runs measured" in text and "-50.0%" in text and "+25.0%" in text
    md = CliRunner().invoke(main, ["validate", str(tmp_path), "--markdown"]).output
    assert "| ttft_ms.mean | 1 | 50.0% | -50.0% |" in md and "| tpot_ms.p50 | 1 | 25.0% | +25.0% |" in md


def test_a_latency_regression_fails_the_check_and_an_unrecorded_one_must_be_recorded(tmp_path):
    also = [{"metric": "ttft_ms.mean", "value": 1000.0}]
    _case(tmp_path, "a", also_measured=also)
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 100.0\n")
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 2 and "also_measured_mape_pct" in res.output and "--record" in res.output
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    assert "also_measured_mape_pct:" in (tmp_path / "recorded.yaml").read_text()
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0
    _case(tmp_path, "a", also_measured=[{"metric": "ttft_ms.mean", "value": 10_000.0}])  # further from the model
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1 and "REGRESSED" in res.output


def test_every_also_measured_figure_is_a_number_its_source_quotes():
    """A latency typed into a case must be traceable: each also_measured value is one of the numbers in the case's quote
    (thousands separators allowed), and the suite carries some."""
    count = 0
    for f in case_files(VALIDATION):
        case = load_case(f)
        numbers = {float(n.replace(",", "")) for n in re.findall(r"\d[\d,]*(?:\.\d+)?", case.source.quote or "")}
        for a in case.also_measured:
            assert a.value in numbers, f"{f.name}: {a.metric} {a.value} is not in its quote"
            count += 1
    assert count >= 40


EAGLE3 = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}


def _speculative(**changes) -> dict:
    """SMALL with EAGLE-3 at a high accept length: the model makes it faster than SMALL without speculation."""
    return dict(SMALL, speculative=EAGLE3, acceptance={"accept_length": 3.5, "source": "test"}) | changes


def test_verdicts_compare_the_speedup_a_source_gives_or_a_case_and_its_baseline(tmp_path):
    """A speculative case measured at 0.8 x its baseline (speculation lost), predicted faster: a wrong verdict, its
    speedups the ratios of the two cases' figures. A source's own speedup of 1.5, predicted faster too: right. A fitted
    speculative case gives no verdict."""
    _case(tmp_path, "base", measured={"metric": "tokens_per_s", "value": 100.0})
    _case(tmp_path, "spec", measured={"metric": "tokens_per_s", "value": 80.0}, scenario=_speculative(),
          baseline_case="base")
    _case(tmp_path, "ratio", measured={"metric": "speedup", "value": 1.5}, scenario=_speculative())
    _case(tmp_path, "fit", fitted=True, measured={"metric": "speedup", "value": 0.5}, scenario=_speculative())
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    rows = {c["id"]: c for c in out["cases"]}
    assert rows["spec"]["predicted"] > rows["base"]["predicted"] and rows["ratio"]["predicted"] > 1
    v = out["summary"]["verdicts"]
    assert (v["compared"], v["agree"]) == (2, 1)
    assert v["wrong"] == [{"id": "spec", "baseline_case": "base", "measured_speedup": pytest.approx(0.8),
                           "predicted_speedup": pytest.approx(rows["spec"]["predicted"] / rows["base"]["predicted"])}]
    assert rows["spec"]["verdict"] == {"baseline_case": "base", "measured_speedup": pytest.approx(0.8),
                                       "predicted_speedup": v["wrong"][0]["predicted_speedup"], "agrees": False}
    assert rows["ratio"]["verdict"]["agrees"] and rows["base"]["verdict"] is None and rows["fit"]["verdict"] is None
    pair_error = abs(v["wrong"][0]["predicted_speedup"] / 0.8 - 1) * 100
    assert v["speedup_mape_pct"] == pytest.approx((pair_error + abs(rows["ratio"]["error_pct"])) / 2)
    text = CliRunner().invoke(main, ["validate", str(tmp_path)]).output
    assert "1 of 2" in text and "wrong verdicts" in text and "0.80x" in text
    md = CliRunner().invoke(main, ["validate", str(tmp_path), "--markdown"]).output
    assert "1 of 2 non-fitted speculative cases agree" in md and "| spec | 0.80x |" in md
    # one case file given alone runs without its pair: no verdict, no error
    alone = CliRunner().invoke(main, ["validate", str(tmp_path / "cases" / "spec.yaml"), "--json"])
    assert alone.exit_code == 0 and json.loads(alone.output)["summary"]["verdicts"]["compared"] == 0


@pytest.mark.parametrize("spec_changes, base_changes, needle", [
    ({"baseline_case": "nobody"}, {}, "no case 'nobody'"),
    ({"baseline_case": "base"}, {"scenario": _speculative()}, "'base' is speculative"),
    ({"baseline_case": "base"}, {"scenario": dict(SMALL, model="qwen3-8b")}, "differs in scenario.model"),
    ({"baseline_case": "base", "scenario": dict(SMALL)}, {}, "only a speculative case"),
    ({"baseline_case": "base", "measured": {"metric": "speedup", "value": 1.2}}, {}, "a pair compares throughputs"),
    ({"baseline_case": "base"}, {"measured": {"metric": "throughput_tokens_per_s", "value": 90.0}},
     "a pair compares one metric"),
])
def test_a_baseline_case_must_be_the_same_scenario_without_speculation(tmp_path, spec_changes, base_changes, needle):
    _case(tmp_path, "base", **base_changes)
    _case(tmp_path, "spec", **({"scenario": _speculative()} | spec_changes))
    res = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "spec.yaml" in res.output and "baseline_case" in res.output
    assert "Traceback" not in res.output


def test_wrong_verdicts_have_their_own_recorded_gate(tmp_path):
    """--record writes the count of wrong verdicts; one more fails --check; a record without the count, or with a
    count that is no whole number, is an input error (exit 2) naming the key."""
    _case(tmp_path, "base")
    _case(tmp_path, "spec", measured={"metric": "tokens_per_s", "value": 80.0}, scenario=_speculative(),
          baseline_case="base")
    _case(tmp_path, "ratio", measured={"metric": "speedup", "value": 1.5}, scenario=_speculative())
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    recorded = yaml.safe_load((tmp_path / "recorded.yaml").read_text())
    assert recorded["verdicts_wrong"] == 1
    text = (tmp_path / "recorded.yaml").read_text()
    (tmp_path / "recorded.yaml").write_text(text.replace("mape_not_fitted_pct:", "mape_not_fitted_pct: 1000 #"))
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0
    _case(tmp_path, "ratio", measured={"metric": "speedup", "value": 0.9}, scenario=_speculative())  # now wrong too
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1 and "recorded wrong verdicts: 1" in res.output and "REGRESSED" in res.output
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 1000\nverdicts_wrong: 1.5\n")
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 2 and "verdicts_wrong" in res.output and "whole number" in res.output
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 1000\n")
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 2 and "verdicts_wrong" in res.output and "--record" in res.output


def test_a_baseline_may_differ_only_in_the_server_settings_speculation_brings(tmp_path):
    """spec_v2 and mem_fraction_static may differ between a pair's servers (each run's own pool is modelled); any
    other server setting may not."""
    _case(tmp_path, "base", measured={"metric": "tokens_per_s", "value": 100.0})
    spec_server = dict(SMALL["server"], spec_v2=True, mem_fraction_static=0.8)
    _case(tmp_path, "spec", measured={"metric": "tokens_per_s", "value": 80.0},
          scenario=_speculative(server=spec_server), baseline_case="base")
    ok = CliRunner().invoke(main, ["validate", str(tmp_path), "--json"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.output)["summary"]["verdicts"]["compared"] == 1
    _case(tmp_path, "spec", measured={"metric": "tokens_per_s", "value": 80.0},
          scenario=_speculative(server=dict(spec_server, cuda_graph=False)), baseline_case="base")
    bad = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert bad.exit_code == 2 and "differs in scenario.server" in bad.output and "server.spec_v2" in bad.output


def _throughput(value: float) -> dict:
    return {"metric": "throughput_tokens_per_s", "value": value}


def _clients(n: int, **changes) -> dict:
    """SMALL with n clients in a closed loop, sending 2n requests."""
    scenario = _speculative(**changes) if changes.pop("speculative", False) else dict(SMALL, **changes)
    workload = dict(scenario["workload"], arrival={"type": "closed", "concurrency": n}, num_requests=2 * n)
    return dict(scenario, workload=workload)


def test_trends_follow_a_series_over_clients_from_the_fewest_to_the_most(tmp_path):
    """Three cases of one source that differ only in their clients (and requests, and each run's own acceptance)
    form a series; its error is the predicted change from 1 to 8 clients against the measured one, so a model
    off by the same factor at every point has none. A case of another model, a fitted case and a case of another
    source stay out; two cases at one concurrency make no series."""
    probe = {n: _case(tmp_path, f"s-c{n}", scenario=_clients(n), measured=_throughput(100.0)) for n in (1, 4, 8)}
    first = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    predicted = {c["id"]: c["predicted"] for c in first["cases"]}
    assert predicted["s-c8"] > predicted["s-c4"] > predicted["s-c1"]
    for n in probe:  # measured at 0.8 x the prediction everywhere: off at every point, right in its shape
        _case(tmp_path, f"s-c{n}", scenario=_clients(n), measured=_throughput(0.8 * predicted[f"s-c{n}"]))
    _case(tmp_path, "spec-c1", scenario=_clients(1, speculative=True), measured=_throughput(100.0))
    _case(tmp_path, "spec-c8", scenario=_clients(8, speculative=True, acceptance={"accept_length": 3.0,
                                                                              "source": "test"}),
          measured=_throughput(400.0))
    _case(tmp_path, "qwen-c4", scenario=_clients(4, model="qwen3-8b"), measured=_throughput(100.0))
    _case(tmp_path, "fit-c2", scenario=_clients(2), fitted=True, measured=_throughput(100.0))
    _case(tmp_path, "other-c2", scenario=_clients(2), source={"citation": "elsewhere"}, measured=_throughput(100.0))
    for twin, n in (("twin-a", 2), ("twin-b", 2), ("twin-c", 4)):
        _case(tmp_path, twin, scenario=_clients(n, model="qwen3-8b"), source={"citation": "twins"},
              measured=_throughput(100.0))
    long = dict(SMALL["workload"], input_tokens={"dist": "fixed", "value": 512})
    for n in (2, 4):  # one stem, two workloads: two series, told apart by their clients
        _case(tmp_path, f"u-c{n}", scenario=_clients(n, model="qwen3-8b"), source={"citation": "u"},
              measured=_throughput(100.0))
        _case(tmp_path, f"u-c{4 * n}", scenario=_clients(4 * n, model="qwen3-8b", workload=long),
              source={"citation": "u"}, measured=_throughput(100.0))
    out = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    rows = {c["id"]: c for c in out["cases"]}
    t = out["summary"]["trends"]
    by_name = {row["name"]: row for row in t["by_series"]}
    assert set(by_name) == {"s", "spec", "u (2-4 clients)", "u (8-16 clients)"} and t["series"] == 4
    assert by_name["u (8-16 clients)"]["cases"] == ["u-c8", "u-c16"]
    s = by_name["s"]
    assert s["cases"] == ["s-c1", "s-c4", "s-c8"] and s["concurrencies"] == [1, 4, 8]
    assert s["measured_change"] == pytest.approx(predicted["s-c8"] / predicted["s-c1"])
    assert s["error_pct"] == pytest.approx(0.0, abs=1e-9) and s["agrees"]
    spec = by_name["spec"]  # the accept length differs between the two runs: still one series
    change = rows["spec-c8"]["predicted"] / rows["spec-c1"]["predicted"]
    assert spec["measured_change"] == pytest.approx(4.0)
    assert spec["error_pct"] == pytest.approx((change / 4.0 - 1) * 100)
    assert t["mape_pct"] == pytest.approx(sum(abs(row["error_pct"]) for row in t["by_series"]) / 4)
    text = CliRunner().invoke(main, ["validate", str(tmp_path)]).output
    assert "trends over clients" in text and "4 series" in text
    md = CliRunner().invoke(main, ["validate", str(tmp_path), "--markdown"]).output
    assert "Trends over clients (4 series" in md and "| s | throughput_tokens_per_s | 1, 4, 8 | " in md


def test_a_trend_regression_fails_the_check_and_an_unrecorded_one_must_be_recorded(tmp_path):
    """Measured as predicted at one client and at 0.9 x at four: recorded, the check passes. Measured at 0.6 x at
    four, the series' change is further from the model's: its own gate fails (the cases' mean is allowed 100%)."""
    for n in (1, 4):
        _case(tmp_path, f"a-c{n}", scenario=_clients(n), measured=_throughput(100.0))
    first = json.loads(CliRunner().invoke(main, ["validate", str(tmp_path), "--json"]).output)
    predicted = {c["id"]: c["predicted"] for c in first["cases"]}
    _case(tmp_path, "a-c1", scenario=_clients(1), measured=_throughput(predicted["a-c1"]))
    _case(tmp_path, "a-c4", scenario=_clients(4), measured=_throughput(0.9 * predicted["a-c4"]))
    (tmp_path / "recorded.yaml").write_text("mape_not_fitted_pct: 100.0\n")
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 2 and "trend_mape_pct" in res.output and "--record" in res.output
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--record"]).exit_code == 0
    recorded = yaml.safe_load((tmp_path / "recorded.yaml").read_text())
    assert recorded["trend_mape_pct"] == pytest.approx((1 / 0.9 - 1) * 100, abs=0.01)
    (tmp_path / "recorded.yaml").write_text(yaml.safe_dump(recorded | {"mape_not_fitted_pct": 100.0}))
    assert CliRunner().invoke(main, ["validate", str(tmp_path), "--check"]).exit_code == 0
    _case(tmp_path, "a-c4", scenario=_clients(4), measured=_throughput(0.6 * predicted["a-c4"]))
    res = CliRunner().invoke(main, ["validate", str(tmp_path), "--check"])
    assert res.exit_code == 1 and re.search(r"recorded trend mean error: [\d.]+% \(REGRESSED\)", res.output)
