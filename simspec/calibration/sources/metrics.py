"""SGLang's Prometheus `/metrics` text (`--enable-metrics`) -> `name{labels}` -> value, and helpers to read it.

Metric names read from SGLang's collectors: 0.5.8 srt/metrics/collector.py; 0.5.10 and 0.5.23
srt/observability/metrics_collector.py. Used here, in every version 0.5.8-0.5.23:
- gauges `sglang:spec_accept_length`, `sglang:spec_accept_rate`, `sglang:gen_throughput`,
  `sglang:num_running_reqs`, `sglang:num_queue_reqs`, `sglang:token_usage` (scheduler labels `model_name`,
  `engine_type`, `tp_rank`, `pp_rank`, `moe_ep_rank`, plus `dp_rank` with DP attention);
- histograms `sglang:inter_token_latency_seconds`, `sglang:time_to_first_token_seconds`,
  `sglang:e2e_request_latency_seconds` (tokenizer labels: `model_name`);
- counter `sglang:cuda_graph_passes_total{mode}`.
Version differences: GPU busy time is `sglang:gpu_execution_seconds_total{category}` in 0.5.8/0.5.10 and
`sglang:forward_execution_seconds_total{category}` in 0.5.23; 0.5.23 adds `sglang:spec_verify_calls_total`,
`sglang:spec_num_steps`, `sglang:spec_num_draft_tokens`, `sglang:spec_cap_length`,
`sglang:spec_block_accept_length` and the histogram `sglang:request_time_per_output_token_seconds`.
"""

from __future__ import annotations

import math
from pathlib import Path

from simspec.calibration.measurements import Measurements
from simspec.calibration.sources.common import open_text
from simspec.errors import InputError

Samples = dict[str, float]

GPU_BUSY_COUNTERS = ("sglang:forward_execution_seconds_total", "sglang:gpu_execution_seconds_total")


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def sample_key(name: str, labels: dict[str, str]) -> str:
    """`name{a="1",b="x"}` with labels sorted; the bare name without labels."""
    if not labels:
        return name
    return name + "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in sorted(labels.items())) + "}"


def split_key(key: str) -> tuple[str, dict[str, str]]:
    """Inverse of sample_key."""
    if "{" not in key:
        return key, {}
    name, _, rest = key.partition("{")
    labels: dict[str, str] = {}
    i, body = 0, rest[:-1]
    while i < len(body):
        eq = body.index("=", i)
        k = body[i:eq]
        j, value = eq + 2, []
        while body[j] != '"':
            if body[j] == "\\":
                j += 1
                value.append({"n": "\n"}.get(body[j], body[j]))
            else:
                value.append(body[j])
            j += 1
        labels[k] = "".join(value)
        i = j + 2  # past the closing quote and the comma
    return name, labels


