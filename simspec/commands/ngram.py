"""`simspec ngram CORPUS`: replay SGLang's n-gram drafter over recorded outputs -> accept-length histogram."""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

import click

from simspec.errors import InputError

# --sweep keys: the NgramConfig fields, plus the replay's concurrency
CONFIG_KEYS = ("num_draft_tokens", "min_bfs_breadth", "max_bfs_breadth", "max_trie_depth", "match_type",
               "capacity", "sglang_version", "min_match_window_size", "max_match_window_size")
SWEEP_KEYS = CONFIG_KEYS + ("concurrency",)
TEXT_KEYS = ("match_type", "sglang_version")

SWEEP_HELP = (
    "Replay several configurations: KEY=V1,V2,... with KEY one of "
    + ", ".join(SWEEP_KEYS)
    + " (dashes or underscores). Repeat it for a grid: --sweep num_draft_tokens=4,8,12 --sweep "
    "max_bfs_breadth=1,10 replays all 6 combinations; a swept key overrides its option."
)


def _option(key: str) -> str:
    return "--" + key.replace("_", "-")


def _int(text: str, where: str) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        raise InputError(f"expected a whole number, got {text!r}", key=where) from None
    return value


def _value(key: str, text: str, where: str) -> Any:
    if key in TEXT_KEYS:
        text = text.strip()
        return text
    return _int(text, where)


def _parse_sweeps(specs: tuple[str, ...]) -> dict[str, list[Any]]:
    grid: dict[str, list[Any]] = {}
    for spec in specs:
        where = f"--sweep {spec}"
        if "=" not in spec:
            raise InputError(f"expected KEY=V1,V2,... with KEY one of {', '.join(SWEEP_KEYS)}", key=where)
        raw_key, _, values = spec.partition("=")
        key = raw_key.strip().replace("-", "_")
        if key not in SWEEP_KEYS:
            raise InputError(f"unknown key {raw_key.strip()!r}; allowed: {', '.join(SWEEP_KEYS)}", key=where)
        if key in grid:
            raise InputError(f"{key} is swept twice: give all its values in one --sweep", key=where)
        items = [v for v in values.split(",") if v.strip()]
        if not items:
            raise InputError("no values after '='", key=where)
        grid[key] = [_value(key, v, where) for v in items]
    return grid


@click.command()
@click.argument("corpus")
@click.option("--tokenizer", metavar="TOKENIZER_JSON", default=None,
              help="Tokenize text with this local tokenizer.json (tokenizers library). Without it text is "
                   "replayed as UTF-8 bytes; token-id files need none.")
@click.option("--concurrency", "-c", default="1", metavar="C", show_default=True,
              help="Requests in flight, sharing the trie; each verify step advances all of them.")
@click.option("--num-draft-tokens", default="12", metavar="N", show_default=True,
              help="--speculative-num-draft-tokens: tokens verified per request and step, root included.")
@click.option("--min-bfs-breadth", default="1", metavar="N", show_default=True)
@click.option("--max-bfs-breadth", default="10", metavar="N", show_default=True,
              help="min = max = 1 drafts a chain; larger widens the tree (PROB: children per node).")
@click.option("--max-trie-depth", default="18", metavar="N", show_default=True,
              help="Longest n-gram stored and matched (0.5.8: branch_length).")
@click.option("--match-type", default="BFS", metavar="BFS|PROB", show_default=True,
              help="BFS: breadth-first, children most recently seen first; PROB: best-first by frequency.")
@click.option("--capacity", default="10000000", metavar="NODES", show_default=True,
              help="Trie nodes before least-recently-used eviction.")
@click.option("--sglang-version", default="0.5.10", metavar="0.5.8|0.5.10|0.5.23", show_default=True,
              help="Whose drafter to follow (see simspec/ngram/config.py for what differs).")
@click.option("--min-match-window-size", default="1", metavar="N", show_default=True, help="0.5.8 only.")
@click.option("--max-match-window-size", default="12", metavar="N", show_default=True,
              help="0.5.8 only: longest suffix matched.")
@click.option("--sweep", "sweeps", multiple=True, metavar="KEY=V1,V2,...", help=SWEEP_HELP)
@click.option("--requests", "show_requests", default="20", metavar="N", show_default=True,
              help="Per-request rows to print for a single configuration (0: none, all: every one); --json "
                   "always has them all.")
