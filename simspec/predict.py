"""predict(resolved scenario) -> the full prediction: the setup, its no-speculation baseline and their
comparison. Pure: the CLI formats and prints it."""

from __future__ import annotations

import copy

from simspec.analysis.metrics import compare, compare_to_itself, summarize
from simspec.errors import InputError
from simspec.presets import interconnect_mismatch
from simspec.scenario.loader import ResolvedScenario
from simspec.scenario.schema import BENCH_SERVING_RANDOM, LengthDistribution
from simspec.simulate import SimulationResult, baseline_of, run


def hypothetical_interconnect(rs: ResolvedScenario) -> str | None:
    """Why the scenario's GPUs could not talk over its interconnect as they stand (a what-if that isolates the
    interconnect), or None for a box that exists."""
    hw = rs.scenario.hardware
    return interconnect_mismatch(hw.gpu, rs.gpu, hw.interconnect, rs.interconnect, rs.scenario.server.tp)


def describe(rs: ResolvedScenario) -> dict:
    sc = rs.scenario
    out = {
        "scenario": sc.name, "model": sc.model, "gpu": sc.hardware.gpu, "num_gpus": sc.hardware.num_gpus,
        "interconnect": sc.hardware.interconnect, "tp": sc.server.tp, "algorithm": rs.algorithm,
        "overlap_schedule": rs.overlap, "max_running_requests": rs.max_running_requests,
        "kv_capacity_tokens": rs.kv_capacity_tokens, "seed": sc.seed,
        "hypothetical_interconnect": hypothetical_interconnect(rs),
    }
    if rs.speculative:
        out |= {"num_draft_tokens": rs.num_draft_tokens}
        if rs.algorithm != "ngram":
            out |= {"num_steps": rs.num_steps, "topk": rs.topk}
    if rs.profile is not None:
        out["calibration_profile"] = rs.profile.name
    return out


def sources(rs: ResolvedScenario) -> dict[str, str]:
    """Where every time-model figure came from."""
    out = {name: f"{c.value:g} ({c.source})" for name, c in rs.coefficients.items()}
    if rs.profile is not None:
        fitted = "; ".join(rs.profile.fitted_to) or "no measurement named"
        out["calibration_profile"] = f"{rs.profile.name} (fitted to: {fitted})"
    out["all_reduce"] = rs.all_reduce.source
    if rs.profile is not None and rs.profile.draft_forward_ms is not None:
        d = rs.profile.draft_forward_ms
        out["draft_forward_ms"] = f"{d.value:g} (profile {rs.profile.name}: {d.source})"
    out["gpu"] = rs.gpu.source
    sustained = rs.gpu.sustained_tensor_fraction
    if sustained is not None:
        parts = ", ".join(f"{c} {getattr(sustained, c):g}" for c in ("bf16", "fp8") if getattr(sustained, c))
        out["sustained_tensor_fraction"] = f"{parts} of the datasheet's peak ({sustained.source})"
    out["model"] = rs.model.source
    from simspec.timing.iteration import IterationModel
    from simspec.timing.stack import release_kernels

    srv = rs.scenario.server
    stack = IterationModel(rs).target.stack  # the stack the prediction charges, release and backend included
    release = release_kernels(srv.version_minor_patch)
    read = f"SGLang 0.5.10's model code{', with ' + release.source if release else ''}"
    copies = (f", {stack.small_kernels_from_two_rows:g} small copies more from two query rows"
              if stack.small_kernels_from_two_rows else "")
    out["kernel_counts"] = (f"{stack.kernels_per_forward:g} kernels per target decode forward, "
                            f"{stack.small_kernels_per_forward:g} of them small{copies} (presets/kernels.yaml:"
                            f" read from {read})")
    if rs.drafter is not None:
        out["drafter"] = rs.drafter.source
    acc = rs.scenario.acceptance
    if rs.replayed is not None:
        out["acceptance"] = rs.replayed.source
    elif acc is not None:
        out["acceptance"] = acc.source or "not stated in the scenario"
    return out


