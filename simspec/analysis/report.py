"""The human-readable prediction: rich tables built from predict()'s dictionary."""

from __future__ import annotations

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from simspec.timing.iteration import BREAKDOWN_KEYS

BREAKDOWN_LABELS = {
    "draft_compute": "draft compute", "draft_comm": "draft communication", "verify_compute": "verify compute",
    "verify_comm": "verify communication", "cpu": "CPU (exposed)",
}


def _f(x: float, digits: int = 1) -> str:
    return f"{x:,.{digits}f}"


def render(result: dict, console: Console) -> None:
    setup = result["setup"]
    spec = setup["algorithm"] != "none"
    title = escape(f"{setup['scenario']}: {setup['model']} on {setup['num_gpus']} x {setup['gpu']}"
                   f" ({setup['interconnect']})")  # names come from user files: never markup
    t = Table(title=title, title_justify="left", show_header=True, header_style="bold")
    t.add_column("metric")
    t.add_column(setup["algorithm"] if spec else "no speculation", justify="right")
    if spec:
        t.add_column("no speculation", justify="right")
    base = result.get("baseline", {})

    def row(label: str, key: str, digits: int = 1, sub: str | None = None) -> None:
        val = result[key][sub] if sub else result[key]
        cells = [label, _f(val, digits)]
        if spec:
            bval = base[key][sub] if sub else base[key]
            cells.append(_f(bval, digits))
        t.add_row(*cells)

    row("per-request decode tok/s", "tokens_per_s")
    row("total throughput tok/s", "throughput_tokens_per_s")
    row("accept length (incl. bonus)", "accept_length", 2)
    row("mean batch size", "mean_batch_size", 1)
    if result.get("retractions") or base.get("retractions"):  # the KV cache ran out: SGLang's retract_decode
        row("retractions (KV cache full)", "retractions", 0)
    if result.get("cached_prompt_tokens"):  # a shared prefix or a conversation's history: the radix cache's share
        row("prompt tokens prefilled", "prefill_tokens", 0)
        row("prompt tokens from the radix cache", "cached_prompt_tokens", 0)
    row("iteration ms", "iteration_ms", 2)
    for k in BREAKDOWN_KEYS:
        row(f"  {BREAKDOWN_LABELS[k]} ms", "breakdown_ms", 2, sub=k)
    row("roofline tok/s (full bandwidth, free comm)", "roofline_tokens_per_s")
    for p in ("p50", "p90", "p99"):
        row(f"TTFT {p} ms", "ttft_ms", 1, sub=p)
    for p in ("p50", "p90", "p99"):
        row(f"inter-token latency {p} ms", "itl_ms", 2, sub=p)
    console.print(t)
    if spec:
        verdict = "faster" if result["speedup"] >= 1 else "SLOWER"
        console.print(
            f"speedup {result['speedup']:.2f}x per request ({verdict} than no speculation), "
            f"{result['throughput_speedup']:.2f}x throughput; "
            f"break-even accept length {result['break_even_accept_length']:.2f} "
            f"(this setup: {result['accept_length']:.2f})"
        )
    acceptance_source = result.get("sources", {}).get("acceptance")
    if spec and acceptance_source:
        console.print(f"acceptance: {escape(acceptance_source)}", highlight=False)
    b = result["breakdown_ms"]
    total = sum(b.values()) or 1.0
    comm = (b["draft_comm"] + b["verify_comm"]) / total
    console.print(f"communication is {comm:.0%} of each iteration; "
                  f"roofline bound {result['roofline_tokens_per_s']:.0f} tok/s")
    hypothetical = setup.get("hypothetical_interconnect")
    if hypothetical:
        console.print(f"[yellow]hypothetical interconnect:[/] {escape(hypothetical)}", highlight=False)
