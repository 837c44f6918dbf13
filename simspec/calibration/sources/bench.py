"""SGLang's benchmark result files -> Measurements. Three formats, told apart per JSON line by their fields.

- `python -m sglang.bench_serving --output-file F` appends one JSON object per run (0.5.8/0.5.10
  sglang/bench_serving.py `benchmark()`; 0.5.23 sglang/benchmark/serving.py): `duration`, `completed`,
  `total_output_tokens`, `output_throughput`, `mean|median|std|p99_{ttft,tpot,itl,e2e_latency}_ms` (0.5.23 adds
  p90/p95 of each), `max_concurrency` (the cap, null when unset), `concurrency` (achieved: sum of request
  latencies / duration), `accept_length` (the server's avg_spec_accept_length, null without speculation),
  `server_info` (/get_server_info: server args + `version` + `internal_states`). `--output-details` adds per
  request `input_lens`, `output_lens`, `ttfts` (s), `itls` (s, one list per request), `generated_texts`, `errors`.
  bench_serving's sglang backend splits a chunk's gap evenly over its tokens, so sum(itls) is the request's
  decode time either way.
- `python -m sglang.bench_one_batch_server` appends (0.5.8/0.5.10 sglang/test/bench_one_batch_server_internal.py
  `BenchOneCaseResult.dump_to_jsonl`; 0.5.23 sglang/benchmark/one_batch_server.py): `run_name`, `batch_size`,
  `input_len`, `output_len`, `latency`, `input_throughput`, `output_throughput` (batch x output tokens / (latency
  - last_ttft)), `overall_throughput`, `last_ttft`, `last_gen_throughput`, `acc_length` (-1 without
  speculation), `cache_hit_rate`; 0.5.23 adds `total_output_tokens`, `num_early_stopped`,
  `steady_state_output_throughput`, `steady_state_window_s`.
- `python -m sglang.bench_one_batch` (no server, never speculative) writes on rank 0 (0.5.8/0.5.10
  sglang/bench_one_batch.py `latency_test_run_once`; 0.5.23 sglang/benchmark/one_batch.py): `run_name`,
  `batch_size`, `input_len`, `output_len`, `prefill_latency`, `prefill_throughput`, `median_decode_latency`,
  `median_decode_throughput`, `total_latency`, `overall_throughput` (seconds, tok/s).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from simspec.calibration.measurements import (
    Measurements,
    RequestRecord,
    ServerDescription,
    StepTime,
    ThroughputPoint,
)
from simspec.calibration.sources.common import open_text, server_description_from_args, skipped_note
from simspec.errors import InputError

SERVING_KEYS = ("duration", "completed", "output_throughput")
ONE_BATCH_SERVER_KEYS = ("batch_size", "latency", "last_ttft", "output_throughput")
ONE_BATCH_KEYS = ("batch_size", "total_latency")


def _num(rec: dict, key: str) -> float | None:
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v):
        return None
    return float(v)


def _need(rec: dict, key: str, where: str, *, positive: bool = True) -> float:
    v = _num(rec, key)
    if v is None or (positive and v <= 0):
        raise ValueError(f"field {key!r} must be a {'positive ' if positive else ''}number, got {rec.get(key)!r}")
    return v


def record_kind(rec: Any) -> str | None:
    """'serving' | 'one_batch_server' | 'one_batch' | None, from the fields a JSON object carries."""
    if not isinstance(rec, dict):
        return None
    if all(k in rec for k in SERVING_KEYS):
        return "serving"
    if all(k in rec for k in ONE_BATCH_SERVER_KEYS):
        return "one_batch_server"
    if all(k in rec for k in ONE_BATCH_KEYS) and ("median_decode_latency" in rec or "prefill_latency" in rec):
        return "one_batch"
    return None


def _serving_requests(rec: dict, concurrency: int) -> tuple[list[RequestRecord], list[float]]:
    """Per-request records and decode rates from --output-details; ([], []) when absent."""
    outs, ins, ttfts, itls = rec.get("output_lens"), rec.get("input_lens"), rec.get("ttfts"), rec.get("itls")
    if not (isinstance(outs, list) and isinstance(itls, list) and len(outs) == len(itls)):
        return [], []
    errors = rec.get("errors") if isinstance(rec.get("errors"), list) else [""] * len(outs)
    requests, rates = [], []
    for i, (out, gaps) in enumerate(zip(outs, itls, strict=True)):
        if errors[i] if i < len(errors) else False:
            continue  # a failed request
        if not isinstance(out, int) or not isinstance(gaps, list) or out <= 0:
            continue
        if not all(isinstance(g, int | float) and g >= 0 for g in gaps):
            raise ValueError(f"itls[{i}] must be a list of non-negative seconds")
        ttft = ttfts[i] if isinstance(ttfts, list) and i < len(ttfts) and isinstance(ttfts[i], int | float) else None
        decode_s = float(sum(gaps))
        if out > 1 and decode_s > 0:
            rates.append((out - 1) / decode_s)
        chunk_times: list[float] = []
        chunk_tokens: list[int] = []
        if ttft is not None and len(gaps) + 1 == out:
            # one entry per token (sglang backend) or one token per chunk: times relative to the request's send
            t = float(ttft)
            chunk_times = [t]
            for g in gaps:
                t += g
                chunk_times.append(t)
            chunk_tokens = [1] * len(chunk_times)
        prompt = ins[i] if isinstance(ins, list) and i < len(ins) and isinstance(ins[i], int) else 0
        requests.append(RequestRecord(concurrency=concurrency, prompt_tokens=prompt, completion_tokens=out,
                                      e2e_latency=(float(ttft) + decode_s) if ttft is not None else None,
                                      chunk_times=chunk_times, chunk_tokens=chunk_tokens))
    return requests, rates


def _serving(rec: dict, where: str, src: str) -> tuple[ThroughputPoint, list[RequestRecord], dict | None]:
    _need(rec, "duration", where)
    completed = _need(rec, "completed", where)
    output_tps = _need(rec, "output_throughput", where)
    cap = rec.get("max_concurrency")
    if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
        concurrency = cap
        how = "max_concurrency"
    else:
        achieved = _num(rec, "concurrency")
        concurrency = max(1, round(achieved)) if achieved else 1
        how = "achieved concurrency"
    requests, rates = _serving_requests(rec, concurrency)
    if rates:
        tokens_per_s = sum(rates) / len(rates)
        how_rate = f"mean over {len(rates)} requests of (output_len - 1) / sum(itls)"
    else:
        tpot = _need(rec, "mean_tpot_ms", where)
        tokens_per_s = 1000.0 / tpot
        how_rate = "1000 / mean_tpot_ms"
    accept = _num(rec, "accept_length")
    point = ThroughputPoint(concurrency=concurrency, tokens_per_s=tokens_per_s, throughput_tokens_per_s=output_tps,
                            accept_length=accept if accept and accept > 0 else None,
                            source=f"{src} {where} (bench_serving, {int(completed)} requests, concurrency from {how};"
                                   f" tok/s = {how_rate})")
    info = rec.get("server_info")
    return point, requests, info if isinstance(info, dict) else None


def _step_time_dict(info: dict, where: str, src: str) -> list[StepTime]:
    """server_info.internal_states[0].step_time_dict (SGLANG_RECORD_STEP_TIME=1): running batch -> the wall time of
    each decode-log interval / decode_log_interval (sglang/srt/managers/scheduler_metrics_mixin.py)."""
    states = info.get("internal_states")
    table = states[0].get("step_time_dict") if isinstance(states, list) and states and isinstance(states[0], dict) \
        else None
    if not isinstance(table, dict):
        return []
    out = []
    for bs, times in table.items():
        try:
            n = int(bs)
        except ValueError:
            raise ValueError(f"server_info step_time_dict key {bs!r} is not a batch size") from None
        vals = [float(t) for t in times if isinstance(t, int | float) and t > 0] if isinstance(times, list) else []
        if n > 0 and vals:
            out.append(StepTime(batch_size=n, seconds=sum(vals) / len(vals), samples=len(vals),
                                source=f"{src} {where} (server_info step_time_dict: decode-log interval / interval"
                                       " length)"))
    return out


def _one_batch_server(rec: dict, where: str, src: str) -> tuple[ThroughputPoint, StepTime | None]:
    bs = _need(rec, "batch_size", where)
    if bs != int(bs):
        raise ValueError(f"batch_size must be an integer, got {rec['batch_size']!r}")
    bs = int(bs)
    out_tps = _need(rec, "output_throughput", where)
    acc = _num(rec, "acc_length")
    acc = acc if acc and acc > 0 else None
    point = ThroughputPoint(concurrency=bs, tokens_per_s=out_tps / bs, throughput_tokens_per_s=out_tps,
                            accept_length=acc,
                            source=f"{src} {where} (bench_one_batch_server: output_throughput / batch_size)")
    step = None
    gen = _num(rec, "last_gen_throughput")
    if gen and gen > 0:
        # the server's last decode-log interval: per-iteration time = batch x accept len / gen throughput
        step = StepTime(batch_size=bs, seconds=bs * (acc or 1.0) / gen, samples=1,
                        source=f"{src} {where} (bench_one_batch_server: batch x acc_length / last_gen_throughput,"
                               " the server's last decode-log interval)")
    return point, step


def _one_batch(rec: dict, where: str, src: str) -> tuple[ThroughputPoint | None, StepTime | None]:
    bs = _need(rec, "batch_size", where)
    if bs != int(bs):
        raise ValueError(f"batch_size must be an integer, got {rec['batch_size']!r}")
    bs = int(bs)
    if "median_decode_latency" not in rec:
        return None, None  # output_len 1: prefill only
    lat = _need(rec, "median_decode_latency", where)
    tps = _num(rec, "median_decode_throughput")
    step = StepTime(batch_size=bs, seconds=lat, samples=1,
                    source=f"{src} {where} (bench_one_batch median_decode_latency, no speculation)")
    point = ThroughputPoint(concurrency=bs, tokens_per_s=1.0 / lat, throughput_tokens_per_s=tps or bs / lat,
                            source=f"{src} {where} (bench_one_batch: 1 / median_decode_latency)")
    return point, step


def _records(path: str | Path) -> list[tuple[str, Any]]:
    """(where, parsed JSON or the error) per non-empty line; a whole-file JSON document when lines do not parse."""
    lines = list(open_text(path))
    out: list[tuple[str, Any]] = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            out.append((f"line {n}", json.loads(line)))
        except json.JSONDecodeError as err:
            out.append((f"line {n}", err))
    if out and isinstance(out[0][1], json.JSONDecodeError):
        try:  # a pretty-printed object or a JSON array
            doc = json.loads("".join(lines))
        except json.JSONDecodeError:
            return out
        items = doc if isinstance(doc, list) else [doc]
        return [(f"record {i}", item) for i, item in enumerate(items, start=1)]
    return out


def read_bench(path: str | Path) -> Measurements:
    """Read bench_serving / bench_one_batch_server / bench_one_batch output (JSON lines, any mix) into Measurements.

    One ThroughputPoint per run line: bench_serving's concurrency is `max_concurrency` (or the achieved
    concurrency rounded when no cap was set), its per-request decode tok/s the mean over requests of
    (output_len - 1) / sum(itls) with --output-details, else 1000 / mean_tpot_ms (the rate at the mean TPOT,
    slightly below the mean rate); bench_one_batch_server's is output_throughput / batch_size; bench_one_batch's
    1 / median_decode_latency. StepTimes: bench_one_batch's median decode latency per batch size, and
    bench_one_batch_server's last decode-log interval (batch x acc_length / last_gen_throughput). With
    --output-details each request becomes a RequestRecord whose chunk_times are seconds since the request was
    sent (first token at ttft). The server description comes from the first `server_info`, and its
    `internal_states[0].step_time_dict` (SGLANG_RECORD_STEP_TIME=1) gives StepTimes too.
    Lines that are not JSON or not one of the three formats are skipped and counted in `sources`; a file with
    no readable line is an InputError.
    """
    file = str(path)
    src = f"bench:{file}"
    skipped: list[tuple[str, str]] = []
    throughput: list[ThroughputPoint] = []
    step_times: list[StepTime] = []
    requests: list[RequestRecord] = []
    server: ServerDescription | None = None
    kinds: dict[str, int] = {}
    for where, rec in _records(path):
        if isinstance(rec, json.JSONDecodeError):
            skipped.append((where, f"not JSON ({rec.msg})"))
            continue
        kind = record_kind(rec)
        if kind is None:
            keys = ", ".join(sorted(rec)[:6]) if isinstance(rec, dict) else type(rec).__name__
            skipped.append((where, f"not a bench_serving ({', '.join(SERVING_KEYS)}), bench_one_batch_server"
                                   f" ({', '.join(ONE_BATCH_SERVER_KEYS)}) or bench_one_batch"
                                   f" ({', '.join(ONE_BATCH_KEYS)}, median_decode_latency) record; has {keys}"))
            continue
        try:
            if kind == "serving":
                point, reqs, info = _serving(rec, where, src)
                throughput.append(point)
                requests += reqs
                step_times += _step_time_dict(info, where, src) if info is not None else []
                if info is not None and server is None:
                    server = server_description_from_args(info, file=file, key=f"{where}.server_info")
            elif kind == "one_batch_server":
                point, step = _one_batch_server(rec, where, src)
                throughput.append(point)
                step_times += [step] if step else []
            else:
                point1, step = _one_batch(rec, where, src)
                throughput += [point1] if point1 else []
                step_times += [step] if step else []
        except ValueError as err:
            skipped.append((where, str(err)))
            continue
        kinds[kind] = kinds.get(kind, 0) + 1
    if not kinds:
        where, why = skipped[0] if skipped else ("file", "empty")
        raise InputError(f"no readable benchmark record: {why}", file=file, key=where)
    sources = [f"{src}: " + ", ".join(f"{n} {k} records" for k, n in sorted(kinds.items()))]
    if skipped:
        sources.append(skipped_note(src, skipped))
    return Measurements(server=server or ServerDescription(), requests=requests, step_times=step_times,
                        throughput=throughput, sources=sources)
