"""The validation suite and `simspec validate`: the CI gate on fidelity, and the command's behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from simspec.cli import main
from simspec.validation import case_files, load_case
from tests.conftest import ROOT, SMALL

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
    assert res.exit_code == 0


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


@pytest.mark.parametrize(("change", "needle"), [
    ({"measured": {"metric": "latency", "value": 1.0}}, "measured.metric"),
    ({"measured": {"metric": "tokens_per_s", "value": -1.0}}, "measured.value"),
    ({"fitted": "perhaps"}, "fitted"),
    ({"surprise": 1}, "surprise"),
])
def test_bad_case_files_exit_2_naming_the_field(tmp_path, change, needle):
    _case(tmp_path, "x", **change)
    res = CliRunner().invoke(main, ["validate", str(tmp_path)])
    assert res.exit_code == 2, res.output
    assert needle in res.output and "x.yaml" in res.output and "Traceback" not in res.output


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
