#!/usr/bin/env python3
"""The per-kernel floors and the weight-streaming rate of one GPU, as simspec's time model charges them.

    python3 calibration/kernel_floor_bench.py --out gpu.json

simspec prices a decode forward as the bytes its kernels stream over an efficiency-scaled bandwidth, plus, per
kernel, a boundary inside the CUDA graph (kernel_gap_graph_us) and, for kernels that move almost no bytes, a floor
(small_kernel_us); presets/defaults.yaml takes both from H100 sources and assumes other GPUs alike. This script
measures them on the GPU it runs on, with nothing but torch:

- copy: a large device-to-device copy (cudaMemcpy in a graph), bytes read plus written over time.
- streams: kernels that only move bytes, x.sum() (reads) and torch.mul(x, 2, out=y) (reads and writes), from
  1 MiB to 1 GiB over distinct buffers: the streaming ceiling, and what a kernel costs beyond its bytes.
- graph_chain: N one-element kernels captured in one CUDA graph, N from 1 to 4,000; the slope of GPU time over N
  is the cost of one trivial kernel in a graph (boundary plus the least a kernel runs), the intercept the graph's
  own start. A profiler trace of one replay splits the slope into kernel duration and the gap between kernels.
- small_ops: the small kernels of a decode layer as torch launches them (RMSNorm, SiLU-and-multiply, a KV-cache
  row store, top-k over routed experts, a per-token FP8 quantisation, a residual add) at batch 1, 8 and 64:
  each op captured 200 times in one graph, its kernels counted from a profiler trace, the time per kernel.
  These are torch's kernels, not SGLang's (sgl-kernel and FlashInfer are not needed here): a proxy of the same
  kind of work.
- gemm: bf16 (and FP8, torch._scaled_mm, per-tensor scales) x @ W.T for decode batch sizes, over distinct
  weights that together hold far more than the L2, so that every GEMM streams its weight from DRAM as a decode
  forward does; the achieved bandwidth and arithmetic rate per shape and batch, and at batch 1, 16 and 64 the
  kernels each GEMM launches (a split-K GEMM adds a reduction) from a profiler trace.

Each figure is the median of repeated graph replays timed with CUDA events. Results are JSON; the last lines
printed are a summary. Never changes clocks or other GPU settings.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import sys
import time
import traceback

import torch
import torch.nn.functional as F
from cupti_trace import kernel_events


def replay_us(graph: torch.cuda.CUDAGraph, replays: int) -> list[float]:
    """GPU time of each of `replays` replays of `graph` (us), after three untimed ones."""
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return times


def capture(fn, calls: int) -> torch.cuda.CUDAGraph:
    """`fn` called `calls` times, captured in one CUDA graph (after a warm-up on a side stream, as torch asks)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def trace_kernels(run) -> list[tuple[float, float]]:
    """(start us, duration us) of every GPU kernel `run()` launches, from a torch profiler (CUPTI) trace."""
    return [(float(e["ts"]), float(e["dur"])) for e in kernel_events(run, with_cpu=True)]


def split_trace(kernels: list[tuple[float, float]]) -> dict:
    """Median kernel duration and median gap (next start - this end) over a traced run."""
    if len(kernels) < 2:
        return {"kernels": len(kernels)}
    gaps = [b[0] - (a[0] + a[1]) for a, b in zip(kernels, kernels[1:], strict=False)]
    return {"kernels": len(kernels), "median_duration_us": statistics.median(d for _, d in kernels),
            "median_gap_us": statistics.median(gaps),
            "span_per_kernel_us": (kernels[-1][0] + kernels[-1][1] - kernels[0][0]) / len(kernels)}


def linear_fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return slope, my - slope * mx


def time_calls(run, calls: int, replays: int, traced: bool, per: str) -> dict:
    """`run` (which makes `calls` calls) captured once: the median time per call (us), and where `traced` the
    kernels per call (`per`) and the trace's split into durations and gaps."""
    graph = capture(run, 1)
    row: dict = {"us": statistics.median(replay_us(graph, replays)) / calls}
    if traced:
        try:
            kernels = trace_kernels(graph.replay)
            row[per] = len(kernels) / calls
            row["trace"] = split_trace(kernels)
        except Exception as exc:  # the profiler is a bonus: the event timing stands without it
            row["trace_error"] = repr(exc)
    return row


