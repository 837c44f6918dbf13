"""The validation suite: published measurements as data, predicted and compared.

A case (validation/cases/*.yaml) holds a scenario in simspec's own format, the measured figure (a key of
`simspec predict --json`), its source and whether a calibration profile was fitted to it. Error on fitted
cases says little; the mean absolute percentage error over the cases NOT used for fitting is the fidelity
figure, and validation/recorded.yaml keeps the value CI must not exceed.
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, StrictBool, StrictFloat, ValidationError

from simspec.errors import InputError
from simspec.scenario.reading import read_yaml, validation_error
from simspec.scenario.schema import StrictModel

Metric = Literal["tokens_per_s", "throughput_tokens_per_s", "speedup", "throughput_speedup", "iteration_ms"]
# Latency figures a benchmark client prints beside its throughput (SGLang's bench_serving: Mean/Median TTFT, TPOT
# and ITL), named as `simspec predict --json` nests them: time to first token, time per output token after the
# first, and the gap between streamed chunks (with speculation a chunk holds a verify step's accepted tokens).
LatencyMetric = Literal[
    "ttft_ms.mean", "ttft_ms.p50", "ttft_ms.p90", "ttft_ms.p99",
    "tpot_ms.mean", "tpot_ms.p50", "tpot_ms.p90", "tpot_ms.p99",
    "itl_ms.mean", "itl_ms.p50", "itl_ms.p90", "itl_ms.p99",
]

M = TypeVar("M", bound=StrictModel)

# The bar set by issue 5: every non-fitted case within 10%, their mean within 5%.
CASE_BAR_PCT = 10.0
MEAN_BAR_PCT = 5.0


def signed_error_pct(predicted: float, measured: float) -> float:
    """(predicted - measured) / measured x 100: the error every case, reading and kernel point reports."""
    return (predicted - measured) / measured * 100.0


class Source(StrictModel):
    citation: str
    url: str | None = None
    quote: str | None = None
    accessed: str | None = None


class Measured(StrictModel):
    metric: Metric
    value: StrictFloat = Field(gt=0)


class AlsoMeasured(StrictModel):
    """A further figure the source measured in the same run (bench_serving's TTFT, TPOT or ITL beside its
    throughput). Compared, but outside the cases' means: a throughput can match for the wrong reasons, a fast
    decode step hiding slow prefills or the reverse, and these say which part of the run the model gets right."""

    metric: LatencyMetric
    value: StrictFloat = Field(gt=0)


class Alternative(StrictModel):
    """Another reading of an input the source does not state: the same case predicted with `set` applied to its
    scenario (key.path=value, as `simspec predict --set`). The spread of a case's readings says whether its miss
    could be the unstated inputs; a miss outside the spread is a mechanism the model lacks."""

    why: str = Field(min_length=1)
    set: list[str] = Field(min_length=1)


class Case(StrictModel):
    id: str
    title: str
    source: Source
    fitted: StrictBool
    measured: Measured
    also_measured: list[AlsoMeasured] = Field(default_factory=list)
    assumptions: list[str] = Field(default_factory=list)
    scenario: dict[str, Any]
    alternatives: list[Alternative] = Field(default_factory=list)
    missing_mechanism: str | None = None
    # the id of the case in which the same source measured the same box and workload without speculation: the two
    # figures give a measured speedup, their predictions a predicted one (verdicts)
    baseline_case: str | None = None


@dataclass(frozen=True)
class AlsoResult:
    """One of a case's also_measured figures, predicted from the case's own run."""

    metric: str
    measured: float
    predicted: float

    @property
    def error_pct(self) -> float:
        return signed_error_pct(self.predicted, self.measured)


@dataclass(frozen=True)
class CaseResult:
    case: Case
    file: str
    predicted: float | None
    error_pct: float | None  # (predicted - measured) / measured x 100; None when the case failed to predict
    failure: str | None = None
    alternatives: tuple[float, ...] = ()  # the prediction under each of case.alternatives, in order
    also: tuple[AlsoResult, ...] = ()  # case.also_measured, predicted from the same run as the case's figure
    # the case's figure predicted again under the next seeds (`simspec validate --seeds`): other draws of what the
    # scenario leaves to chance (sampled lengths, arrivals, acceptance), everything else as the case reads it
    reseeded: tuple[float, ...] = ()

    @property
    def within_bar(self) -> bool:
        return self.error_pct is not None and abs(self.error_pct) <= CASE_BAR_PCT

    def _span(self, others: tuple[float, ...]) -> tuple[float, float] | None:
        """Lowest and highest error over the case's own prediction and `others`; None without others."""
        if self.error_pct is None or not others:
            return None
        m = self.case.measured.value
        errs = [self.error_pct, *(signed_error_pct(p, m) for p in others)]
        return min(errs), max(errs)

    @property
    def error_range_pct(self) -> tuple[float, float] | None:
        """Lowest and highest error over the case's reading and its alternatives; None without alternatives."""
        return self._span(self.alternatives)

    @property
    def seed_range_pct(self) -> tuple[float, float] | None:
        """Lowest and highest error over the case's own seed and the next ones; None unless reseeded. A miss inside
        this span may be the draw, not the model: the run measured one draw too."""
        return self._span(self.reseeded)

    @property
    def measured_in_range(self) -> bool | None:
        """Whether the measurement lies within the span of the case's readings, widened by the case bar (None
        without alternatives): False means no reading of the unstated inputs, nor any between them, explains the
        miss."""
        span = self.error_range_pct
        return None if span is None else reaches_bar(span)


