"""Bad input in calibration profiles and the files a scenario points at, booleans where numbers go (and the
reverse), `--set` paths and values, and cost/optimize flags past a stated range. Each exits 2 with one line
naming the file and the field or flag, never a traceback."""

from __future__ import annotations

import copy
import functools
from pathlib import Path
from typing import Any

import pytest
import yaml

from simspec.cli import main
from tests.conftest import ROOT, SMALL, assert_refused, cli_runner

# this file's refusals: one line on stderr; stdout is not checked
_refused = functools.partial(assert_refused, stdout_empty=False)

M1 = ROOT / "calibration" / "profiles" / "m1-kimi-k25-8x-rtxpro6000-pcie.yaml"
EAGLE3 = ROOT / "scenarios" / "eagle3.yaml"


def _run(*args: Any):
    return cli_runner().invoke(main, [str(a) for a in args])


def _write(tmp_path: Path, data: Any, name: str) -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _with_profile(tmp_path: Path, profile: dict) -> Path:
    """A small scenario pointing at `profile` (written next to it as profile.yaml)."""
    _write(tmp_path, profile, "profile.yaml")
    return _write(tmp_path, copy.deepcopy(SMALL) | {"calibration": "profile.yaml"}, "small.yaml")


def _coef(value: Any, **more: Any) -> dict:
    return {"value": value, "source": "x", **more}


# ------------------------------------------------------------------------------------------- 1: booleans


@pytest.mark.parametrize("override, key", [
    ("acceptance.accept_length=true", "acceptance.accept_length"),
    ("server.mem_fraction_static=true", "server.mem_fraction_static"),
    ("server.schedule_conservativeness=true", "server.schedule_conservativeness"),
    ("acceptance.chain_rates=[true]", "acceptance.chain_rates.0"),
    ("server.cuda_graph=0", "server.cuda_graph"),
    ("server.spec_v2=1", "server.spec_v2"),
])
def test_a_boolean_is_not_a_number_nor_a_number_a_boolean(override, key):
    _refused(_run("predict", EAGLE3, "--set", override), "eagle3.yaml", key)


def test_true_as_a_number_says_so():
    _refused(_run("predict", EAGLE3, "--set", "acceptance.accept_length=true"),
                      "true and false are not numbers")


# ------------------------------------------------------------------------------------------- 2: profiles


@pytest.mark.parametrize("profile, needles", [
    ({"name": "p", "coefficients": {"scheduler_cpu_ms": _coef(1e12)}},
     ("coefficients.scheduler_cpu_ms.value", "allowed: 0 to 50", "fitting.py BOUNDS")),
    ({"name": "p", "coefficients": {"compute_efficiency": _coef(0.01)}},
     ("coefficients.compute_efficiency.value", "allowed: 0.1 to 1")),
    ({"name": "p", "coefficients": {"kernel_gap_graph_us": _coef(1e12)}},
     ("coefficients.kernel_gap_graph_us.value", "allowed: 0 to 100")),
    ({"name": "p", "draft_forward_ms": _coef(1e12)}, ("draft_forward_ms.value", "allowed: 0 to 1000")),
    ({"name": "p", "coefficients": {"scheduler_cpu_ms": _coef(True)}},
     ("coefficients.scheduler_cpu_ms.value", "not numbers")),
    ({"name": "p", "coefficients": {"scheduler_cpu_ms": _coef(1.0, interval_95=[-1, 1.0])}},
     ("coefficients.scheduler_cpu_ms.interval_95", "allowed: 0 to 50")),
    ({"name": "p", "coefficients": {"scheduler_cpu_ms": _coef(1.0, interval_95=[2.0, 0.5])}},
     ("coefficients.scheduler_cpu_ms", "interval_95", "low <= value")),
    ({"name": "p", "coefficients": {"scheduler_cpu_ms": _coef(1.0, interval_95=[2.0, 3.0])}},
     ("coefficients.scheduler_cpu_ms", "interval_95", "low <= value")),
    ({"name": "p", "coefficients": {"moe_routing_spread": _coef(50.0)}},
     ("coefficients.moe_routing_spread.value", "allowed: 0 to 10")),
], ids=["scheduler-huge", "efficiency-below-fit-bound", "kernel-gap-huge", "draft-step-huge", "value-true",
        "interval-negative", "interval-reversed", "interval-misses-value", "routing-spread-huge"])
