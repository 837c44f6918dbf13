"""Bad input through the real command line: every mistake exits with code 2 and one line on stderr that names
the file, the key path and what is allowed, and never a traceback.

Each case starts from a valid, tiny scenario (scenarios/baseline.yaml without its calibration profile, one
short request) and breaks one thing.
"""

from __future__ import annotations

import copy
import functools
import multiprocessing
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from simspec.cli import main
from tests.conftest import assert_refused, cli_runner

# this file's refusals: nothing on stdout; the error is not held to one line
_refused = functools.partial(assert_refused, one_line=False)

ROOT = Path(__file__).resolve().parent.parent
BASELINE = ROOT / "scenarios" / "baseline.yaml"
PROFILE = ROOT / "calibration" / "profiles" / "m1-kimi-k25-8x-rtxpro6000-pcie.yaml"
FILE = "scenario.yaml"

EAGLE3 = {"algorithm": "eagle3", "drafter": "eagle3-kimi-k2.5", "num_steps": 3, "topk": 1, "num_draft_tokens": 4}


def _tiny(data: dict[str, Any]) -> dict[str, Any]:
    data = copy.deepcopy(data)
    data.pop("calibration", None)
    data["workload"]["num_requests"] = 1
    data["workload"]["input_tokens"] = {"dist": "fixed", "value": 64}
    data["workload"]["output_tokens"] = {"dist": "fixed", "value": 16}
    return data


BASE = _tiny(yaml.safe_load(BASELINE.read_text()))


@pytest.fixture
def scenario() -> dict[str, Any]:
    """A valid, tiny scenario mapping (the M1 baseline box, one 64+16-token request, no profile)."""
    return copy.deepcopy(BASE)


def _write(tmp_path: Path, data: Any, name: str = FILE) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _predict(path: Path | str, *args: str):
    return cli_runner().invoke(main, ["predict", str(path), *args])


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        node = d
        for part in path[:-1]:
            node = node.setdefault(part, {})
        node[path[-1]] = value
    return mutate


def _spec(speculative: dict | None, acceptance: dict | None) -> Callable[[dict], None]:
    def mutate(d: dict) -> None:
        if speculative is not None:
            d["speculative"] = copy.deepcopy(speculative)
        if acceptance is not None:
            d["acceptance"] = copy.deepcopy(acceptance)
    return mutate


def _drop(key: str) -> Callable[[dict], None]:
    return lambda d: d.pop(key)


def _no_fit(d: dict) -> None:
    d["hardware"] = {"gpu": "rtx-4090", "num_gpus": 1, "interconnect": "pcie4-nccl-no-p2p"}
    d["server"]["tp"] = 1


