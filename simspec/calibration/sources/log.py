"""SGLang server logs -> Measurements: decode-log lines (step time, throughput, accept length) and server_args.

The decode line, as SGLang 0.5.8-0.5.23 writes it (rank 0 of each attention-TP group, every
`--decode-log-interval` decode iterations, default 40):

    [2026-01-05 10:00:00 TP0] Decode batch, #running-req: 1, #token: 1234, token usage: 0.01, accept len: 1.52,
    accept rate: 0.38, cuda graph: True, gen throughput (token/s): 52.31, #queue-req: 0

Read from SGLang's source: 0.5.8 srt/managers/scheduler_metrics_mixin.py `log_decode_stats`; 0.5.10
srt/observability/scheduler_metrics_mixin.py `report_decode_stats`; 0.5.23
srt/managers/scheduler_components/metrics_reporter.py `report_decode_stats`. Differences:
- 0.5.8 ends with `#queue-req: N, ` (a trailing comma and space); 0.5.10 and 0.5.23 end at `#queue-req: N`,
  optionally followed by `, est. decode TFLOPS/s (per GPU): ...` (--enable-mfu-metrics) and, in 0.5.23, the
  `fwd occupancy: x%` pair (device timer).
- `accept len` / `accept rate` only with speculation; 0.5.23 adds `cap len` / `block accept len` when non-zero.
  0.5.8/0.5.10's accept rate is (accepted + bonus) / (verify steps x draft tokens); 0.5.23's is accepted drafts /
  (verify steps x (draft tokens - 1)). Only accept len, the same quantity in every version, is used.
- hybrid models print `#full token` / `#swa token` / `mamba num` (and their usages) instead of `#token`;
  disaggregated decode adds `pre-allocated usage`, `#prealloc-req`, ...; `cpu graph` / `npu graph` replace
  `cuda graph` off CUDA. `Decode batch [N]` carries the forward count with SGLANG_LOG_FORWARD_ITERS.
The prefix is `[%Y-%m-%d %H:%M:%S{ms} {ranks}] ` (srt/utils/common.py `configure_logger`): `.%(msecs)03d` with
SGLANG_LOG_MS=1, ranks ` DP{d}`, ` PP{p}`, ` ATTN_CP{c}`, ` MOE_DP{m}`, ` TP{t}`, ` EP{e}` each only when that
parallelism is on (no ranks at all with TP 1; srt/managers/scheduler.py). Ray actors put `(Actor pid=N)` first.
`Prefill batch, ...` lines (same files) mark the intervals a prefill interrupted.

Each rank also logs `Load weight begin. avail mem=78.59 GB` (srt/model_executor/model_runner.py `load_model`, the
same text in 0.5.8, 0.5.10 and 0.5.23; "GB" are GiB): the memory free after CUDA and NCCL start, which the KV
cache is sized from (model_runner_kv_cache_mixin.profile_max_num_token).
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from simspec.calibration.measurements import Measurements, ServerDescription, StepTime, ThroughputPoint
from simspec.calibration.sources.common import (
    open_text,
    parse_server_args_text,
    server_description_from_args,
    skipped_note,
)
from simspec.errors import InputError

_DECODE_SKIP = "decode line: "  # how a skipped decode-log line's reason starts

DEFAULT_DECODE_LOG_INTERVAL = 40  # ServerArgs.decode_log_interval in 0.5.8-0.5.23

_PREFIX = re.compile(r"\[(?P<ts>\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2})(?:[.,](?P<ms>\d{1,6}))?"
                     r"(?P<ranks>(?:\s+[A-Z][A-Z_]*\d+)*)\]\s*$")
_DECODE = re.compile(r"Decode batch(?: \[(?P<iter>\d+)\])?,\s*(?P<body>.*?)\s*$")
_RANK = re.compile(r"\b(?:DP|PP|ATTN_CP|MOE_DP|TP|EP)\d+\b")
_SERVER_ARGS = re.compile(r"server_args=(?=ServerArgs\(|\{)")
_PAIR = re.compile(r"^(?P<key>[^:]+?):\s*(?P<value>\S.*?)$")
_LOAD_BEGIN = re.compile(r"Load weight begin\. avail mem=(?P<gib>\d+(?:\.\d+)?) GB")


@dataclass
class DecodeLine:
    """One parsed decode-log line."""

    line: int
    rank: str  # the log prefix's ranks, e.g. "DP0 TP0" ("" with TP 1)
    time: datetime | None
    running: int
    gen_throughput: float
    accept_len: float | None
    queue: int | None
    cuda_graph: bool | None
    fields: dict[str, float | int | bool | str]
    clean: bool = False  # the previous stats line of this rank was a decode line at the same batch size


def _value(text: str) -> float | int | bool | str:
    if text in ("True", "False"):
        return text == "True"
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_decode_body(body: str) -> dict[str, float | int | bool | str]:
    """`#running-req: 1, #token: 5, ...` -> {key: value}; raises ValueError on a part that is not `key: value`."""
    out: dict[str, float | int | bool | str] = {}
    for part in body.split(","):
        part = part.strip()
        if not part:
            continue  # 0.5.8's trailing ", "
        m = _PAIR.match(part)
        if not m:
            raise ValueError(f"{part!r} is not 'name: value'")
        out[m["key"].strip()] = _value(m["value"].strip())
    return out


def _prefix(before: str) -> tuple[str, datetime | None]:
    m = _PREFIX.search(before)
    if not m:  # a custom logging config (SGLANG_LOGGING_CONFIG_PATH): keep only the rank names, not a timestamp
        return " ".join(_RANK.findall(before)), None
    ts = datetime.strptime(m["ts"], "%Y-%m-%d %H:%M:%S")
    if m["ms"]:
        ts = ts.replace(microsecond=int(m["ms"].ljust(6, "0")[:6]))
    actor = before[:m.start()].strip()
    rank = " ".join(part for part in (actor, m["ranks"].strip()) if part)
    return rank, ts


def _decode_line(n: int, line: str, idx: int) -> DecodeLine:
    rank, ts = _prefix(line[:idx])
    m = _DECODE.match(line, idx)
    if not m:
        raise ValueError("expected 'Decode batch, #running-req: N, ...'")
    fields = parse_decode_body(m["body"])
    running = fields.get("#running-req")
    gen = fields.get("gen throughput (token/s)")
    if not isinstance(running, int) or isinstance(running, bool) or running < 0:
        raise ValueError("no '#running-req: <int>'")
    if isinstance(gen, int | float) and not isinstance(gen, bool) and not (math.isfinite(gen) and gen >= 0):
        raise ValueError(f"'gen throughput (token/s)' is {gen}: allowed is a finite number >= 0")
    if not isinstance(gen, int | float) or isinstance(gen, bool):
        raise ValueError("no 'gen throughput (token/s): <number>'")
    accept = fields.get("accept len")
    if accept is not None and (not isinstance(accept, int | float) or isinstance(accept, bool)
                               or not math.isfinite(accept)):
        raise ValueError(f"accept len {accept!r} is not a finite number")
    graph = next((v for k, v in fields.items() if k.endswith(" graph") and isinstance(v, bool)), None)
    queue = fields.get("#queue-req")
    return DecodeLine(line=n, rank=rank, time=ts, running=running, gen_throughput=float(gen),
                      accept_len=float(accept) if accept is not None else None,
                      queue=queue if isinstance(queue, int) else None, cuda_graph=graph, fields=fields)


def parse_log_lines(path: str | Path
                    ) -> tuple[list[DecodeLine], dict | None, int, list[tuple[str, str]], float | None]:
    """(decode lines, server args or None, prefill lines, skipped malformed lines as (where, why), free memory at
    startup in GiB or None).

    The free memory at startup is the smallest over ranks of each rank's FIRST `Load weight begin. avail mem=X GB`
    (the target model's: the figure SGLang sizes the KV cache from). A draft model's runner logs its own line later
    (eagle_worker.py loads it after the target's weights and KV cache), with far less free."""
    file = str(path)
    decodes: list[DecodeLine] = []
    server_args: dict | None = None
    prefills = 0
    skipped: list[tuple[str, str]] = []
    last_kind: dict[str, tuple[str, int]] = {}  # rank -> ("decode", batch) | ("prefill", 0)
    first_free: dict[str, float] = {}  # rank -> its first 'Load weight begin' free memory, GiB
    for n, line in enumerate(open_text(path), start=1):
        if (m := _LOAD_BEGIN.search(line)) is not None:
            rank, _ = _prefix(line[:m.start()])
            first_free.setdefault(rank, float(m.group("gib")))
        elif "Decode batch" in line:
            idx = line.index("Decode batch")
            try:
                d = _decode_line(n, line, idx)
            except ValueError as err:
                skipped.append((f"line {n}", f"{_DECODE_SKIP}{err}"))
                continue
            prev = last_kind.get(d.rank)
            d.clean = prev == ("decode", d.running)
            last_kind[d.rank] = ("decode", d.running)
            decodes.append(d)
        elif "Prefill batch" in line:
            prefills += 1
            rank, _ = _prefix(line[:line.index("Prefill batch")])
            last_kind[rank] = ("prefill", 0)
        elif (m := _SERVER_ARGS.search(line)) is not None:
            text = line[m.end():]
            try:
                server_args = parse_server_args_text(text, file=file, key=f"line {n}")
            except InputError as err:
                skipped.append((f"line {n}", err.message))
    return decodes, server_args, prefills, skipped, min(first_free.values()) if first_free else None


def read_decode_log(path: str | Path, *, decode_log_interval: int | None = None) -> Measurements:
    """Read an SGLang server log (plain or .gz) into Measurements.

    - server: from the `server_args=...` start-up line when the log has it (algorithm mapped to simspec's names).
    - step_times: per running batch size N, the mean wall time of one scheduler iteration. Each decode line's
      `gen throughput` is the tokens generated since the previous decode line / the wall time since it
      (SGLang resets both counters at every decode line), i.e. over `decode_log_interval` K iterations. With N
      running requests each gaining `accept len` tokens per iteration (1 without speculation), the interval
      holds K x N x accept_len tokens, so per-iteration time = N x accept_len / gen_throughput: a MEAN over
      the K iterations, not a per-iteration sample. Only "clean" lines count: the previous stats line of the
      same rank was a decode line at the same N, so no prefill and no batch-size change fell in the interval
      (the first line after start-up or idling, which carries the idle gap, is never clean).
    - throughput: per N (and per logging rank when several ranks log, as with DP attention), tokens_per_s =
      gen_throughput / N (per-request decode rate), throughput_tokens_per_s = gen_throughput, from clean lines.
    - accept_lengths: the `accept len` of every speculative decode line: each is the mean over its interval's
      K x N request-steps, not a per-verify-step value.
    Lines that mention `Decode batch` or `server_args=` but cannot be read are skipped and counted in `sources`;
    a log with neither a readable decode line nor server arguments is an InputError.
    """
    file = str(path)
    decodes, args, prefills, skipped, free = parse_log_lines(path)
    if not decodes and args is None:
        where, why = skipped[0] if skipped else ("file", "")
        raise InputError("no SGLang decode-log line ('Decode batch, #running-req: N, ..., gen throughput "
                         "(token/s): X, ...') and no 'server_args=' line found" + (f" ({why})" if why else ""),
                         file=file, key=where if skipped else None)
    decode_skips = [(where, why) for where, why in skipped if why.startswith(_DECODE_SKIP)]
    if not decodes and decode_skips:
        # decode lines there, none readable: the log's timings are broken, not absent; say where and why
        where, why = decode_skips[0]
        raise InputError(f"none of the {len(decode_skips)} decode-log lines is readable, so the log gives no step"
                         f" time or throughput; the first: {why.removeprefix(_DECODE_SKIP)}", file=file, key=where)
    server = server_description_from_args(args, file=file) if args is not None else ServerDescription()
    if decode_log_interval is None:
        interval = args.get("decode_log_interval") if args else None
        decode_log_interval = interval if isinstance(interval, int) and interval > 0 else DEFAULT_DECODE_LOG_INTERVAL
    if free is not None:
        server = server.model_copy(update={"startup_free_gib": free})
    if server.cuda_graph is None and any(d.cuda_graph is not None for d in decodes):
        server = server.model_copy(update={"cuda_graph": any(d.cuda_graph for d in decodes)})

    ranks = sorted({d.rank for d in decodes})
    clean = [d for d in decodes if d.clean and d.gen_throughput > 0 and d.running > 0]
    by_n: dict[int, list[float]] = defaultdict(list)
    for d in clean:
        by_n[d.running].append(d.running * (d.accept_len or 1.0) / d.gen_throughput)
    src = f"log:{file}"
    step_times = [StepTime(batch_size=n, seconds=sum(v) / len(v), samples=len(v),
                           source=f"{src} (N x accept len / gen throughput, mean of {len(v)} decode-log intervals"
                                  f" of {decode_log_interval} iterations)")
                  for n, v in sorted(by_n.items())]

    groups: dict[tuple[str, int], list[DecodeLine]] = defaultdict(list)
    for d in clean:
        groups[(d.rank if len(ranks) > 1 else "", d.running)].append(d)
    throughput = []
    for (rank, n), ds in sorted(groups.items()):
        accepts = [d.accept_len for d in ds if d.accept_len]
        gen = sum(d.gen_throughput for d in ds) / len(ds)
        throughput.append(ThroughputPoint(
            concurrency=n, tokens_per_s=gen / n, throughput_tokens_per_s=gen,
            accept_length=sum(accepts) / len(accepts) if accepts else None,
            source=f"{src}{' rank ' + rank if rank else ''} (gen throughput at {n} running, {len(ds)} lines)"))

    accept_lengths = [d.accept_len for d in decodes if d.accept_len and d.accept_len > 0]
    sources = [f"{src}: {len(decodes)} decode lines ({len(clean)} clean intervals), {prefills} prefill lines"
               f"{', server_args' if args is not None else ''}"
               f"{f', startup free memory {free:.2f} GiB' if free is not None else ''}"
               "; accept_lengths are per-line interval means"]
    if skipped:
        sources.append(skipped_note(src, skipped))
    return Measurements(server=server, step_times=step_times, throughput=throughput,
                        accept_lengths=accept_lengths, sources=sources)
