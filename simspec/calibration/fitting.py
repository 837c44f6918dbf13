"""From measurements to a profile: fit the time-model coefficients a server's own timings pin down.

What is fitted, and why only that:
  - The all-reduce curve comes from the collective microbenchmark when one is given (calibration/
    collective_bench.py -> calibration/collectives.py), else from the interconnect preset. Step times alone
    cannot separate communication from compute at one TP degree, so they do not move it.
  - From measured iteration times per running batch size: the memory-bandwidth efficiency (the weight- and
    KV-streaming rate, which sets a decode step on every GPU we model) and ONE fixed per-iteration overhead,
    the one the model exposes for this server: scheduler CPU without overlap (none), speculative CPU work
    without overlap (EAGLE v1, n-gram), else the per-forward launch overhead. With three or more batch sizes
    a per-request slope is fitted too: exposed CPU per request without overlap, GPU time per request with it.
    The two fixed terms are confounded when every step time was measured at one batch size; a weak prior
    at the defaults (presets/defaults.yaml) keeps the fit defined and the bootstrap interval shows how little
    the data said.
  - A torch-profiler trace's draft phase gives the draft step time directly (profile.draft_forward_ms).
  - Acceptance is not a profile field: it belongs to the drafter and the text, so it goes into the scenario
    that calibrate writes (a histogram of accepted drafts per verify step).
Uncertainty: every fitted figure carries a 95% bootstrap interval over resampled step-time observations.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import math
import re
import sys
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from scipy.optimize import least_squares, minimize_scalar

from simspec import presets
from simspec.calibration.measurements import GraphLaunch, Measurements, RequestRecord, ServerDescription, StepTime
from simspec.errors import InputError
from simspec.scenario.loader import (
    STARTUP_MEMORY_LIMIT,
    ResolvedScenario,
    parse_scenario,
    resolve,
    startup_memory_key,
)
from simspec.scenario.loader import Coefficient as ResolvedCoefficient
from simspec.scenario.profile import Coefficient, CollectiveCurve, MeasuredOn, Profile, Provenance
from simspec.scenario.schema import Server
from simspec.timing.iteration import IterationModel

# Prior weight: a parameter one prior scale away from its default costs as much as a 1% misfit of one
# step-time observation. Small enough that two batch sizes outvote it, large enough to pin a flat direction.
PRIOR_WEIGHT = 0.01
PRIOR_SCALE = {"memory_bandwidth_efficiency": 0.15, "compute_efficiency": 0.15, "scheduler_cpu_ms": 1.0,
               "spec_cpu_ms": 1.0, "spec_tree_cpu_ms": 1.0, "forward_overhead_ms": 0.3, "graph_replay_gpu_us": 300.0,
               "scheduler_cpu_per_request_ms": 0.05, "decode_per_request_us": 50.0}
BOUNDS = {"memory_bandwidth_efficiency": (0.2, 1.0), "compute_efficiency": (0.1, 1.0), "scheduler_cpu_ms": (0.0, 50.0),
          "spec_cpu_ms": (0.0, 50.0), "spec_tree_cpu_ms": (0.0, 50.0), "forward_overhead_ms": (0.0, 20.0),
          "graph_replay_gpu_us": (0.0, 20_000.0),
          "scheduler_cpu_per_request_ms": (0.0, 5.0), "decode_per_request_us": (0.0, 5000.0)}
# What a fit may end at. The bounds above are of two kinds. A zero floor of an additive time (an overhead, a
# per-request term) is physical: the data may say the term is nil (hidden by overlap, or too small to see), and the
# fit ending there is a reading. Every other bound (both ends of an efficiency: a fraction of peak a real kernel
# neither exceeds nor falls far below; the top of each overhead: tens of ms of CPU per iteration) is the edge of
# what a healthy server can be, and a fit ending there reports the bound's value, not the server's.
PHYSICAL_FLOORS = {n for n, (lo, _) in BOUNDS.items() if lo == 0.0}
# A fit ends at a bound when it lies within this fraction of the bound's range of it (least_squares' iterates are
# strictly feasible, so a bound is approached, never met exactly).
AT_BOUND = 1e-3
# How far a fit may miss its own points: per batch size, the model at the fitted coefficients against the mean
# measured there; the RMS over batch sizes, weighted by the iterations behind each mean. The free coefficients set
# the step time's level (efficiency + one fixed overhead) and, with three or more batch sizes, its growth with the
# batch, so at the batch sizes they were fitted to they reproduce the measured means up to the measurement's own
# noise, the prior's pull (PRIOR_WEIGHT: one prior scale costs a 1% misfit) and the time model's shape between
# batch sizes.
# - A fit held at a bound that still reproduces its points within the timing noise of a measured step (10%: what
#   the live round trip against the fake server allows, tests/test_calibrate_cli.py) had a direction the data
#   leave flat settled by the bound, as the prior settles it otherwise: kept, the coefficient labelled as held at
#   its bound. Missing by more than that noise while held means the bound stopped the fit: refused.
# - Missing by more than FIT_MISS_LIMIT, bound or not, means the fit could not reach the data (held by bounds or
#   by the prior, or the data do not move the model at all): the step times are not this model on this GPU, or
#   not per-iteration times. Refused.
BOUND_MISS_LIMIT = 0.10
FIT_MISS_LIMIT = 0.25
# A coefficient whose prior scale moves no modelled step time by this fraction is not measured by these step times:
# whatever value it ends at is its prior's, and it is left out of the profile (the default stays, labelled so).
MIN_SENSITIVITY = 1e-3


@dataclass(frozen=True)
class Box:
    """What the server cannot say about itself: the hardware presets (simspec presets)."""

    gpu: str
    interconnect: str
    num_gpus: int | None = None  # default: the server's tp
    model: str | None = None  # default: matched from the server's model path
    drafter: str | None = None  # default: matched from the server's draft model path


@dataclass
class Fit:
    profile: Profile
    scenario: dict[str, Any]  # raw scenario mapping reproducing the measured server and workload
    parameters: dict[str, tuple[float, tuple[float, float] | None]]  # name -> (value, 95% interval)
    residuals_pct: list[tuple[int, float, float]]  # (batch size, measured ms, modelled ms)
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------ naming


def _normalise(name: str) -> str:
    return name.rstrip("/").split("/")[-1].lower().replace("_", "-")


def match_preset(path: str | None, names: list[str], what: str, flag: str) -> str:
    """The preset whose name is the longest prefix of the served model's repository name
    (meta-llama/Llama-3.1-8B-Instruct -> llama-3.1-8b); a clear error naming the flag otherwise."""
    if path:
        repo = _normalise(path)
        hits = [n for n in names if repo.startswith(n) or repo == n]
        if hits:
            return max(hits, key=len)
    raise InputError(f"cannot tell which {what} preset the server runs (it reports {path!r}); pass {flag} with one"
                     f" of: {', '.join(sorted(names))}", key=flag)


def _drafter_for(meas: Measurements, box: Box, model: str) -> str | None:
    """The drafter preset (EAGLE family) or draft-model preset (standalone) the server runs: --drafter, else
    the one preset that matches both the server's draft model path and the target model."""
    s = meas.server
    if s.algorithm == "standalone":
        if box.drafter:
            return box.drafter
        path = s.raw.get("speculative_draft_model_path")
        return match_preset(path if isinstance(path, str) else None, list(presets.models()), "draft model",
                            "--drafter")
    if s.algorithm not in ("eagle", "eagle3"):
        return None
    if box.drafter:
        return box.drafter
    drafters = presets.drafters()
    guess = f"{s.algorithm}-{model}"
    candidates = [guess] if guess in drafters else []
    path = s.raw.get("speculative_draft_model_path") or s.raw.get("draft_model_path")
    if not candidates and isinstance(path, str):
        repo = _normalise(path)
        candidates = [n for n in drafters if n in repo and n.startswith(s.algorithm + "-")]
    if len(candidates) == 1:
        return candidates[0]
    raise InputError(f"cannot tell which drafter preset the server runs (draft model {path!r}, target {model});"
                     f" pass --drafter with one of: {', '.join(sorted(drafters))}", key="--drafter")