# (id, mutation of the valid scenario, strings the error must contain besides the file name)
CASES: list[tuple[str, Callable[[dict], None], tuple[str, ...]]] = [
    # unknown keys: the message lists the keys allowed at that level
    ("unknown-top-level-key", _set(("speed",), 1),
     ("speed", "unknown key", "allowed keys", "hardware", "workload")),
    ("unknown-nested-key", _set(("server", "tensor_parallel"), 8),
     ("server.tensor_parallel", "unknown key", "allowed keys", "tp", "cuda_graph")),
    ("unknown-deep-key", _set(("workload", "arrival", "clients"), 4),
     ("workload.arrival.clients", "unknown key", "allowed keys", "concurrency")),
    ("unknown-key-in-poisson-arrival", _set(("workload", "arrival"), {"type": "poisson", "rate_per_s": 1,
                                                                       "concurrency": 2}),
     ("workload.arrival.concurrency", "unknown key", "rate_per_s")),
    ("missing-required-key", _drop("server"), ("server", "required")),
    ("bench-serving-lengths-on-one-side", _set(("workload", "input_tokens"),
                                               {"dist": "bench_serving_random", "value": 1000}),
     ("workload", "bench_serving_random", "give it for both")),
    # wrong types
    ("string-for-int", _set(("server", "tp"), "eight"), ("server.tp", "valid integer", "'eight'")),
    ("string-for-int-nested", _set(("workload", "num_requests"), "lots"),
     ("workload.num_requests", "valid integer")),
    ("mapping-for-section", _set(("server",), "fast"), ("server", "valid dictionary")),
    ("unknown-algorithm", _spec({"algorithm": "medusa"}, {"accept_length": 1.5}),
     ("speculative.algorithm", "'eagle3'", "'ngram'", "'medusa'")),
    ("unknown-arrival-type", _set(("workload", "arrival"), {"type": "burst"}),
     ("workload.arrival", "'closed'", "'poisson'")),
    # unknown presets: the message lists the known ones
    ("unknown-gpu", _set(("hardware", "gpu"), "h900"), ("hardware.gpu", "'h900'", "known:", "h100-sxm")),
    ("unknown-model", _set(("model",), "gpt-5"), ("model", "'gpt-5'", "known:", "deepseek-v3")),
    ("unknown-interconnect", _set(("hardware", "interconnect"), "carrier-pigeon"),
     ("hardware.interconnect", "'carrier-pigeon'", "known:", "nvlink4-nccl")),
    ("unknown-drafter", _spec(dict(EAGLE3, drafter="eagle9-kimi"), {"accept_length": 1.5}),
     ("speculative.drafter", "'eagle9-kimi'", "known:", "eagle3-kimi-k2.5")),
    # zero and negative values
    ("concurrency-zero", _set(("workload", "arrival", "concurrency"), 0),
     ("workload.arrival.concurrency", "greater than or equal to 1")),
    ("num-requests-negative", _set(("workload", "num_requests"), -1),
     ("workload.num_requests", "greater than or equal to 1")),
    ("length-negative", _set(("workload", "output_tokens", "value"), -5),
     ("workload.output_tokens.value", "greater than or equal to 1")),
    ("length-zero", _set(("workload", "input_tokens", "value"), 0),
     ("workload.input_tokens.value", "greater than or equal to 1")),
    ("tp-zero", _set(("server", "tp"), 0), ("server.tp", "greater than or equal to 1")),
    ("tp-boolean", _set(("server", "tp"), True), ("server.tp", "valid integer")),
    ("poisson-rate-vanishing", _set(("workload", "arrival"), {"type": "poisson", "rate_per_s": 1e-300}),
     ("workload.arrival.rate_per_s", "greater than or equal to 0.000001")),
    ("poisson-rate-zero", _set(("workload", "arrival"), {"type": "poisson", "rate_per_s": 0}),
     ("workload.arrival.rate_per_s", "greater than or equal to 0.000001")),
    ("seed-negative", _set(("seed",), -1), ("seed", "greater than or equal to 0")),
    ("uniform-low-above-high", _set(("workload", "output_tokens"), {"dist": "uniform", "low": 10, "high": 5}),
     ("workload.output_tokens", "must be <=")),
    # the draft tree
    ("topk-above-draft-tokens", _spec(dict(EAGLE3, topk=4), {"accept_length": 1.5}),
     ("speculative.topk", "allowed: 1..3")),
    ("chain-needs-steps-plus-one", _spec(dict(EAGLE3, num_draft_tokens=5), {"accept_length": 1.5}),
     ("speculative.num_draft_tokens", "num_steps + 1 = 4")),
    ("accept-length-above-tree", _spec(EAGLE3, {"accept_length": 6.0}),
     ("acceptance.accept_length", "allowed: 1.0..4")),
    ("chain-rates-deeper-than-tree", _spec(EAGLE3, {"chain_rates": [0.9, 0.8, 0.7, 0.6]}),
     ("acceptance.chain_rates", "at most 3")),
    # the box
    ("tp-above-num-gpus", _set(("server", "tp"), 16), ("server.tp", "allowed: 1..8")),
    ("model-does-not-fit", _no_fit, ("model", "kimi-k2.5", "does not fit", "raise tp, pick a larger GPU")),
    # acceptance against the algorithm
    ("acceptance-without-speculation", _spec(None, {"accept_length": 1.5}),
     ("acceptance", "remove it or set speculative.algorithm")),
    ("speculation-without-acceptance", _spec({"algorithm": "ngram"}, None),
     ("acceptance", "needs an acceptance section", "accept_length")),
    ("mtp-on-model-without-mtp-head", _spec({"algorithm": "mtp"}, {"accept_length": 1.5}),
     ("speculative.algorithm", "kimi-k2.5", "hypothetical_mtp_head: true")),
    ("cumulative-rates-increase", _spec({"algorithm": "ngram"}, {"cumulative_rates": [0.5, 0.7]}),
     ("acceptance", "cumulative_rates", "must not increase")),
    ("positional-rates-sum-above-one",
     _spec(dict(EAGLE3, topk=2, num_draft_tokens=6), {"positional_rates": [0.7, 0.6]}),
     ("acceptance", "positional_rates", "sum must be <= 1")),
    ("two-acceptance-figures", _spec({"algorithm": "ngram"}, {"accept_length": 1.5, "chain_rates": [0.5]}),
     ("acceptance", "exactly one of", "got accept_length, chain_rates")),
    ("rate-above-one", _spec({"algorithm": "ngram"}, {"chain_rates": [1.5]}),
     ("acceptance.chain_rates.0", "less than or equal to 1")),
    # conversations and releases
    ("turns-not-dividing-requests", _set(("workload", "arrival"), {"type": "closed", "concurrency": 1, "turns": 3}),
     ("workload", "multiple of arrival.turns (3)", "whole conversations")),
    ("turns-on-poisson", _set(("workload", "arrival"), {"type": "poisson", "rate_per_s": 1, "turns": 2}),
     ("workload.arrival.turns", "unknown key")),
    ("shared-prefix-as-long-as-a-prompt", _set(("workload", "shared_prefix_tokens"), 64),
     ("workload.shared_prefix_tokens", "not below the shortest prompt input_tokens can draw (64)", "allowed: 0..63")),
    ("shared-prefix-on-lognormal-prompts-without-min",
     lambda d: (_set(("workload", "input_tokens"), {"dist": "lognormal", "mean": 64, "std": 8})(d),
                _set(("workload", "shared_prefix_tokens"), 16)(d)),
     ("workload.shared_prefix_tokens", "set min above the prefix", "allowed: 0..0")),
    ("followups-without-turns", _set(("workload", "arrival"), {"type": "closed", "concurrency": 1,
                                                               "followup_tokens": {"dist": "fixed", "value": 8}}),
     ("workload.arrival", "followup_tokens", "needs turns >= 2")),
    ("shared-prefix-negative", _set(("workload", "shared_prefix_tokens"), -1),
     ("workload.shared_prefix_tokens", "greater than or equal to 0")),
    ("release-not-modelled", _set(("server", "sglang_version"), "0.4.5"),
     ("server.sglang_version", "not modelled", "0.4.4, 0.4.6")),
    ("algorithm-not-in-release", lambda d: (_set(("server", "sglang_version"), "0.4.4")(d),
                                            _spec({"algorithm": "ngram"}, {"accept_length": 1.5})(d)),
     ("speculative.algorithm", "SGLang 0.4.4 has no ngram", "none, eagle, mtp")),
    # calibration
    ("calibration-profile-missing", _set(("calibration",), "profiles/nope.yaml"),
     ("calibration", "'profiles/nope.yaml'", "not found")),
]


