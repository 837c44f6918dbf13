#!/usr/bin/env python3
"""SGLang's Triton fused-MoE GEMMs timed on one GPU, with the configs and kernel code a given release ships.

    python3 calibration/fused_moe_bench.py --wheel sglang-0.5.12-....whl --out moe.json

simspec prices the routed experts' w13 and w2 GEMMs at their rooflines (forward.ForwardModel.moe_kernels); SGLang
runs them with Triton tiles read from config files that change between releases (0.5.9 added Triton 3.5.1 configs,
a separate down-projection config with TMA, and A/B swapped onto wgmma for 16-row tiles on SM90). This script
times the two GEMM kernels of SGLang's own `fused_experts_impl`, from an unpacked release wheel, for one expert
shape (default DeepSeek-V3 at TP 8: 256 routed experts + the fused shared one, top 8 + 1, hidden 7168, N 256, block
FP8; `--dtype bf16` for BF16 experts, which run the release's heuristic tile where it ships no config file) at
decode token counts. Each call routes at random over distinct copies of the experts' weights, so the
experts a call touches are read from DRAM. The GEMM kernels' durations come from a torch profiler (CUPTI) trace; the
other kernels of the call (alignment, activation quantisation, SiLU, the sum) run as small torch stand-ins here,
not SGLang's, and are not reported.

The wheel is unpacked and its fused-MoE modules imported without SGLang's server: the imports they make for a
server (sgl_kernel, server args, environment flags, platform checks) are replaced by stand-ins that answer as an
NVIDIA GPU would with no flags set. Needs torch and triton; not sgl_kernel, FlashInfer or SGLang's dependencies.

GLM-4.7-Flash's experts (65 with the fused shared one, top 4 + 1, hidden 2,048, N 1,536, BF16, no config file in
0.5.10.post1), whose heuristic switches from its 16-row to its 64-row tile past 65 tokens, where the GLM box's
iteration grows far more than the model's (validation/HISTORY.md rounds 28 and 31):

    python3 calibration/fused_moe_bench.py --wheel sglang-0.5.10.post1-py3-none-any.whl --dtype bf16 \\
        --experts 65 --top-k 5 --hidden 2048 --intermediate 1536 --tokens 32,64,65,96,128,192,256,512,1024 \\
        --out glm.json
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import statistics
import sys
import tempfile
import time
import types
import zipfile

import torch
from cupti_trace import kernel_events

PACKAGES = ("sglang.srt.layers.moe.moe_runner.triton_utils", "sglang.srt.layers.moe.fused_moe_triton")


# ------------------------------------------------------------------------- stand-ins for SGLang's server imports

def _align(topk_ids, num_experts, block_size, sorted_ids, expert_ids, num_tokens_post_pad, cumsum, pad_sorted=True):
    """sgl_kernel.moe_align_block_size's contract in torch: each expert's (token, slot) indices grouped and padded
    to a multiple of block_size, the pad value topk_ids.numel(); one expert id per block; the padded total."""
    flat = topk_ids.flatten().to(torch.int64)
    numel = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)[:num_experts]
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded
    sorted_ids.fill_(numel)
    order = torch.argsort(flat, stable=True)
    experts_sorted = flat[order]
    rank = torch.arange(numel, device=flat.device) - (torch.cumsum(counts, 0) - counts)[experts_sorted]
    sorted_ids[starts[experts_sorted] + rank] = order.to(sorted_ids.dtype)
    total = int(padded.sum())
    expert_ids.fill_(-1)
    blocks = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // block_size)
    expert_ids[: blocks.numel()] = blocks.to(expert_ids.dtype)
    num_tokens_post_pad.fill_(total)


def _group_quant_fp8(x, group_size, *args, **kwargs):
    """Per-token-group FP8 quantisation (e4m3, scales as float32 [tokens, groups])."""
    fp8 = torch.float8_e4m3fn
    g = x.reshape(*x.shape[:-1], x.shape[-1] // group_size, group_size).float()
    scale = g.abs().amax(-1, keepdim=True).clamp(min=1e-10) / torch.finfo(fp8).max
    q = (g / scale).to(fp8).reshape(x.shape)
    return q, scale.squeeze(-1).contiguous()


def _silu_and_mul(x, out=None, **kwargs):
    d = x.shape[-1] // 2
    y = torch.nn.functional.silu(x[..., :d]) * x[..., d:]
    if out is None:
        return y
    out.copy_(y)
    return out


def _moe_sum_reduce(x, out, routed_scaling_factor=1.0, *args, **kwargs):
    torch.sum(x, dim=1, out=out)
    if routed_scaling_factor not in (None, 1.0):
        out.mul_(routed_scaling_factor)


class _Flag:
    def get(self):
        return False

    value = False


class _Namespace(types.SimpleNamespace):
    def __getattr__(self, name):  # any server flag not set: off
        return False


def _unsupported(*args, **kwargs):
    raise NotImplementedError("not available in this benchmark (only block FP8 and BF16 experts are)")


def _module(name: str, path: str | None = None, **attrs) -> types.ModuleType:
    m = types.ModuleType(name)
    if path is not None:
        m.__path__ = [path]
    m.__dict__.update(attrs)
    sys.modules[name] = m
    return m


def install_stand_ins(root: str, package: str) -> None:
    """Packages whose __init__ would import the server, as empty packages over the wheel's folders, and the
    server-side modules the fused MoE imports, as stand-ins."""
    def here(name: str) -> str:
        return os.path.join(root, *name.split("."))

    for name in ("sglang", "sglang.srt", "sglang.srt.layers", "sglang.srt.layers.moe",
                 "sglang.srt.layers.moe.moe_runner", "sglang.srt.layers.quantization", "sglang.jit_kernel"):
        _module(name, here(name))
    _module(package, here(package), get_config=lambda: None)

    def utils_getattr(name):
        if name.startswith(("is_", "use_")) or name.endswith("_supported") or name.startswith("cpu_has"):
            return {"is_cuda": lambda: True, "is_sm90_supported": lambda *a: True,
                    "is_sm100_supported": lambda *a: False}.get(name, lambda *a, **k: False)
        raise AttributeError(f"sglang.srt.utils stand-in has no {name}")

    utils = _module("sglang.srt.utils", here("sglang.srt.utils"),
                    get_bool_env_var=lambda n, default="false": os.environ.get(n, default).lower() in ("1", "true"),
                    get_int_env_var=lambda n, default=0: int(os.environ.get(n, default)),
                    get_device_name=lambda device_id=0: torch.cuda.get_device_name(device_id),
                    direct_register_custom_op=lambda *a, **k: None)
    utils.__getattr__ = utils_getattr  # type: ignore[attr-defined]
    _module("sglang.srt.utils.custom_op",
            register_custom_op=lambda *a, **k: (a[0] if a and callable(a[0]) and not k else (lambda f: f)))
    _module("sglang.srt.environ", envs=type("Envs", (), {"__getattr__": lambda self, n: _Flag()})())
    _module("sglang.srt.server_args", get_global_server_args=lambda: _Namespace())
    _module("sglang.srt.batch_invariant_ops", is_batch_invariant_mode_enabled=lambda: False)
    _module("sglang.srt.layers.moe.utils", get_moe_padding_size=lambda *a: 0)
    _module("sglang.srt.layers.moe.moe_runner.base", MoeRunnerConfig=type("MoeRunnerConfig", (), {}))
    sys.modules["sglang.srt.layers.moe.moe_runner"].MoeRunnerConfig = sys.modules[
        "sglang.srt.layers.moe.moe_runner.base"].MoeRunnerConfig
    _module("sglang.srt.layers.quantization.fp8_kernel", per_token_group_quant_fp8=_group_quant_fp8,
            sglang_per_token_group_quant_fp8=_group_quant_fp8, scaled_fp8_quant=_unsupported)
    _module("sglang.srt.layers.quantization.int8_kernel", per_token_group_quant_int8=_unsupported,
            per_token_quant_int8=_unsupported, sglang_per_token_group_quant_int8=_unsupported)
    _module("sgl_kernel", moe_align_block_size=_align, moe_sum_reduce=_moe_sum_reduce, silu_and_mul=_silu_and_mul,
            gelu_and_mul=_unsupported)
    _module("sglang.jit_kernel.activation", silu_and_mul=_silu_and_mul, gelu_and_mul=_unsupported)


def load_fused_moe(wheel: str, workdir: str):
    """The release's fused_moe module (fused_experts_impl, try_get_optimal_moe_config) and its package name."""
    zipfile.ZipFile(wheel).extractall(workdir)
    for package in PACKAGES:
        if os.path.isfile(os.path.join(workdir, *package.split("."), "fused_moe.py")):
            break
    else:
        raise SystemExit(f"{wheel}: no fused_moe.py under {' or '.join(PACKAGES)}")
    install_stand_ins(workdir, package)
    sys.path.insert(0, workdir)
    import importlib

    config = importlib.import_module(package + ".fused_moe_triton_config")
    return importlib.import_module(package + ".fused_moe"), config, package