# ------------------------------------------------------------------------------------------ the scenario


def histogram_from_requests(records: list[RequestRecord], max_drafts: int) -> list[float] | None:
    """The server's per-request histograms summed (verify steps that accepted k drafts).

    SGLang counts a step by the drafts the target accepted, even when the request's length limit then cut the
    step short (eagle_info.py verify: the histogram reads accept_index_cpu, taken before the cut), so these are
    the drafter's untruncated outcomes; the simulator cuts the last step itself, as the server does."""
    with_hist = [r for r in records if r.accept_histogram]
    if not with_hist:
        return None
    hist = np.zeros(max_drafts + 1)
    for r in with_hist:
        assert r.accept_histogram is not None
        for k, n in r.accept_histogram.items():
            hist[min(int(k), max_drafts)] += n
    return hist.tolist() if hist.sum() > 0 else None


def _accept_histogram(meas: Measurements, max_drafts: int) -> tuple[list[float], str] | None:
    """Verify steps that accepted k drafts, k = 0..max_drafts: the server's own histogram when the version
    has one, else the per-step accept lengths streamed chunks showed."""
    hist = np.zeros(max_drafts + 1)
    from_server = histogram_from_requests(meas.requests, max_drafts)
    if from_server is not None:
        n = sum(1 for r in meas.requests if r.accept_histogram)
        return from_server, f"spec accept histogram of {n} requests (server meta_info)"
    if meas.accept_lengths:
        for al in meas.accept_lengths:
            hist[min(max(int(round(al)) - 1, 0), max_drafts)] += 1
        return hist.tolist(), f"{len(meas.accept_lengths)} verify steps' streamed chunk sizes"
    return None


def _mean_accept_length(meas: Measurements) -> float | None:
    """Mean accept length as the server reports it (completion tokens / verify steps), else from throughput
    points or the Prometheus gauge."""
    pairs = [(r.completion_tokens, r.spec_verify_ct) for r in meas.requests if r.spec_verify_ct]
    if pairs:
        return sum(c for c, _ in pairs) / sum(v for _, v in pairs)
    values = [t.accept_length for t in meas.throughput if t.accept_length]
    if values:
        return float(np.mean(values))
    if meas.prometheus:
        from simspec.calibration.sources.metrics import spec_accept_length

        return spec_accept_length(meas.prometheus)
    return None


