"""`simspec cost`: $ per million output tokens from the predicted throughput and the GPU price, and when a
trained drafter pays back."""

from __future__ import annotations

import json
import math

import pytest
import yaml

from simspec import presets
from simspec.cli import main
from simspec.predict import predict
from simspec.scenario.loader import load_scenario
from simspec.studies.cost import DEFAULT_TRAIN_TOKENS, cost_figures, price_note
from tests.conftest import SCENARIOS, assert_refused, cli_runner

SHORT = ["workload.num_requests=2", "workload.output_tokens.value=128"]  # keeps the M1 runs fast


@pytest.fixture
def fast_eagle3(tmp_path, small) -> str:
    """Llama-3.1-8B on one H100 with an EAGLE-3 head that accepts well: faster than no speculation."""
    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 3.0, "source": "assumed for the test"}
    path = tmp_path / "fast.yaml"
    path.write_text(yaml.safe_dump(small))
    return str(path)


def _figures(path: str, overrides: list[str] | None = None, **kw) -> tuple[dict, dict]:
    rs = load_scenario(path, overrides or [])
    result = predict(rs)
    return result, cost_figures(result, rs, **kw)


def _v(out: dict, key: str) -> float:
    return out["figures"][key]["value"]


def test_usd_per_mtok_is_box_price_over_predicted_throughput(fast_eagle3):
    """$/Mtok = GPUs x preset price / (predicted tok/s x 3600 / 1e6), for the setup and its baseline."""
    result, out = _figures(fast_eagle3)
    price = presets.gpus()["h100-sxm"].price_per_hour_usd
    per_hour = 1 * price
    expected = per_hour / (result["throughput_tokens_per_s"] * 3600) * 1e6
    expected_base = per_hour / (result["baseline_throughput_tokens_per_s"] * 3600) * 1e6
    assert _v(out, "price_per_gpu_hour_usd") == price
    assert "preset h100-sxm" in out["figures"]["price_per_gpu_hour_usd"]["source"]
    assert "late-2026" in out["figures"]["price_per_gpu_hour_usd"]["source"]
    assert _v(out, "usd_per_mtok") == pytest.approx(expected, rel=1e-12)
    assert _v(out, "baseline_usd_per_mtok") == pytest.approx(expected_base, rel=1e-12)
    assert _v(out, "saving_usd_per_mtok") == pytest.approx(expected_base - expected, rel=1e-12)
    assert all(f["source"] for f in out["figures"].values())  # every figure says where it came from


def test_m1_eagle3_never_pays_back():
    """M1: EAGLE-3 is slower than no speculation on the PCIe box, so no training budget ever pays back."""
    _, out = _figures(str(SCENARIOS / "eagle3.yaml"), SHORT, train_tokens_per_s_per_gpu=1e9, train_tokens=1)
    assert _v(out, "saving_usd_per_mtok") < 0
    assert out["pays_back"] is False
    assert math.isinf(_v(out, "payback_mtok"))
    assert out["verdict"].startswith("never")


def test_m1_never_through_the_cli():
    res = cli_runner().invoke(main, ["cost", str(SCENARIOS / "eagle3.yaml"), "--json", "--train-throughput", "5000",
                                  *[a for o in SHORT for a in ("--set", o)]])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["pays_back"] is False and out["figures"]["payback_mtok"]["value"] is None  # JSON has no infinity
    assert "never" in out["figures"]["payback_mtok"]["source"]


def test_faster_setup_pays_back_and_moves_with_training_cost(fast_eagle3):
    """Pay-back volume = (data generation + training) $ / saving per Mtok; more training cost, later pay-back."""
    kw = {"train_tokens_per_s_per_gpu": 4000.0, "train_tokens": 1e8}
    _, out = _figures(fast_eagle3, **kw)
    assert out["pays_back"] is True
    payback = _v(out, "payback_mtok")
    assert 0 < payback < math.inf
    assert payback == pytest.approx(_v(out, "investment_usd") / _v(out, "saving_usd_per_mtok"))
    price = _v(out, "price_per_gpu_hour_usd")
    train_usd = 1e8 * 2 / (4000.0 * 3600) * price  # default 2 epochs
    assert _v(out, "train_usd") == pytest.approx(train_usd)
    _, more_tokens = _figures(fast_eagle3, **(kw | {"train_tokens": 2e8}))
    _, slower_training = _figures(fast_eagle3, **(kw | {"train_tokens_per_s_per_gpu": 1000.0}))
    _, pricier = _figures(fast_eagle3, **kw, price_per_gpu_hour=2 * price)
    assert _v(more_tokens, "payback_mtok") > payback
    assert _v(slower_training, "payback_mtok") > payback
    # price scales investment and saving alike: the volume stays, the dollars double
    assert _v(pricier, "payback_mtok") == pytest.approx(payback)
    assert _v(pricier, "investment_usd") == pytest.approx(2 * _v(out, "investment_usd"))


def test_defaults_cite_a_source_and_training_throughput_is_required(fast_eagle3):
    _, out = _figures(fast_eagle3)
    assert _v(out, "train_tokens") == DEFAULT_TRAIN_TOKENS
    assert "2503.01840" in out["figures"]["train_tokens"]["source"]
    assert _v(out, "train_tokens_per_s_per_gpu") is None
    assert out["pays_back"] is None and out["verdict"].startswith("unknown: needs --train-throughput")
    assert _v(out, "generation_usd") > 0  # data generation is priced from the predicted baseline throughput


