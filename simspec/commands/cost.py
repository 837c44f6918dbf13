"""`simspec cost FILE`: $ per million output tokens for a setup and its baseline, and when training its drafter
pays back."""

from __future__ import annotations

import json
import math

import click

from simspec.errors import InputError

LABELS = {
    "price_per_gpu_hour_usd": "price per GPU-hour",
    "box_usd_per_hour": "box per hour",
    "throughput_tokens_per_s": "throughput (setup)",
    "baseline_throughput_tokens_per_s": "throughput (no speculation)",
    "usd_per_mtok": "$ per M output tokens (setup)",
    "baseline_usd_per_mtok": "$ per M output tokens (no speculation)",
    "saving_usd_per_mtok": "saving per M output tokens",
    "saving_pct": "saving",
    "train_tokens": "training tokens",
    "train_epochs": "training epochs",
    "generate_tokens": "tokens to generate (training data)",
    "generation_tokens_per_s": "generation throughput",
    "generation_wall_hours": "data generation, wall-clock",
    "generation_gpu_hours": "data generation",
    "generation_usd": "data generation cost",
    "train_gpus": "training GPUs",
    "train_tokens_per_s_per_gpu": "training throughput",
    "train_gpu_hours": "training",
    "train_wall_hours": "training, wall-clock",
    "train_usd": "training cost",
    "investment_usd": "investment",
    "payback_mtok": "pays back after",
    "payback_serving_hours": "pays back after (serving time)",
}
SECTIONS = (("serving", ("price_per_gpu_hour_usd", "box_usd_per_hour", "throughput_tokens_per_s",
                         "baseline_throughput_tokens_per_s", "usd_per_mtok", "baseline_usd_per_mtok",
                         "saving_usd_per_mtok", "saving_pct")),
            ("drafter training", ("train_tokens", "train_epochs", "generate_tokens", "generation_tokens_per_s",
                                  "generation_wall_hours", "generation_gpu_hours", "generation_usd", "train_gpus",
                                  "train_tokens_per_s_per_gpu", "train_gpu_hours", "train_wall_hours", "train_usd",
                                  "investment_usd")),
            ("pay-back", ("payback_mtok", "payback_serving_hours")))