def build_scenario(meas: Measurements, box: Box, *, name: str, concurrency: int) -> dict[str, Any]:
    """A scenario that reproduces the measured server and workload at one concurrency (raw mapping)."""
    s = meas.server
    if s.tp is None:
        raise InputError("the measurements do not say the server's tp (no /server_info, no server_args log line);"
                         " pass --tp", key="--tp")
    model = box.model or match_preset(s.model_path, list(presets.models()), "model", "--model")
    server: dict[str, Any] = {"tp": s.tp, "cuda_graph": s.cuda_graph if s.cuda_graph is not None else True}
    if s.sglang_version:
        server["sglang_version"] = _supported_version(s.sglang_version)
    for key in ("cuda_graph_max_bs", "max_running_requests", "mem_fraction_static"):
        if getattr(s, key) is not None:
            server[key] = getattr(s, key)
    if s.overlap_schedule is not None:
        server["overlap_schedule"] = "on" if s.overlap_schedule else "off"
    if s.scheduler_recv_interval is not None and s.scheduler_recv_interval > 1:
        server["scheduler_recv_interval"] = s.scheduler_recv_interval
    if s.kv_cache_dtype is not None and s.kv_cache_dtype != "auto":
        allowed = typing.get_args(Server.model_fields["kv_cache_dtype"].annotation)
        if s.kv_cache_dtype not in allowed:
            raise InputError(f"the server keeps its KV cache as {s.kv_cache_dtype!r}, which simspec does not model;"
                             f" allowed: {', '.join(allowed)}", key="kv_cache_dtype")
        server["kv_cache_dtype"] = s.kv_cache_dtype
    scenario: dict[str, Any] = {
        "name": name,
        "description": f"written by simspec calibrate from {', '.join(meas.sources) or 'measurements'}",
        "hardware": {"gpu": box.gpu, "num_gpus": box.num_gpus or s.tp, "interconnect": box.interconnect},
        "model": model,
        "server": server,
    }
    if box.drafter and s.algorithm not in ("eagle", "eagle3", "standalone"):
        raise InputError(f"the server runs {'no speculative decoding' if s.algorithm == 'none' else s.algorithm},"
                         " which takes no drafter preset; --drafter is for EAGLE, EAGLE-3 and standalone servers:"
                         " leave it out", key="--drafter")
    if s.algorithm != "none":
        spec: dict[str, Any] = {"algorithm": s.algorithm}
        drafter = _drafter_for(meas, box, model)
        if drafter:
            spec["drafter"] = drafter
        for key in ("num_steps", "topk", "num_draft_tokens"):
            if getattr(s, key) is not None and not (s.algorithm == "ngram" and key != "num_draft_tokens"):
                spec[key] = getattr(s, key)
        if s.algorithm == "ngram" and s.ngram:
            spec["ngram"] = dict(s.ngram)
        scenario["speculative"] = spec
        max_drafts = max_drafts_of(s)
        hist = _accept_histogram(meas, max_drafts)
        if hist is not None:
            scenario["acceptance"] = {"histogram": hist[0], "source": f"measured: {hist[1]}"}
        else:
            al = _mean_accept_length(meas)
            if al is None:
                raise InputError("the measurements hold no accept length (no per-request spec fields, no chunk"
                                 " sizes, no decode-log accept len): cannot describe this speculative server")
            scenario["acceptance"] = {"accept_length": round(max(al, 1.0), 4),
                                      "source": "measured: mean accept length reported by the server"}
    at_c = [r for r in meas.requests if r.concurrency == concurrency] or meas.requests
    if at_c:
        prompt = int(round(np.mean([r.prompt_tokens for r in at_c])))
        output = int(round(np.mean([r.completion_tokens for r in at_c])))
        n = len(at_c)
    else:
        prompt, output, n = 1024, 256, 4 * concurrency
    scenario["workload"] = {
        "arrival": {"type": "closed", "concurrency": concurrency},
        "num_requests": max(n, concurrency),
        "input_tokens": {"dist": "fixed", "value": max(prompt, 1)},
        "output_tokens": {"dist": "fixed", "value": max(output, 1)},
    }
    scenario["seed"] = 0
    return scenario


# scenario keys a calibrate flag sets: an error about one names the flag
_FLAG_OF_KEY = {"model": "--model", "speculative.drafter": "--drafter", "hardware.num_gpus": "--num-gpus",
                "hardware.gpu": "--gpu", "hardware.interconnect": "--interconnect"}


def resolve_calibrated(scenario: dict[str, Any], box: Box) -> ResolvedScenario:
    """Resolve the scenario calibrate built; an error about a key a flag set names the flag (--model, not
    `<calibrate>: model`)."""
    try:
        return resolve(parse_scenario(scenario, "<calibrate>"), "<calibrate>")
    except InputError as err:
        flag = next((f for k, f in _FLAG_OF_KEY.items() if err.key == k or (err.key or "").startswith(k + ".")),
                    None)
        if flag is None:
            raise
        raise InputError(err.message, key=flag) from None