@click.option("--engine", default="auto", metavar="auto|compiled|literal", show_default=True,
              help="auto: compiled (numba) where numba imports, else literal (pure Python, ~10x slower); both "
                   "give the same answers.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def ngram(corpus: str, tokenizer: str | None, concurrency: str, num_draft_tokens: str, min_bfs_breadth: str,
          max_bfs_breadth: str, max_trie_depth: str, match_type: str, capacity: str, sglang_version: str,
          min_match_window_size: str, max_match_window_size: str, sweeps: tuple[str, ...], show_requests: str,
          engine: str, as_json: bool) -> None:
    """Replay SGLang's n-gram drafter over the outputs in CORPUS and print the accept-length histogram.

    CORPUS: a .jsonl file, one object per line with `output_ids` (and optionally `prompt_ids`/`input_ids`) or
    `text` (and optionally `prompt`) (a line with both is read as its `output_ids`, as SGLang's responses carry
    both); or a plain text file, one request per blank-line-separated block. At
    temperature 0 the replay is exact: each step accepts the longest draft path that matches what the model
    produced next.
    """
    from simspec.cli import fail

    try:
        base = {"num_draft_tokens": _int(num_draft_tokens, "--num-draft-tokens"),
                "min_bfs_breadth": _int(min_bfs_breadth, "--min-bfs-breadth"),
                "max_bfs_breadth": _int(max_bfs_breadth, "--max-bfs-breadth"),
                "max_trie_depth": _int(max_trie_depth, "--max-trie-depth"),
                "match_type": match_type.strip(), "capacity": _int(capacity, "--capacity"),
                "sglang_version": sglang_version.strip(), "concurrency": _int(concurrency, "--concurrency"),
                "min_match_window_size": _int(min_match_window_size, "--min-match-window-size"),
                "max_match_window_size": _int(max_match_window_size, "--max-match-window-size")}
        if show_requests.strip().lower() == "all":
            n_rows = -1
        else:
            n_rows = _int(show_requests, "--requests")
            if n_rows < 0:
                raise InputError(f"expected a number >= 0 or all, got {show_requests!r}", key="--requests")
        if engine not in ("auto", "compiled", "literal"):
            raise InputError(f"expected auto, compiled or literal, got {engine!r}", key="--engine")
        grid = _parse_sweeps(sweeps)
        runs = _plan(base, grid)
        _check_windows_apply(click.get_current_context(), grid, runs)
        from simspec.ngram import load_corpus

        sequences, tokenization = load_corpus(corpus, tokenizer)
        results = _replay_all(sequences, runs, engine)
        swept = [sw for _, _, sw in runs]
    except InputError as err:
        fail(err)
        return
    if as_json:
        out: dict[str, Any] = {"corpus": corpus, "tokenization": tokenization, "num_requests": len(sequences)}
        if grid:
            out["sweep"] = grid
            out["results"] = [{"swept": sw, **r.to_dict()} for sw, r in zip(swept, results, strict=True)]
        else:
            out.update(results[0].to_dict())
        click.echo(json.dumps(out, indent=2))
        return
    _render(corpus, tokenization, sequences, results, swept, grid, n_rows)


WINDOW_KEYS = ("min_match_window_size", "max_match_window_size")
WINDOW_VERSION = "0.5.8"  # the one release read whose drafter has match windows (simspec/ngram/config.py)


def _check_windows_apply(ctx: click.Context, grid: dict[str, list[Any]], runs: list) -> None:
    """A match-window size given (an option or a --sweep) where no replay follows 0.5.8 would change nothing: an
    error, not a setting shown as if it had been used."""
    if any(cfg.sglang_version == WINDOW_VERSION for cfg, _, _ in runs):
        return
    for key in WINDOW_KEYS:
        if key in grid:
            where = f"--sweep {key}={','.join(map(str, grid[key]))}"
        elif ctx.get_parameter_source(key) is not click.core.ParameterSource.DEFAULT:
            where = _option(key)
        else:
            continue
        versions = ", ".join(sorted({cfg.sglang_version for cfg, _, _ in runs}))
        raise InputError(f"applies only to --sglang-version {WINDOW_VERSION}: SGLang {versions} matches every suffix"
                         f" depth and has no match window; drop it, or replay {WINDOW_VERSION}", key=where)


def _plan(base: dict[str, Any], grid: dict[str, list[Any]]) -> list[tuple[Any, int, dict[str, Any]]]:
    """Every combination of the swept values, each as (NgramConfig, concurrency, the swept values)."""
    from simspec.ngram import NgramConfig
    from simspec.ngram.config import MAX_DRAFT_TOKENS

    keys = list(grid)
    runs = []
    for combo in itertools.product(*(grid[k] for k in keys)) if keys else [()]:
        swept = dict(zip(keys, combo, strict=True))
        settings = {**base, **swept}
        conc = settings.pop("concurrency")
        if settings["sglang_version"] != WINDOW_VERSION and not any(k in swept for k in WINDOW_KEYS):
            for k in WINDOW_KEYS:  # unused by this release: keep them out of its label (a sweep lists its own)
                settings.pop(k)
        if isinstance(conc, bool) or conc < 1:
            where = f"--sweep concurrency={','.join(map(str, grid['concurrency']))}" if "concurrency" in swept \
                else "--concurrency"
            raise InputError(f"must be >= 1, got {conc}", key=where)
        try:
            n_draft = settings["num_draft_tokens"]
            if isinstance(n_draft, int) and not 2 <= n_draft <= MAX_DRAFT_TOKENS:
                # the scenario schema's range (speculative.num_draft_tokens): 1 is the root alone, nothing drafted
                raise InputError(f"must be 2 .. {MAX_DRAFT_TOKENS}, as in a scenario (tokens verified per request, "
                                 f"root included: SGLang's drafter needs >= 1, the root, and 1 drafts nothing), got "
                                 f"{n_draft}", key="num_draft_tokens")
            cfg = NgramConfig(**{k: v for k, v in settings.items() if k in CONFIG_KEYS})
        except InputError as err:
            field = err.key or ""
            if field in swept:
                where = f"--sweep {field}={','.join(map(str, grid[field]))}"
            else:
                where = _option(field) if field else None
            raise InputError(err.message, key=where) from None
        runs.append((cfg, conc, swept))
    return runs