def _number(text: str | None, option: str, *, integer: bool = False) -> float | None:
    """An option's number, or one clear InputError (range checks live in cost_figures)."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        raise InputError(f"{option} expects a number, got {text!r}") from None
    if integer and (not math.isfinite(value) or value != int(value)):
        raise InputError(f"{option} expects a whole number, got {text!r}")
    return value


def _format(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    if math.isinf(value):
        return "never"
    if math.isnan(value):
        return "n/a"
    if unit.startswith("$"):
        sign = "-" if value < 0 else ""
        return f"{sign}${abs(value):,.2f}" if abs(value) >= 0.01 or value == 0 else f"{sign}${abs(value):.3g}"
    if unit == "tokens":
        return f"{value:,.0f}"
    if unit in ("GPUs", "epochs"):
        return f"{value:g}"
    text = f"{value:,.1f}" if abs(value) >= 1 else f"{value:.3g}"
    return f"{text} {unit}"


def _generation_rate(path: str, overrides: list[str], concurrency: int) -> tuple[float, str]:
    """Predicted no-speculation throughput of this box at closed-loop `concurrency` (a data-generation job)."""
    from simspec.analysis.metrics import summarize
    from simspec.scenario.loader import load_scenario
    from simspec.scenario.schema import MAX_CONCURRENCY, MAX_REQUESTS
    from simspec.simulate import run
    from simspec.workload import whole_conversations

    rs = load_scenario(path, overrides)
    turns = rs.scenario.workload.turns  # keep the conversations' turns
    requests = whole_conversations(rs.scenario.workload.num_requests, concurrency, turns)
    if requests > MAX_REQUESTS:
        raise InputError(f"{concurrency:,} clients with whole conversations of {turns} turns need {requests:,}"
                         f" requests, more than the {MAX_REQUESTS:,} a workload may have; allowed: 1.."
                         f"{min(MAX_CONCURRENCY, MAX_REQUESTS // turns):,}", file=path, key="--gen-concurrency")
    try:
        gen = load_scenario(path, [*overrides, "speculative={algorithm: none}", "acceptance=",
                                   f"workload.arrival={{type: closed, concurrency: {concurrency}, turns: {turns}}}",
                                   f"workload.num_requests={requests}"])
    except InputError as err:  # the scenario itself loaded above: what fails is the flag's data-generation run
        raise InputError(f"the no-speculation run at concurrency {concurrency:,} cannot be simulated"
                         f" ({err.key or 'scenario'}: {err.message})", file=path, key="--gen-concurrency") from None
    tput = float(summarize(run(gen))["throughput_tokens_per_s"])
    return tput, (f"predicted no-speculation throughput of this box, closed loop, concurrency {concurrency}"
                  f" (--gen-concurrency), {requests} requests of this workload")


@click.command()
@click.argument("scenario_file", type=click.Path(dir_okay=False))
@click.option("--price", metavar="USD_PER_GPU_HOUR", help="$ per GPU-hour (default: the GPU preset's price).")
@click.option("--train-tokens", metavar="N", help="Tokens in the drafter's training set (default 1e9, cited).")
@click.option("--train-epochs", metavar="N", help="Passes over the training set (default 2, cited).")
@click.option("--train-throughput", metavar="TOK_S_PER_GPU",
              help="Training tokens/s per GPU (no default: without it training cost and pay-back are unknown).")
@click.option("--train-gpus", metavar="N", help="GPUs that train the drafter (default: the box's).")
@click.option("--gen-tokens", metavar="N", help="Tokens the target generates for training data"
                                                " (default: the training tokens).")
@click.option("--gen-throughput", metavar="TOK_S", help="Data-generation tok/s of the box (default: predicted).")
@click.option("--gen-concurrency", metavar="N",
              help="Predict the data-generation tok/s at this closed-loop concurrency (default: the scenario's).")
@click.option("--set", "overrides", multiple=True, metavar="KEY.PATH=VALUE",
              help="Change a scenario field, e.g. --set workload.arrival.concurrency=8 (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def cost(scenario_file: str, price: str | None, train_tokens: str | None, train_epochs: str | None,
         train_throughput: str | None, train_gpus: str | None, gen_tokens: str | None, gen_throughput: str | None,
         gen_concurrency: str | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """$ per million output tokens for SCENARIO_FILE and its no-speculation baseline, and the serving volume at
    which training its drafter pays back."""
    from simspec.cli import fail, null_non_finite
    from simspec.predict import predict
    from simspec.scenario.loader import load_scenario
    from simspec.scenario.schema import MAX_CONCURRENCY
    from simspec.studies.cost import check_inputs, cost_figures

    try:
        numbers = {"price_per_gpu_hour": _number(price, "--price"),
                   "train_tokens": _number(train_tokens, "--train-tokens"),
                   "train_epochs": _number(train_epochs, "--train-epochs"),
                   "train_tokens_per_s_per_gpu": _number(train_throughput, "--train-throughput"),
                   "generate_tokens": _number(gen_tokens, "--gen-tokens"),
                   "generation_tokens_per_s": _number(gen_throughput, "--gen-throughput")}
        gpus = _number(train_gpus, "--train-gpus", integer=True)
        if gpus is not None:
            check_inputs(train_gpus=gpus)  # its range, before a huge float becomes a 300-digit whole number
        gpus = None if gpus is None else int(gpus)
        concurrency = _number(gen_concurrency, "--gen-concurrency", integer=True)
        if concurrency is not None and not 1 <= concurrency <= MAX_CONCURRENCY:
            raise InputError(f"the closed-loop clients of the data-generation run: allowed 1..{MAX_CONCURRENCY:,},"
                             f" got {gen_concurrency}", file=scenario_file, key="--gen-concurrency")
        if gen_throughput is not None and concurrency is not None:
            raise InputError("give --gen-throughput or --gen-concurrency, not both")
        check_inputs(train_gpus=gpus, **numbers)
        rs = load_scenario(scenario_file, list(overrides))
        result = predict(rs)
        gen_source = None
        if concurrency is not None:
            numbers["generation_tokens_per_s"], gen_source = _generation_rate(scenario_file, list(overrides),
                                                                              int(concurrency))
        figures = cost_figures(result, rs, train_gpus=gpus, generation_source=gen_source, **numbers)
    except InputError as err:
        fail(err)
        return
    if as_json:
        click.echo(json.dumps(null_non_finite(figures), indent=2))
        return
    _render(figures)


def _render(out: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    fig = out["figures"]
    title = escape(f"{out['scenario']}: {out['algorithm']} on {out['num_gpus']} x {out['gpu']}")
    t = Table(title=title, title_justify="left", header_style="bold")
    t.add_column("figure [dim](source)[/]", ratio=1)
    t.add_column("value", justify="right", no_wrap=True)
    for section, keys in SECTIONS:
        present = [k for k in keys if k in fig]
        if not present:
            continue
        t.add_section()
        t.add_row(f"[bold]{section}[/]", "")
        for k in present:
            f = fig[k]
            t.add_row(f"{LABELS[k]}\n[dim]{escape(f['source'])}[/]", escape(_format(f["value"], f["unit"])))
    console.print(t)
    if not out["trains_drafter"]:
        console.print(f"{escape(out['algorithm'])}: no drafter to train.", highlight=False)
    console.print(escape(out["verdict"]), highlight=False)
    if out.get("hypothetical_interconnect"):  # priced as if the box existed: say it does not
        console.print(f"[yellow]hypothetical interconnect:[/] {escape(out['hypothetical_interconnect'])}",
                      highlight=False)