def check_box(server: ServerDescription, box: Box) -> None:
    """Everything about the flags and the server description that fit() would refuse, checked before anything is
    measured or written: tp known, --num-gpus = tp, the model and drafter presets (given or matched), the version,
    the GPU/interconnect pairing. Acceptance is not known yet: a placeholder stands in for it."""
    if server.tp is None:
        raise InputError("the sources do not say the server's tp (no /server_info, no server_args log line);"
                         " pass --tp", key="--tp")
    if box.num_gpus is not None and box.num_gpus != server.tp:
        raise InputError(f"{box.num_gpus} GPUs but the server runs tp {server.tp}: a profile describes one"
                         f" tensor-parallel engine, so allowed is {server.tp} (or leave --num-gpus out)",
                         key="--num-gpus")
    probe = Measurements(server=server, accept_lengths=[1.0])
    resolved = resolve_calibrated(build_scenario(probe, box, name="probe", concurrency=1), box)
    _check_real_box(box, resolved.scenario.server.tp)


def max_drafts_of(s: Any) -> int:
    if s.algorithm == "ngram":
        return max((s.num_draft_tokens or 12) - 1, 1)
    steps = s.num_steps or 3
    n = s.num_draft_tokens or steps + 1
    return max(min(steps, n - 1), 1)


def _supported_version(v: str) -> str:
    """calibrate reads servers of 0.5.8-0.5.23 (their log, metric and argument formats); an exact version in that
    range is kept."""
    parts = v.split(".")
    try:
        minor, patch = int(parts[1]), int(parts[2].split("rc")[0].split("+")[0])
    except (IndexError, ValueError):
        raise InputError(f"server version {v!r} is not a release version 0.5.N", key="version") from None
    if (minor, patch) < (5, 8) or (minor, patch) > (5, 23):
        raise InputError(f"SGLang {v} is outside the versions simspec calibrate reads (0.5.8 to 0.5.23)",
                         key="version")
    return f"0.{minor}.{patch}"


# ------------------------------------------------------------------------------------------ fitting


def _context_per_request(meas: Measurements) -> float:
    """Mean context a decode step attends over: the prompt plus half the output (requests grow linearly)."""
    if not meas.requests:
        return 1024.0
    return float(np.mean([r.prompt_tokens + r.completion_tokens / 2 for r in meas.requests]))


def free_parameters(rs: ResolvedScenario, batch_sizes: set[int]) -> list[str]:
    """The coefficients this server's step times can pin down (see the module docstring)."""
    if not rs.overlap:
        # a tree server's fixed host time per iteration is measured as its tree cost (spec_cpu_ms keeps the
        # default every speculative iteration pays; the two cannot be told apart at one topk)
        fixed = ("spec_tree_cpu_ms" if rs.topk > 1 else "spec_cpu_ms") if rs.speculative else "scheduler_cpu_ms"
    else:
        # overlap hides the host's work, graph launches included: what stays fixed per step is GPU time around the
        # forward (a replay's input copies and sampler, or an eager forward's own overhead)
        fixed = "graph_replay_gpu_us" if rs.scenario.server.cuda_graph else "forward_overhead_ms"
    names = ["memory_bandwidth_efficiency", fixed]
    if len(batch_sizes) >= 3:
        # per-request growth: exposed CPU without overlap, GPU-side work with it (overlap hides the CPU's)
        names.append("decode_per_request_us" if rs.overlap else "scheduler_cpu_per_request_ms")
    return names


def _with(rs: ResolvedScenario, values: dict[str, float], source: str) -> ResolvedScenario:
    coeffs = dict(rs.coefficients)
    for k, v in values.items():
        coeffs[k] = ResolvedCoefficient(float(v), source)
    return dataclasses.replace(rs, coefficients=coeffs)


def modelled_step_ms(rs: ResolvedScenario, batch_size: int, context: float) -> float:
    return IterationModel(rs).decode(batch_size, batch_size * context).total_ms


def _fit_once(rs: ResolvedScenario, names: list[str], obs: list[StepTime], context: float,
              prior_shift: np.ndarray | None = None) -> np.ndarray:
    lo = np.array([BOUNDS[n][0] for n in names])
    hi = np.array([BOUNDS[n][1] for n in names])
    scale = np.array([PRIOR_SCALE[n] for n in names])
    x0 = np.clip(np.array([rs.coefficient(n) for n in names]), lo, hi)
    prior = x0 if prior_shift is None else x0 + prior_shift * scale
    x0 = np.clip(prior, lo, hi)
    weights = np.sqrt(np.array([max(o.samples, 1) for o in obs], dtype=float))
    measured = np.array([o.seconds * 1e3 for o in obs])

    def residuals(x: np.ndarray) -> np.ndarray:
        trial = _with(rs, dict(zip(names, x, strict=True)), "trial")
        model = np.array([modelled_step_ms(trial, o.batch_size, context) for o in obs])
        return np.concatenate([(model - measured) / measured * 100.0 * weights,
                               (x - prior) / scale * PRIOR_WEIGHT * 100.0])

    return least_squares(residuals, x0, bounds=(lo, hi), x_scale=scale).x


def _check_real_box(box: Box, tp: int) -> None:
    """A profile describes the box that was measured: a GPU paired with another box's interconnect is refused
    here (a scenario may still pair them, as a what-if that predict names)."""
    gpu, links = presets.gpus()[box.gpu], presets.interconnects()
    why = presets.interconnect_mismatch(box.gpu, gpu, box.interconnect, links[box.interconnect], tp)
    if why:
        fits = sorted(n for n, ic in links.items() if presets.interconnect_mismatch(box.gpu, gpu, n, ic, tp) is None)
        raise InputError(f"{why}. A profile describes the box measured; allowed with --gpu {box.gpu} at TP {tp}:"
                         f" {', '.join(fits)} (a what-if pairing belongs in a scenario:"
                         " simspec predict FILE --set hardware.interconnect=...)", key="--interconnect")