def _replay_all(sequences: list, runs: list[tuple[Any, int, dict[str, Any]]], engine: str) -> list[Any]:
    """Every planned replay, with a status line on a terminal's stderr (nothing is written elsewhere): the first
    replay after installing compiles the numba engine, which takes a while with no output of its own."""
    from rich.console import Console

    err = Console(stderr=True)
    results = []
    with err.status("replaying (the first replay after installing also compiles the engine, ~20 s)") as status:
        for i, (cfg, conc, _) in enumerate(runs):
            if len(runs) > 1:
                status.update(f"replaying configuration {i + 1} of {len(runs)}")
            results.append(_replay(sequences, cfg, conc, engine))
    return results


def _replay(sequences: list, cfg: Any, conc: int, engine: str) -> Any:
    from simspec.ngram import replay

    try:
        result = replay(sequences, cfg, conc, engine=engine)
    except InputError as err:
        raise InputError(err.message, file=err.file, key=_option(err.key) if err.key else None) from None
    return result


def _f(x: float, digits: int = 2) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _render(corpus: str, tokenization: str, sequences: list, results: list, swept: list[dict[str, Any]],
            grid: dict[str, list[Any]], n_rows: int) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    n_out = sum(len(s.output_ids) for s in sequences)
    console.print(f"[bold]{escape(corpus)}[/]: {len(sequences)} requests, {n_out:,} output tokens; "
                  f"tokenization: {escape(tokenization)}", highlight=False)
    if grid:
        t = Table(title="n-gram replay sweep", title_justify="left", header_style="bold")
        for k in grid:
            t.add_column(k, no_wrap=True, min_width=len(k))
        for col in ("accept length", "verify steps", "accepted drafts", "P(>=1 accepted)", "engine"):
            t.add_column(col, justify="right")
        for sw, r in zip(swept, results, strict=True):
            steps = r.verify_steps
            p1 = 1 - r.histogram[0] / steps if steps else math.nan
            t.add_row(*[escape(str(sw[k])) for k in grid], _f(r.mean_accept_length, 3), f"{steps:,}",
                      f"{r.accepted_drafts:,}", _f(p1, 3), r.engine)
        console.print(t)
        for note in sorted({n for r in results for n in r.notes}):
            console.print(f"note: {escape(note)}", highlight=False)
        return
    r = results[0]
    console.print(f"config: {escape(r.config.label())}; concurrency {r.concurrency}; engine {r.engine}",
                  highlight=False)
    t = Table(title="accepted drafts per verify step", title_justify="left", header_style="bold")
    t.add_column("accepted drafts", justify="right")
    t.add_column("accept length", justify="right")
    t.add_column("steps", justify="right")
    t.add_column("share", justify="right")
    t.add_column("share >= k", justify="right")
    steps = r.verify_steps
    tail = steps
    last = max((k for k, n in enumerate(r.histogram) if n), default=0)
    for k, n in enumerate(r.histogram):
        if k > last:
            break
        t.add_row(str(k), str(k + 1), f"{n:,}", _f(n / steps if steps else math.nan, 3),
                  _f(tail / steps if steps else math.nan, 3))
        tail -= n
    console.print(t)
    console.print(f"mean accept length {_f(r.mean_accept_length, 3)} (accepted drafts + 1 bonus, per request and "
                  f"verify step) over {steps:,} verify steps ({r.batch_steps:,} batch steps); "
                  f"{r.accepted_drafts:,} drafts accepted", highlight=False)
    if n_rows != 0 and r.requests:
        shown = r.requests if n_rows < 0 else r.requests[:n_rows]
        rt = Table(title="per request (tokens, verify steps; spec_accept_length = output / steps, as SGLang's "
                         "meta_info)", title_justify="left", header_style="bold")
        for col in ("request", "prompt", "output", "steps", "accept length", "spec_accept_length"):
            rt.add_column(col, justify="left" if col == "request" else "right", no_wrap=col != "request")
        for q in shown:
            rt.add_row(escape(q.name), f"{q.prompt_tokens:,}", f"{q.output_tokens:,}", f"{q.verify_steps:,}",
                       _f(q.accept_length), _f(q.spec_accept_length))
        console.print(rt)
        if len(shown) < len(r.requests):
            console.print(f"... and {len(r.requests) - len(shown)} more (--requests all, or --json)")
        lengths = sorted(q.accept_length for q in r.requests if q.verify_steps)
        if len(lengths) > 1:
            mid = lengths[len(lengths) // 2]
            console.print(f"per-request accept length: min {_f(lengths[0])}, median {_f(mid)}, "
                          f"max {_f(lengths[-1])}", highlight=False)
    for note in r.notes:
        console.print(f"note: {escape(note)}", highlight=False)
