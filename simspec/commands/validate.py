"""`simspec validate [DIR]`: predict every published measurement in the validation suite and report the error."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import click

EXIT_REGRESSED = 1
# Recorded figures are rounded up to this step, so a re-run that differs in the last digits does not trip CI.
_RECORD_STEP = 0.01


@dataclass(frozen=True)
class _Gate:
    """One figure CI holds to DIR/recorded.yaml: which part of the summary gives it, where that part reports the
    recorded figure, and when recorded.yaml must hold it."""
    key: str  # its name in recorded.yaml
    part: str  # the summary part that gives it (see _summary_parts)
    value: Callable[[dict], float | None]  # this run's figure (None: nothing to compare or record)
    recorded_field: str  # where the part reports the recorded figure (--json)
    label: str  # the console's "recorded <label>: <figure> (ok / REGRESSED)"
    # what makes the figure required once recorded.yaml exists ("has no <key> while <needs>"), which `present`
    # tests on the part; None for the suite's own figure, whose absence is recorded.yaml's own
    needs: str | None = None
    present: Callable[[dict], bool] = lambda part: True
    count: bool = False  # a count, written as it is, not a percentage rounded up to _RECORD_STEP

    def recorded(self, root: Path) -> float | int | None:
        from simspec import validation as v

        figure = v.recorded_mape(root, self.key)
        return int(figure) if figure is not None and self.count else figure

    def up(self, value: float) -> float | int:
        """The figure as recorded: a count as it is, a percentage rounded up to _RECORD_STEP."""
        return int(value) if self.count else round(_RECORD_STEP * -(-value // _RECORD_STEP), 2)

    def written(self, figure: float) -> str:
        """The figure as recorded.yaml holds it."""
        return f"{figure:d}" if self.count else f"{figure:.2f}"

    def shown(self, figure: float) -> str:
        return self.written(figure) + ("" if self.count else "%")


# In recorded.yaml's order; the first is the suite's own figure (the cases' non-fitted mean error).
_GATES = (
    _Gate("mape_not_fitted_pct", "cases", lambda s: s["mape_not_fitted_pct"], "recorded_mape_not_fitted_pct",
          "non-fitted mean error"),
    _Gate("kernel_mape_pct", "kernels", lambda s: s["mape_pct"], "recorded_mape_pct", "kernel mean error",
          needs="the suite has kernel tables"),
    _Gate("also_measured_mape_pct", "also_measured", lambda s: s["mape_pct"], "recorded_mape_pct",
          "latency mean error", needs="cases give also_measured figures", present=lambda s: s["figures"] > 0),
    _Gate("verdicts_wrong", "verdicts", lambda s: len(s["wrong"]) if s["compared"] else None, "recorded_wrong",
          "wrong verdicts", needs="speculative cases give verdicts", present=lambda s: s["compared"] > 0,
          count=True),
    _Gate("trend_mape_pct", "trends", lambda s: s["mape_pct"], "recorded_mape_pct", "trend mean error",
          needs="cases form series over clients", present=lambda s: s["series"] > 0),
)
_GATE = {g.part: g for g in _GATES}


def _summary_parts(summary: dict, kernel_summary: dict | None) -> dict[str, dict]:
    """The summary part behind each gate; the kernel tables' only where the suite has them."""
    parts = {"cases": summary, "also_measured": summary["also_measured"], "verdicts": summary["verdicts"],
             "trends": summary["trends"]}
    if kernel_summary is not None:
        parts["kernels"] = kernel_summary
    return parts


def _print_recorded(console, part: str, parts: dict[str, dict], regressed: dict[str, bool]) -> None:
    """The recorded figure of one gate and whether this run exceeds it, where one is recorded."""
    gate = _GATE[part]
    figure = parts[part][gate.recorded_field]
    if figure is not None:
        state = "[red]REGRESSED[/]" if regressed[part] else "ok"
        console.print(f"recorded {gate.label}: {gate.shown(figure)} ({state})")


@click.command()
@click.argument("directory", default="validation", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (cases and summary).")
@click.option("--check", is_flag=True,
              help="Exit 1 when a case fails to predict, or the non-fitted mean error, the kernel tables' mean"
                   " error, the cases' other measured figures' mean error, the trends' mean error or the count of"
                   " wrong verdicts exceeds DIR/recorded.yaml (the CI regression gate).")
@click.option("--record", is_flag=True,
              help="Write the non-fitted mean error, the kernel tables', the other measured figures' and the"
                   " trends' mean errors and the count of wrong verdicts to DIR/recorded.yaml.")
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False),
              help="Also draw every case's error, grouped by source, to this image (.png, .svg or .pdf).")
