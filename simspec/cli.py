"""The simspec command line: parses, calls, prints. Bad input exits with code 2 and one clear line."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simspec import __version__
from simspec.errors import InputError

EXIT_BAD_INPUT = 2


def fail(err: InputError) -> None:
    """Print a bad-input error as one line on stderr and exit 2: the one way every command reports bad input."""
    # the message quotes user input (keys, file names, values): escape it so it is shown, never interpreted
    Console(stderr=True).print(f"[bold red]error:[/] {escape(str(err))}", highlight=False, soft_wrap=True)
    sys.exit(EXIT_BAD_INPUT)



@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="simspec")
def main() -> None:
    """Predict what speculative decoding does on an LLM serving box, and why."""


def _replay_status(scenario_file: str, overrides: tuple[str, ...]) -> Any:
    """A status line on a terminal's stderr while a scenario whose acceptance replays the n-gram drafter loads:
    the first replay after installing compiles the numba engine (~20 s) and prints nothing of its own."""
    import contextlib

    try:
        replays = "ngram_replay" in Path(scenario_file).read_text(errors="replace") or \
            any("ngram_replay" in o for o in overrides)
    except OSError:  # the loader reports the file
        replays = False
    if not replays:
        return contextlib.nullcontext()
    return Console(stderr=True).status("replaying the n-gram drafter over the corpus (the first replay after "
                                       "installing also compiles the engine, ~20 s)")


TRACE_SUFFIXES = (".json",)  # write_chrome_trace writes plain JSON


def _scenario_inputs(rs: Any) -> list[tuple[str, Path]]:
    """The files a loaded scenario was read from: the scenario, its calibration profile, its replay corpus and
    tokenizer (where it names them)."""
    from simspec.scenario.reading import relative_to_scenario

    sc = rs.scenario
    named = [("the scenario's calibration profile", sc.calibration)]
    replay = sc.acceptance.ngram_replay if sc.acceptance is not None else None
    if replay is not None:
        named += [("the scenario's replay corpus", replay.corpus), ("the scenario's tokenizer", replay.tokenizer)]
    return [("the scenario file", Path(rs.path)), *((role, relative_to_scenario(p, rs.path)) for role, p in named if p)]


@main.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Change a scenario field, e.g. --set workload.arrival.concurrency=8 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
@click.option("--sources", "show_sources", is_flag=True, help="Also list where every time-model figure came from.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False, writable=True), default=None,
              help="Write the simulated iterations as a Chrome trace (open in Perfetto / chrome://tracing).")
@click.option("--trace-detail", type=click.IntRange(min=0), default=50, show_default=True,
              help="Decode iterations whose every collective is drawn; later ones show phase totals.")
def predict(scenario_file: str, overrides: tuple[str, ...], as_json: bool, show_sources: bool,
            trace_path: str | None, trace_detail: int) -> None:
    """Predict tok/s, its breakdown and the no-speculation baseline for SCENARIO_FILE."""
    from simspec.analysis.report import render
    from simspec.outputs import check_folder, check_output
    from simspec.predict import check_decodes, predict_with_run
    from simspec.scenario.loader import load_scenario

    try:
        if trace_path is not None:  # before any work: the scenario's other files are known once it loads
            check_folder(trace_path, "--trace")
            check_output(trace_path, "--trace", "a Chrome trace (JSON)", TRACE_SUFFIXES,
                         [("the scenario file", scenario_file)])
        with _replay_status(scenario_file, overrides):
            rs = load_scenario(scenario_file, list(overrides))
            if trace_path is not None:
                check_output(trace_path, "--trace", "a Chrome trace (JSON)", TRACE_SUFFIXES, _scenario_inputs(rs))
            result, sim = predict_with_run(rs)
            check_decodes(rs, sim)
    except InputError as err:
        fail(err)
        return
    if trace_path is not None:
        from simspec.analysis.timeline import write_chrome_trace

        try:
            n = write_chrome_trace(sim, trace_path, detail_iterations=trace_detail)
        except OSError as err:
            fail(InputError(f"cannot write the trace: {err.strerror}", file=trace_path, key="--trace"))
            return
        Console(stderr=True).print(f"trace: {n} events written to {escape(trace_path)}", highlight=False)
    if as_json:
        click.echo(json.dumps(null_non_finite(result), indent=2, default=jsonable, allow_nan=False))
        return
    console = Console()
    render(result, console)
    if show_sources:
        t = Table(title="sources", title_justify="left")
        t.add_column("figure")
        t.add_column("value and source")
        for k, v in result["sources"].items():
            t.add_row(escape(k), escape(v))
        console.print(t)


def null_non_finite(obj: Any) -> Any:
    """Infinity ("never") and NaN become null, through dicts and lists: JSON has no such numbers."""
    if isinstance(obj, dict):
        return {k: null_non_finite(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [null_non_finite(v) for v in obj]
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    return obj


def jsonable(obj: Any) -> Any:
    """json.dumps default= for numpy scalars."""
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"not JSON serialisable: {type(obj).__name__}")


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Print every preset's figures as JSON.")
def presets(as_json: bool) -> None:
    """List the GPU, interconnect, model and drafter presets."""
    from simspec import presets as p

    cat = p.catalog()
    if as_json:
        click.echo(json.dumps({kind: {k: v.model_dump() for k, v in items.items()} for kind, items in cat.items()},
                              indent=2))
        return
    console = Console()
    for kind, items in cat.items():
        t = Table(title=kind, title_justify="left")
        t.add_column("name")
        t.add_column("what")
        t.add_column("source")
        for name, preset in items.items():
            t.add_row(escape(name), escape(preset.display_name), escape(preset.source))
        console.print(t)


# Commands that live beside the code they drive (one module each, under simspec/commands/). Each module
# defines a click command named like the module and imports its heavy dependencies inside the command body,
# so `simspec --help` stays fast.
_COMMAND_MODULES = ("validate", "calibrate", "ngram", "sweep", "plot", "report", "cost", "optimize")


def _register_commands() -> None:
    import importlib

    for name in _COMMAND_MODULES:
        main.add_command(getattr(importlib.import_module(f"simspec.commands.{name}"), name))


_register_commands()

if __name__ == "__main__":
    main()
