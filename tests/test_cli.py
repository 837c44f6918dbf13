"""`simspec predict` and `simspec presets` as a user runs them."""

from __future__ import annotations

import json

import yaml
from click.testing import CliRunner

from simspec.cli import main
from tests.conftest import SCENARIOS

JSON_KEYS = {"tokens_per_s", "throughput_tokens_per_s", "baseline_tokens_per_s", "speedup", "accept_length",
             "break_even_accept_length", "roofline_tokens_per_s", "iteration_ms", "breakdown_ms"}


def _write(tmp_path, data, name="s.yaml"):
    p = tmp_path / name
    p.write_text(yaml.safe_dump(data))
    return str(p)


def test_predict_json_has_every_documented_key(tmp_path, small):
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b"}
    small["acceptance"] = {"accept_length": 3.0}
    res = CliRunner().invoke(main, ["predict", _write(tmp_path, small), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert JSON_KEYS <= set(out)
    assert set(out["breakdown_ms"]) == {"draft_compute", "draft_comm", "verify_compute", "verify_comm", "cpu"}
    assert out["setup"]["num_steps"] == 5 and out["setup"]["topk"] == 4  # SGLang's Llama auto default


def test_predict_table_explains_the_result():
    res = CliRunner().invoke(main, ["predict", str(SCENARIOS / "eagle3_k2_drafter.yaml"), "--sources"])
    assert res.exit_code == 0, res.output
    for text in ("per-request decode tok/s", "verify communication", "break-even accept length", "SLOWER",
                 "roofline", "TTFT p99", "all_reduce", "fitted by calibration/fit_m1.py", "kernel_counts",
                 "fit_spec_overhead.py"):
        assert text in res.output, text


def test_predict_table_names_a_gpu_paired_with_another_box_s_interconnect(tmp_path, small):
    base = CliRunner().invoke(main, ["predict", str(SCENARIOS / "baseline.yaml")])
    assert base.exit_code == 0, base.output
    assert "hypothetical" not in base.output
    what_if = CliRunner().invoke(main, ["predict", str(SCENARIOS / "baseline.yaml"), "--set",
                                        "hardware.interconnect=nvlink4-nccl", "--set", "calibration=null"])
    assert what_if.exit_code == 0, what_if.output
    assert "hypothetical interconnect" in what_if.output
    assert "rtx-pro-6000-server has PCIe 5 links" in " ".join(what_if.output.split())
    # one GPU: nothing crosses the interconnect, so no pairing is hypothetical
    small["hardware"]["interconnect"] = "pcie4-nccl"
    one = json.loads(CliRunner().invoke(main, ["predict", _write(tmp_path, small), "--json"]).output)
    assert one["setup"]["hypothetical_interconnect"] is None


def test_set_overrides_change_the_prediction_and_are_validated(tmp_path, small):
    path = _write(tmp_path, small)
    one = json.loads(CliRunner().invoke(main, ["predict", path, "--json"]).output)
    many = CliRunner().invoke(main, ["predict", path, "--json", "--set", "workload.arrival.concurrency=2",
                                     "--set", "workload.num_requests=4"])
    assert many.exit_code == 0, many.output
    many = json.loads(many.output)
    assert many["mean_batch_size"] > one["mean_batch_size"]
    assert many["throughput_tokens_per_s"] > one["throughput_tokens_per_s"]


def test_same_seed_same_output(tmp_path, small):
    small["workload"]["output_tokens"] = {"dist": "lognormal", "mean": 60, "std": 30, "max": 200}
    small["speculative"] = {"algorithm": "ngram"}
    small["acceptance"] = {"accept_length": 2.0}
    path = _write(tmp_path, small)
    a = CliRunner().invoke(main, ["predict", path, "--json"]).output
    b = CliRunner().invoke(main, ["predict", path, "--json"]).output
    c = CliRunner().invoke(main, ["predict", path, "--json", "--set", "seed=1"]).output
    assert a == b
    assert json.loads(a)["tokens_per_s"] != json.loads(c)["tokens_per_s"]


def test_presets_lists_every_kind():
    res = CliRunner().invoke(main, ["presets", "--json"])
    assert res.exit_code == 0
    cat = json.loads(res.output)
    assert "kimi-k2.5" in cat["models"] and "rtx-pro-6000-server" in cat["gpus"]
    assert cat["gpus"]["h100-sxm"]["memory_bandwidth_gbps"] == 3350


def test_names_from_user_files_are_printed_literally(tmp_path, small):
    """Scenario names and sources go through rich: brackets must be shown, never read as markup."""
    small["name"] = "[/x] odd [red]name"
    small["speculative"] = {"algorithm": "ngram"}
    small["acceptance"] = {"accept_length": 2.0, "source": "[/bold] from [red]nowhere"}
    res = CliRunner().invoke(main, ["predict", _write(tmp_path, small), "--sources"])
    assert res.exit_code == 0, res.output
    assert "[/x] odd [red]name" in res.output
    assert "[/bold] from [red]nowhere" in res.output