@pytest.mark.parametrize("mutate, needles", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_scenario_is_rejected_cleanly(tmp_path, scenario, mutate, needles):
    mutate(scenario)
    _refused(_predict(_write(tmp_path, scenario)), FILE, *needles)


def test_the_unmutated_scenario_is_valid(tmp_path, scenario):
    """The cases above break one thing each in a scenario that is itself valid."""
    res = _predict(_write(tmp_path, scenario), "--json")
    assert res.exit_code == 0, res.output


# ------------------------------------------------------------------------------------------------ files


def test_missing_file(tmp_path):
    _refused(_predict(tmp_path / "nowhere.yaml"), "nowhere.yaml", "not found")


def test_invalid_yaml_syntax(tmp_path):
    path = tmp_path / FILE
    path.write_text("name: x\nhardware: {gpu: h100-sxm, num_gpus: 1\n")
    _refused(_predict(path), FILE, "not valid YAML", "line")


def test_yaml_list_is_not_a_scenario(tmp_path):
    _refused(_predict(_write(tmp_path, [BASE])), FILE, "must be a YAML mapping")


def test_empty_file_is_not_a_scenario(tmp_path):
    path = tmp_path / FILE
    path.write_text("")
    _refused(_predict(path), FILE, "must be a YAML mapping")


def test_non_utf8_file(tmp_path):
    path = tmp_path / FILE
    path.write_bytes(b"name: caf\xe9\n")  # latin-1, not UTF-8
    _refused(_predict(path), FILE)


# ------------------------------------------------------------------------------------------------ --set


def test_set_without_equals(tmp_path, scenario):
    _refused(_predict(_write(tmp_path, scenario), "--set", "server.tp"), FILE, "--set",
                      "key.path=value", "'server.tp'")


def test_set_of_unknown_key(tmp_path, scenario):
    _refused(_predict(_write(tmp_path, scenario), "--set", "server.tpp=8"), FILE, "server.tpp",
                      "unknown key", "allowed keys", "tp")


def test_set_below_a_scalar(tmp_path, scenario):
    _refused(_predict(_write(tmp_path, scenario), "--set", "server.tp.x=1"), FILE, "server.tp.x",
                      "server.tp is not a mapping")


def test_set_of_a_bad_value(tmp_path, scenario):
    _refused(_predict(_write(tmp_path, scenario), "--set", "workload.arrival.concurrency=0"), FILE,
                      "workload.arrival.concurrency", "greater than or equal to 1")


# ------------------------------------------------------------------------------------------------ calibration


def test_profile_of_another_interconnect_is_rejected():
    """The M1 profile's all-reduce curve was measured over PCIe: it must not describe an NVLink box."""
    res = _predict(BASELINE, "--set", "hardware.interconnect=nvlink4-nccl")
    _refused(res, "baseline.yaml", "hardware.interconnect", "'pcie5-nccl'", "'nvlink4-nccl'",
                      "use a profile of this box")


def test_profile_of_another_gpu_is_rejected():
    res = _predict(BASELINE, "--set", "hardware.gpu=rtx-pro-6000-workstation")
    _refused(res, "baseline.yaml", "hardware.gpu", "'rtx-pro-6000-server'", "use a profile of this box")


def test_profile_with_unknown_key_names_the_profile(tmp_path, scenario):
    profile = yaml.safe_load(PROFILE.read_text())
    profile["all_reduce_curve"] = profile.pop("all_reduce")
    _write(tmp_path, profile, "profile.yaml")
    scenario["calibration"] = "profile.yaml"
    _refused(_predict(_write(tmp_path, scenario)), "profile.yaml", "all_reduce_curve", "unknown key",
                      "allowed keys", "all_reduce")


def test_profile_with_unknown_coefficient(tmp_path, scenario):
    _write(tmp_path, {"name": "p", "coefficients": {"warp_speed": {"value": 1.0, "source": "x"}}}, "profile.yaml")
    scenario["calibration"] = "profile.yaml"
    _refused(_predict(_write(tmp_path, scenario)), "profile.yaml", "coefficients.warp_speed",
                      "allowed", "compute_efficiency")


def test_profile_with_the_retired_per_layer_coefficient_names_its_replacement(tmp_path, scenario):
    _write(tmp_path, {"name": "p", "coefficients": {"layer_overhead_graph_us": {"value": 8.0, "source": "x"}}},
           "profile.yaml")
    scenario["calibration"] = "profile.yaml"
    _refused(_predict(_write(tmp_path, scenario)), "profile.yaml", "coefficients.layer_overhead_graph_us",
                      "kernel_gap_graph_us", "small_kernel_us")


def test_profile_with_implausible_startup_memory_names_the_profile(tmp_path, scenario):
    """A profile claiming most of the GPU in use before SGLang sizes its KV cache (M1's box: tp 8, 97,887 MiB)."""
    _write(tmp_path, {"name": "p", "coefficients": {"startup_memory_multi_gpu_mib": {"value": 30000, "source": "x"}}},
           "profile.yaml")
    scenario["calibration"] = "profile.yaml"
    _refused(_predict(_write(tmp_path, scenario)), "profile.yaml",
                      "coefficients.startup_memory_multi_gpu_mib", "allowed: 0 to 24,472 MiB")


@pytest.mark.parametrize("profile, key", [
    ({"name": "p", "all_reduce": {"measured_gpus": 8, "points_bytes_us": [[256, float("nan")]], "source": "x"}},
     "all_reduce"),
    ({"name": "p", "coefficients": {"forward_overhead_ms": {"value": float("inf"), "source": "x"}}},
     "coefficients.forward_overhead_ms"),
], ids=["all-reduce-nan", "coefficient-inf"])
def test_non_finite_profile_figures(tmp_path, scenario, profile, key):
    _write(tmp_path, profile, "profile.yaml")
    scenario["calibration"] = "profile.yaml"
    _refused(_predict(_write(tmp_path, scenario)), "profile.yaml", key)


# ------------------------------------------------------------------------------------------------ bugs


@pytest.mark.parametrize("key", ["[/x]", "[red]x"])
def test_error_text_is_not_rich_markup(tmp_path, scenario, key):
    scenario[key] = 1
    _refused(_predict(_write(tmp_path, scenario)), FILE, key, "unknown key")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
def test_histogram_with_infinite_count(tmp_path, scenario):
    _spec({"algorithm": "ngram"}, {"histogram": [float("inf"), 1.0]})(scenario)
    _refused(_predict(_write(tmp_path, scenario)), FILE, "acceptance.histogram")


@pytest.mark.parametrize("dist", [
    {"dist": "normal", "mean": float("inf"), "std": 1.0},
    {"dist": "normal", "mean": 100.0, "std": float("inf")},
    {"dist": "lognormal", "mean": float("inf"), "std": 1.0},
], ids=["normal-mean-inf", "normal-std-inf", "lognormal-mean-inf"])
def test_infinite_length_parameters(tmp_path, scenario, dist):
    scenario["workload"]["output_tokens"] = dist
    _refused(_predict(_write(tmp_path, scenario)), FILE, "workload.output_tokens")


@pytest.mark.parametrize("dist", [
    {"dist": "lognormal", "mean": 40.0, "std": 1e200, "max": 100},
    {"dist": "uniform", "low": 1, "high": 2**70, "max": 50},
], ids=["lognormal-std-1e200", "uniform-high-2**70"])
def test_huge_length_parameters_never_crash(tmp_path, scenario, dist):
    scenario["workload"]["output_tokens"] = dist
    res = _predict(_write(tmp_path, scenario), "--json")
    # either simulated (the samples are clipped to max) or rejected: never a traceback
    assert res.exit_code in (0, 2) and "Traceback" not in res.output, (res.exit_code, res.exception)
    if res.exit_code == 2:
        _refused(res, FILE, "workload.output_tokens")


def _invoke_in_child(conn, args: list[str]) -> None:
    res = cli_runner().invoke(main, args)
    conn.send((res.exit_code, res.stderr, repr(res.exception)))


def _predict_or_hang(path: Path, timeout_s: float = 3.0) -> tuple[int, str, str] | None:
    """Run `simspec predict` in a forked child; None when it is still running after timeout_s."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_invoke_in_child, args=(child, ["predict", str(path)]))
    proc.start()
    try:
        if parent.poll(timeout_s):
            return parent.recv()
        return None
    finally:
        if proc.is_alive():
            proc.kill()
        proc.join()


@pytest.mark.skipif(sys.platform == "win32", reason="needs fork")
@pytest.mark.parametrize("dist", [
    {"dist": "lognormal", "mean": 40.0, "std": float("inf"), "max": 100},
    {"dist": "fixed", "value": 5, "min": 2**70, "max": 2**70},
], ids=["lognormal-std-inf-with-max", "min-above-int64"])
def test_absurd_lengths_end_with_an_error_not_a_hang(tmp_path, scenario, dist):
    scenario["workload"]["output_tokens"] = dist
    out = _predict_or_hang(_write(tmp_path, scenario))
    assert out is not None, "simspec predict still running after 3 s (a 1-request scenario takes < 0.1 s)"
    code, stderr, exc = out
    assert code == 2 and "Traceback" not in stderr and FILE in stderr and "workload.output_tokens" in stderr, out


# ------------------------------------------------------------------------------------------------ a real process


def test_real_process_exits_2_without_traceback(tmp_path, scenario):
    """`python -m simspec.cli` as a user runs it: exit code 2, one line on stderr, nothing on stdout."""
    scenario["hardware"]["gpu"] = "h900"
    path = _write(tmp_path, scenario)
    proc = subprocess.run([sys.executable, "-m", "simspec.cli", "predict", str(path)], capture_output=True,
                          text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""
    assert FILE in proc.stderr and "hardware.gpu" in proc.stderr and "known:" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr


def test_a_conversations_last_turn_must_fit_the_kv_cache(tmp_path, scenario):
    """With follow-ups a later turn carries every earlier turn: the loader checks the last turn (here 250,064 tokens
    against ~229,000), though any one turn of the conversation alone would fit."""
    base = copy.deepcopy(scenario)
    base["workload"].update(arrival={"type": "closed", "concurrency": 1, "turns": 3,
                                     "followup_tokens": {"dist": "fixed", "value": 20_000}},
                            num_requests=3, output_tokens={"dist": "fixed", "value": 70_000})
    _refused(_predict(_write(tmp_path, base)), "workload", "a conversation's last turn",
                      "turns or followup_tokens")