# A sweep varies the speculative settings far more often than what the baseline depends on: keep the last
# baselines per process (keyed by the no-speculation scenario and the file its paths are relative to).
_BASELINES: dict[tuple[str, str], dict] = {}  # insertion-ordered: the oldest goes first
_BASELINE_CACHE_SIZE = 256


def _baseline_summary(rs: ResolvedScenario) -> dict:
    base = baseline_of(rs)
    # what the resolved baseline read from files (its profile's coefficients and curve) is part of the key
    key = (base.scenario.model_dump_json() + repr(sorted(base.coefficients.items()))
           + base.all_reduce.model_dump_json() + repr(base.profile), base.path)
    hit = _BASELINES.get(key)
    if hit is None:
        hit = summarize(run(base))
        if len(_BASELINES) >= _BASELINE_CACHE_SIZE:
            _BASELINES.pop(next(iter(_BASELINES)))
        _BASELINES[key] = hit
    return copy.deepcopy(hit)


def can_draw_more_than_one(d: LengthDistribution) -> bool:
    """Can this output-length distribution draw 2 or more tokens (workload.sample_lengths: rounded, clipped to
    [min, max])? A normal or lognormal with std 0 draws its mean; with std > 0 its tail reaches any length."""
    if d.max < 2:
        return False
    if d.dist in ("normal", "lognormal"):
        assert d.mean is not None and d.std is not None
        return d.std > 0 or max(round(d.mean), d.min) >= 2
    longest = d.high if d.dist == "uniform" else d.value  # fixed and bench_serving_random: randint up to value
    assert longest is not None
    return max(longest, d.min) >= 2


def check_decodes(rs: ResolvedScenario, sim: SimulationResult) -> None:
    """Refuse a run in which no request decoded: a request's first output token comes from its prefill, so with
    one output token each there is no decode step, and every decode figure (tokens/s, ITL, TPOT, speedup,
    break-even) would be undefined. One request with two or more tokens is enough. The message tells a
    distribution that only ever gives 1 token from one that can give more but drew 1 for each request this run."""
    out = sim.requests.output_tokens
    if not len(out) or int(out.max()) >= 2:
        return
    why = "which its prefill produces: no decode step, so no decode figure (tokens/s, ITL, speedup) exists"
    d = rs.scenario.workload.output_tokens
    if not can_draw_more_than_one(d):
        raise InputError(f"every request has 1 output token (this distribution draws no other length), {why};"
                         " allowed: lengths that can reach at least 2 output tokens",
                         file=rs.path, key="workload.output_tokens")
    bench = d.dist == BENCH_SERVING_RANDOM  # draws with its own seed, not the scenario's
    key, seed = ("workload.output_tokens.seed", d.seed) if bench else ("seed", rs.scenario.seed)
    who = f"each of the {len(out)} requests" if len(out) > 1 else "the only request"
    raise InputError(f"{key} {seed} drew 1 output token for {who} (the distribution can draw more), {why}; this "
                     f"depends on the drawn lengths: allowed: a draw with at least one output of 2 or more tokens: "
                     f"raise the output tokens (e.g. workload.output_tokens.min=2), draw more requests "
                     f"(workload.num_requests) or change {key}", file=rs.path, key="workload.output_tokens")


def predict(rs: ResolvedScenario) -> dict:
    return predict_with_run(rs)[0]


def predict_with_run(rs: ResolvedScenario) -> tuple[dict, SimulationResult]:
    """The prediction and the scenario's own simulated run (its raw records, e.g. for a timeline)."""
    sim = run(rs)
    spec = summarize(sim)
    result = {"setup": describe(rs)} | spec
    if rs.speculative:
        base = _baseline_summary(rs)
        result |= compare(spec, base)
        result["baseline"] = base
    else:
        result |= compare_to_itself(spec)
    result["sources"] = sources(rs)
    return result, sim