def measure_copy(replays: int) -> dict:
    n = 1 << 30  # 2 GiB of bf16 each way
    src = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    graph = capture(lambda: dst.copy_(src), 1)
    us = statistics.median(replay_us(graph, replays))
    moved = 2 * src.numel() * src.element_size()
    return {"bytes_read_plus_written": moved, "median_us": us, "gb_per_s": moved / us / 1e3}


def measure_graph_chain(replays: int) -> dict:
    x = torch.zeros(1, device="cuda", dtype=torch.float32)
    rows = []
    for n in (1, 10, 100, 1000, 4000):
        graph = capture(lambda: x.add_(1.0), n)
        times = replay_us(graph, replays)
        rows.append({"kernels": n, "median_us": statistics.median(times), "min_us": min(times)})
        del graph
    slope, intercept = linear_fit([r["kernels"] for r in rows[2:]], [r["median_us"] for r in rows[2:]])
    # the host side of one replay: how long graph.replay() holds the CPU for a 1,000-kernel graph
    graph = capture(lambda: x.add_(1.0), 1000)
    torch.cuda.synchronize()
    host = []
    for _ in range(replays):
        t0 = time.perf_counter()
        graph.replay()
        host.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    out = {"rows": rows, "us_per_kernel": slope, "graph_start_us": intercept,
           "host_replay_call_us_1000_kernels": statistics.median(host)}
    try:
        out["trace_1000_kernels"] = split_trace(trace_kernels(graph.replay))
    except Exception as exc:  # the profiler is a bonus: the event timings above stand without it
        out["trace_error"] = repr(exc)
    return out


def small_ops(batch: int) -> dict:
    """Decode-layer small work at `batch` tokens, shapes of a DeepSeek-V3-like layer (hidden 7168, 256 experts)."""
    hidden, experts, kv_row = 7168, 256, 576
    x = torch.randn(batch, hidden, device="cuda", dtype=torch.bfloat16)
    residual = torch.randn_like(x)
    weight = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
    gate_up = torch.randn(batch, 2 * 2048, device="cuda", dtype=torch.bfloat16)
    logits = torch.randn(batch, experts, device="cuda", dtype=torch.float32)
    cache = torch.randn(65536, kv_row, device="cuda", dtype=torch.bfloat16)
    rows = torch.randint(0, 65536, (batch,), device="cuda")
    new_kv = torch.randn(batch, kv_row, device="cuda", dtype=torch.bfloat16)
    fp8_max = torch.finfo(torch.float8_e4m3fn).max

    def quant():
        scale = x.abs().amax(dim=-1, keepdim=True).float() / fp8_max
        return (x / scale).to(torch.float8_e4m3fn)

    return {
        "rms_norm": lambda: F.rms_norm(x, (hidden,), weight, 1e-6),
        "residual_add": lambda: residual.add_(x),
        "silu_and_mul": lambda: F.silu(gate_up[:, :2048]) * gate_up[:, 2048:],
        "kv_row_store": lambda: cache.index_copy_(0, rows, new_kv),
        "topk_8_of_256": lambda: torch.topk(logits, 8, dim=-1),
        "fp8_per_token_quant": quant,
    }


def measure_small_ops(replays: int, calls: int = 200) -> list[dict]:
    out = []
    for batch in (1, 8, 64):
        for name, fn in small_ops(batch).items():
            row = {"op": name, "batch": batch}
            try:
                kernels = trace_kernels(fn)
                row["kernels_per_call"] = len(kernels)
                graph = capture(fn, calls)
                per_call = statistics.median(replay_us(graph, replays)) / calls
                row["us_per_call"] = per_call
                if kernels:
                    row["us_per_kernel"] = per_call / len(kernels)
                try:
                    row["trace"] = split_trace(trace_kernels(graph.replay))
                except Exception as exc:
                    row["trace_error"] = repr(exc)
                del graph
            except Exception as exc:
                row["error"] = repr(exc)
            out.append(row)
    return out