def fit(meas: Measurements, box: Box, *, name: str, collective_curve: CollectiveCurve | None = None,
        bootstrap: int = 200, seed: int = 0, host: str | None = None) -> Fit:
    """Fit a profile to the measurements and write the scenario that reproduces them."""
    if not meas.step_times and not meas.kernel_splits and collective_curve is None:
        read = "; ".join(meas.sources)
        raise InputError("nothing to fit: the measurements hold no iteration times, no trace and no collective"
                         " table (give --host, --from-log, --from-bench, --from-trace or --collectives)"
                         + (f"; read: {read}" if read else ""), file=", ".join(source_files(meas.sources)) or None)
    concurrency = max((o.batch_size for o in meas.step_times), default=1)
    scenario = build_scenario(meas, box, name=name, concurrency=concurrency)
    base = resolve_calibrated(scenario, box)
    _check_real_box(box, base.scenario.server.tp)
    if collective_curve is not None:
        base = dataclasses.replace(base, all_reduce=collective_curve)
    notes: list[str] = []
    parameters: dict[str, tuple[float, tuple[float, float] | None]] = {}
    coefficients: dict[str, Coefficient] = {}
    today = _dt.date.today().isoformat()
    draft_ms = _draft_step_ms(meas, base)
    if draft_ms is not None:
        base = dataclasses.replace(base, profile=Profile(name=name, draft_forward_ms=Coefficient(
            value=draft_ms, source="trace")))
    # measured before the step times are fitted: without overlap a launch's host time is part of every step
    for n, (value, source) in _graph_launch_costs(meas, base, today).items():
        base = _with(base, {n: value}, source)
        coefficients[n] = Coefficient(value=value, source=source)
    broadcast = _request_broadcast_cost(meas, base, today, notes)
    if broadcast is not None:
        value, source = broadcast
        base = _with(base, {"tp_request_broadcast_us": value}, source)
        coefficients["tp_request_broadcast_us"] = Coefficient(value=value, source=source)
    residual_rows: list[tuple[int, float, float]] = []
    obs = [o for o in meas.step_times if o.seconds > 0]
    if obs:
        context = _context_per_request(meas)
        names = free_parameters(base, {o.batch_size for o in obs})
        best = _fit_once(base, names, obs, context)
        held = _refuse_unfit(base, names, best, obs, context)
        for n, b in held.items():
            notes.append(f"{n} ended at its bound {b:g}: the fit reproduces the step times within"
                         f" {BOUND_MISS_LIMIT:.0%} there, but the value is the bound's, not one the data pinned (the"
                         " profile labels it so)")
        unmeasured = _insensitive(base, names, best, obs, context)
        for n in unmeasured:
            notes.append(f"{n} does not move the modelled step times of these measurements: not fitted, the"
                         " profile leaves it at its default")
        rng = np.random.default_rng(seed)
        draws = []
        if len(obs) >= 2 and bootstrap > 0:
            # randomise-then-optimise: resample the observations AND draw the prior's centre from the prior,
            # so a direction the data leave flat (efficiency vs fixed overhead at one batch size) shows up as a
            # wide interval instead of the prior's point
            for _ in range(bootstrap):
                sample = [obs[i] for i in rng.integers(0, len(obs), len(obs))]
                draws.append(_fit_once(base, names, sample, context, rng.standard_normal(len(names))))
        bsizes = sorted({o.batch_size for o in obs})
        what = (f"fitted by simspec calibrate ({today}) to {len(obs)} measured iteration times at batch sizes "
                f"{', '.join(map(str, bsizes))}")
        for i, n in enumerate(names):
            if n in unmeasured:
                continue  # never a default labelled as fitted
            interval = None
            if draws:
                col = np.array(draws)[:, i]
                # percentiles of the resampled fits; a fit whose draws all fall to one side of it (a skewed,
                # bounded direction) still reports an interval that holds its own value, as a profile must
                value = round(float(best[i]), 6)
                interval = (min(round(float(np.percentile(col, 2.5)), 6), value),
                            max(round(float(np.percentile(col, 97.5)), 6), value))
            parameters[n] = (float(best[i]), interval)
            source = what if n not in held else (f"{what}; held there at its bound {held[n]:g}: the bound's value,"
                                                 " not one the data pinned")
            coefficients[n] = Coefficient(value=round(float(best[i]), 6), source=source, interval_95=interval)
        if not draws:
            notes.append("one step-time observation: no bootstrap interval (measure more batch sizes)" if len(obs) < 2
                         else "--bootstrap 0: no bootstrap interval")
        else:
            corr = np.corrcoef(np.array(draws).T) if len(names) > 1 else np.ones((1, 1))
            for i in range(len(names)):
                for j in range(i + 1, len(names)):
                    if np.isfinite(corr[i, j]) and abs(corr[i, j]) > 0.9:
                        notes.append(f"{names[i]} and {names[j]} are confounded by these measurements (bootstrap"
                                     f" correlation {corr[i, j]:+.2f}): the step times pin their combined effect,"
                                     " not each; measure more batch sizes or a baseline server to separate them")
        fitted = _with(base, dict(zip(names, best, strict=True)), what)
        for o in obs:
            residual_rows.append((o.batch_size, o.seconds * 1e3, modelled_step_ms(fitted, o.batch_size, context)))
    startup = _startup_memory(meas, base, today, notes)
    if startup is not None:
        coefficients[startup[0]] = startup[1]
    profile = Profile(
        name=name,
        description=f"measured on {host or meas.server.host or 'an SGLang server'} by simspec calibrate",
        measured_on=MeasuredOn(gpu=box.gpu, interconnect=box.interconnect, tp=base.scenario.server.tp,
                               model=base.scenario.model),
        fitted_to=[f"{o.source}: {o.seconds * 1e3:.3f} ms at batch {o.batch_size}" for o in obs][:50],
        provenance=Provenance(date=today, host=host or meas.server.host, sglang_version=meas.server.sglang_version,
                              method="simspec calibrate: " + ", ".join(meas.sources),
                              server_args={k: v for k, v in meas.server.raw.items()
                                           if isinstance(v, str | int | float | bool) or v is None}),
        all_reduce=collective_curve,
        coefficients=coefficients,
        draft_forward_ms=(Coefficient(value=round(draft_ms, 6), source=f"torch-profiler trace, draft phase ({today})")
                          if draft_ms is not None else None),
    )
    return Fit(profile, scenario, parameters, residual_rows, notes)


