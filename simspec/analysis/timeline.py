"""The simulated run as a Chrome trace (`traceEvents` JSON), loadable in Perfetto or chrome://tracing.

Drawn from the engine's raw iteration records, so every iteration's spans add up to exactly the time the
engine charged it. Tracks (one process per run): "iterations" (one span per engine iteration), "GPU (TP
rank 0)" (draft and verify forwards, their compute and every tensor-parallel collective), "CPU (scheduler)"
(the CPU time the iteration exposes). The model knows a forward's total compute and the time of each
collective; how compute falls between two collectives it does not know, so the timeline spreads it evenly
over the decoder layers (2 slices per layer, as SGLang's decoder layer does attention -> all-reduce ->
MLP/MoE -> all-reduce). Totals are exact; positions inside a forward are illustrative.

Detail is bounded: the first `detail_iterations` decode iterations show every collective; later ones show one
compute and one communication span per phase (their sums are the same), so a 10,000-iteration trace stays a
few MB.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simspec.simulate import SimulationResult
from simspec.timing.iteration import IterationModel
from simspec.timing.stack import ACTIVATION_BYTES

PID = 1
TID_ITER, TID_GPU, TID_CPU = 1, 2, 3


def _span(name: str, cat: str, tid: int, ts_us: float, dur_us: float, args: dict | None = None) -> dict[str, Any]:
    ev = {"name": name, "cat": cat, "ph": "X", "pid": PID, "tid": tid, "ts": round(ts_us, 3),
          "dur": round(max(dur_us, 0.0), 3)}
    if args:
        ev["args"] = args
    return ev


def _forward_spans(model: IterationModel, bs: int, t_us: float, label: str, cat: str, is_draft: bool,
                   compute_us: float, comm_us: float, detailed: bool, index: int) -> tuple[list[dict], float]:
    """Spans of one phase (all draft forwards, or the verify) placed from t_us; returns them and the end.
    Every span carries its iteration's index (args.iteration), so a tool can group them exactly."""
    out: list[dict] = []
    tag = {"iteration": index}
    if not detailed or comm_us <= 0:
        if compute_us > 0:
            out.append(_span(f"{label} compute", f"{cat}_compute", TID_GPU, t_us, compute_us, tag))
            t_us += compute_us
        if comm_us > 0:
            out.append(_span(f"{label} collectives", f"{cat}_comm", TID_GPU, t_us, comm_us, tag))
            t_us += comm_us
        return out, t_us
    plan = [p for p in model.plan(bs) if p.is_draft == is_draft]
    fm = model.draft if is_draft else model.target
    assert fm is not None
    stack, coll = fm.stack, model.collectives
    pbs, _ = model.padded(bs)
    # forwards whose modelled communication is zero (a profiled draft step) draw none
    forwards = [(p.tokens_per_request, p.logit_tokens_per_request) for p in plan for _ in range(p.repeats)
                if p.comm_ms > 0]
    if not forwards:
        return _forward_spans(model, bs, t_us, label, cat, is_draft, compute_us, comm_us, False, index)
    # each forward's collectives at their modelled sizes; the recorded total is shared out in proportion so
    # the spans sum to exactly what the engine charged
    calls: list[list[tuple[str, float, int]]] = []
    for q, logits in forwards:
        nbytes = pbs * q * stack.hidden_size * ACTIVATION_BYTES
        ar = coll.all_reduce_us(nbytes)
        fcalls = [("all_reduce", ar, nbytes)] * stack.all_reduces_per_forward
        ag_bytes = pbs * logits * stack.logits_vocab * ACTIVATION_BYTES
        fcalls.append(("all_gather (logits)", coll.all_gather_us(ag_bytes), ag_bytes))
        calls.append(fcalls)
    modelled = sum(t for f in calls for _, t, _ in f)
    scale = comm_us / modelled if modelled > 0 else 0.0
    per_forward_compute = compute_us / len(forwards)
    for i, fcalls in enumerate(calls):
        slices = len(fcalls)  # compute before each collective: embedding, 2 per layer, then the LM head
        piece = per_forward_compute / slices
        name = f"{label} forward {i + 1}" if len(forwards) > 1 else label
        for op, t, nbytes in fcalls:
            out.append(_span(f"{name} compute", f"{cat}_compute", TID_GPU, t_us, piece, tag))
            t_us += piece
            out.append(_span(op, f"{cat}_comm", TID_GPU, t_us, t * scale, {"bytes": int(nbytes), **tag}))
            t_us += t * scale
    return out, t_us


def chrome_trace(result: SimulationResult, *, detail_iterations: int = 50) -> dict[str, Any]:
    """The run as a Chrome trace object. Times in microseconds from the start of the simulation."""
    rs = result.resolved
    model = IterationModel(rs)
    name = rs.scenario.name
    events: list[dict] = [
        {"name": "process_name", "ph": "M", "pid": PID, "args": {"name": f"simspec: {name} ({rs.algorithm})"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_ITER, "args": {"name": "iterations"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_GPU, "args": {"name": "GPU (TP rank 0)"}},
        {"name": "thread_name", "ph": "M", "pid": PID, "tid": TID_CPU, "args": {"name": "CPU (scheduler)"}},
    ]
    detailed_left = detail_iterations
    cols = result.iterations.itertuples(index=False)
    for i, it in enumerate(cols):
        start, end = it.start_ms * 1e3, it.end_ms * 1e3
        args = {"batch_size": int(it.batch_size), "tokens": int(it.tokens), "index": i}
        events.append(_span(f"{it.kind} bs={int(it.batch_size)}", it.kind, TID_ITER, start, end - start, args))
        t = start
        if it.cpu_ms > 0:
            events.append(_span("scheduler (exposed CPU)", "cpu", TID_CPU, t, it.cpu_ms * 1e3, {"iteration": i}))
            t += it.cpu_ms * 1e3
        detailed = it.kind == "decode" and detailed_left > 0 and rs.scenario.server.tp > 1
        if it.kind == "decode":
            detailed_left -= 1
        draft_label = "prefill (draft model)" if it.kind == "prefill" else "draft"
        verify_label = "prefill" if it.kind == "prefill" else ("verify" if rs.speculative else "decode")
        spans, t = _forward_spans(model, int(it.batch_size), t, draft_label, "draft", True,
                                  it.draft_compute_ms * 1e3, it.draft_comm_ms * 1e3,
                                  detailed and model.draft is not None, i)
        events += spans
        spans, t = _forward_spans(model, int(it.batch_size), t, verify_label, "verify", False,
                                  it.verify_compute_ms * 1e3, it.verify_comm_ms * 1e3, detailed, i)
        events += spans
    return {"traceEvents": events, "displayTimeUnit": "ms",
            "otherData": {"generator": "simspec", "scenario": name, "algorithm": rs.algorithm}}


def write_chrome_trace(result: SimulationResult, path: str | Path, *, detail_iterations: int = 50) -> int:
    """Write the trace; returns the number of events."""
    trace = chrome_trace(result, detail_iterations=detail_iterations)
    Path(path).write_text(json.dumps(trace, separators=(",", ":")))
    return len(trace["traceEvents"])