def test_implausible_profile_coefficients(tmp_path, profile, needles):
    _refused(_run("predict", _with_profile(tmp_path, profile)), "small.yaml", "calibration",
                      "profile.yaml", *needles)


def _m1_curve(**changes: Any) -> dict:
    profile = yaml.safe_load(M1.read_text())
    profile["all_reduce"] |= changes
    return profile


@pytest.mark.parametrize("changes, key", [
    ({"bus_bandwidth_gbps": 1e-12}, "all_reduce.bus_bandwidth_gbps"),
    ({"bus_bandwidth_gbps": True}, "all_reduce.bus_bandwidth_gbps"),
    ({"points_bytes_us": [[14336, 23.957], [57344, 1e12]]}, "all_reduce.points_bytes_us.1.1"),
    ({"measured_gpus": 10**12}, "all_reduce.measured_gpus"),
    ({"measured_gpus": 2.0}, "all_reduce.measured_gpus"),
], ids=["busbw-tiny", "busbw-true", "point-huge", "gpus-huge", "gpus-float"])
def test_implausible_all_reduce_curve(tmp_path, changes, key):
    path = _write(tmp_path, _m1_curve(**changes), "m1.yaml")
    res = _run("predict", ROOT / "scenarios" / "baseline.yaml", "--set", f"calibration={path}")
    _refused(res, "baseline.yaml", "calibration", "m1.yaml", key)


def test_measured_on_tp_is_a_whole_number(tmp_path):
    profile = yaml.safe_load(M1.read_text())
    profile["measured_on"]["tp"] = 8.0
    path = _write(tmp_path, profile, "m1.yaml")
    res = _run("predict", ROOT / "scenarios" / "baseline.yaml", "--set", f"calibration={path}")
    _refused(res, "baseline.yaml", "calibration", "m1.yaml", "measured_on.tp")


def test_checked_in_profiles_load():
    from simspec.scenario.loader import load_profile

    for path in sorted((ROOT / "calibration" / "profiles").glob("*.yaml")):
        load_profile(path)


# ------------------------------------------------------------------------------------------- 3: on/off


@pytest.mark.parametrize("value, meant", [("off", "off"), ("on", "on"), ("false", "off"), ("true", "on")])
def test_unquoted_on_off_is_the_overlap_setting(value, meant):
    from simspec.scenario.loader import parse_scenario
    from simspec.scenario.reading import apply_overrides

    data = apply_overrides(copy.deepcopy(SMALL), [f"server.overlap_schedule={value}"], "small.yaml")
    assert parse_scenario(data, "small.yaml").server.overlap_schedule == meant


def test_unquoted_off_runs():
    res = _run("predict", EAGLE3, "--set", "server.overlap_schedule=off", "--set", "workload.num_requests=8")
    assert res.exit_code == 0, res.stderr


def test_overlap_on_off_in_the_file(tmp_path):
    from simspec.scenario.loader import load_scenario

    path = _write(tmp_path, copy.deepcopy(SMALL), "small.yaml")
    path.write_text(path.read_text().replace("tp: 1", "tp: 1\n  overlap_schedule: off"))
    assert load_scenario(path).scenario.server.overlap_schedule == "off"


# ------------------------------------------------------------------------------------------- 4: referenced files