def reaches_bar(span: tuple[float, float]) -> bool:
    """Whether an error range comes within the case bar somewhere."""
    return span[0] <= CASE_BAR_PCT and span[1] >= -CASE_BAR_PCT


def load_named(path: Path, schema: type[M]) -> M:
    """A suite file (a case or a kernel table) read against its schema; its id must be its file name."""
    data = read_yaml(path)
    try:
        item = schema.model_validate(data)
    except ValidationError as exc:
        raise validation_error(exc, str(path), schema) from None
    ident = item.id  # type: ignore[attr-defined]  # every suite schema has one
    if ident != path.stem:
        raise InputError(f"id {ident!r} must equal the file name without .yaml ({path.stem!r})",
                         file=str(path), key="id")
    return item


def load_case(path: Path) -> Case:
    return load_named(path, Case)


def case_files(directory: str | Path) -> list[Path]:
    d = Path(directory)
    if not d.exists():
        raise InputError("directory not found", file=str(d))
    folder = d.parent if d.is_file() else d
    if folder.name == "kernels" and (folder.parent / "cases").is_dir():
        raise InputError(f"kernel tables run with their suite: give {folder.parent}", file=str(d))
    if d.is_file():
        return [d]
    root = d / "cases" if (d / "cases").is_dir() else d
    files = sorted(f for f in root.glob("*.yaml") if f.name != RECORDED)
    if not files:
        raise InputError("no case files (*.yaml) found", file=str(root))
    return files


def predicted_value(result: dict[str, Any], metric: str) -> float | None:
    """A figure of `simspec predict --json` by its case name: a top-level key, or a nested one as `ttft_ms.p50`."""
    value: Any = result
    for part in metric.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return float(value) if isinstance(value, int | float) and math.isfinite(value) else None


def predict_case(case: Case, file: Path, alternative: int | None = None) -> float:
    """Predict the case's measured metric, as the case reads its scenario or under case.alternatives[alternative].
    Scenario errors name the key as `scenario.<path>`, or `alternatives[i].set` for an alternative's."""
    return _predict(case, file, alternative)[0]


def reseeded_predictions(case: Case, file: Path, seeds: int) -> tuple[float, ...]:
    """The case's measured metric predicted under the seeds after the case's own (seed + 1 .. seed + seeds - 1)."""
    from simspec.scenario.schema import Scenario

    # called after the case's own reading predicted, so its seed, if set, is a valid one
    first = case.scenario.get("seed", Scenario.model_fields["seed"].default)
    return tuple(_predict(case.model_copy(update={"scenario": {**case.scenario, "seed": first + k}}), file)[0]
                 for k in range(1, seeds))


