"""`simspec optimize FILE`: per concurrency, the speculative algorithm and (num_steps, topk, num_draft_tokens)
that give the most tok/s, the runner-up and the margin."""

from __future__ import annotations

import json
import math

import click

from simspec.errors import InputError


def _positive_ms(text: str | None, option: str) -> float | None:
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{option} expects a number of milliseconds, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise InputError(f"{option} must be a positive number of milliseconds, got {text!r}")
    return value


def _whole(text: str, option: str) -> int:
    if not text.strip().isdigit() or int(text) < 1:
        raise InputError(f"{option} expects a whole number >= 1, got {text!r}")
    return int(text)


@click.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--concurrency", "concurrency_text", metavar="1,8,32",
              help="Closed-loop concurrencies to optimise for (default: the scenario's own workload).")
@click.option("--objective", default="throughput", show_default=True, metavar="throughput|per_request",
              help="throughput: total tok/s of the box; per_request: decode tok/s one user sees.")
@click.option("--max-itl-ms", metavar="MS", help="Only configurations whose inter-token latency is within MS.")
@click.option("--max-tpot-ms", metavar="MS", help="Only configurations whose time per output token is within MS.")
@click.option("--latency-stat", default="p99", show_default=True, metavar="p50|p90|p99|mean",
              help="Which statistic of ITL / TPOT the bound applies to.")
@click.option("--algorithms", "algorithms_text", metavar="eagle3,ngram,none",
              help="Algorithms to search (default: the scenario's, none, and every one in --setups).")
@click.option("--setups", "setups_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="YAML mapping algorithm -> scenario changes (speculative settings, acceptance) for algorithms"
                   " other than the scenario's.")
@click.option("--max-steps", "max_steps_text", default="5", show_default=True, metavar="N",
              help="Deepest num_steps in the EAGLE-style grid.")
@click.option("--jobs", "jobs_text", default="1", show_default=True, metavar="N",
              help="Simulate grid points on N processes.")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Change a scenario field, e.g. --set workload.output_tokens.value=512 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object (every grid point) instead of tables.")
def optimize(scenario_file: str, concurrency_text: str | None, objective: str, max_itl_ms: str | None,
             max_tpot_ms: str | None, latency_stat: str, algorithms_text: str | None, setups_path: str | None,
             max_steps_text: str, jobs_text: str, overrides: tuple[str, ...], as_json: bool) -> None:
    """Find the speculative setting of SCENARIO_FILE that gives the most tok/s at each concurrency."""
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from simspec.cli import fail, null_non_finite
    from simspec.studies import optimize as study

    try:
        if objective not in study.OBJECTIVES:
            raise InputError(f"unknown objective {objective!r}; allowed: {', '.join(study.OBJECTIVES)}")
        if latency_stat not in study.LATENCY_STATS:
            raise InputError(f"unknown --latency-stat {latency_stat!r}; allowed: {', '.join(study.LATENCY_STATS)}")
        itl = _positive_ms(max_itl_ms, "--max-itl-ms")
        tpot = _positive_ms(max_tpot_ms, "--max-tpot-ms")
        if itl is not None and tpot is not None:
            raise InputError("give --max-itl-ms or --max-tpot-ms, not both")
        given = click.get_current_context().get_parameter_source("latency_stat")
        if itl is None and tpot is None and given is not click.core.ParameterSource.DEFAULT:
            raise InputError(f"--latency-stat {latency_stat} picks the statistic a latency bound applies to, and no"
                             " bound is given: add --max-itl-ms MS or --max-tpot-ms MS, or drop --latency-stat",
                             key="--latency-stat")
        concurrencies = study.parse_concurrency(concurrency_text) if concurrency_text is not None else None
        algorithms = study.parse_algorithms(algorithms_text) if algorithms_text is not None else None
        max_steps = _whole(max_steps_text, "--max-steps")
        jobs = _whole(jobs_text, "--jobs")
        p = study.plan(scenario_file, list(overrides), concurrencies=concurrencies, algorithms=algorithms,
                       setups_path=setups_path, max_steps=max_steps)
        err_console = Console(stderr=True)
        with Progress(TextColumn("simulating"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                      console=err_console, transient=True, disable=as_json or not err_console.is_terminal) as bar:
            task = bar.add_task("grid", total=p.num_simulations)
            result = study.optimize(p, objective=objective, max_itl_ms=itl, max_tpot_ms=tpot,
                                    latency_stat=latency_stat, jobs=jobs, on_done=lambda: bar.advance(task))
    except InputError as err:
        fail(err)
        return
    if as_json:
        click.echo(json.dumps(null_non_finite(result), indent=2))
        return
    _render(result)


def _render(result: dict) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    metric = result["metric"]
    what = "total throughput" if result["objective"] == "throughput" else "per-request decode tok/s"
    bound = result["latency_bound"]
    title = f"{result['scenario']}: best setting by {what}"
    if bound:
        title += f", {bound['metric'].removesuffix('_ms').upper()} {bound['stat']} <= {bound['max_ms']:g} ms"
    t = Table(title=escape(title), title_justify="left", header_style="bold", box=box.SIMPLE_HEAD)
    for col in ("conc.", "winner", "tok/s", "runner-up", "tok/s", "margin", "vs none"):
        t.add_column(col, justify="left" if col in ("winner", "runner-up") else "right",
                     no_wrap=col in ("winner", "runner-up"))
    t.caption = escape("; ".join(dict.fromkeys(g["workload"] for g in result["concurrencies"] if g["workload"])))
    t.caption_justify = "left"
    for g in result["concurrencies"]:
        w, r = g["winner"], g["runner_up"]
        none = next((pt for pt in g["points"] if pt["algorithm"] == "none" and pt["feasible"]), None)
        vs_none = (f"{100 * (w[metric] / none[metric] - 1):+.1f}%" if w and none and none[metric] > 0
                   and w is not none else "-")
        t.add_row(str(g["concurrency"]) if g["concurrency"] is not None else "scenario's",
                  escape(w["label"]) if w else "[red]no feasible point[/]", f"{w[metric]:,.1f}" if w else "-",
                  escape(r["label"]) if r else "-", f"{r[metric]:,.1f}" if r else "-",
                  f"{g['margin_pct']:.1f}%" if g["margin_pct"] is not None else "-", vs_none)
    console.print(t)
    for g in result["concurrencies"]:
        where = f"concurrency {g['concurrency']}" if g["concurrency"] is not None else "the scenario's workload"
        over = f", {g['over_bound']} over the latency bound" if bound else ""
        n = g["evaluated"]
        console.print(f"{where}: {n} point{'s' if n != 1 else ''} simulated, {len(g['rejected'])} rejected by the"
                      f" loader{over}", highlight=False)
        if g["winner"] is None:
            console.print(f"[red]{escape(where)}:[/] {escape(g['message'])}", highlight=False)
    for alg, info in result["grid"].items():
        console.print(f"{escape(alg)}: {info['points']} grid point{'s' if info['points'] != 1 else ''};"
                      f" {escape(info['note'])}", highlight=False)
    for note in result["notes"]:
        console.print(escape(note), highlight=False)