def source_files(sources: Sequence[str]) -> list[str]:
    """The files (or servers) a list of sources / StepTime.source labels came from, each once, in order:
    `log:server.log (N x ...)` -> server.log, `bench:b.jsonl line 3 (...)` -> b.jsonl, `live:http://h:1` as is."""
    out: list[str] = []
    for src in sources:
        head = src.split(" (")[0]
        kind, sep, rest = head.partition(":")
        if sep and kind in ("log", "bench", "trace", "metrics", "collectives"):
            head = rest.split(": ")[0]
            head = re.sub(r" line \d+$", "", head)
        if head not in out:
            out.append(head)
    return out


def _refuse_unfit(rs: ResolvedScenario, names: list[str], best: np.ndarray, obs: list[StepTime],
                  context: float) -> dict[str, float]:
    """Refuse a fit that misses its own points by more than FIT_MISS_LIMIT, or by more than BOUND_MISS_LIMIT while
    a coefficient is held at a bound other than a physical zero (PHYSICAL_FLOORS): its coefficients would describe
    the bounds or the prior, not the server. Returns the coefficients held at such a bound (name -> bound) in a fit
    that is kept."""
    fitted = _with(rs, dict(zip(names, best, strict=True)), "fit")
    pooled: dict[int, list[float]] = {}
    for o in obs:
        acc = pooled.setdefault(o.batch_size, [0.0, 0.0])
        acc[0] += o.seconds * 1e3 * max(o.samples, 1)
        acc[1] += max(o.samples, 1)
    # per batch size, the model against the mean measured there; judged as the RMS weighted by the iterations each
    # mean covers (what the fit itself minimises), so a batch size seen for a few transient iterations (a run's
    # drain) weighs as little as it did in the fit
    misses = {b: modelled_step_ms(fitted, b, context) / (t / n) - 1 for b, (t, n) in sorted(pooled.items())}
    weights = {b: n for b, (_, n) in pooled.items()}
    rms = math.sqrt(sum(weights[b] * m * m for b, m in misses.items()) / sum(weights.values()))
    worst_b = max(misses, key=lambda b: abs(misses[b]))
    held: dict[str, float] = {}
    for n, x in zip(names, best, strict=True):
        lo, hi = BOUNDS[n]
        tol = AT_BOUND * (hi - lo)
        if x <= lo + tol and n not in PHYSICAL_FLOORS:
            held[n] = lo
        elif x >= hi - tol:
            held[n] = hi
    limit = BOUND_MISS_LIMIT if held else FIT_MISS_LIMIT
    if rms <= limit:
        return held
    shown = ", ".join(f"{t / n:.4g} ms at batch {b}" for b, (t, n) in sorted(pooled.items())[:4])
    why = [f"{n} is held at its {'lower' if b == BOUNDS[n][0] else 'upper'} bound {b:g} (allowed {BOUNDS[n][0]:g}"
           f" to {BOUNDS[n][1]:g})" for n, b in held.items()]
    why.append(f"the fit misses its own points by {rms:.0%} RMS, {misses[worst_b] * 100:+.0f}% at batch {worst_b}"
               f" (allowed {limit:.0%} RMS{' with a coefficient at a bound' if held else ''})")
    raise InputError(f"measured step times ({shown}) cannot be fitted: {'; '.join(why)}. A {rs.scenario.model} step"
                     f" on {rs.scenario.server.tp} x {rs.gpu.display_name} at the default coefficients takes"
                     f" {modelled_step_ms(rs, worst_b, context):.4g} ms at batch {worst_b}: check the measurements are"
                     " from this model and GPU (--model, --gpu, --tp) and are per-iteration times; no profile written",
                     file=", ".join(source_files([o.source for o in obs])) or None, key="step times")


