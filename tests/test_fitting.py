"""Fitting a profile to measurements (simspec/calibration/fitting.py), on synthetic measurements whose
true coefficients are known because the time model itself produced them."""

from __future__ import annotations

import dataclasses

import pytest

from simspec.calibration.fitting import (
    Box,
    beats_neighbours,
    build_scenario,
    check_minimum,
    fit,
    match_preset,
    modelled_step_ms,
)
from simspec.calibration.live import description_from_server_info
from simspec.calibration.measurements import Measurements, RequestRecord, ServerDescription, StepTime
from simspec.calibration.sources.common import server_description_from_args
from simspec.errors import InputError
from simspec.scenario.loader import Coefficient, parse_scenario, resolve

BOX = Box(gpu="h100-sxm", interconnect="nvlink4-nccl")
TRUTH = {"memory_bandwidth_efficiency": 0.62, "spec_cpu_ms": 1.7, "scheduler_cpu_per_request_ms": 0.04}
BATCHES = (1, 2, 4, 8, 16)


def _server(**kw) -> ServerDescription:
    base = dict(model_path="meta-llama/Llama-3.1-8B-Instruct", tp=1, sglang_version="0.5.10", algorithm="eagle3",
                num_steps=3, topk=1, num_draft_tokens=4)
    return ServerDescription(**(base | kw))


def _measurements(truth: dict[str, float], batches=BATCHES, **server) -> Measurements:
    m = Measurements(server=_server(**server), sources=["synthetic"])
    m.requests = [RequestRecord(concurrency=c, prompt_tokens=400, completion_tokens=200, spec_verify_ct=80,
                                accept_histogram={0: 10, 1: 20, 2: 30, 3: 20}) for c in batches for _ in range(c)]
    rs = resolve(parse_scenario(build_scenario(m, BOX, name="truth", concurrency=1), "t"), "t")
    rs = dataclasses.replace(rs, coefficients=rs.coefficients | {k: Coefficient(v, "truth") for k, v in truth.items()})
    context = 400 + 100  # prompt + half the output, what fit() assumes
    m.step_times = [StepTime(batch_size=b, seconds=modelled_step_ms(rs, b, context) / 1e3, samples=10,
                             source="synthetic") for b in batches]
    return m


def test_fit_reproduces_the_measured_step_times_and_brackets_the_truth():
    f = fit(_measurements(TRUTH), BOX, name="t", bootstrap=30)
    for _, measured, modelled in f.residuals_pct:
        assert modelled == pytest.approx(measured, rel=0.01)
    for name, true in TRUTH.items():
        value, interval = f.parameters[name]
        assert interval is not None
        assert interval[0] - 1e-9 <= true <= interval[1] + 1e-9, (name, true, interval)
    # every fitted coefficient is in the profile with its interval and a source naming the evidence
    for name in TRUTH:
        c = f.profile.coefficients[name]
        assert c.interval_95 is not None and "batch sizes 1, 2, 4, 8, 16" in c.source


def test_a_tree_server_measures_its_fixed_host_time_as_tree_cost():
    truth = {"memory_bandwidth_efficiency": 0.62, "spec_tree_cpu_ms": 2.4, "scheduler_cpu_per_request_ms": 0.04}
    f = fit(_measurements(truth, num_steps=4, topk=4, num_draft_tokens=16), BOX, name="t", bootstrap=20)
    assert "spec_cpu_ms" not in f.parameters
    value, interval = f.parameters["spec_tree_cpu_ms"]
    assert interval[0] - 1e-9 <= 2.4 <= interval[1] + 1e-9


def test_one_batch_size_reports_the_confounding():
    f = fit(_measurements(TRUTH, batches=(1, 1, 1)), BOX, name="t", bootstrap=20)
    assert any("confounded" in n for n in f.notes)


def test_scenario_reproduces_the_server_and_its_acceptance():
    m = _measurements(TRUTH)
    sc = build_scenario(m, BOX, name="x", concurrency=4)
    assert sc["model"] == "llama-3.1-8b"
    assert sc["speculative"] == {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                                 "num_draft_tokens": 4}
    # the server's histograms summed over every request: 10/20/30/20 steps accepted 0/1/2/3 drafts
    n = len(m.requests)
    assert sc["acceptance"]["histogram"] == [10.0 * n, 20.0 * n, 30.0 * n, 20.0 * n]
    assert sc["workload"]["arrival"] == {"type": "closed", "concurrency": 4}
    assert sc["workload"]["input_tokens"]["value"] == 400 and sc["workload"]["output_tokens"]["value"] == 200


