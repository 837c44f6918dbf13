#!/usr/bin/env python3
"""SGLang's own small decode kernels (sgl-kernel) timed on one GPU, as simspec's small_kernel_us stands for them.

    python3 calibration/sgl_kernel_bench.py --out small.json [--sgl-kernel-dir DIR]

simspec charges every kernel that moves almost no bytes a boundary (kernel_gap_graph_us) and a floor
(small_kernel_us, from an H100 profile of vLLM's kernels). This script times the small kernels SGLang launches in a
decode layer, from sgl-kernel itself: RMSNorm and its fused residual add, per-token-group FP8 quantisation, SiLU-and-
multiply, the rotary embedding, DeepSeek-V3's grouped top-k gate, the fused MoE's block alignment and sum, and
Qwen3-MoE's top-k softmax, at DeepSeek-V3 (TP 8) and Qwen3 shapes, batch 1, 8 and 64. Each op is captured 200 times in
one CUDA graph; the time per call is the median of graph replays over 200, its kernels counted from a CUPTI trace,
and a one-element torch kernel is timed the same way for the boundary. `--sgl-kernel-dir` is a folder holding the
`sgl_kernel` package (an unpacked wheel: only the GPU's architecture's common_ops library is needed), and `lib/`
with any system library it lacks (libnuma).
"""

from __future__ import annotations

import argparse
import ctypes
import glob
import json
import os
import statistics
import sys
import time

import torch
from kernel_floor_bench import capture, replay_us, trace_kernels

CALLS = 200


def load_sgl_kernel(folder: str | None):
    if folder:
        for lib in sorted(glob.glob(os.path.join(folder, "lib", "*.so*"))):
            ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
        sys.path.insert(0, folder)
    # the CUDA libraries sgl-kernel links against ship with torch's CUDA wheels: load them by path first
    site = os.path.dirname(os.path.dirname(torch.__file__))
    for name in ("libnvrtc.so.*", "libcublas.so.*", "libcublasLt.so.*", "libcudart.so.*"):
        for lib in sorted(glob.glob(os.path.join(site, "nvidia", "**", name), recursive=True)):
            try:
                ctypes.CDLL(lib, mode=ctypes.RTLD_GLOBAL)
            except OSError:
                pass
    import sgl_kernel

    return sgl_kernel