def parse_metrics_text(text: str, *, file: str | None = None) -> tuple[Samples, int]:
    """Prometheus text exposition -> ({name{labels}: value}, number of non-finite samples left out)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Samples = {}
    dropped = 0
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if not math.isfinite(s.value):
                    dropped += 1
                    continue
                out[sample_key(s.name, dict(s.labels))] = float(s.value)
    except (ValueError, TypeError, IndexError, KeyError) as err:
        why = str(err)
        why = ascii(why[:120] + ("..." if len(why) > 120 else ""))[1:-1]  # quoted input: short and printable
        raise InputError(f"not Prometheus text exposition format ('name{{label=\"value\"}} number' lines): {why}",
                         file=file, key=_bad_line(text)) from None
    return out, dropped


def _binary_line(text: str) -> int | None:
    """The first line holding what Prometheus text (UTF-8) never does: an undecodable byte (open_text replaced it
    with U+FFFD) or a control character other than tab and line ends; None for a text file."""
    for n, line in enumerate(text.splitlines(), start=1):
        if any(c == "\ufffd" or (ord(c) < 32 and c not in "\t\r\n") or ord(c) == 127 for c in line):
            return n
    return None


def _bad_line(text: str) -> str | None:
    """The first sample line the parser rejects on its own, to name it in the error."""
    from prometheus_client.parser import text_string_to_metric_families

    for n, line in enumerate(text.splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        try:
            for family in text_string_to_metric_families(line + "\n"):
                list(family.samples)
        except (ValueError, TypeError, IndexError, KeyError):
            return f"line {n}"
    return None


def read_metrics(path: str | Path) -> Measurements:
    """A saved `/metrics` scrape (e.g. `curl host:port/metrics > m.prom`) -> Measurements.prometheus."""
    file = str(path)
    text = "".join(open_text(path))
    binary = _binary_line(text)
    if binary is not None:
        raise InputError("not Prometheus text: the file holds binary data (bytes that are not UTF-8 text, or control"
                         " characters); save the scrape as text, e.g. curl HOST:PORT/metrics > metrics.prom",
                         file=file, key=f"line {binary}")
    samples, dropped = parse_metrics_text(text, file=file)
    if not any(k.startswith("sglang:") for k in samples):
        raise InputError("no sglang:* metric found (is the server started with --enable-metrics?)", file=file)
    note = f", {dropped} non-finite samples left out" if dropped else ""
    return Measurements(prometheus=samples, sources=[f"metrics:{file}: {len(samples)} samples{note}"])


def values(samples: Samples, name: str, **labels: str) -> list[tuple[dict[str, str], float]]:
    """Every sample of one metric name whose labels include `labels`."""
    out = []
    for key, v in samples.items():
        n, lab = split_key(key)
        if n == name and all(lab.get(k) == str(want) for k, want in labels.items()):
            out.append((lab, v))
    return out


def gauge(samples: Samples, name: str, *, reduce: str = "mean", **labels: str) -> float | None:
    """One figure from a gauge reported by several ranks: their mean, sum, min or max; None if absent."""
    vs = [v for _, v in values(samples, name, **labels)]
    if not vs:
        return None
    return {"mean": sum(vs) / len(vs), "sum": sum(vs), "min": min(vs), "max": max(vs)}[reduce]


def spec_accept_length(samples: Samples) -> float | None:
    """`sglang:spec_accept_length`: the accept length (bonus included) over the last decode-log interval, mean over
    DP ranks. SGLang reports 0 without speculation; that is returned as None."""
    v = gauge(samples, "sglang:spec_accept_length")
    return v if v else None


def gen_throughput(samples: Samples) -> float | None:
    """`sglang:gen_throughput`: output tok/s over the last decode-log interval, summed over DP ranks."""
    return gauge(samples, "sglang:gen_throughput", reduce="sum")


def gpu_busy_seconds(samples: Samples) -> float | None:
    """Total forward-pass GPU busy time, all categories (0.5.23 forward_execution_*, older gpu_execution_*)."""
    for name in GPU_BUSY_COUNTERS:
        v = gauge(samples, name, reduce="sum")
        if v is not None:
            return v
    return None


def histogram(samples: Samples, name: str, *, before: Samples | None = None) -> dict | None:
    """A histogram summed over its label sets: {"buckets": [(le, cumulative count)], "sum", "count", "mean"}.

    With `before` (an earlier scrape of the same server), the figures are the differences: what the run between
    the two scrapes added. None when the histogram is absent.
    """
    def collect(s: Samples) -> tuple[dict[float, float], float, float]:
        buckets: dict[float, float] = {}
        for lab, v in values(s, name + "_bucket"):
            le = float(lab.get("le", "inf"))
            buckets[le] = buckets.get(le, 0.0) + v
        total = sum(v for _, v in values(s, name + "_sum"))
        count = sum(v for _, v in values(s, name + "_count"))
        return buckets, total, count

    buckets, total, count = collect(samples)
    if not buckets and not values(samples, name + "_count"):
        return None
    if before is not None:
        b0, t0, c0 = collect(before)
        buckets = {le: v - b0.get(le, 0.0) for le, v in buckets.items()}
        total, count = total - t0, count - c0
    return {"buckets": sorted(buckets.items()), "sum": total, "count": count,
            "mean": total / count if count > 0 else None}


def histogram_mean(samples: Samples, name: str, *, before: Samples | None = None) -> float | None:
    """Mean of a histogram (sum / count), e.g. `sglang:inter_token_latency_seconds` -> mean ITL in seconds."""
    h = histogram(samples, name, before=before)
    return h["mean"] if h else None