def _insensitive(rs: ResolvedScenario, names: list[str], best: np.ndarray, obs: list[StepTime],
                 context: float) -> set[str]:
    """The coefficients whose prior scale moves no modelled step time by MIN_SENSITIVITY (relative)."""
    values = dict(zip(names, best, strict=True))
    batches = sorted({o.batch_size for o in obs})
    here = np.array([modelled_step_ms(_with(rs, values, "fit"), b, context) for b in batches])
    out = set()
    for n in names:
        lo, hi = BOUNDS[n]
        step = PRIOR_SCALE[n] if values[n] + PRIOR_SCALE[n] <= hi else -PRIOR_SCALE[n]
        moved = np.array([modelled_step_ms(_with(rs, values | {n: max(lo, values[n] + step)}, "fit"), b, context)
                          for b in batches])
        if np.max(np.abs(moved - here) / here) < MIN_SENSITIVITY:
            out.add(n)
    return out


def _startup_memory(meas: Measurements, rs: ResolvedScenario, today: str,
                    notes: list[str]) -> tuple[str, Coefficient] | None:
    """The memory in use before SGLang sized its KV cache, from the log's free memory at startup and the GPU's
    total: startup_memory_mib (tp 1) or startup_memory_multi_gpu_mib (tp > 1)."""
    free = meas.server.startup_free_gib
    if free is None:
        return None
    in_use = rs.gpu.memory_mib - free * 1024
    if not 0 <= in_use < rs.gpu.memory_mib * STARTUP_MEMORY_LIMIT:
        notes.append(f"the log's free memory at startup ({free:.2f} GiB) leaves {in_use:,.0f} MiB in use on the"
                     f" {rs.gpu.display_name}'s {rs.gpu.memory_mib:,} MiB, outside 0 to"
                     f" {STARTUP_MEMORY_LIMIT:.0%} of it: another GPU type, or another process on the GPU?"
                     " startup memory not set")
        return None
    return startup_memory_key(rs.scenario.server.tp), Coefficient(value=round(in_use, 1), source=(
        f"measured by simspec calibrate ({today}): 'Load weight begin. avail mem={free:.2f} GB' in the server log"
        f" on a {rs.gpu.memory_mib:,} MiB {rs.gpu.display_name}"))


def _draft_step_ms(meas: Measurements, rs: ResolvedScenario) -> float | None:
    """One draft forward's GPU time from a trace's draft phase (ms per iteration / draft forwards)."""
    if not rs.speculative or rs.algorithm == "ngram" or rs.num_steps < 2:
        return None
    splits = [k for k in meas.kernel_splits if k.phase == "draft" and k.iterations > 0]
    if not splits:
        return None
    per_iteration = float(np.mean([sum(k.category_ms.values()) for k in splits]))
    value = per_iteration / (rs.num_steps - 1)
    return value if math.isfinite(value) and value > 0 else None


# The phases whose CUDA graphs the target replays and those the draft replays (a prefill runs eagerly; "other":
# a launch under no phase range, whose graph is not known).
TARGET_GRAPH_PHASES = ("decode", "verify")
DRAFT_GRAPH_PHASES = ("draft", "draft_extend")
GRAPH_LAUNCH_COEFFICIENTS = ("graph_launch_us", "graph_launch_per_node_us")  # what a trace's launches measure


def _graph_launch_costs(meas: Measurements, rs: ResolvedScenario, today: str) -> dict[str, tuple[float, str]]:
    """graph_launch_us and graph_launch_per_node_us (value, source) from a trace's cudaGraphLaunch calls. Which of
    the box's graphs branch is the model's rule (releases.decode_graph_branches, by the phase's model), so: the
    launch of a graph that does not branch is graph_launch_us (the median over those launches); a branched one's
    host time beyond graph_launch_us, per node, is graph_launch_per_node_us (the median over its launches). A
    coefficient the trace has no such graph for is left out (its default stands)."""
    model = IterationModel(rs)
    straight: list[GraphLaunch] = []
    branched: list[GraphLaunch] = []
    for g in meas.graph_launches:
        if g.phase in TARGET_GRAPH_PHASES:
            branches = model.target_graph_branches
        elif g.phase in DRAFT_GRAPH_PHASES and rs.speculative and rs.algorithm != "ngram":
            branches = model.draft_graph_branches
        else:
            continue
        (branched if branches else straight).append(g)

    def median(values: list[float], counts: list[int]) -> float:
        return float(np.median(np.repeat(values, counts)))

    def phases(gs: list[GraphLaunch]) -> str:
        return ", ".join(sorted({g.phase for g in gs}))

    out: dict[str, tuple[float, str]] = {}
    trace = f"measured by simspec calibrate ({today}) from torch-profiler traces"
    if straight:
        value = median([g.host_us for g in straight], [g.launches for g in straight])
        out["graph_launch_us"] = (round(value, 3), f"{trace}: the median cudaGraphLaunch of"
                                  f" {sum(g.launches for g in straight)} replays of graphs that do not branch"
                                  f" ({phases(straight)}); the profiler's callbacks included")
    if branched:
        fixed = out["graph_launch_us"][0] if straight else rs.coefficient("graph_launch_us")
        value = median([max(0.0, g.host_us - fixed) / g.nodes for g in branched], [g.launches for g in branched])
        out["graph_launch_per_node_us"] = (round(value, 4), f"{trace}: the median cudaGraphLaunch beyond"
                                           f" {fixed:g} us per node of {sum(g.launches for g in branched)} replays of"
                                           f" branched graphs ({phases(branched)}, {min(g.nodes for g in branched)}-"
                                           f"{max(g.nodes for g in branched)} nodes); the profiler's callbacks"
                                           " included")
    return out