@pytest.mark.parametrize("override, key", [
    ('calibration=""', "calibration"),
    ('acceptance.ngram_replay.corpus=""', "acceptance.ngram_replay.corpus"),
])
def test_an_empty_path_is_not_a_file(override, key):
    scenario = ROOT / "scenarios" / "ngram_chain_replay.yaml"
    _refused(_run("predict", scenario, "--set", override), "ngram_chain_replay.yaml", key,
                      "must be a path to a file")


def test_a_profile_that_is_not_a_mapping_names_the_scenario(tmp_path):
    (tmp_path / "p.yaml").write_text("- 1\n- 2\n")
    _refused(_run("predict", EAGLE3, "--set", f"calibration={tmp_path / 'p.yaml'}"),
                      "eagle3.yaml: calibration: ", "p.yaml", "must be a YAML mapping")


def test_a_directory_as_profile_names_the_scenario(tmp_path):
    _refused(_run("predict", EAGLE3, "--set", f"calibration={tmp_path}"),
                      "eagle3.yaml: calibration: ", "cannot read")


def test_a_scenario_given_as_profile_is_recognised():
    res = _run("predict", EAGLE3, "--set", f"calibration={ROOT / 'scenarios' / 'baseline.yaml'}")
    _refused(res, "eagle3.yaml: calibration: ", "baseline.yaml", "is a scenario",
                      "not a calibration profile")
    assert "unknown key" not in res.stderr


# ------------------------------------------------------------------------------------------- 5: --set


def test_set_value_that_is_not_yaml():
    _refused(_run("predict", EAGLE3, "--set", "model=[1,"), "eagle3.yaml", "model", "not valid YAML")
    assert "scalar" not in _run("predict", EAGLE3, "--set", "model=[1,").stderr.split("not valid YAML")[0]


def test_set_path_with_an_empty_segment():
    _refused(_run("predict", EAGLE3, "--set", "hardware..gpu=1"), "eagle3.yaml",
                      "'hardware..gpu' is not a field path")


def test_set_a_section_to_nothing_says_so():
    _refused(_run("predict", EAGLE3, "--set", "hardware="), "eagle3.yaml", "hardware", "(got None)")


# ------------------------------------------------------------------------------------------- 6, 7: flags


@pytest.mark.parametrize("flag", ["--price", "--train-tokens", "--train-epochs", "--train-throughput",
                                  "--gen-tokens", "--gen-throughput", "--train-gpus"])
def test_cost_refuses_implausibly_large_inputs(flag):
    _refused(_run("cost", EAGLE3, flag, "1e300"), flag, "allowed:", "implausibly large")


def test_optimize_max_steps_beyond_the_schema(tmp_path):
    from simspec.scenario.schema import MAX_NUM_STEPS

    _refused(_run("optimize", EAGLE3, "--max-steps", str(MAX_NUM_STEPS + 1)), "--max-steps",
                      f"allowed 1..{MAX_NUM_STEPS}")


def test_an_exponent_without_a_dot_is_a_number(tmp_path):
    # YAML 1.1 reads 1e-1 as text; with strict number fields that used to refuse a value every user means as 0.1
    from simspec.scenario.reading import read_yaml

    f = tmp_path / "n.yaml"
    f.write_text('a: 1e-1\nb: 5E3\nc: "1e-1"\n')
    assert read_yaml(f) == {"a": 0.1, "b": 5000.0, "c": "1e-1"}


def test_a_calibration_profile_that_is_a_symlink_loop_is_refused_naming_the_key(tmp_path):
    """Path.resolve() raises on a link loop (RuntimeError before Python 3.13): the scenario's reference is
    refused like a missing file, naming the scenario and the key, not with a traceback."""
    (tmp_path / "loop.yaml").symlink_to("loop.yaml")
    scenario = _write(tmp_path, copy.deepcopy(SMALL) | {"calibration": "loop.yaml"}, "small.yaml")
    _refused(_run("predict", scenario), "small.yaml", "calibration", "loop.yaml")