# (K, N) of x[M, K] @ W[N, K].T: decode GEMMs of common models, whole or per TP rank
GEMM_SHAPES = {
    "llama8b_qkv": (4096, 6144), "llama8b_o": (4096, 4096), "llama8b_gate_up": (4096, 28672),
    "llama8b_down": (14336, 4096), "llama70b_tp8_gate_up": (8192, 7168), "llama70b_tp8_down": (3584, 8192),
    "qwen3_32b_tp2_gate_up": (5120, 25600), "llama70b_tp8_qkv": (8192, 1280), "llama70b_tp8_o": (1024, 8192),
    "dsv3_qkv_a": (7168, 2112), "dsv3_tp8_q_b": (1536, 3072), "dsv3_tp8_o": (2048, 7168),
    "square_2k": (2048, 2048), "square_1k": (1024, 1024), "llama8b_lm_head": (4096, 128256),
}
TRACED_BATCHES = (1, 16, 64)  # batches whose GEMMs are also traced: kernels per GEMM and their durations
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
ROTATE_BYTES = 1.5e9  # distinct weights per graph: far above a 50-60 MB L2
# at least this many calls per graph, so that the graph's own start (~5 us on an H200) is a small share of each
# (the first H200 result, calibration/measurements/, ran its 1 GB LM heads with two)
MIN_COPIES = 8


