"""`simspec report RESULTS`: one self-contained HTML page with a sweep's plots and table."""

from __future__ import annotations

from pathlib import Path

import click


@click.command()
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="HTML file to write (default: RESULTS with .html).")
@click.option("--title", default=None, help="Page title (default: from the table's file name).")
def report(results: str, out: str | None, title: str | None) -> None:
    """Write ONE HTML page for a sweep table (CSV or Parquet): plots embedded as images, failed points, the
    table. No external links, styles or scripts: it opens offline."""
    from simspec.cli import fail
    from simspec.errors import InputError
    from simspec.outputs import check_output
    from simspec.studies.html_report import write_report
    from simspec.studies.plots import check_table
    from simspec.studies.sweep import read_table

    out_path = out or str(Path(results).with_suffix(".html"))
    try:
        check_output(out_path, "--out", "an HTML page", (".html", ".htm"), [("the table", results)])
        df = check_table(read_table(results), results, "report")
        path = write_report(df, out_path, title=title, source=results)
    except InputError as err:
        fail(err)
        return
    click.echo(f"wrote {path} ({path.stat().st_size // 1024} KB, {len(df)} rows)")