def test_accept_lengths_from_chunks_when_the_version_has_no_histogram():
    m = Measurements(server=_server(), accept_lengths=[1, 2, 2, 4, 4, 4], sources=["s"])
    sc = build_scenario(m, BOX, name="x", concurrency=1)
    assert sc["acceptance"]["histogram"] == [1.0, 2.0, 0.0, 3.0]


def test_baseline_server_has_no_speculative_section():
    m = Measurements(server=_server(algorithm="none", num_steps=None, topk=None, num_draft_tokens=None))
    sc = build_scenario(m, BOX, name="x", concurrency=1)
    assert "speculative" not in sc and "acceptance" not in sc


def test_model_names_map_to_presets_or_ask_for_the_flag():
    names = ["llama-3.1-8b", "llama-3.1-70b", "kimi-k2.5", "kimi-k2"]
    assert match_preset("meta-llama/Llama-3.1-8B-Instruct", names, "model", "--model") == "llama-3.1-8b"
    assert match_preset("moonshotai/Kimi-K2.5", names, "model", "--model") == "kimi-k2.5"
    with pytest.raises(InputError, match="--model"):
        match_preset("/models/my-finetune", names, "model", "--model")


@pytest.mark.parametrize(("change", "needle"), [
    ({"tp": None}, "--tp"),
    ({"sglang_version": "0.4.4"}, "0.5.8 to 0.5.23"),
])
def test_what_the_server_did_not_say_is_asked_for(change, needle):
    m = Measurements(server=_server(**change), step_times=[StepTime(batch_size=1, seconds=0.01, source="s")])
    with pytest.raises(InputError, match=needle):
        fit(m, BOX, name="x", bootstrap=0)


def test_nothing_to_fit_is_an_error():
    with pytest.raises(InputError, match="nothing to fit"):
        fit(Measurements(server=_server()), BOX, name="x")


def test_the_memory_in_use_at_startup_comes_from_the_log():
    """A server log's 'Load weight begin. avail mem=' sets startup_memory_mib (tp 1) or
    startup_memory_multi_gpu_mib (tp > 1) from the GPU's total; a figure above that total, or one leaving more than
    a quarter of the GPU in use (a log from another GPU type), is refused with a note."""
    m = _measurements(TRUTH, batches=(1, 2))
    m.server = m.server.model_copy(update={"startup_free_gib": 78.5})
    f = fit(m, BOX, name="t", bootstrap=0)
    c = f.profile.coefficients["startup_memory_mib"]
    assert c.value == pytest.approx(81_559 - 78.5 * 1024, abs=0.1)
    assert "avail mem=78.50" in c.source and "startup_memory_multi_gpu_mib" not in f.profile.coefficients
    m.server = m.server.model_copy(update={"startup_free_gib": 90.0})  # more than an 80 GB H100 holds
    f = fit(m, BOX, name="t", bootstrap=0)
    assert "startup_memory_mib" not in f.profile.coefficients
    assert any("outside 0 to 25%" in n for n in f.notes)
    m.server = m.server.model_copy(update={"startup_free_gib": 40.0})  # 40 GiB in use: not this GPU's log
    f = fit(m, BOX, name="t", bootstrap=0)
    assert "startup_memory_mib" not in f.profile.coefficients
    m8 = _measurements(TRUTH, batches=(1, 2), tp=8)
    m8.server = m8.server.model_copy(update={"startup_free_gib": 77.43})
    f8 = fit(m8, dataclasses.replace(BOX, num_gpus=8), name="t", bootstrap=0)
    in_use = f8.profile.coefficients["startup_memory_multi_gpu_mib"].value
    assert in_use == pytest.approx(81_559 - 77.43 * 1024, abs=0.1)


