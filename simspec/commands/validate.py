"""`simspec validate [DIR]`: predict every published measurement in the validation suite and report the error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

EXIT_REGRESSED = 1
# Recorded figures are rounded up to this step, so a re-run that differs in the last digits does not trip CI.
_RECORD_STEP = 0.01


@click.command()
@click.argument("directory", default="validation", type=click.Path(file_okay=True, dir_okay=True))
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (cases and summary).")
@click.option("--check", is_flag=True,
              help="Exit 1 when a case fails to predict or the non-fitted mean error exceeds DIR/recorded.yaml"
                   " (the CI regression gate).")
@click.option("--record", is_flag=True, help="Write the non-fitted mean error to DIR/recorded.yaml.")
def validate(directory: str, as_json: bool, check: bool, record: bool) -> None:
    """Predict every case under DIR (default: validation/) and compare with what was measured.

    Prints measured, predicted and error per case, then the mean absolute percentage error over the cases
    NOT used to fit a profile (the fidelity figure) and, separately, over the fitted ones.
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.progress import Progress
    from rich.table import Table

    from simspec import validation as v
    from simspec.cli import fail, jsonable
    from simspec.errors import InputError

    try:
        files = v.case_files(directory)
        with Progress(transient=True, disable=as_json, console=Console(stderr=True)) as bar:
            task = bar.add_task("predicting cases", total=len(files))
            results = v.run_cases(files, progress=lambda: bar.advance(task))
        summary = v.summary(results)
        root = v.suite_root(directory)
        recorded = v.recorded_mape(root)
        if record and Path(directory).is_file():
            raise InputError("--record records the whole suite's error: give the suite directory, not one case",
                             file=directory, key="--record")
    except InputError as err:
        fail(err)
        return
    summary["recorded_mape_not_fitted_pct"] = recorded
    # a case that no longer predicts would drop out of the mean and flatter it: that is a regression too
    regressed = summary["failed"] > 0 or (recorded is not None and summary["mape_not_fitted_pct"] is not None
                                          and summary["mape_not_fitted_pct"] > recorded)
    summary["regressed"] = regressed

    if record:
        value = summary["mape_not_fitted_pct"]
        if value is None:
            fail(InputError("no non-fitted case predicted: nothing to record", file=directory))
        rounded = _RECORD_STEP * -(-value // _RECORD_STEP)
        (root / "recorded.yaml").write_text(
            "# Mean absolute % error of simspec validate over the cases NOT used for fitting.\n"
            "# CI (tests/test_validation.py) fails when it grows beyond this. Update with\n"
            "# `simspec validate --record` only when a change is meant to move it, and say why in the commit.\n"
            f"mape_not_fitted_pct: {rounded:.2f}\n")
        summary["recorded_mape_not_fitted_pct"] = round(rounded, 2)
        regressed = summary["failed"] > 0
        summary["regressed"] = regressed

    if as_json:
        click.echo(json.dumps({"cases": v.as_rows(results), "summary": summary}, indent=2, default=jsonable))
    else:
        console = Console()
        t = Table(title=f"validation: {len(results)} cases", title_justify="left")
        t.add_column("case", overflow="fold")
        t.add_column("metric", overflow="fold")
        for col in ("measured", "predicted", "error"):
            t.add_column(col, justify="right", no_wrap=True)
        t.add_column("fitted")
        for r in results:
            if r.failure is not None:
                t.add_row(escape(r.case.id), r.case.measured.metric, f"{r.case.measured.value:g}",
                          "[red]failed[/]", "", "yes" if r.case.fitted else "no")
                continue
            colour = "green" if r.within_bar else "red"
            t.add_row(escape(r.case.id), r.case.measured.metric, f"{r.case.measured.value:.4g}",
                      f"{r.predicted:.4g}", f"[{colour}]{r.error_pct:+.1f}%[/]", "yes" if r.case.fitted else "no")
        console.print(t)
        for r in results:
            if r.failure is not None:
                console.print(f"[red]failed[/] {escape(r.case.id)}: {escape(r.failure)}", soft_wrap=True)

        def pct(x: float | None) -> str:
            return "n/a" if x is None else f"{x:.1f}%"

        if len(summary["by_source"]) > 1:
            s = Table(title="non-fitted cases by source, worst first", title_justify="left")
            s.add_column("source", overflow="fold")
            for col in ("cases", "mean |error|", f"within {v.CASE_BAR_PCT:g}%"):
                s.add_column(col, justify="right", no_wrap=True)
            for row in summary["by_source"]:
                s.add_row(escape(row["source"]), str(row["cases"]), pct(row["mape_pct"]),
                          f"{row['within_case_bar']} of {row['cases']}")
            console.print(s)
        console.print(
            f"mean absolute error, cases not used for fitting ({summary['not_fitted']}): "
            f"[bold]{pct(summary['mape_not_fitted_pct'])}[/] (bar {v.MEAN_BAR_PCT:g}%; "
            f"{summary['not_fitted_within_case_bar']} of {summary['not_fitted']} within {v.CASE_BAR_PCT:g}%;"
            f" median {pct(summary['median_abs_error_not_fitted_pct'])})")
        console.print(f"mean absolute error, fitted cases ({summary['fitted']}): {pct(summary['mape_fitted_pct'])}"
                      " (says little: a profile was fitted to them)")
        if recorded is not None:
            state = "[red]REGRESSED[/]" if regressed else "ok"
            console.print(f"recorded non-fitted mean error: {recorded:.2f}% ({state})")
    if check and regressed:
        sys.exit(EXIT_REGRESSED)
