#!/usr/bin/env python3
"""All-reduce time against message size on this box, as simspec's collective curve needs it.

    torchrun --nproc-per-node 8 calibration/collective_bench.py --out table.csv

Sweeps message sizes like nccl-tests (`-b 8 -e 64M -f 2`: min, min x factor, ... up to max bytes), bf16 by
default, with any torch.distributed backend (nccl on CUDA, else gloo). Each size is timed eagerly and, on CUDA,
inside a CUDA graph (K all-reduces captured once, the graph replayed; SGLang replays decode and verify forwards
as CUDA graphs, where launch overhead disappears). GPU times come from CUDA events, CPU times from
perf_counter after a barrier; each row is the mean time of one call over --iters calls, the slowest rank's
(all ranks' times reduced with MAX, since a collective ends when its last rank does). Rank 0 writes the CSV
that simspec.calibration.collectives.read_collective_table reads:

    # simspec collective_bench: host=... torch=... backend=nccl world_size=8 dtype=bf16 date=...
    bytes,time_us,world_size,backend,in_cuda_graph,op

It also times, unless --no-broadcast, the broadcast SGLang's scheduler makes every loop turn at TP > 1: rank 0
sends the other ranks the size of what it received (one int64, the whole message on a turn with no new request)
over a gloo group of all ranks (Scheduler.recv_requests -> broadcast_pyobj on the TP CPU group). Those rows have op
`broadcast` and backend gloo; simspec calibrate sets the profile's tp_request_broadcast_us from them.

Needs only torch; simspec need not be installed on the GPU node.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time

import torch
import torch.distributed as dist

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
COLUMNS = "bytes,time_us,world_size,backend,in_cuda_graph,op"


def _size(text: str) -> int:
    """8, 4K, 64M, 1G (powers of 1024, as nccl-tests reads -b/-e)."""
    text = text.strip().upper().removesuffix("B")
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
    number = text[:-1] if scale > 1 else text
    value = int(float(number) * scale)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: a size must be positive")
    return value


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", required=True, help="CSV file rank 0 writes")
    p.add_argument("--min-bytes", type=_size, default=8, help="smallest message (default 8)")
    p.add_argument("--max-bytes", type=_size, default=64 << 20, help="largest message (default 64M)")
    p.add_argument("--factor", type=int, default=2, help="size multiplier between steps (default 2)")
    p.add_argument("--iters", type=int, default=20, help="timed calls per measurement (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed calls before each measurement (default 5)")
    p.add_argument("--repeats", type=int, default=3, help="measurements (rows) per size and mode (default 3)")
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bf16")
    p.add_argument("--backend", choices=["nccl", "gloo"], default=None,
                   help="torch.distributed backend (default: nccl with CUDA, else gloo)")
    p.add_argument("--cuda-graph", choices=["auto", "on", "off"], default="auto",
                   help="also time inside a CUDA graph (auto: on CUDA devices)")
    p.add_argument("--graph-calls", type=int, default=10, help="all-reduces captured per CUDA graph (default 10)")
    p.add_argument("--no-broadcast", action="store_true",
                   help="skip timing the scheduler's per-turn gloo broadcast (op broadcast)")
    args = p.parse_args(argv)
    if args.min_bytes > args.max_bytes:
        p.error("--min-bytes is larger than --max-bytes")
    if args.factor < 2 or args.iters < 1 or args.warmup < 0 or args.repeats < 1 or args.graph_calls < 1:
        p.error("--factor must be >= 2, --iters, --repeats and --graph-calls >= 1, --warmup >= 0")
    return args


def sizes(min_bytes: int, max_bytes: int, factor: int) -> list[int]:
    out, s = [], min_bytes
    while s <= max_bytes:
        out.append(s)
        s *= factor
    return out


def _slowest(seconds: float, device: torch.device) -> float:
    t = torch.tensor([seconds], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def time_eager(x: torch.Tensor, iters: int, warmup: int) -> float:
    """Seconds per all-reduce call, this rank."""
    for _ in range(warmup):
        dist.all_reduce(x)
    if x.is_cuda:
        torch.cuda.synchronize(x.device)
        dist.barrier()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            dist.all_reduce(x)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / iters


def time_graph(x: torch.Tensor, iters: int, warmup: int, calls: int) -> float:
    """Seconds per all-reduce call when `calls` of them are captured in one CUDA graph and replayed."""
    side = torch.cuda.Stream(device=x.device)
    side.wait_stream(torch.cuda.current_stream(x.device))
    with torch.cuda.stream(side):  # the communicator must exist before capture
        for _ in range(max(1, warmup)):
            dist.all_reduce(x)
    torch.cuda.current_stream(x.device).wait_stream(side)
    torch.cuda.synchronize(x.device)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            dist.all_reduce(x)
    for _ in range(warmup):
        graph.replay()
    torch.cuda.synchronize(x.device)
    dist.barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1e3 / (iters * calls)


def time_request_broadcast(group: dist.ProcessGroup, iters: int, warmup: int) -> float:
    """Seconds per call of the broadcast SGLang's scheduler makes each loop turn at TP > 1 when no request arrived:
    rank 0 sends one int64 (the size of what it received) over a gloo group, the others wait for it and read it."""
    size = torch.zeros(1, dtype=torch.long)
    for _ in range(warmup):
        dist.broadcast(size, src=0, group=group)
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.broadcast(size, src=0, group=group)
        int(size.item())
    return (time.perf_counter() - t0) / iters


def header(args: argparse.Namespace, backend: str, world: int, device: torch.device) -> str:
    info = {"host": socket.gethostname(), "torch": torch.__version__, "backend": backend, "world_size": world,
            "dtype": args.dtype, "iters": args.iters, "warmup": args.warmup, "repeats": args.repeats,
            "graph_calls": args.graph_calls,
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}  # Python 3.9+: GPU nodes vary
    if device.type == "cuda":
        info["device"] = torch.cuda.get_device_name(device).replace(" ", "_")
        if backend == "nccl":
            info["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    return "# simspec collective_bench: " + " ".join(f"{k}={v}" for k, v in info.items())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    backend = args.backend or ("nccl" if torch.cuda.is_available() else "gloo")
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        device = torch.device("cuda", local)
    else:
        device = torch.device("cpu")
    dist.init_process_group(backend)  # env:// (torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT)
    rank, world = dist.get_rank(), dist.get_world_size()
    dtype = DTYPES[args.dtype]
    elsize = torch.tensor([], dtype=dtype).element_size()
    graph = device.type == "cuda" and args.cuda_graph != "off"
    if args.cuda_graph == "on" and device.type != "cuda":
        print("collective_bench: --cuda-graph on needs a CUDA device (nccl backend)", file=sys.stderr)
        return 2
    rows: list[str] = []
    for nbytes in sizes(args.min_bytes, args.max_bytes, args.factor):
        count = nbytes // elsize
        if count == 0:
            continue
        x = torch.zeros(count, dtype=dtype, device=device)  # zeros: repeated sums stay finite
        modes = [False, True] if graph else [False]
        for in_graph in modes:
            for _ in range(args.repeats):
                t = time_graph(x, args.iters, args.warmup, args.graph_calls) if in_graph else \
                    time_eager(x, args.iters, args.warmup)
                t = _slowest(t, device)
                rows.append(f"{count * elsize},{t * 1e6:.3f},{world},{backend},{str(in_graph).lower()},all_reduce")
        if rank == 0:
            print(f"{count * elsize:>12} B  {rows[-1].split(',')[1]:>12} us", file=sys.stderr, flush=True)
    if not args.no_broadcast and world > 1:
        gloo = dist.group.WORLD if backend == "gloo" else dist.new_group(backend="gloo")
        for _ in range(args.repeats):
            t = _slowest(time_request_broadcast(gloo, args.iters, args.warmup), device)
            rows.append(f"8,{t * 1e6:.3f},{world},gloo,false,broadcast")
        if rank == 0:
            print(f"{'broadcast':>12}    {rows[-1].split(',')[1]:>12} us (gloo, the scheduler's per-turn receive)",
                  file=sys.stderr, flush=True)
    if rank == 0:
        text = "\n".join([header(args, backend, world, device), COLUMNS, *rows]) + "\n"
        tmp = args.out + ".tmp"
        with open(tmp, "w") as fh:
            fh.write(text)
        os.replace(tmp, args.out)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