def ops(sk, batch: int) -> dict:
    """name -> zero-argument call, at `batch` tokens. Shapes: DeepSeek-V3 at TP 8 (hidden 7168, q_lora 1536, 16 heads
    of 64 rope dims per GPU, dense intermediate 18432 / 8, 256 routed experts in 8 groups + 1 fused shared, top 8)
    and Qwen3-30B-A3B's router (128 experts, top 8)."""
    cuda, bf16, f32 = "cuda", torch.bfloat16, torch.float32
    fp8 = torch.float8_e4m3fn
    hidden = 7168
    x = torch.randn(batch, hidden, device=cuda, dtype=bf16)
    residual = torch.randn_like(x)
    w = torch.randn(hidden, device=cuda, dtype=bf16)
    q_a = torch.randn(batch, 1536, device=cuda, dtype=bf16)
    w_q = torch.randn(1536, device=cuda, dtype=bf16)
    q_out = torch.empty(batch, hidden, device=cuda, dtype=fp8)
    s_out = torch.empty(batch, hidden // 128, device=cuda, dtype=f32)
    gate_up = torch.randn(batch, 2 * 2304, device=cuda, dtype=bf16)
    act = torch.empty(batch, 2304, device=cuda, dtype=bf16)
    positions = torch.randint(0, 4096, (batch,), device=cuda)
    q_rope = torch.randn(batch, 16 * 64, device=cuda, dtype=bf16)
    k_rope = torch.randn(batch, 64, device=cuda, dtype=bf16)
    cos_sin = torch.randn(4096, 64, device=cuda, dtype=bf16)
    logits = torch.randn(batch, 256, device=cuda, dtype=f32)
    bias = torch.randn(256, device=cuda, dtype=f32)
    topk_ids = torch.randint(0, 257, (batch, 9), device=cuda, dtype=torch.int32)
    block, experts = 16, 257 + 1
    numel = topk_ids.numel()
    padded = numel * block if numel < experts else numel + experts * (block - 1)
    sorted_ids = torch.empty(padded, device=cuda, dtype=torch.int32)
    expert_ids = torch.empty((padded + block - 1) // block, device=cuda, dtype=torch.int32)
    post_pad = torch.empty(1, device=cuda, dtype=torch.int32)
    cumsum = torch.empty(experts + 1, device=cuda, dtype=torch.int32)
    pairs = torch.randn(batch, 9, hidden, device=cuda, dtype=bf16)
    summed = torch.empty(batch, hidden, device=cuda, dtype=bf16)
    qwen_logits = torch.randn(batch, 128, device=cuda, dtype=f32)
    qwen_w = torch.empty(batch, 8, device=cuda, dtype=f32)
    qwen_ids = torch.empty(batch, 8, device=cuda, dtype=torch.int32)
    finfo = torch.finfo(fp8)
    one = torch.zeros(1, device=cuda)
    return {
        "torch_one_element_add": lambda: one.add_(1.0),
        "rmsnorm_7168": lambda: sk.rmsnorm(x, w, 1e-6),
        "fused_add_rmsnorm_7168": lambda: sk.fused_add_rmsnorm(x, residual, w, 1e-6),
        "rmsnorm_1536": lambda: sk.rmsnorm(q_a, w_q, 1e-6),
        "per_token_group_quant_fp8_7168": lambda: sk.sgl_per_token_group_quant_8bit(
            x, q_out, s_out, 128, 1e-10, finfo.min, finfo.max),
        "silu_and_mul_2304": lambda: sk.silu_and_mul(gate_up, act),
        "rotary_embedding_16x64": lambda: sk.rotary_embedding(positions, q_rope, k_rope, 64, cos_sin, False),
        "moe_fused_gate_256_top8_shared1": lambda: sk.moe_fused_gate(logits, bias, 8, 4, 9, 1, 2.5),
        "moe_align_block_size_258_bm16": lambda: sk.moe_align_block_size(
            topk_ids, experts, block, sorted_ids, expert_ids, post_pad, cumsum, True),
        "moe_sum_reduce_9x7168": lambda: sk.moe_sum_reduce(pairs, summed, 2.5),
        "topk_softmax_128_top8": lambda: sk.topk_softmax(qwen_w, qwen_ids, qwen_logits, True),
    }


def start(doc: str, name: str, argv: list[str] | None):
    """(arguments, sgl_kernel, the result's header) for a bench of sgl-kernel's kernels (this one and
    mla_decode_bench.py): --out, --sgl-kernel-dir, --replays; None, said on stderr, without a CUDA device."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sgl-kernel-dir", default=None, help="folder holding sgl_kernel (default: the installed one)")
    p.add_argument("--replays", type=int, default=20)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print(f"{name}: no CUDA device", file=sys.stderr)
        return None
    sk = load_sgl_kernel(args.sgl_kernel_dir)
    header = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "sgl_kernel": getattr(sk, "__version__", "?"), "replays": args.replays,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "rows": []}
    return args, sk, header


def emit(result: dict, row: dict) -> None:
    """A timed row kept in the result and printed at once (a run cut short still shows what it measured)."""
    result["rows"].append(row)
    print(json.dumps(row), flush=True)


def save(result: dict, path: str) -> int:
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    return 0


def main(argv: list[str] | None = None) -> int:
    started = start(__doc__, "sgl_kernel_bench", argv)
    if started is None:
        return 2
    args, sk, result = started
    result["calls_per_graph"] = CALLS
    for batch in (1, 8, 64):
        for name, fn in ops(sk, batch).items():
            row: dict = {"op": name, "batch": batch}
            try:
                kernels = trace_kernels(fn)
                graph = capture(fn, CALLS)
                per_call = statistics.median(replay_us(graph, args.replays)) / CALLS
                row.update(kernels_per_call=len(kernels), us_per_call=per_call,
                           us_per_kernel=per_call / max(len(kernels), 1))
            except Exception as exc:
                row["error"] = repr(exc)[:300]
            emit(result, row)
    return save(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
