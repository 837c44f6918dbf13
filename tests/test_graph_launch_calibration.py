"""A CUDA graph's launch cost measured from torch-profiler traces: read per replay, fitted per box."""

from __future__ import annotations

import json

import pytest

from simspec.calibration.fitting import Box, fit
from simspec.calibration.measurements import GraphLaunch, Measurements, ServerDescription, StepTime
from simspec.calibration.sources import read_traces
from simspec.scenario.loader import load_scenario
from simspec.timing.iteration import IterationModel


def _trace(rank_scale: float = 1.0) -> dict:
    """Kineto's layout (tests/test_trace_parser.py): phase ranges and runtime calls on the host thread, the GPU
    events of a call joined to it by args.correlation."""
    host, gpu = {"pid": 100, "tid": 100}, {"pid": 0, "tid": 7}
    ev: list[dict] = []
    corr = [0]

    def x(cat, name, ts, dur, where, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args})

    def call(api, ts, dur, kernels):
        corr[0] += 1
        x("cuda_runtime", api, ts, dur, host, correlation=corr[0])
        for k in range(kernels):
            x("kernel", f"k{k}", ts + 50 + k, 1, gpu, correlation=corr[0], stream=7)

    for i, verify_us in enumerate((300.0, 500.0)):
        t = 10_000 * i
        x("user_annotation", "draft", t, 100, host)
        call("cudaGraphLaunch_v10000", t + 10, 4.0 * rank_scale, kernels=2)  # CUPTI's versioned name
        x("user_annotation", "step[VERIFY bs=1]", t + 200, 2000, host)
        call("cudaGraphLaunch", t + 210, verify_us * rank_scale, kernels=3)
        call("cudaLaunchKernel", t + 900, 5.0, kernels=1)  # an eager kernel: not a replay
    call("cudaGraphLaunch", 50_000, 7.0, kernels=1)  # under no phase range
    call("cudaGraphLaunch", 60_000, 9.0, kernels=0)  # no GPU event joined to it: nothing to count, left out
    return {"traceEvents": ev}


def test_a_trace_gives_each_replays_host_time_nodes_and_phase(tmp_path):
    (tmp_path / "p-TP-0.trace.json").write_text(json.dumps(_trace()))
    (tmp_path / "p-TP-1.trace.json").write_text(json.dumps(_trace(rank_scale=2.0)))
    got = {(g.phase, g.nodes): g for g in read_traces(tmp_path).graph_launches}
    assert set(got) == {("draft", 2), ("verify", 3), ("other", 1)}
    # both ranks pooled: verify 300, 500 (rank 0) and 600, 1000 (rank 1)
    assert got[("verify", 3)].launches == 4 and got[("verify", 3)].host_us == pytest.approx(550.0)
    assert got[("draft", 2)].launches == 4 and got[("draft", 2)].host_us == pytest.approx(6.0)
    assert got[("other", 1)].launches == 2 and got[("other", 1)].host_us == pytest.approx(7.0)
    assert "cudaGraphLaunch, verify phase, 3 nodes" in got[("verify", 3)].source


def _eagle3_server(tp: int) -> Measurements:
    # SGLang 0.5.8 with --disable-overlap-schedule: the v1 EAGLE worker, whose host work every step waits for
    return Measurements(server=ServerDescription(
        model_path="meta-llama/Llama-3.1-8B-Instruct", tp=tp, sglang_version="0.5.8", algorithm="eagle3",
        num_steps=3, topk=1, num_draft_tokens=4, cuda_graph=True, overlap_schedule=False),
        accept_lengths=[2.5] * 20, sources=["synthetic"])


def test_graphs_that_do_not_branch_give_the_launch_and_leave_the_per_node_cost_alone():
    """Llama and its EAGLE-3 head at TP 1 replay straight graphs (releases.decode_graph_branches): their launches
    are graph_launch_us; a prefill's or an unplaced launch says nothing about the decode graphs."""
    m = _eagle3_server(tp=1)
    m.graph_launches = [
        GraphLaunch(phase="verify", nodes=300, host_us=3.0, launches=10, source="t"),
        GraphLaunch(phase="draft", nodes=30, host_us=2.0, launches=9, source="t"),
        GraphLaunch(phase="draft_extend", nodes=15, host_us=4.0, launches=1, source="t"),
        GraphLaunch(phase="other", nodes=5, host_us=50.0, launches=100, source="t"),
        GraphLaunch(phase="prefill", nodes=5, host_us=50.0, launches=100, source="t"),
    ]
    m.step_times = [StepTime(batch_size=1, seconds=9e-3, samples=5, source="s")]
    f = fit(m, Box(gpu="h100-sxm", interconnect="nvlink4-nccl"), name="t", bootstrap=0)
    launch = f.profile.coefficients["graph_launch_us"]
    assert launch.value == pytest.approx(3.0)  # the median of 10 x 3.0, 9 x 2.0, 1 x 4.0
    assert "20 replays of graphs that do not branch (draft, draft_extend, verify)" in launch.source
    assert "graph_launch_per_node_us" not in f.profile.coefficients


