#!/usr/bin/env python3
"""FlashMLA's decode kernel (sgl-kernel's, as SGLang's flashmla backend calls it) timed on one GPU, for simspec's
decode-attention kernel tables.

    python3 calibration/mla_decode_bench.py --out mla.json [--sgl-kernel-dir DIR] [--replays 20]
    python3 calibration/mla_decode_tables.py mla.json --gpu h200-sxm --out validation/kernels

The published decode-attention timings (validation/kernels/*-decode-*) are of B200 kernels and of FA3 through vLLM;
none times MLA at the head counts SGLang serves DeepSeek-V3 with on 8 Hopper GPUs (16 a GPU at TP 8) at small
batch. This script does, for DeepSeek-V3's latent attention (576 query/key dims, 512 value dims, one KV head, BF16
cache in pages of 64): 16 and 128 query heads, batch 1-64, contexts of 1k-16k tokens, one, two and four query
tokens a request (decode, MTP verify). Each call is sgl_kernel.flash_mla.flash_mla_with_kvcache (the split-KV kernel
and its combine), captured in one CUDA graph once per copy of the inputs, enough copies that together they hold
four times the L2 (no call reads its cache from L2, as no decode layer does); the time per call is the median graph
replay over the copies. get_mla_metadata, which SGLang runs once a forward, not once a layer, is outside the graph.
Kernels per call come from a CUPTI trace of one call.

`--sgl-kernel-dir` is a folder holding the `sgl_kernel` package (an unpacked sglang-kernel wheel: the GPU
architecture's common_ops library and flashmla_ops.abi3.so, ~35 MB; flash_ops, ~1 GB, is not needed) and `lib/`
with any system library it lacks (libnuma), as for sgl_kernel_bench.py. Written for the lent H200 and not yet run
on one: the first run is its test.
"""

from __future__ import annotations

import math
import statistics
import sys

import torch
from kernel_floor_bench import capture, replay_us, trace_kernels
from sgl_kernel_bench import emit, save, start

D_QK, D_V, PAGE = 576, 512, 64  # DeepSeek-V3's absorbed MLA: kv_lora_rank 512 + rope 64; FlashMLA's page size
HEADS = (16, 128)  # query heads a GPU: DeepSeek-V3 at TP 8, and at TP 1 (the published B200 tables' shape)
BATCHES = (1, 4, 16, 64)
CONTEXTS = (1024, 4096, 16384)
Q_TOKENS = (1, 2, 4)
MAX_COPIES = 256


def copies_for(kv_bytes: int, l2_bytes: int) -> int:
    """Copies of the inputs one graph cycles through: together at least four times the L2, at least two."""
    return max(2, min(MAX_COPIES, math.ceil(4 * l2_bytes / max(kv_bytes, 1))))


def mla_call(fm, heads: int, batch: int, context: int, q_tokens: int, copies: int):
    """(one call, all `copies` calls): closures over inputs already on the GPU, one KV cache per copy."""
    cuda, bf16 = "cuda", torch.bfloat16
    pages = math.ceil(context / PAGE)
    seqlens = torch.full((batch,), context, dtype=torch.int32, device=cuda)
    block_table = torch.arange(batch * pages, dtype=torch.int32, device=cuda).view(batch, pages)
    metadata, splits = fm.get_mla_metadata(seqlens, q_tokens * heads, 1)
    inputs = [(torch.randn(batch, q_tokens, heads, D_QK, device=cuda, dtype=bf16),
               torch.randn(batch * pages, PAGE, 1, D_QK, device=cuda, dtype=bf16)) for _ in range(copies)]

    def call(q, cache):
        fm.flash_mla_with_kvcache(q, cache, block_table, seqlens, D_V, metadata, splits, causal=True)

    return (lambda: call(*inputs[0])), (lambda: [call(q, c) for q, c in inputs])


def main(argv: list[str] | None = None) -> int:
    started = start(__doc__, "mla_decode_bench", argv)
    if started is None:
        return 2
    args, _, result = started
    from sgl_kernel import flash_mla as fm

    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    result.update(l2_bytes=l2, page_size=PAGE)
    for heads in HEADS:
        for batch in BATCHES:
            for context in CONTEXTS:
                for q_tokens in Q_TOKENS:
                    kv_bytes = batch * context * D_QK * 2
                    row: dict = {"heads": heads, "batch": batch, "context": context, "q_tokens": q_tokens,
                                 "kv_bytes": kv_bytes}
                    try:
                        copies = copies_for(kv_bytes, l2)
                        one, every = mla_call(fm, heads, batch, context, q_tokens, copies)
                        kernels = trace_kernels(one)
                        graph = capture(every, 1)
                        per_call = statistics.median(replay_us(graph, args.replays)) / copies
                        row.update(copies=copies, kernels_per_call=len(kernels), us_per_call=per_call)
                        del graph, one, every
                    except Exception as exc:  # one shape's failure (memory, an unsupported size) keeps the rest
                        row["error"] = repr(exc)[:300]
                    torch.cuda.empty_cache()
                    emit(result, row)
    return save(result, args.out)


if __name__ == "__main__":
    sys.exit(main())