def test_ngram_has_no_drafter_to_train(tmp_path, small):
    small["speculative"] = {"algorithm": "ngram", "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 2.5}
    path = tmp_path / "ngram.yaml"
    path.write_text(yaml.safe_dump(small))
    _, out = _figures(str(path))
    assert out["trains_drafter"] is False and _v(out, "investment_usd") == 0
    assert "train_usd" not in out["figures"]


def test_price_option_overrides_the_preset(fast_eagle3):
    runner = cli_runner()
    preset = json.loads(runner.invoke(main, ["cost", fast_eagle3, "--json"]).stdout)
    res = runner.invoke(main, ["cost", fast_eagle3, "--json", "--price", "2.5"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    assert out["figures"]["price_per_gpu_hour_usd"] == {"value": 2.5, "unit": "$/GPU-hour",
                                                        "source": "user input (--price)"}
    ratio = 2.5 / presets.gpus()["h100-sxm"].price_per_hour_usd
    assert out["figures"]["usd_per_mtok"]["value"] == pytest.approx(ratio * preset["figures"]["usd_per_mtok"]["value"])


def test_table_names_sources_and_verdict(fast_eagle3):
    res = cli_runner().invoke(main, ["cost", fast_eagle3, "--train-throughput", "4000"])
    assert res.exit_code == 0, res.output
    for text in ("price per GPU-hour", "preset h100-sxm", "(--train-throughput)", "pays back after"):
        assert text in res.stdout, text


def test_a_box_that_does_not_exist_is_priced_and_named_so():
    args = ["cost", str(SCENARIOS / "eagle3.yaml"), *[x for kv in SHORT for x in ("--set", kv)]]
    what_if = ["--set", "hardware.interconnect=nvlink4-nccl", "--set", "calibration=null"]
    real = json.loads(cli_runner().invoke(main, [*args, "--json"]).stdout)
    assert real["hypothetical_interconnect"] is None
    hypo = json.loads(cli_runner().invoke(main, [*args, *what_if, "--json"]).stdout)
    assert "rtx-pro-6000-server has PCIe 5 links" in hypo["hypothetical_interconnect"]
    table = cli_runner().invoke(main, [*args, *what_if])
    assert table.exit_code == 0 and "hypothetical interconnect" in table.stdout


@pytest.mark.parametrize("args", [
    ["--price", "-1"], ["--price", "abc"], ["--price", "0"], ["--train-gpus", "0"], ["--train-gpus", "1.5"],
    ["--train-tokens", "-5"], ["--train-throughput", "0"], ["--gen-concurrency", "0"],
    ["--gen-throughput", "10", "--gen-concurrency", "4"], ["--set", "hardware.gpu=h900"],
])
def test_bad_input_exits_2_with_one_line(fast_eagle3, args):
    res = cli_runner().invoke(main, ["cost", fast_eagle3, *args])
    assert res.exit_code == 2, res.output
    assert res.stderr.startswith("error:") and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "Traceback" not in res.output


@pytest.mark.parametrize(("flag", "allowed"), [
    ("--price", "allowed: more than 0 and at most 1000 ($ per GPU-hour"),  # 0 itself is refused as not positive
    ("--train-epochs", "allowed: more than 0 and at most 1000 (passes"),
    ("--gen-throughput", "allowed: more than 0 and at most 1e+10 (tokens/s"),
    ("--train-tokens", "allowed: 0 to 1e+14 (tokens"),  # 0: no training
    ("--train-gpus", "allowed: 1 to 1e+06 (GPUs"),
])
def test_a_too_large_input_states_the_range_it_must_lie_in(fast_eagle3, flag, allowed):
    assert_refused(cli_runner().invoke(main, ["cost", fast_eagle3, flag, "1e20"]), f"{flag}: 1e+20 is implausibly"
                   " large", allowed)


def test_missing_file_exits_2(tmp_path):
    res = cli_runner().invoke(main, ["cost", str(tmp_path / "nope.yaml")])
    assert res.exit_code == 2
    assert "file not found" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_generation_rate_at_a_batch_size(fast_eagle3):
    """--gen-concurrency predicts the data-generation rate at a larger batch: faster, so cheaper data."""
    runner = cli_runner()
    one = json.loads(runner.invoke(main, ["cost", fast_eagle3, "--json"]).stdout)["figures"]
    res = runner.invoke(main, ["cost", fast_eagle3, "--json", "--gen-concurrency", "4"])
    assert res.exit_code == 0, res.output
    four = json.loads(res.stdout)["figures"]
    assert four["generation_tokens_per_s"]["value"] > one["generation_tokens_per_s"]["value"]
    assert "concurrency 4 (--gen-concurrency)" in four["generation_tokens_per_s"]["source"]
    assert four["generation_usd"]["value"] < one["generation_usd"]["value"]


def test_a_price_line_comment_qualifies_the_preset_price():
    assert "midpoint" in price_note("l40s")
    assert price_note("h100-sxm") is None