@click.option("--markdown", "as_markdown", is_flag=True,
              help="Print the means and the per-source table as Markdown (the README's current-figures block).")
@click.option("--seeds", type=click.IntRange(min=1), default=1, show_default=True,
              help="Also predict every case under its next SEEDS - 1 seeds (other draws of its sampled lengths,"
                   " arrivals and acceptance) and report each case's error range over them: a miss inside its range"
                   " may be the draw. The means and the gates stay those of each case's own seed. SEEDS times as"
                   " slow.")
def validate(directory: str, as_json: bool, check: bool, record: bool, plot_path: str | None,
             as_markdown: bool, seeds: int) -> None:
    """Predict every case under DIR (default: validation/) and compare with what was measured.

    Prints measured, predicted and error per case, then the mean absolute percentage error over the cases
    NOT used to fit a profile (the fidelity figure) and, separately, over the fitted ones. The latencies a case's
    source measured in the same run (its also_measured: TTFT, TPOT, ITL) follow, with their own mean. Kernel
    tables under DIR/kernels (published microbenchmarks of one kernel) are reported last, with theirs. Verdicts
    say, for each speculative case, whether speculation beat no speculation as measured and as predicted: from the
    speedup the source gives, or from the case and its baseline_case. Trends follow each series of cases that differ
    only in their clients: the figure's change from the fewest clients to the most, measured and predicted.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from simspec import kernel_validation as kv
    from simspec import validation as v
    from simspec.cli import fail, jsonable
    from simspec.errors import InputError
    from simspec.outputs import check_folder

    try:
        if as_json and as_markdown:  # refused before minutes of predicting
            raise InputError("give one of --json and --markdown", key="--markdown")
        if plot_path is not None:
            from simspec.studies.plots import FORMATS

            suffix = Path(plot_path).suffix.lstrip(".").lower()
            if suffix not in FORMATS:
                raise InputError(f"the image format comes from the file name's suffix: "
                                 f"{', '.join('.' + f for f in FORMATS)}, not {Path(plot_path).suffix or 'none'}",
                                 file=plot_path, key="--plot")
            check_folder(plot_path, "--plot")
        root = v.suite_root(directory)
        if check and not record and not (root / v.RECORDED).exists():  # said before minutes of predicting
            raise InputError(f"no recorded figure to check against: {root / v.RECORDED} does not exist; record one"
                             f" with `simspec validate {directory} --record`", file=str(root / v.RECORDED),
                             key="--check")
        files = v.case_files(directory)
        v.check_baseline_cases(files, suite=not Path(directory).is_file())
        with Progress(transient=True, disable=as_json or as_markdown, console=Console(stderr=True)) as bar:
            task = bar.add_task("predicting cases", total=len(files))
            results = v.run_cases(files, progress=lambda: bar.advance(task), seeds=seeds)
        summary = v.summary(results)
        # kernel tables belong to the suite, not to one case: a single case file runs without them
        tables = kv.run_tables(kv.kernel_files(root)) if not Path(directory).is_file() else []
        kernel_summary = kv.summary(tables) if tables else None
        parts = _summary_parts(summary, kernel_summary)
        recorded = {gate.part: gate.recorded(root) for gate in _GATES if gate.part in parts}
        for gate in _GATES:
            if gate.needs and gate.part in parts and gate.present(parts[gate.part]) \
                    and recorded["cases"] is not None and recorded[gate.part] is None and not record \
                    and not Path(directory).is_file():
                raise InputError(f"has no {gate.key} while {gate.needs}: record it with --record",
                                 file=str(root / v.RECORDED), key=gate.key)
        if kernel_summary is not None and record and kernel_summary["mape_pct"] is None:
            raise InputError("no kernel-table point is compared (all fit in L2 or belong to fitted tables):"
                             " nothing to record for them",
                             file=str(root / kv.KERNELS_DIR), key="--record")
        if record and Path(directory).is_file():
            raise InputError("--record records the whole suite's error: give the suite directory, not one case",
                             file=directory, key="--record")
        failed = [r for r in results if r.failure is not None]
        if record and failed:  # the mean of the cases that did predict would flatter the model
            raise InputError(f"refusing to record: {_failed_text(failed)}; the mean would leave them out: fix or"
                             " remove them first (nothing was written)", file=str(root / v.RECORDED), key="--record")
    except InputError as err:
        fail(err)
        return
    for part, figure in recorded.items():
        parts[part][_GATE[part].recorded_field] = figure
    regressed = {part: figure is not None and (value := _GATE[part].value(parts[part])) is not None and value > figure
                 for part, figure in recorded.items()}
    # a case that no longer predicts would drop out of the mean and flatter it: that is a regression too
    regressed["cases"] = regressed["cases"] or summary["failed"] > 0
    summary["regressed"] = any(regressed.values())

    if record:
        if summary["mape_not_fitted_pct"] is None:
            fail(InputError("no non-fitted case predicted: nothing to record", file=directory))
        text = ("# Mean absolute % error of simspec validate over the cases NOT used for fitting, over the\n"
                "# compared points of the kernel tables not used for fitting (validation/kernels), and over the\n"
                "# non-fitted cases' also_measured latencies and over the change along each series of cases that\n"
                "# differ only in their clients (trends), and the count of non-fitted speculative cases whose\n"
                "# verdict (faster than no speculation or not) the model gets wrong. CI (tests/test_validation.py)\n"
                "# fails when any grows beyond its figure here. Update with `simspec validate --record` only when a\n"
                "# change is meant to move them, and say why in the commit.\n")
        for gate in _GATES:
            if gate.part not in parts:
                continue
            value = gate.value(parts[gate.part])
            figure = None if value is None else gate.up(value)
            if figure is not None:
                text += f"{gate.key}: {gate.written(figure)}\n"
            parts[gate.part][gate.recorded_field] = figure
        (root / "recorded.yaml").write_text(text)
        regressed = dict.fromkeys(regressed, False)
        regressed["cases"] = summary["regressed"] = summary["failed"] > 0

    if as_markdown:
        click.echo(v.markdown_summary(summary, kernel_summary), nl=False)
    elif as_json:
        out = {"cases": v.as_rows(results), "summary": summary}
        if kernel_summary is not None:
            out["kernels"] = {"points": kv.as_rows(tables), "summary": kernel_summary}
        click.echo(json.dumps(out, indent=2, default=jsonable))
    else:
        console = Console()
        t = Table(title=f"validation: {len(results)} cases", title_justify="left")
        t.add_column("case", overflow="fold")
        t.add_column("metric", overflow="fold")
        for col in ("measured", "predicted", "error"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("all readings", justify="right", no_wrap=True)
        if seeds > 1:
            t.add_column(f"{seeds} seeds", justify="right", no_wrap=True)
        t.add_column("fitted")
        for r in results:
            by_seed = [] if seeds == 1 else [""]
            if r.failure is not None:
                t.add_row(escape(r.case.id), r.case.measured.metric, f"{r.case.measured.value:g}",
                          "[red]failed[/]", "", "", *by_seed, "yes" if r.case.fitted else "no")
                continue
            colour = "green" if r.within_bar else "red"
            spread = r.error_range_pct
            readings = "" if spread is None else f"{spread[0]:+.0f}..{spread[1]:+.0f}%"
            if (drawn := r.seed_range_pct) is not None:
                by_seed = [f"{drawn[0]:+.0f}..{drawn[1]:+.0f}%"]
            t.add_row(escape(r.case.id), r.case.measured.metric, f"{r.case.measured.value:.4g}",
                      f"{r.predicted:.4g}", f"[{colour}]{r.error_pct:+.1f}%[/]", readings, *by_seed,
                      "yes" if r.case.fitted else "no")
        console.print(t)
        for r in results:
            if r.failure is not None:
                console.print(f"[red]failed[/] {escape(r.case.id)}: {escape(r.failure)}", soft_wrap=True)

        if len(summary["by_source"]) > 1:
            s = Table(title="non-fitted cases by source, worst first", title_justify="left")
            s.add_column("source", overflow="fold")
            for col in ("cases", "mean |error|", f"within {v.CASE_BAR_PCT:g}%"):
                s.add_column(col, justify="right", no_wrap=True)
            for row in summary["by_source"]:
                s.add_row(escape(row["source"]), str(row["cases"]), v.pct(row["mape_pct"]),
                          f"{row['within_case_bar']} of {row['cases']}")
            console.print(s)
        console.print(
            f"mean absolute error, cases not used for fitting ({summary['not_fitted']}): "
            f"[bold]{v.pct(summary['mape_not_fitted_pct'])}[/] (bar {v.MEAN_BAR_PCT:g}%; "
            f"{summary['not_fitted_within_case_bar']} of {summary['not_fitted']} within {v.CASE_BAR_PCT:g}%;"
            f" median {v.pct(summary['median_abs_error_not_fitted_pct'])})")
        if any(r.alternatives for r in results):
            console.print(
                f"misses (non-fitted, outside {v.CASE_BAR_PCT:g}%) that the cases' other readings of their unstated"
                f" inputs span: {summary['not_fitted_missed_within_alternatives']}; that no reading explains:"
                f" {summary['not_fitted_missed_outside_alternatives']} (all readings: the error range over a"
                " case's own reading and its `alternatives`)")
        if (drawn := summary["seeds"]) is not None:
            console.print(
                f"over {drawn['seeds']} seeds each: mean absolute error of the cases' seed-averaged figures"
                f" {v.pct(drawn['mape_not_fitted_over_seeds_pct'])}; misses that some seed brings within"
                f" {v.CASE_BAR_PCT:g}%: {drawn['misses_a_seed_brings_within_bar']}; widest: "
                + ", ".join(f"{escape(w['id'])} {w['seed_range_pct'][0]:+.0f}..{w['seed_range_pct'][1]:+.0f}%"
                            for w in drawn["widest"][:3]), soft_wrap=True)
        console.print(f"mean absolute error, fitted cases ({summary['fitted']}): {v.pct(summary['mape_fitted_pct'])}"
                      " (says little: a profile was fitted to them)")
        _print_recorded(console, "cases", parts, regressed)
        if summary["verdicts"]["compared"]:
            _print_verdicts(console, summary["verdicts"])
            _print_recorded(console, "verdicts", parts, regressed)
        if summary["trends"]["series"]:
            _print_trends(console, summary["trends"])
            _print_recorded(console, "trends", parts, regressed)
        if summary["also_measured"]["figures"]:
            _print_also(console, results, summary["also_measured"])
            _print_recorded(console, "also_measured", parts, regressed)
        if kernel_summary is not None:
            k = Table(title="kernel tables: microbenchmarks of one kernel (not in the means above)",
                      title_justify="left")
            k.add_column("table", overflow="fold")
            k.add_column("kernel")
            k.add_column("hardware", overflow="fold")
            for col in ("points", "mean |error|", "error range"):
                k.add_column(col, justify="right", no_wrap=True)
            for r in tables:
                errs = [p.error_pct for p in r.compared]
                span = f"{min(errs):+.0f}..{max(errs):+.0f}%" if errs else ""
                k.add_row(escape(r.table.id) + (" (fitted)" if r.table.fitted else ""), kv.kind(r.table),
                          escape(kv.hardware(r.table)),
                          f"{len(r.compared)} of {len(r.points)}", v.pct(r.mape_pct), span)
            console.print(k)
            console.print(f"mean absolute error, kernel points compared ({kernel_summary['points_compared']}):"
                          f" [bold]{v.pct(kernel_summary['mape_pct'])}[/] ({kernel_summary['points_in_l2']} points"
                          " whose experts fit in L2 not compared)")
            if kernel_summary["points_fitted"]:
                fitted_points = kernel_summary["points_fitted"]
                console.print(f"mean absolute error, kernel points of fitted tables ({fitted_points}):"
                              f" {v.pct(kernel_summary['mape_fitted_pct'])}")
            _print_recorded(console, "kernels", parts, regressed)
    # the image comes last, so that a failed write loses neither the printed results nor the gate's exit code
    plot_failed = False
    if plot_path is not None:
        from simspec.analysis.validation_plot import error_figure
        from simspec.studies.plots import Plot, save

        try:
            save(Plot("validation_errors", "validation errors", error_figure(results)), plot_path)
        except OSError as err:
            plot_failed = True
            click.echo(f"error: {plot_path}: --plot: cannot write the image: {err.strerror}", err=True)
        else:
            if not as_json:
                click.echo(f"wrote {plot_path}", err=True)
    if check and summary["regressed"]:
        sys.exit(EXIT_REGRESSED)
    if failed:  # without --check a case that cannot be predicted is bad input (with it, a regression: exit 1)
        fail(InputError(_failed_text(failed)))
    if plot_failed:
        sys.exit(2)


def _print_also(console, results: list, also_summary: dict) -> None:
    """The latencies the cases' sources measured in the same runs (also_measured), case by case, then by metric."""
    from rich.markup import escape
    from rich.table import Table

    from simspec import validation as v

    t = Table(title="latencies the same runs measured (also_measured; not in the means above)", title_justify="left")
    t.add_column("case", overflow="fold")
    t.add_column("metric")
    for col in ("measured", "predicted", "error"):
        t.add_column(col, justify="right", no_wrap=True)
    t.add_column("fitted")
    for r in results:
        for a in r.also:
            t.add_row(escape(r.case.id), a.metric, f"{a.measured:.4g}", f"{a.predicted:.4g}",
                      f"{a.error_pct:+.1f}%", "yes" if r.case.fitted else "no")
    console.print(t)
    m = Table(title="latencies by metric, non-fitted cases", title_justify="left")
    m.add_column("metric")
    for col in ("figures", "mean |error|", "mean signed error"):
        m.add_column(col, justify="right", no_wrap=True)
    for row in also_summary["by_metric"]:
        m.add_row(row["metric"], str(row["figures"]), v.pct(row["mape_pct"]), f"{row['mean_signed_error_pct']:+.1f}%")
    console.print(m)
    console.print(f"mean absolute error, latencies of non-fitted cases ({also_summary['figures']}):"
                  f" [bold]{v.pct(also_summary['mape_pct'])}[/]")