def measure_gemms(replays: int, fp8: bool) -> list[dict]:
    out = []
    dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    width = 1 if fp8 else 2
    for shape, (k, n) in GEMM_SHAPES.items():
        copies = max(MIN_COPIES, int(ROTATE_BYTES // (k * n * width)))
        weights = [(torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * 0.05).to(dtype) for _ in range(copies)]
        one = torch.ones((), device="cuda", dtype=torch.float32)
        for m in BATCHES:
            row = {"shape": shape, "k": k, "n": n, "m": m, "dtype": "fp8_e4m3" if fp8 else "bf16", "copies": copies}
            try:
                x = (torch.randn(m, k, device="cuda", dtype=torch.bfloat16) * 0.05).to(dtype)
                if fp8:
                    def run(x=x, ws=weights, one=one):
                        for w in ws:
                            torch._scaled_mm(x, w.t(), scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
                else:
                    def run(x=x, ws=weights):
                        for w in ws:
                            F.linear(x, w)
                row.update(time_calls(run, copies, replays, traced=m in TRACED_BATCHES, per="kernels_per_gemm"))
                row.update(gb_per_s=(k * n * width + m * k * width + m * n * 2) / row["us"] / 1e3,
                           tflops=2 * m * k * n / row["us"] / 1e6)
            except Exception as exc:
                row["error"] = repr(exc).splitlines()[0][:300]
            out.append(row)
        weights = run = None  # free this shape's weights before the next shape's
        torch.cuda.empty_cache()
    return out


STREAM_MIB = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def measure_streams(replays: int) -> list[dict]:
    """Kernels that only stream bytes: x.sum() (reads x) and torch.mul(x, 2, out=y) (reads x, writes y), over
    distinct buffers worth far more than the L2, as a decode forward streams its weights."""
    out = []
    for mib in STREAM_MIB:
        n = mib * (1 << 20) // 2  # bf16 elements
        copies = max(MIN_COPIES, int(ROTATE_BYTES // (n * 2)))
        xs = [torch.randn(n, device="cuda", dtype=torch.bfloat16) for _ in range(copies)]
        ys = [torch.empty_like(x) for x in xs]
        for op in ("sum", "mul"):
            row = {"op": op, "mib": mib, "copies": copies}
            try:
                if op == "sum":
                    def run(xs=xs):
                        for x in xs:
                            x.sum()
                else:
                    def run(xs=xs, ys=ys):
                        for x, y in zip(xs, ys, strict=True):
                            torch.mul(x, 2.0, out=y)
                row.update(time_calls(run, copies, replays, traced=True, per="kernels_per_call"))
                row["gb_per_s"] = n * 2 * (1 if op == "sum" else 2) / row["us"] / 1e3
            except Exception as exc:
                row["error"] = repr(exc).splitlines()[0][:300]
            out.append(row)
        xs = ys = run = None
        torch.cuda.empty_cache()
    return out


def environment() -> dict:
    props = torch.cuda.get_device_properties(0)
    env = {"gpu": props.name, "sms": props.multi_processor_count, "memory_bytes": props.total_memory,
           "l2_bytes": getattr(props, "L2_cache_size", None), "torch": torch.__version__, "cuda": torch.version.cuda,
           "host": platform.node(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    try:
        env["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception as exc:
        env["nvidia_smi"] = repr(exc)
    return env


def summary(result: dict) -> list[str]:
    lines = [f"{result['environment']['gpu']}  torch {result['environment']['torch']}"]
    if "copy" in result:
        lines.append(f"copy: {result['copy']['gb_per_s']:.0f} GB/s read+written")
    chain = result.get("graph_chain", {})
    if "us_per_kernel" in chain:
        lines.append(f"graph chain: {chain['us_per_kernel']:.3f} us per trivial kernel, graph start "
                     f"{chain['graph_start_us']:.1f} us, host replay() {chain['host_replay_call_us_1000_kernels']:.1f}"
                     f" us; trace {chain.get('trace_1000_kernels', chain.get('trace_error'))}")
    for row in result.get("small_ops", []):
        t = row.get("trace", {})
        nan = float("nan")
        lines.append(f"small {row['op']:20s} b={row['batch']:<3d} kernels={row.get('kernels_per_call', '?')} "
                     f"us/call={row.get('us_per_call', nan):.2f} us/kernel={row.get('us_per_kernel', nan):.2f}"
                     f" dur={t.get('median_duration_us', nan):.2f} gap={t.get('median_gap_us', nan):.2f}"
                     + (f" ERROR {row['error']}" if "error" in row else ""))
    for key in ("gemm_bf16", "gemm_fp8"):
        for row in result.get(key, []):
            t = row.get("trace", {})
            traced = (f" kernels/gemm={row['kernels_per_gemm']:.2f} dur={t.get('median_duration_us', 0):.2f}"
                      f" gap={t.get('median_gap_us', 0):.2f}" if "kernels_per_gemm" in row else "")
            lines.append(f"{key} {row['shape']:22s} m={row['m']:<4d} "
                         + (f"{row['us']:8.2f} us {row['gb_per_s']:7.0f} GB/s {row['tflops']:6.1f} TF/s{traced}"
                            if "us" in row else f"ERROR {row.get('error')}"))
    for row in result.get("streams", []):
        t = row.get("trace", {})
        lines.append(f"stream {row['op']:4s} {row['mib']:5d} MiB "
                     + (f"{row['us']:9.2f} us {row['gb_per_s']:7.0f} GB/s kernels={row.get('kernels_per_call', 0):.2f}"
                        f" dur={t.get('median_duration_us', 0):.2f} gap={t.get('median_gap_us', 0):.2f}"
                        if "us" in row else f"ERROR {row.get('error')}"))
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="JSON file to write (rewritten after each part)")
    p.add_argument("--replays", type=int, default=20, help="timed graph replays per figure (default 20)")
    p.add_argument("--parts", default="copy,graph_chain,gemm_bf16,gemm_fp8,streams,small_ops",
                   help="comma-separated parts, in the order run (the profiler-using small_ops last)")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_floor_bench: no CUDA device", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    result: dict = {"environment": environment(), "replays": args.replays}
    parts = {"copy": lambda: measure_copy(args.replays), "graph_chain": lambda: measure_graph_chain(args.replays),
             "small_ops": lambda: measure_small_ops(args.replays),
             "gemm_bf16": lambda: measure_gemms(args.replays, fp8=False),
             "gemm_fp8": lambda: measure_gemms(args.replays, fp8=True),
             "streams": lambda: measure_streams(args.replays)}
    for name in args.parts.split(","):
        t0 = time.time()
        try:
            result[name] = parts[name]()
        except Exception:
            result[name + "_error"] = traceback.format_exc()[-2000:]
        result.setdefault("seconds", {})[name] = round(time.time() - t0, 1)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
        print(f"[{name}: {result['seconds'][name]} s]", flush=True)
    try:
        print("\n".join(summary(result)))
    except Exception:  # the JSON is written: a summary that fails loses nothing
        traceback.print_exc()
    return 0


if __name__ == "__main__":
    sys.exit(main())
