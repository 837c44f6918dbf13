#!/usr/bin/env python3
"""Decode-attention kernel tables (validation/kernels) from calibration/mla_decode_bench.py's result.

    python calibration/mla_decode_tables.py RESULT.json --gpu h200-sxm --out validation/kernels

One table per query-head count, `kernel: attention_decode` over the model preset deepseek-v3 at the TP degree that
leaves that many heads a GPU (128 / heads), BF16 cache: each point the median time of one
flash_mla_with_kvcache call. Rows the bench could not time (their `error`) are left out and listed on stderr.
Check the raw result in under calibration/measurements/ before citing it: a table names it as its source.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml
from table_inputs import build_or_refuse, common_arguments

MODEL = "deepseek-v3"  # the preset whose attention the bench times (its heads split over the TP degree)


def tables(result: dict, raw: str, gpu: str) -> dict[str, dict]:
    """id -> table, one per head count in the result. ValueError when a head count does not divide DeepSeek-V3's."""
    by_heads: dict[int, list[dict]] = {}
    skipped = []
    for row in result["rows"]:
        if "error" in row:
            skipped.append(f"{row['heads']} heads, batch {row['batch']}, context {row['context']}, "
                           f"q {row['q_tokens']}: {row['error']}")
            continue
        by_heads.setdefault(int(row["heads"]), []).append(row)
    for line in skipped:
        print(f"left out: {line}", file=sys.stderr)
    from simspec.presets import models

    all_heads = models()[MODEL].attention.num_heads
    out = {}
    for heads, rows in sorted(by_heads.items()):
        if heads < 1 or all_heads % heads:
            raise ValueError(f"{heads} heads a GPU is not {MODEL}'s {all_heads} split over a TP degree")
        table_id = f"simspec-{gpu.split('-')[0]}-mla-decode-flashmla-h{heads}"
        out[table_id] = {
            "id": table_id,
            "title": f"MLA decode attention (DeepSeek-V3, {heads} heads a GPU, BF16 KV), FlashMLA from sgl-kernel, one "
                     f"{result['gpu']}, CUDA graph, no call from L2",
            "source": {"citation": f"measured by simspec: calibration/mla_decode_bench.py on one {result['gpu']} "
                                   f"({result['date']}, torch {result['torch']}, sgl-kernel {result['sgl_kernel']}); "
                                   f"raw result {raw}",
                       "accessed": str(result["date"])[:10]},
            "kernel": "attention_decode",
            "gpu": gpu,
            "model": MODEL,
            "tp": all_heads // heads,
            "kv_cache_dtype": "bf16",
            "backend": "FlashMLA (sgl_kernel.flash_mla: SGLang's flashmla attention backend)",
            "timed": "one flash_mla_with_kvcache call: the split-KV kernel and its combine (get_mla_metadata, once a "
                     "forward in SGLang, not timed)",
            "assumptions": [
                f"each call reads its own copy of the cache (copies holding four times the GPU's "
                f"{result['l2_bytes']:,}-byte L2), pages of {result['page_size']} tokens, every request the same "
                "context; causal among a request's query tokens",
            ],
            "points": [{"batch": int(r["batch"]), "context": int(r["context"]), "q_tokens": int(r["q_tokens"]),
                        "us": round(float(r["us_per_call"]), 3)}
                       for r in sorted(rows, key=lambda r: (r["q_tokens"], r["batch"], r["context"]))],
        }
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    common_arguments(p, "mla_decode_bench.py", "folder the tables are written to")
    args = p.parse_args(argv)
    built = build_or_refuse(args, "mla_decode_bench.py", lambda result, raw: tables(result, raw, args.gpu))
    if built is None:
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for table_id, table in built.items():
        path = out / f"{table_id}.yaml"
        path.write_text(yaml.safe_dump(table, sort_keys=False, width=120))
        print(f"wrote {path} ({len(table['points'])} points)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