def _print_verdicts(console, verdict_summary: dict) -> None:
    """Whether speculation beats no speculation, as measured and as predicted, and the cases where the two differ."""
    from rich.markup import escape
    from rich.table import Table

    from simspec import validation as v

    console.print(f"verdicts (faster than no speculation on the same box, or not), non-fitted speculative cases:"
                  f" [bold]{verdict_summary['agree']} of {verdict_summary['compared']}[/] agree with the measurement;"
                  f" mean |error| of the predicted speedups {v.pct(verdict_summary['speedup_mape_pct'])}")
    if verdict_summary["wrong"]:
        t = Table(title="wrong verdicts", title_justify="left")
        t.add_column("case", overflow="fold")
        t.add_column("baseline", overflow="fold")
        for col in ("measured speedup", "predicted speedup"):
            t.add_column(col, justify="right", no_wrap=True)
        for w in verdict_summary["wrong"]:
            t.add_row(escape(w["id"]), escape(w["baseline_case"] or "(the source's speedup)"),
                      f"{w['measured_speedup']:.2f}x", f"{w['predicted_speedup']:.2f}x")
        console.print(t)


def _print_trends(console, trend_summary: dict) -> None:
    """Each series of cases that differ only in their clients: how the figure moves from the fewest to the most,
    measured and predicted (validation.trends), worst first."""
    from rich.markup import escape
    from rich.table import Table

    from simspec import validation as v

    t = Table(title="trends over clients: the figure's change from the fewest clients to the most (not in the means"
                    " above)", title_justify="left")
    t.add_column("series", overflow="fold")
    t.add_column("metric", overflow="fold")
    t.add_column("clients", overflow="fold")
    for col in ("measured", "predicted", "error"):
        t.add_column(col, justify="right", no_wrap=True)
    for row in trend_summary["by_series"]:
        colour = "green" if abs(row["error_pct"]) <= v.CASE_BAR_PCT else "red"
        t.add_row(escape(row["name"]), row["metric"], ", ".join(map(str, row["concurrencies"])),
                  f"{row['measured_change']:.2f}x", f"{row['predicted_change']:.2f}x",
                  f"[{colour}]{row['error_pct']:+.1f}%[/]")
    console.print(t)
    console.print(f"trends: {trend_summary['series']} series, mean |error| of the change"
                  f" [bold]{v.pct(trend_summary['mape_pct'])}[/]; {trend_summary['agree']} of"
                  f" {trend_summary['series']} move the way the box did")


def _failed_text(failed: list) -> str:
    """The failed cases for an error line: the first with its reason (file, key path, what is wrong), the rest
    by file."""
    more = f"; {len(failed) - 1} more failed: {', '.join(r.file for r in failed[1:])}" if len(failed) > 1 else ""
    return f"{len(failed)} case(s) cannot be predicted: {failed[0].failure}{more}"
