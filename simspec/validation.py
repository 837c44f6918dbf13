"""The validation suite: published measurements as data, predicted and compared.

A case (validation/cases/*.yaml) holds a scenario in simspec's own format, the measured figure (a key of
`simspec predict --json`), its source and whether a calibration profile was fitted to it. Error on fitted
cases says little; the mean absolute percentage error over the cases NOT used for fitting is the fidelity
figure, and validation/recorded.yaml keeps the value CI must not exceed.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import Field, StrictBool, StrictFloat, ValidationError

from simspec.errors import InputError
from simspec.scenario.reading import read_yaml, validation_error
from simspec.scenario.schema import StrictModel

Metric = Literal["tokens_per_s", "throughput_tokens_per_s", "speedup", "throughput_speedup", "iteration_ms"]

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
    assumptions: list[str] = Field(default_factory=list)
    scenario: dict[str, Any]
    alternatives: list[Alternative] = Field(default_factory=list)
    missing_mechanism: str | None = None


@dataclass(frozen=True)
class CaseResult:
    case: Case
    file: str
    predicted: float | None
    error_pct: float | None  # (predicted - measured) / measured x 100; None when the case failed to predict
    failure: str | None = None
    alternatives: tuple[float, ...] = ()  # the prediction under each of case.alternatives, in order

    @property
    def within_bar(self) -> bool:
        return self.error_pct is not None and abs(self.error_pct) <= CASE_BAR_PCT

    @property
    def error_range_pct(self) -> tuple[float, float] | None:
        """Lowest and highest error over the case's reading and its alternatives; None without alternatives."""
        if self.error_pct is None or not self.alternatives:
            return None
        m = self.case.measured.value
        errs = [self.error_pct, *(signed_error_pct(p, m) for p in self.alternatives)]
        return min(errs), max(errs)

    @property
    def measured_in_range(self) -> bool | None:
        """Whether the measurement lies within the span of the case's readings, widened by the case bar (None
        without alternatives): False means no reading of the unstated inputs, nor any between them, explains the
        miss."""
        span = self.error_range_pct
        return None if span is None else span[0] <= CASE_BAR_PCT and span[1] >= -CASE_BAR_PCT


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


def predict_case(case: Case, file: Path, alternative: int | None = None) -> float:
    """Predict the case's measured metric, as the case reads its scenario or under case.alternatives[alternative].
    Scenario errors name the key as `scenario.<path>`, or `alternatives[i].set` for an alternative's."""
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
    value = result.get(case.measured.metric)
    if value is None or not math.isfinite(value):
        raise InputError(f"the prediction has no {case.measured.metric} for this scenario",
                         file=str(file), key="measured.metric" if alternative is None else where)
    return float(value)


def run_cases(files: list[Path], progress: Any = None) -> list[CaseResult]:
    """Predict every case. A case whose scenario is invalid is reported as failed; the others still run."""
    results = []
    for f in files:
        case = load_case(f)
        try:
            predicted = predict_case(case, f)
            # an alternative that does not predict is a broken case: reported as failed, like its main reading
            others = tuple(predict_case(case, f, i) for i in range(len(case.alternatives)))
        except InputError as err:
            results.append(CaseResult(case, str(f), None, None, failure=str(err)))
        else:
            results.append(CaseResult(case, str(f), predicted, signed_error_pct(predicted, case.measured.value),
                                      alternatives=others))
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
    return "\n".join(lines) + "\n"


def as_rows(results: list[CaseResult]) -> list[dict[str, Any]]:
    def alternatives(r: CaseResult) -> list[dict[str, Any]]:
        m = r.case.measured.value
        if r.failure is not None:  # a failed case has no predictions: its readings are listed unpredicted
            return [{"why": a.why, "set": a.set, "predicted": None, "error_pct": None} for a in r.case.alternatives]
        return [{"why": a.why, "set": a.set, "predicted": p, "error_pct": signed_error_pct(p, m)}
                for a, p in zip(r.case.alternatives, r.alternatives, strict=True)]

    return [{
        "id": r.case.id, "title": r.case.title, "metric": r.case.measured.metric, "measured": r.case.measured.value,
        "predicted": r.predicted, "error_pct": r.error_pct, "fitted": r.case.fitted,
        "source": source_of(r.case), "missing_mechanism": r.case.missing_mechanism,
        "alternatives": alternatives(r), "error_range_pct": r.error_range_pct,
        "measured_in_range": r.measured_in_range, "failure": r.failure,
    } for r in results]


RECORDED = "recorded.yaml"
RECORDED_KEYS = ("mape_not_fitted_pct", "kernel_mape_pct")


def suite_root(directory: str | Path) -> Path:
    """Where recorded.yaml lives: the suite directory (the one holding cases/), never among a file's cases."""
    d = Path(directory)
    if d.is_file():
        d = d.parent
    return d.parent if d.name == "cases" and not (d / "cases").is_dir() else d


def recorded_mape(directory: str | Path, key: str = "mape_not_fitted_pct") -> float | None:
    """A mean error recorded in the repository (validation/recorded.yaml), a CI regression gate: the end-to-end
    cases' non-fitted MAPE (mape_not_fitted_pct) or the kernel tables' (kernel_mape_pct). None when not recorded."""
    path = suite_root(directory) / RECORDED
    if not path.exists():
        return None
    data = read_yaml(path)
    unknown = [k for k in data if k not in RECORDED_KEYS]
    if unknown:
        raise InputError(f"unknown key; allowed keys: {', '.join(RECORDED_KEYS)} (the cases' non-fitted and the kernel"
                         " tables' mean error; `simspec validate DIR --record` writes them)", file=str(path),
                         key=str(unknown[0]))
    if key not in data:
        if key != "mape_not_fitted_pct":
            return None
        raise InputError("required key is missing; record it with `simspec validate DIR --record`",
                         file=str(path), key=key)
    value = data.get(key)
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        raise InputError("must be a non-negative number", file=str(path), key=key)
    return float(value)