def test_beats_neighbours_accepts_a_minimum_and_refuses_a_point_beside_it():
    """The fit scripts' --check: a bowl with its minimum at (1, 0); the check moves each value by its step, never
    below 0, so a minimum on the bound is still accepted."""
    def bowl(v):
        return (v[0] - 1.0) ** 2 + (v[1] + 0.5) ** 2  # minimum at v[1] = -0.5, outside the [0, ...) range

    ok, here, best = beats_neighbours(bowl, (1.0, 0.0), (0.1, 0.1))
    assert ok and here == pytest.approx(0.25) and best > here
    ok, _, _ = beats_neighbours(bowl, (1.3, 0.0), (0.1, 0.1))
    assert not ok  # 1.2 scores better


def test_check_minimum_reports_and_exits_as_a_fit_script_check(capsys, tmp_path):
    def bowl(v):
        return (v[0] - 1.0) ** 2 + v[1] ** 2

    where = tmp_path / "profile.yaml"
    assert check_minimum(bowl, ("a", "b"), (1.0, 0.0), (0.1, 0.1), where, "rerun the fit") == 0
    assert "a = 1.0, b = 0.0 minimise the fit objective" in capsys.readouterr().out
    assert check_minimum(bowl, ("a", "b"), (1.3, 0.0), (0.1, 0.1), where, "rerun the fit") == 1
    err = capsys.readouterr().err
    assert f"in {where} do not minimise the fit objective: rerun the fit" in err


def test_a_speedup_with_fitted_coefficients_compares_against_a_baseline_on_the_same_coefficients(small):
    """Fit scripts set trial coefficients on a resolved scenario (prediction_with); the no-speculation baseline a
    speedup divides by must run on them too, not on what re-resolving the scenario's files gives."""
    from simspec.calibration.fitting import prediction_with

    small["speculative"] = {"algorithm": "eagle3", "drafter": "eagle3-llama-3.1-8b", "num_steps": 3, "topk": 1,
                            "num_draft_tokens": 4}
    small["acceptance"] = {"accept_length": 2.5}
    rs = resolve(parse_scenario(small, "<test>"), "<test>")
    slow, fast = (prediction_with(rs, ("memory_bandwidth_efficiency",), (e,)) for e in (0.5, 0.9))
    # the baseline streams at the trial efficiency: ~0.9 / 0.5 faster at batch 1, not unchanged
    assert slow["baseline"]["iteration_ms"] > 1.5 * fast["baseline"]["iteration_ms"]
    assert slow["baseline_tokens_per_s"] < fast["baseline_tokens_per_s"] / 1.5


def test_the_scenario_keeps_the_servers_fp8_kv_cache_and_refuses_one_simspec_cannot_model():
    """--kv-cache-dtype as /server_info reports it: an FP8 cache goes into the scenario (it halves every token's KV
    bytes); "auto" is the default and left out; an FP4 cache is refused with the field, not read as BF16."""
    def scenario(kv: str) -> dict:
        server = _server(algorithm="none", num_steps=None, topk=None, num_draft_tokens=None, kv_cache_dtype=kv)
        return build_scenario(Measurements(server=server), BOX, name="x", concurrency=1)

    assert scenario("fp8_e4m3")["server"]["kv_cache_dtype"] == "fp8_e4m3"
    assert scenario("bfloat16")["server"]["kv_cache_dtype"] == "bfloat16"
    assert "kv_cache_dtype" not in scenario("auto")["server"]
    with pytest.raises(InputError, match="fp4_e2m1") as err:
        scenario("fp4_e2m1")
    assert err.value.key == "kv_cache_dtype"


def test_the_scenario_keeps_the_servers_scheduler_recv_interval():
    """--scheduler-recv-interval as the server reports it (server_args or /server_info): above 1 it goes into the
    scenario (new requests wait for the scheduler's next receive); 1, SGLang's default, is left out."""
    def server(args: dict) -> dict:
        desc = server_description_from_args({"model_path": "meta-llama/Llama-3.1-8B-Instruct", "tp_size": 1,
                                              "version": "0.5.10", **args})
        return build_scenario(Measurements(server=desc), BOX, name="x", concurrency=1)["server"]

    assert server({"scheduler_recv_interval": 30})["scheduler_recv_interval"] == 30
    assert "scheduler_recv_interval" not in server({"scheduler_recv_interval": 1})
    assert "scheduler_recv_interval" not in server({})
    live = description_from_server_info({"version": "0.5.12", "scheduler_recv_interval": 10})
    assert live.scheduler_recv_interval == 10