def test_branched_graphs_give_the_per_node_cost_and_the_step_fit_stops_absorbing_it():
    """At TP 2 every decode graph branches (NCCL's event nodes): the host time beyond the launch's fixed part, per
    node, is graph_launch_per_node_us; without overlap it is part of each step, so the fitted speculative host
    time is what is left once the measured launches are charged."""
    box = Box(gpu="h100-sxm", interconnect="nvlink4-nccl")
    plain = _eagle3_server(tp=2)
    plain.step_times = [StepTime(batch_size=b, seconds=(7.5 + 0.5 * (b - 1) / 3) / 1e3, samples=5, source="s")
                        for b in (1, 2, 4)]
    with_trace = plain.model_copy(deep=True)
    with_trace.graph_launches = [
        GraphLaunch(phase="verify", nodes=800, host_us=2.5 + 800 * 2.0, launches=4, source="t"),
        GraphLaunch(phase="draft", nodes=60, host_us=2.5 + 60 * 2.0, launches=4, source="t"),
    ]
    measured = fit(with_trace, box, name="t", bootstrap=0)
    per_node = measured.profile.coefficients["graph_launch_per_node_us"]
    assert per_node.value == pytest.approx(2.0)  # beyond the default 2.5 us launch, which stays unmeasured
    assert "8 replays of branched graphs (draft, verify, 60-800 nodes)" in per_node.source
    assert "graph_launch_us" not in measured.profile.coefficients
    assumed = fit(plain, box, name="t", bootstrap=0)
    assert "graph_launch_per_node_us" not in assumed.profile.coefficients
    # the dearer measured launches take the place of other host work and of slower weight streaming
    coefficients = assumed.profile.coefficients, measured.profile.coefficients
    assert coefficients[1]["spec_cpu_ms"].value < coefficients[0]["spec_cpu_ms"].value
    assert (coefficients[1]["memory_bandwidth_efficiency"].value
            > coefficients[0]["memory_bandwidth_efficiency"].value)
    for f in (assumed, measured):
        for _, step_ms, modelled_ms in f.residuals_pct:
            assert modelled_ms == pytest.approx(step_ms, rel=0.05)


def test_a_profiles_measured_launch_cost_reaches_the_prediction(tmp_path):
    """A profile's graph_launch_per_node_us replaces the default in every branched replay's host time."""
    profile = tmp_path / "p.yaml"
    profile.write_text("name: p\ncoefficients:\n  graph_launch_per_node_us: {value: 3.0, source: trace}\n")
    base = load_scenario("scenarios/eagle3.yaml", ["calibration=null"])
    measured = load_scenario("scenarios/eagle3.yaml", [f"calibration={profile}"])
    host = [sum(p.launch_host_ms for p in IterationModel(rs).plan(1)) for rs in (base, measured)]
    assert IterationModel(base).target_graph_branches  # TP 8
    assert host[1] - 2.5e-3 * 3 == pytest.approx(3 * (host[0] - 2.5e-3 * 3))  # three replays, 2.5 us fixed each


def test_calibrate_from_a_trace_writes_and_reports_the_launch_cost(tmp_path):
    """`simspec calibrate --from-trace`: the profile holds the measured launch with its evidence, and --json says
    it came from the trace (no step times were fitted)."""
    import yaml
    from click.testing import CliRunner

    from simspec.cli import main

    (tmp_path / "p-TP-0.trace.json").write_text(json.dumps(_trace()))
    out = tmp_path / "out" / "p.yaml"
    res = CliRunner().invoke(main, ["calibrate", "--from-trace", str(tmp_path), "--gpu", "h100-sxm",
                                    "--interconnect", "nvlink4-nccl", "--model", "llama-3.1-8b", "--tp", "1",
                                    "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["from_trace"] == {"graph_launch_us": 400.0} and summary["parameters"] == {}
    written = yaml.safe_load(out.read_text())["coefficients"]["graph_launch_us"]
    assert written["value"] == 400.0 and "cudaGraphLaunch" in written["source"]
