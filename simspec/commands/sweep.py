"""`simspec sweep FILE`: predict every point of a sweep file and write the table (CSV, Parquet)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

MAX_WARNINGS = 20  # failed points named one per line; the table's `error` column has them all
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")


def _base_inputs(spec: Any) -> list[tuple[str, str]]:
    """The files a loaded sweep reads besides the sweep file: its base scenario and that scenario's calibration
    profile (where it names them)."""
    from simspec.scenario.reading import relative_to_scenario

    out = []
    if spec.base_path != spec.file:  # `base:` (an inline `scenario:` is resolved against the sweep file)
        out.append(("the base scenario", spec.base_path))
    calibration = spec.base.get("calibration") if isinstance(spec.base, dict) else None
    if isinstance(calibration, str) and calibration.strip():
        out.append(("the base scenario's calibration profile", str(relative_to_scenario(calibration, spec.base_path))))
    return out


def _write_interrupted(stop: Any, out_path: str, parquet: str | None, elapsed: float, err_console: Any) -> None:
    """Write the points an interrupted sweep finished (a second Ctrl-C does not cut the writing short), say how
    many of how many, and exit 128 + the signal (130 for Ctrl-C)."""
    import signal
    import sys

    from simspec.studies import sweep as S

    old = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        S.write_csv(stop.table, out_path)
        if parquet:
            S.write_parquet(stop.table, parquet)
    finally:
        signal.signal(signal.SIGINT, old)
    written = out_path + (f" and {parquet}" if parquet else "")
    why = "Ctrl-C" if stop.signum == signal.SIGINT else signal.Signals(stop.signum).name
    err_console.print(f"interrupted ({why}) after {elapsed:.1f} s: wrote the {len(stop.table)} of {stop.total}"
                      f" points that finished to {written}; the missing point numbers did not run", markup=False)
    sys.exit(128 + stop.signum)


@click.command()
@click.argument("sweep_file", type=click.Path(dir_okay=False))
@click.option("--out", "out", type=click.Path(dir_okay=False), default=None,
              help="CSV table to write (default: the sweep file's name with .csv, in this directory).")
@click.option("--parquet", "parquet", type=click.Path(dir_okay=False), default=None,
              help="Also write the table as Parquet (needs pyarrow).")
@click.option("--jobs", type=click.IntRange(min=1), default=None,
              help="Parallel workers (local processes, or CPUs of a local Ray). Default: every core.")
@click.option("--backend", type=click.Choice(["local", "ray"]), default="local", show_default=True,
              help="local: a process pool on this machine; ray: Ray tasks (pip install 'simspec[ray]').")
@click.option("--address", default=None, help="Ray cluster address (with --backend ray); default: a local Ray.")
@click.option("--fast", is_flag=True, help="Use the analytic fast path instead of the discrete-event engine.")
@click.option("--max-points", "max_points", type=click.IntRange(min=1), default=None,
              help="Refuse a sweep of more points than this (default: 100,000 with --fast, 10,000 without: up to"
                   " an hour or so on one core; see benchmarks/sweep_speed.py).")
def sweep(sweep_file: str, out: str | None, parquet: str | None, jobs: int | None, backend: str,
          address: str | None, fast: bool, max_points: int | None) -> None:
    """Run every point of SWEEP_FILE (a base scenario plus grid, points and/or setups) and write one row per
    point: the varied fields, then the prediction's figures. A point that fails validation gets its reason in
    the `error` column and a warning; the others still run. Ctrl-C stops the sweep and writes the points that
    finished (exit 130)."""
    import sys
    import time

    from rich.console import Console
    from rich.markup import escape

    from simspec.cli import fail
    from simspec.errors import InputError
    from simspec.outputs import check_folder, check_output
    from simspec.studies import sweep as S

    err_console = Console(stderr=True, highlight=False, soft_wrap=True)
    out_path = out or f"{Path(sweep_file).stem}.csv"
    try:
        S.check_backend(backend, address)
        if Path(out_path).suffix.lower() in PARQUET_SUFFIXES:  # it would hold CSV under a Parquet name
            raise InputError("writes a CSV table; for Parquet give --parquet FILE (beside a CSV --out, or the "
                             "default one)", file=out_path, key="--out")
        if parquet:
            S.require_pyarrow()
        try:
            with err_console.status(f"reading {escape(sweep_file)}"):
                spec = S.load_sweep(sweep_file, max_points=max_points or S.point_cap(fast))
        except KeyboardInterrupt:
            err_console.print("interrupted before any point ran; nothing written")
            sys.exit(130)
        # neither table may hold the wrong format, overwrite the sweep file or its base scenario, or the other table
        inputs = [("the sweep file", sweep_file), *_base_inputs(spec)]
        check_output(out_path, "--out", "a CSV table", CSV_SUFFIXES, inputs)
        if parquet:
            check_output(parquet, "--parquet", "a Parquet table", PARQUET_SUFFIXES,
                         [*inputs, ("the --out table", out_path)])
        # a table that cannot be written should be said before the points run, not after
        for flag, target in (("--out", out_path), ("--parquet", parquet)):
            if target:
                check_folder(target, flag)
        t0 = time.perf_counter()
        try:
            df = S.run_points(spec, jobs=jobs, backend=backend, address=address, fast=fast, progress=True)
        except S.SweepInterrupted as stop:
            _write_interrupted(stop, out_path, parquet, time.perf_counter() - t0, err_console)
            return
        elapsed = time.perf_counter() - t0
        S.write_csv(df, out_path)
        if parquet:
            S.write_parquet(df, parquet)
    except InputError as err:
        fail(err)
        return
    failed = S.failed_points(df)
    for _, row in failed.head(MAX_WARNINGS).iterrows():
        where = ", ".join(f"{c}={row[c]}" for c in spec.input_columns[1:])
        reason = escape(str(row["error"]))
        err_console.print(f"[yellow]warning:[/] point {row['point']} ({escape(where)}) failed: {reason}")
    if len(failed) > MAX_WARNINGS:
        err_console.print(f"[yellow]warning:[/] {len(failed) - MAX_WARNINGS} more points failed; the table's"
                          " `error` column says why")
    written = out_path + (f" and {parquet}" if parquet else "")
    click.echo(f"{len(df)} points ({len(failed)} failed) in {elapsed:.1f} s -> {written}")
    if len(failed) == len(df):
        fail(InputError(f"every point failed; the first: {failed.iloc[0]['error']}", file=sweep_file))
