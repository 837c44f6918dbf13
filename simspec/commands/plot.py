"""`simspec plot RESULTS`: draw whichever sweep plots the table's columns allow."""

from __future__ import annotations

import click


@click.command()
@click.argument("results", type=click.Path(dir_okay=False))
@click.option("--out-dir", default="plots", show_default=True, type=click.Path(file_okay=False),
              help="Directory for the images.")
@click.option("--format", "formats", default="png,svg", show_default=True,
              help="Comma-separated image formats: png, svg, pdf.")
def plot(results: str, out_dir: str, formats: str) -> None:
    """Plot a sweep table (CSV or Parquet from `simspec sweep`): tok/s vs concurrency, the iteration-time
    breakdown, the speedup heatmap with its break-even contour, speedup vs interconnect latency. Says which
    plots the table does not allow, and why."""
    from simspec.cli import fail
    from simspec.errors import InputError
    from simspec.studies.plots import check_table, parse_formats, write_plots
    from simspec.studies.sweep import read_table

    try:
        fmts = parse_formats(formats)
        df = check_table(read_table(results), results, "plot")
        written, skipped = write_plots(df, out_dir, fmts)
    except InputError as err:
        fail(err)
        return
    for path in written:
        click.echo(f"wrote {path}")
    for name, reason in skipped:
        click.echo(f"skipped {name}: {reason}")
    if not written:
        click.echo(f"no plot drawn from {results}")