def _predict(case: Case, file: Path, alternative: int | None = None) -> tuple[float, dict[str, Any]]:
    """(the case's measured metric as predicted, the whole prediction): run_cases reads the case's also_measured
    figures from the same prediction."""
    from simspec.predict import predict
    from simspec.scenario.loader import parse_scenario, resolve
    from simspec.scenario.reading import apply_overrides

    where, sep = ("scenario", ".") if alternative is None else (f"alternatives[{alternative}].set", ": ")
    try:
        data = case.scenario
        if alternative is not None:
            data = apply_overrides(data, case.alternatives[alternative].set, str(file))
        # the calibration path in a case is relative to the case file, as in a scenario file
        rs = resolve(parse_scenario(data, str(file)), str(file))
    except InputError as err:
        raise InputError(err.message, file=str(file), key=f"{where}{sep}{err.key}" if err.key else where) from None
    result = predict(rs)
    value = predicted_value(result, case.measured.metric)
    if value is None:
        raise InputError(f"the prediction has no {case.measured.metric} for this scenario",
                         file=str(file), key="measured.metric" if alternative is None else where)
    return value, result


def _also(case: Case, file: Path, result: dict[str, Any]) -> tuple[AlsoResult, ...]:
    """The case's also_measured figures as its own prediction gives them."""
    out = []
    for i, also in enumerate(case.also_measured):
        value = predicted_value(result, also.metric)
        if value is None:  # e.g. a run whose requests all decode a single token has no TPOT
            raise InputError(f"the prediction has no {also.metric} for this scenario", file=str(file),
                             key=f"also_measured[{i}].metric")
        out.append(AlsoResult(also.metric, also.value, value))
    return tuple(out)


def run_cases(files: list[Path], progress: Any = None, seeds: int = 1) -> list[CaseResult]:
    """Predict every case. A case whose scenario is invalid is reported as failed; the others still run. With
    seeds > 1 each case's figure is also predicted under its next seeds - 1 seeds (CaseResult.reseeded)."""
    results = []
    for f in files:
        case = load_case(f)
        try:
            predicted, result = _predict(case, f)
            also = _also(case, f, result)
            # an alternative that does not predict is a broken case: reported as failed, like its main reading
            others = tuple(predict_case(case, f, i) for i in range(len(case.alternatives)))
            reseeded = reseeded_predictions(case, f, seeds) if seeds > 1 else ()
        except InputError as err:
            results.append(CaseResult(case, str(f), None, None, failure=str(err)))
        else:
            results.append(CaseResult(case, str(f), predicted, signed_error_pct(predicted, case.measured.value),
                                      alternatives=others, also=also, reseeded=reseeded))
        if progress is not None:
            progress()
    return results


def mape(results: list[CaseResult], *, fitted: bool) -> float | None:
    errs = [abs(r.error_pct) for r in results if r.case.fitted == fitted and r.error_pct is not None]
    return sum(errs) / len(errs) if errs else None


def source_of(case: Case) -> str:
    return case.source.url or case.source.citation