# ------------------------------------------------------------------------------------------------- the timing

def gemm_kernel_times(run, calls: int) -> list[list[float]]:
    """Durations (us) of the fused_moe GEMM kernels each call launches, in order, from one traced run."""
    gemms = [(e["ts"], e["dur"]) for e in kernel_events(run) if "fused_moe_kernel" in e.get("name", "")]
    per_call = len(gemms) // calls
    return [[d for _, d in gemms[i::per_call]] for i in range(per_call)]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--wheel", required=True, help="an SGLang release wheel (not installed: unpacked here)")
    p.add_argument("--out", required=True, help="JSON to write")
    p.add_argument("--tokens", default="1,2,4,8,16,32,64")
    p.add_argument("--experts", type=int, default=257, help="experts in the kernel (routed + fused shared)")
    p.add_argument("--top-k", type=int, default=9, help="experts per token, the fused shared one included")
    p.add_argument("--hidden", type=int, default=7168)
    p.add_argument("--intermediate", type=int, default=256, help="N: one expert's intermediate columns per GPU")
    p.add_argument("--shared", type=int, choices=(0, 1), default=1,
                   help="1: the last expert is a fused shared expert every token routes to (DeepSeek-V3 from 0.5.3)")
    p.add_argument("--dtype", choices=("fp8", "bf16"), default="fp8",
                   help="fp8: block-FP8 weights (128 x 128 scales) and activations; bf16: BF16 weights, no scales")
    p.add_argument("--copies", type=int, default=4, help="distinct copies of all experts' weights")
    p.add_argument("--calls", type=int, default=20, help="traced calls per token count")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("fused_moe_bench: no CUDA device", file=sys.stderr)
        return 2
    workdir = tempfile.mkdtemp(prefix="sglang-wheel-")
    fused_moe, config_module, package = load_fused_moe(args.wheel, workdir)
    torch.manual_seed(0)
    E, K, N, top_k = args.experts, args.hidden, args.intermediate, args.top_k
    fp8 = args.dtype == "fp8"
    block = [128, 128] if fp8 else None
    weight_dtype = torch.float8_e4m3fn if fp8 else torch.bfloat16
    weights = []
    for _ in range(args.copies):
        w1 = (torch.randn(E, 2 * N, K, device="cuda") * 0.05).to(weight_dtype)
        w2 = (torch.randn(E, K, N, device="cuda") * 0.05).to(weight_dtype)
        s1 = torch.rand(E, 2 * N // 128, K // 128, device="cuda") * 1e-3 + 1e-3 if fp8 else None
        s2 = torch.rand(E, K // 128, N // 128, device="cuda") * 1e-3 + 1e-3 if fp8 else None
        weights.append((w1, w2, s1, s2))
    accepted = inspect.signature(fused_moe.fused_experts_impl).parameters
    result = {"wheel": os.path.basename(args.wheel), "package": package, "gpu": torch.cuda.get_device_name(0),
              "torch": torch.__version__, "triton": __import__("triton").__version__,
              "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "shape": {"experts": E, "top_k": top_k, "hidden": K, "intermediate": N,
                        "weights": "fp8 block 128" if fp8 else "bf16",
                        "fused_shared_expert": bool(args.shared)},
              "copies": args.copies, "calls": args.calls, "points": []}
    for tokens in [int(t) for t in args.tokens.split(",")]:
        row: dict = {"tokens": tokens}
        try:
            x = torch.randn(tokens, K, device="cuda", dtype=torch.bfloat16)
            calls = []
            for i in range(args.calls):
                routed_experts, routed_k = E - args.shared, top_k - args.shared
                routed = torch.stack([torch.randperm(routed_experts, device="cuda")[:routed_k] for _ in range(tokens)])
                if args.shared:
                    routed = torch.cat([routed, torch.full((tokens, 1), E - 1, device="cuda")], 1)
                ids = routed.to(torch.int32)
                w = torch.softmax(torch.randn(tokens, top_k, device="cuda"), -1)
                calls.append((ids, w, weights[i % args.copies]))
            kwargs = {"use_fp8_w8a8": True, "block_shape": block} if fp8 else {}

            def run(calls=calls, x=x, kwargs=kwargs):
                for ids, w, (w1, w2, s1, s2) in calls:
                    scales = {"w1_scale": s1, "w2_scale": s2} if fp8 else {}
                    fused_moe.fused_experts_impl(x, w1, w2, w, ids, **scales,
                                                 **{k: v for k, v in kwargs.items() if k in accepted})

            run()  # compiles the release's kernels for these tiles
            times = gemm_kernel_times(run, args.calls)
            row["kernels_per_call"] = len(times)
            row["gemm_us"] = [statistics.median(t) for t in times]
            dtype = "fp8_w8a8" if fp8 else None  # SGLang's config key: None for BF16 experts
            try:
                got = config_module.try_get_optimal_moe_config((E, 2 * N, K), (E, K, N), top_k, dtype, tokens,
                                                               block_shape=block, return_down_config=True)
                row["config"] = got[0] if isinstance(got, tuple) else got
                if isinstance(got, tuple) and isinstance(got[1], tuple):
                    row["down_config"] = got[1][0]
            except TypeError:
                row["config"] = config_module.try_get_optimal_moe_config((E, 2 * N, K), (E, K, N), top_k,
                                                                         dtype, tokens, block_shape=block)
        except Exception as exc:
            row["error"] = repr(exc)[:500]
        result["points"].append(row)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1, default=str)
        print(json.dumps(row, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