def _request_broadcast_cost(meas: Measurements, rs: ResolvedScenario, today: str,
                            notes: list[str]) -> tuple[float, str] | None:
    """tp_request_broadcast_us (value, source) from a collective table's `broadcast` rows (calibration/
    collective_bench.py: the gloo broadcast SGLang's scheduler makes every loop turn at TP > 1), measured over as
    many ranks as the server's tp; rows over another number of ranks are not carried to it (a note says so)."""
    rows = [c for c in meas.collectives if c.op == "broadcast" and c.time_us > 0]
    if not rows:
        return None
    tp = rs.scenario.server.tp
    here = [c.time_us for c in rows if c.world_size == tp]
    if not here:
        notes.append(f"the table's gloo broadcast was timed over {sorted({c.world_size for c in rows})} ranks and"
                     f" the server runs tp {tp}: tp_request_broadcast_us keeps its default")
        return None
    value = round(float(np.median(here)), 3)
    return value, (f"measured by simspec calibrate ({today}) from calibration/collective_bench.py: the median of"
                   f" {len(here)} timings of a gloo broadcast of one int64 over {tp} ranks, the one SGLang's"
                   " scheduler makes every loop turn (Scheduler.recv_requests -> broadcast_pyobj)")


# ------------------------------------------------------------------ for the fit scripts under calibration/


def published_cases(paths: Sequence[Path], *, without_profile: bool) -> list[tuple[ResolvedScenario, float]]:
    """The validation cases a fit script fits to, each resolved with its measured value. without_profile: resolve
    each without its scenario's calibration profile, when that is the profile the script writes (a fit must not
    start from its own output)."""
    from simspec.validation import load_case

    out = []
    for path in paths:
        case = load_case(path)
        scenario = {k: v for k, v in case.scenario.items() if not (without_profile and k == "calibration")}
        out.append((resolve(parse_scenario(scenario, str(path)), str(path)), case.measured.value))
    return out


def prediction_with(rs: ResolvedScenario, names: Sequence[str], values: Sequence[float]) -> dict[str, Any]:
    """`simspec predict`'s whole result for the scenario with the named coefficients set to `values`."""
    from simspec.predict import predict

    coefficients = rs.coefficients | {n: ResolvedCoefficient(v, "fit") for n, v in zip(names, values, strict=True)}
    return predict(dataclasses.replace(rs, coefficients=coefficients))


def predicted_with(rs: ResolvedScenario, names: Sequence[str], values: Sequence[float], metric: str) -> float:
    """`simspec predict`'s `metric` for the scenario with the named coefficients set to `values`."""
    return prediction_with(rs, names, values)[metric]


def fit_scalar(objective: Callable[[float], float], upper: float) -> float:
    """A fit script's one-coefficient fit: bounded minimisation of `objective` over [0, upper], rounded to 1."""
    res = minimize_scalar(objective, bounds=(0.0, upper), method="bounded", options={"xatol": 0.5})
    return float(round(res.x))


def log_misfit(cases: Sequence[tuple[ResolvedScenario, float]], names: Sequence[str], values: Sequence[float],
               metric: str) -> float:
    """Sum over the cases of log(predicted / measured)^2: the fit scripts' objective, symmetric in over- and
    under-prediction."""
    return sum(math.log(predicted_with(rs, names, values, metric) / measured) ** 2 for rs, measured in cases)


def write_fitted_profile(path: Path, profile: dict[str, Any], script: str) -> None:
    """Write a profile a calibration script fitted, headed so that nobody edits it by hand."""
    header = f"# Written by {script}: do not edit by hand; rerun the script.\n"
    path.write_text(header + yaml.safe_dump(profile, sort_keys=False, width=110))


def beats_neighbours(objective: Callable[[tuple[float, ...]], float], values: Sequence[float],
                     steps: Sequence[float]) -> tuple[bool, float, float]:
    """How a fit script checks its checked-in result cheaply: whether `values` score no worse than each of them
    moved by -step and +step (never below 0). Returns (ok, the objective at `values`, the best neighbour's)."""
    v = tuple(values)
    if len(steps) != len(v):
        raise ValueError(f"{len(v)} values need as many steps, not {len(steps)}")
    here = objective(v)
    moved = {tuple(max(0.0, round(x + sign * steps[i], 6)) if j == i else x for j, x in enumerate(v))
             for i in range(len(v)) for sign in (-1, 1)} - {v}
    scores = [objective(m) for m in moved]
    return all(here <= s for s in scores), here, min(scores, default=here)


def check_minimum(objective: Callable[[tuple[float, ...]], float], names: Sequence[str], values: Sequence[float],
                  steps: Sequence[float], where: Path, remedy: str) -> int:
    """A fit script's --check: report whether the checked-in `values` (of `names`, read from `where`) beat their
    neighbours (beats_neighbours); 0 if they do, else 1 with `remedy` on stderr."""
    ok, here, best = beats_neighbours(objective, values, steps)
    shown = ", ".join(f"{n} = {x}" for n, x in zip(names, values, strict=True))
    if ok:
        print(f"{shown} minimise the fit objective ({here:.4g}; neighbours {best:.4g} and up)")
        return 0
    print(f"{shown} in {where} do not minimise the fit objective: {remedy}", file=sys.stderr)
    return 1