def by_source(results: list[CaseResult]) -> list[dict[str, Any]]:
    """Non-fitted cases grouped by source (its URL, else its citation), the worst mean error first: one source
    with many cases, or one box nobody described, can carry the suite's mean on its own."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        if not r.case.fitted and r.error_pct is not None:
            groups.setdefault(source_of(r.case), []).append(r)
    rows = [{"source": src, "cases": len(rs), "mape_pct": sum(abs(r.error_pct or 0.0) for r in rs) / len(rs),
             "within_case_bar": sum(r.within_bar for r in rs)} for src, rs in groups.items()]
    return sorted(rows, key=lambda row: (-row["mape_pct"], row["source"]))


def summary(results: list[CaseResult]) -> dict[str, Any]:
    free = [r for r in results if not r.case.fitted]
    errs = [abs(r.error_pct) for r in free if r.error_pct is not None]
    return {
        "cases": len(results),
        "not_fitted": len(free),
        "fitted": len(results) - len(free),
        "failed": sum(r.failure is not None for r in results),
        "mape_not_fitted_pct": mape(results, fitted=False),
        "median_abs_error_not_fitted_pct": statistics.median(errs) if errs else None,
        "mape_fitted_pct": mape(results, fitted=True),
        "not_fitted_within_case_bar": sum(r.within_bar for r in free),
        # misses no stated reading of the case's unstated inputs explains: a mechanism is missing
        "not_fitted_missed_outside_alternatives": sum(not r.within_bar and r.measured_in_range is False for r in free),
        "not_fitted_missed_within_alternatives": sum(not r.within_bar and r.measured_in_range is True for r in free),
        "case_bar_pct": CASE_BAR_PCT,
        "mean_bar_pct": MEAN_BAR_PCT,
        "by_source": by_source(results),
        "also_measured": also_summary(results),
        "verdicts": verdict_summary(results),
        "trends": trend_summary(results),
        "seeds": seed_summary(results),
    }


def seed_summary(results: list[CaseResult], widest: int = 10) -> dict[str, Any] | None:
    """How much of the non-fitted cases' error the draw can move (`simspec validate --seeds`; None without it): the
    mean absolute error of each case's figure averaged over its seeds, the misses (outside the case bar) that some
    seed brings within it, and the cases whose error spans the most points across seeds."""
    runs = [r for r in results if r.reseeded and not r.case.fitted and r.predicted is not None]
    if not runs:
        return None
    spans: dict[str, tuple[float, float]] = {}
    for r in runs:
        span = r.seed_range_pct
        assert span is not None  # reseeded and predicted
        spans[r.case.id] = span

    def over_seeds(r: CaseResult) -> float:
        return abs(signed_error_pct(statistics.fmean([r.predicted, *r.reseeded]), r.case.measured.value))

    ranked = sorted(runs, key=lambda r: spans[r.case.id][0] - spans[r.case.id][1])  # widest first
    return {
        "seeds": 1 + len(runs[0].reseeded),
        "mape_not_fitted_over_seeds_pct": statistics.fmean(over_seeds(r) for r in runs),
        "misses_a_seed_brings_within_bar": sum(not r.within_bar and reaches_bar(spans[r.case.id]) for r in runs),
        "widest": [{"id": r.case.id, "error_pct": r.error_pct, "seed_range_pct": spans[r.case.id]}
                   for r in ranked[:widest]],
    }


def also_summary(results: list[CaseResult]) -> dict[str, Any]:
    """The non-fitted cases' also_measured figures: their mean absolute error over all of them (the figure
    recorded.yaml gates as also_measured_mape_pct) and, per metric, the mean absolute and the mean signed error
    (negative: the model's latency is too short)."""
    groups: dict[str, list[float]] = {}
    for r in results:
        if not r.case.fitted:
            for a in r.also:
                groups.setdefault(a.metric, []).append(a.error_pct)
    errs = [e for es in groups.values() for e in es]
    return {
        "figures": len(errs),
        "mape_pct": sum(map(abs, errs)) / len(errs) if errs else None,
        "by_metric": [{"metric": m, "figures": len(es), "mape_pct": sum(map(abs, es)) / len(es),
                       "mean_signed_error_pct": sum(es) / len(es)} for m, es in sorted(groups.items())],
    }


SPEEDUP_METRICS = ("speedup", "throughput_speedup")
PAIRED_METRICS = ("tokens_per_s", "throughput_tokens_per_s")  # a baseline_case pair compares one of these
# what a speculative case's scenario may change from its baseline_case's: all else is the same box and workload
PAIR_FREE_KEYS = ("name", "description", "speculative", "acceptance")
# server settings a speculative run may set apart from its baseline: spec_v2 means nothing without speculation, and
# operators lower mem_fraction_static to make room for a draft's weights and cache (each case's own pool is modelled)
PAIR_FREE_SERVER_KEYS = ("spec_v2", "mem_fraction_static")


def is_speculative(case: Case) -> bool:
    spec = case.scenario.get("speculative")
    return isinstance(spec, dict) and spec.get("algorithm", "none") != "none"


def check_baseline_cases(files: list[Path], suite: bool = True) -> None:
    """Every baseline_case names a case among `files` that is the same scenario without speculation (as
    PAIR_FREE_KEYS allow), measured in the same metric, a throughput; InputError naming the file and the field
    otherwise. Run before predicting, so that a broken pair costs no minutes. suite=False: one case file given
    alone, which runs without its pair (only the case's own fields are checked)."""
    cases = {f: load_case(f) for f in files}
    by_id = {c.id: c for c in cases.values()}
    for f, case in cases.items():
        ref = case.baseline_case
        if ref is None:
            continue

        def bad(why: str, f: Path = f) -> InputError:
            return InputError(why, file=str(f), key="baseline_case")

        if not is_speculative(case):
            raise bad("only a speculative case has a baseline: this case's scenario has no speculative.algorithm")
        if case.measured.metric not in PAIRED_METRICS:
            raise bad(f"a pair compares throughputs ({', '.join(PAIRED_METRICS)}), not {case.measured.metric}; a "
                      "speedup the source gives is compared as it stands")
        base = by_id.get(ref)
        if base is None:
            if suite:
                raise bad(f"no case {ref!r} in the suite: give the id of the no-speculation case of the same box")
            continue
        if is_speculative(base):
            raise bad(f"{ref!r} is speculative: a baseline runs without speculation")
        if base.measured.metric != case.measured.metric:
            raise bad(f"{ref!r} measured {base.measured.metric}, this case {case.measured.metric}: a pair compares one"
                      " metric")
        keys = sorted((set(case.scenario) | set(base.scenario)) - set(PAIR_FREE_KEYS))
        differ = [k for k in keys if _pair_part(case.scenario, k) != _pair_part(base.scenario, k)]
        if differ:
            raise bad(f"{ref!r} differs in scenario.{differ[0]}: a baseline is the same scenario without speculation"
                      f" (it may differ only in {', '.join(PAIR_FREE_KEYS)}, and in server."
                      f"{' or server.'.join(PAIR_FREE_SERVER_KEYS)})")


def _without(part: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """A scenario part less the keys two compared cases may set apart (pairs and trends)."""
    return {k: v for k, v in part.items() if k not in keys}


def _pair_part(scenario: dict[str, Any], key: str) -> Any:
    """scenario[key] as a pair compares it: the server without the keys a speculative run may set apart."""
    value = scenario.get(key)
    if key == "server" and isinstance(value, dict):
        return _without(value, PAIR_FREE_SERVER_KEYS)
    return value


@dataclass(frozen=True)
class Verdict:
    """Whether speculation beats no speculation on a case's box, as measured and as predicted: the question
    simspec answers before anyone commits GPU hours. From a case whose source gives the speedup, or from a
    throughput case and its baseline_case (both figures measured, both predicted)."""

    case_id: str
    baseline_case: str | None
    measured_speedup: float
    predicted_speedup: float

    @property
    def agrees(self) -> bool:
        """Both faster than no speculation, or both not."""
        return (self.measured_speedup > 1.0) == (self.predicted_speedup > 1.0)

    @property
    def error_pct(self) -> float:
        return signed_error_pct(self.predicted_speedup, self.measured_speedup)


def verdicts(results: list[CaseResult]) -> list[Verdict]:
    """The verdicts of the non-fitted speculative cases that predicted (a pair needs its baseline predicted too;
    the baseline itself may be fitted: the verdict turns on the speculative run)."""
    by_id = {r.case.id: r for r in results}
    out = []
    for r in results:
        case = r.case
        if case.fitted or r.predicted is None or not is_speculative(case):
            continue
        if case.measured.metric in SPEEDUP_METRICS:
            out.append(Verdict(case.id, None, case.measured.value, r.predicted))
            continue
        base = by_id.get(case.baseline_case) if case.baseline_case else None
        if base is not None and base.predicted is not None:
            out.append(Verdict(case.id, base.case.id, case.measured.value / base.case.measured.value,
                               r.predicted / base.predicted))
    return out


def verdict_summary(results: list[CaseResult]) -> dict[str, Any]:
    """How many verdicts agree, the ones that do not (recorded.yaml gates their count as verdicts_wrong), and the
    mean absolute error of the predicted speedups."""
    vs = verdicts(results)
    return {
        "compared": len(vs),
        "agree": sum(v.agrees for v in vs),
        "speedup_mape_pct": sum(abs(v.error_pct) for v in vs) / len(vs) if vs else None,
        "wrong": [{"id": v.case_id, "baseline_case": v.baseline_case, "measured_speedup": v.measured_speedup,
                   "predicted_speedup": v.predicted_speedup} for v in vs if not v.agrees],
    }


# What a series of cases may vary: the clients of a closed loop and the requests sent (sources scale the prompts
# with the clients), and the acceptance each run measured (the model is given each run's own, so the series
# follows the time model). Every other scenario field, the source and the metric are the series' own.
TREND_FREE_KEYS = ("name", "description", "acceptance")
TREND_FREE_WORKLOAD_KEYS = ("num_requests",)
# server caps a batch sweep may set to each run's batch (bench_eagle3 passes --max-running-requests and
# --cuda-graph-max-bs at the batch size)
TREND_FREE_SERVER_KEYS = ("max_running_requests", "cuda_graph_max_bs")


@dataclass(frozen=True)
class Trend:
    """How a figure moves as one source adds clients to one box and workload (issue 5: shapes matter as much as
    points; EAGLE's speedup falling with batch size, M3): the measured change from the fewest clients to the
    most against the predicted change. A model can sit within 10% at every point and still bend the wrong way
    between them, or miss every point by 15% and scale as the box does; this says which."""

    name: str
    metric: str
    case_ids: tuple[str, ...]
    concurrencies: tuple[int, ...]
    measured: tuple[float, ...]
    predicted: tuple[float, ...]

    @property
    def measured_change(self) -> float:
        return self.measured[-1] / self.measured[0]

    @property
    def predicted_change(self) -> float:
        return self.predicted[-1] / self.predicted[0]

    @property
    def error_pct(self) -> float:
        """The predicted change against the measured, as every other error here: +: the model grows (or keeps) more
        with clients than the box did."""
        return signed_error_pct(self.predicted_change, self.measured_change)

    @property
    def agrees(self) -> bool:
        """Both rise from the fewest clients to the most, or both do not."""
        return (self.measured_change > 1.0) == (self.predicted_change > 1.0)


def _trend_key(case: Case) -> str | None:
    """What the cases of one series share (source, metric, the scenario less TREND_FREE_KEYS, its clients, its
    request count and the server caps TREND_FREE_SERVER_KEYS); None for a case that is not a closed loop."""
    scenario = _without(case.scenario, TREND_FREE_KEYS)
    workload = scenario.get("workload")
    arrival = workload.get("arrival") if isinstance(workload, dict) else None
    if not isinstance(arrival, dict) or arrival.get("type") != "closed" or "concurrency" not in arrival:
        return None
    scenario["workload"] = (_without(workload, TREND_FREE_WORKLOAD_KEYS)
                            | {"arrival": _without(arrival, ("concurrency",))})
    server = scenario.get("server")
    if isinstance(server, dict):
        scenario["server"] = _without(server, TREND_FREE_SERVER_KEYS)
    return json.dumps([source_of(case), case.measured.metric, scenario], sort_keys=True, default=str)


def _clients(r: CaseResult) -> int:
    """A series member's clients (a closed loop's concurrency: _trend_key admits no other case)."""
    return int(r.case.scenario["workload"]["arrival"]["concurrency"])


def _series_name(ids: list[str]) -> str:
    """The ids' common stem, cut back to a whole '-' part ('m3-llama31-8b-h100-eagle-chain3' from its -bs2 ...
    -bs64 cases); the first id when they share no such stem."""
    stem = os.path.commonprefix(ids)
    cut = stem.rfind("-")
    return stem[:cut] if cut > 0 else ids[0]


def trends(results: list[CaseResult]) -> list[Trend]:
    """The series among the non-fitted cases that predicted: two or more cases of one source and box that differ
    only in their clients (_trend_key), worst |error| first. A group with two cases at the same concurrency is no
    series (which of them would it follow?) and is left out."""
    groups: dict[str, list[CaseResult]] = {}
    for r in results:
        if r.case.fitted or r.predicted is None:
            continue
        key = _trend_key(r.case)
        if key is not None:
            groups.setdefault(key, []).append(r)
    out = []
    for members in groups.values():
        members.sort(key=_clients)
        clients = tuple(_clients(r) for r in members)
        if len(members) < 2 or len(set(clients)) != len(clients):
            continue
        ids = [r.case.id for r in members]
        out.append(Trend(_series_name(ids), members[0].case.measured.metric, tuple(ids), clients,
                         tuple(r.case.measured.value for r in members),
                         tuple(float(r.predicted or 0.0) for r in members)))
    # two series of one stem (a source that changed its setup between low and high concurrency) by their clients
    stems = [t.name for t in out]
    out = [replace(t, name=f"{t.name} ({t.concurrencies[0]}-{t.concurrencies[-1]} clients)")
           if stems.count(t.name) > 1 else t for t in out]
    return sorted(out, key=lambda t: (-abs(t.error_pct), t.name))


def trend_summary(results: list[CaseResult]) -> dict[str, Any]:
    """The series' mean |error| of the change from the fewest clients to the most, how many bend the same way as
    measured, and each series."""
    ts = trends(results)
    return {
        "series": len(ts),
        "agree": sum(t.agrees for t in ts),
        "mape_pct": sum(abs(t.error_pct) for t in ts) / len(ts) if ts else None,
        "by_series": [{"name": t.name, "metric": t.metric, "cases": list(t.case_ids),
                       "concurrencies": list(t.concurrencies), "measured_change": t.measured_change,
                       "predicted_change": t.predicted_change, "error_pct": t.error_pct, "agrees": t.agrees}
                      for t in ts],
    }


def pct(x: float | None) -> str:
    """A percentage as simspec validate prints it (tables, Markdown): one decimal, n/a for none."""
    return "n/a" if x is None else f"{x:.1f}%"


def markdown_summary(summary: dict[str, Any], kernel_summary: dict[str, Any] | None = None) -> str:
    """The README's current-figures block (`simspec validate --markdown`): the means, then the non-fitted cases by
    source, worst first, from summary()'s output (and kv.summary()'s, where the suite has kernel tables). CI
    compares the README's block with this, so the table there is the suite's as it predicts today."""
    lines = [f"Non-fitted cases: {summary['not_fitted']}, mean |error| {pct(summary['mape_not_fitted_pct'])}, "
             f"median {pct(summary['median_abs_error_not_fitted_pct'])}, {summary['not_fitted_within_case_bar']} "
             f"within {summary['case_bar_pct']:g}% (the bar: each within {summary['case_bar_pct']:g}%, their mean "
             f"within {summary['mean_bar_pct']:g}%). Fitted cases: {summary['fitted']}, mean |error| "
             f"{pct(summary['mape_fitted_pct'])}."]
    if kernel_summary is not None:
        lines[0] += (f" Kernel tables: {kernel_summary['points_compared']} points compared, mean |error| "
                     f"{pct(kernel_summary['mape_pct'])}.")
    lines += ["", "| source | non-fitted cases | within the bar | mean \\|error\\| |", "|---|---|---|---|"]
    for row in summary["by_source"]:
        src = row["source"].replace("|", "\\|")
        link = f"<{src}>" if src.startswith(("http://", "https://")) else src
        lines.append(f"| {link} | {row['cases']} | {row['within_case_bar']} | {pct(row['mape_pct'])} |")
    verdict = summary.get("verdicts")
    if verdict and verdict["compared"]:
        lines += ["", f"Verdicts (does speculation beat no speculation on the same box, as measured?): "
                  f"{verdict['agree']} of {verdict['compared']} non-fitted speculative cases agree; the predicted "
                  f"speedups' mean |error| {pct(verdict['speedup_mape_pct'])}."]
        if verdict["wrong"]:
            lines += ["", "| wrong verdict | measured speedup | predicted speedup |", "|---|---|---|"]
            lines += [f"| {w['id']} | {w['measured_speedup']:.2f}x | {w['predicted_speedup']:.2f}x |"
                      for w in verdict["wrong"]]
    trend = summary.get("trends")
    if trend and trend["series"]:
        lines += ["", f"Trends over clients ({trend['series']} series: cases of one source, box and workload that"
                  f" differ only in their clients; the figure's change from the fewest clients to the most, measured"
                  f" and predicted): mean |error| {pct(trend['mape_pct'])}; {trend['agree']} of {trend['series']} move "
                  "the way the box did.", "",
                  "| series | metric | clients | measured change | predicted change | error |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {t['name']} | {t['metric']} | {', '.join(map(str, t['concurrencies']))} | "
                  f"{t['measured_change']:.2f}x | {t['predicted_change']:.2f}x | {t['error_pct']:+.1f}% |"
                  for t in trend["by_series"]]
    also = summary.get("also_measured")
    if also and also["figures"]:
        lines += ["", f"Latencies the same runs measured (the non-fitted cases' `also_measured`, not in the means "
                  f"above): {also['figures']} figures, mean |error| {pct(also['mape_pct'])}.", "",
                  "| metric | figures | mean \\|error\\| | mean signed error |", "|---|---|---|---|"]
        for row in also["by_metric"]:
            lines.append(f"| {row['metric']} | {row['figures']} | {pct(row['mape_pct'])} | "
                         f"{row['mean_signed_error_pct']:+.1f}% |")
    return "\n".join(lines) + "\n"


def as_rows(results: list[CaseResult]) -> list[dict[str, Any]]:
    def alternatives(r: CaseResult) -> list[dict[str, Any]]:
        m = r.case.measured.value
        if r.failure is not None:  # a failed case has no predictions: its readings are listed unpredicted
            return [{"why": a.why, "set": a.set, "predicted": None, "error_pct": None} for a in r.case.alternatives]
        return [{"why": a.why, "set": a.set, "predicted": p, "error_pct": signed_error_pct(p, m)}
                for a, p in zip(r.case.alternatives, r.alternatives, strict=True)]

    def also(r: CaseResult) -> list[dict[str, Any]]:
        if r.failure is not None:  # listed unpredicted, as its alternatives are
            return [{"metric": a.metric, "measured": a.value, "predicted": None, "error_pct": None}
                    for a in r.case.also_measured]
        return [{"metric": a.metric, "measured": a.measured, "predicted": a.predicted, "error_pct": a.error_pct}
                for a in r.also]

    judged = {vd.case_id: vd for vd in verdicts(results)}

    def verdict(r: CaseResult) -> dict[str, Any] | None:
        vd = judged.get(r.case.id)
        return None if vd is None else {"baseline_case": vd.baseline_case, "measured_speedup": vd.measured_speedup,
                                        "predicted_speedup": vd.predicted_speedup, "agrees": vd.agrees}

    return [{
        "id": r.case.id, "title": r.case.title, "metric": r.case.measured.metric, "measured": r.case.measured.value,
        "predicted": r.predicted, "error_pct": r.error_pct, "fitted": r.case.fitted,
        "source": source_of(r.case), "missing_mechanism": r.case.missing_mechanism,
        "alternatives": alternatives(r), "error_range_pct": r.error_range_pct,
        "measured_in_range": r.measured_in_range, "failure": r.failure,
        "reseeded": list(r.reseeded), "seed_range_pct": r.seed_range_pct,
        "also_measured": also(r), "verdict": verdict(r),
    } for r in results]


RECORDED = "recorded.yaml"
RECORDED_KEYS = ("mape_not_fitted_pct", "kernel_mape_pct", "also_measured_mape_pct", "trend_mape_pct",
                 "verdicts_wrong")


def suite_root(directory: str | Path) -> Path:
    """Where recorded.yaml lives: the suite directory (the one holding cases/), never among a file's cases."""
    d = Path(directory)
    if d.is_file():
        d = d.parent
    return d.parent if d.name == "cases" and not (d / "cases").is_dir() else d


def recorded_mape(directory: str | Path, key: str = "mape_not_fitted_pct") -> float | None:
    """A mean error recorded in the repository (validation/recorded.yaml), a CI regression gate: the end-to-end
    cases' non-fitted MAPE (mape_not_fitted_pct), the kernel tables' (kernel_mape_pct) or the non-fitted cases'
    also_measured figures' (also_measured_mape_pct), the trends' (trend_mape_pct: the change along each series of
    cases that differ only in their clients); or the count of verdicts the model gets wrong (verdicts_wrong). None
    when not recorded."""
    path = suite_root(directory) / RECORDED
    if not path.exists():
        return None
    data = read_yaml(path)
    unknown = [k for k in data if k not in RECORDED_KEYS]
    if unknown:
        raise InputError(f"unknown key; allowed keys: {', '.join(RECORDED_KEYS)} (the cases' non-fitted, the kernel"
                         " tables', the cases' other measured figures' and the trends' mean error, and the wrong"
                         " verdicts;"
                         " `simspec validate DIR --record` writes them)", file=str(path),
                         key=str(unknown[0]))
    if key not in data:
        if key != "mape_not_fitted_pct":
            return None
        raise InputError("required key is missing; record it with `simspec validate DIR --record`",
                         file=str(path), key=key)
    value = data.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InputError("must be a non-negative number", file=str(path), key=key)
    if key == "verdicts_wrong" and value != int(value):
        raise InputError("must be a whole number (a count of cases)", file=str(path), key=key)
    return float(value)
