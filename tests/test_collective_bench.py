"""calibration/collective_bench.py run for real (gloo, two CPU processes) and its table fitted into a curve;
the table readers (the bench's CSV, nccl-tests' text) and the fit on known data."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from simspec.calibration.collectives import (
    bus_bandwidth_gbps,
    fit_collective_curve,
    fit_collective_table,
    read_collective_table,
    read_collectives,
    table_header,
)
from simspec.calibration.measurements import CollectiveSample
from simspec.errors import InputError
from simspec.presets import check_curve_points
from simspec.timing.collectives import Collectives

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "calibration" / "collective_bench.py"


def test_gloo_two_processes_and_fit(tmp_path):
    pytest.importorskip("torch", reason="the collective benchmark needs torch (pip install torch)")
    out = tmp_path / "table.csv"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(BENCH),
           "--backend", "gloo", "--min-bytes", "8", "--max-bytes", "4K", "--iters", "3", "--warmup", "1",
           "--repeats", "2", "--out", str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    lines = out.read_text().splitlines()
    assert lines[0].startswith("# simspec collective_bench:") and lines[1] == \
        "bytes,time_us,world_size,backend,in_cuda_graph,op"
    info = table_header(out)
    assert info["backend"] == "gloo" and info["world_size"] == "2" and info["dtype"] == "bf16"
    assert {"host", "torch", "date"} <= set(info)
    samples = read_collective_table(out)
    reduces = [s for s in samples if s.op == "all_reduce"]
    assert len(reduces) == 10 * 2  # 8 B .. 4 KiB, two repeats
    assert {(s.world_size, s.backend, s.in_cuda_graph) for s in reduces} == {(2, "gloo", False)}
    assert sorted({s.bytes for s in reduces}) == [8 << k for k in range(10)]
    # and, twice, the gloo broadcast SGLang's scheduler makes every loop turn at TP > 1: one int64
    broadcasts = [s for s in samples if s.op == "broadcast"]
    assert len(broadcasts) == 2 and all(s.bytes == 8 and s.backend == "gloo" and s.time_us > 0 for s in broadcasts)
    curve = fit_collective_table(out)
    assert curve.measured_gpus == 2 and len(curve.points_bytes_us) == 10
    check_curve_points(curve.points_bytes_us)
    assert curve.bus_bandwidth_gbps > 0
    assert "table.csv" in curve.source and "gloo" in curve.source and "eager" in curve.source
    assert Collectives(curve, 8, "pcie").all_reduce_us(1 << 20) > Collectives(curve, 8, "pcie").all_reduce_us(64)
    m = read_collectives(out)
    assert len(m.collectives) == 22 and "table.csv" in m.sources[0]


def test_bench_arguments():
    pytest.importorskip("torch", reason="the collective benchmark needs torch (pip install torch)")
    sys.path.insert(0, str(BENCH.parent))
    try:
        import collective_bench as cb
    finally:
        sys.path.pop(0)
    args = cb.parse_args(["--out", "x.csv", "--min-bytes", "1K", "--max-bytes", "64M"])
    assert (args.min_bytes, args.max_bytes, args.dtype, args.iters) == (1024, 64 << 20, "bf16", 20)
    assert cb.sizes(8, 64, 2) == [8, 16, 32, 64]
    with pytest.raises(SystemExit):
        cb.parse_args(["--out", "x.csv", "--min-bytes", "1M", "--max-bytes", "1K"])


NCCL_HEADER = ("# nThread 1 nGpus 1 minBytes 8 maxBytes 67108864 step: 4(factor) warmup iters: 5 iters: 20 agg iters: 1"
               " validation: 1 graph: 1")
NCCL_TESTS = "# Collective test starting: all_reduce_perf\n" + NCCL_HEADER + """
#
# Using devices
#  Rank  0 Group  0 Pid  41001 on     node01 device  0 [0x18] NVIDIA RTX PRO 6000 Blackwell Server Edition
#  Rank  1 Group  0 Pid  41002 on     node01 device  1 [0x2a] NVIDIA RTX PRO 6000 Blackwell Server Edition
#  Rank  2 Group  0 Pid  41003 on     node01 device  2 [0x3a] NVIDIA RTX PRO 6000 Blackwell Server Edition
#  Rank  3 Group  0 Pid  41004 on     node01 device  3 [0x5d] NVIDIA RTX PRO 6000 Blackwell Server Edition
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
           0             0  bfloat16     sum      -1     0.12    0.00    0.00      0     0.11    0.00    0.00      0
           8             4  bfloat16     sum      -1    25.10    0.00    0.00      0    24.90    0.00    0.00      0
          32            16  bfloat16     sum      -1    24.70    0.00    0.00      0    25.30    0.00    0.00      0
         128            64  bfloat16     sum      -1    25.40    0.01    0.01      0    25.20    0.01    0.01      0
         512           256  bfloat16     sum      -1    26.00    0.02    0.03      0    26.10    0.02    0.03      0
        2048          1024  bfloat16     sum      -1    27.90    0.07    0.11      0    27.70    0.07    0.11    N/A
     4194304       2097152  bfloat16     sum      -1   160.50   26.13   39.20      0   161.00   26.05   39.08      0
    16777216       8388608  bfloat16     sum      -1   630.00   26.63   39.95      0   629.00   26.67   40.01      0
    67108864      33554432  bfloat16     sum      -1  2520.00   26.63   39.94      0  2519.00   26.64   39.96      0
# Out of bounds values : 0 OK
# Avg bus bandwidth    : 18.7654
#
"""


def test_nccl_tests_output(tmp_path):
    p = tmp_path / "all_reduce_perf.txt"
    p.write_text(NCCL_TESTS)
    samples = read_collective_table(p)
    assert len(samples) == 8 * 2  # size-0 row dropped; out-of-place and in-place per row
    assert {(s.world_size, s.backend, s.in_cuda_graph, s.op) for s in samples} == {(4, "nccl-tests", True,
                                                                                     "all_reduce")}
    curve = fit_collective_table(p)
    assert curve.measured_gpus == 4 and curve.points_bytes_us[0] == (8.0, 25.0)
    times = [t for _, t in curve.points_bytes_us]
    assert times == sorted(times) and times[1] == times[0]  # 24.7/25.3 at 32 B pooled with 8 B: never falls
    # the median over the three largest sizes of the median time's bus bandwidth
    assert curve.bus_bandwidth_gbps == pytest.approx(bus_bandwidth_gbps(67108864, 2519.5, 4), rel=1e-9)
    assert curve.bus_bandwidth_gbps == pytest.approx(39.95, abs=0.05)  # what nccl-tests printed
    assert "inside a CUDA graph" in curve.source and "all_reduce_perf.txt" in curve.source
    old = tmp_path / "old.txt"  # an nccl-tests version without the root column; world from nThread x nGpus
    old.write_text("# nThread 1 nGpus 2 minBytes 8 maxBytes 16 step: 2(factor) warmup iters: 5 iters: 20\n"
                   "           8             2     float     sum    30.0    0.00    0.00  0e+00    29.0    0.00"
                   "    0.00  0e+00\n")
    assert [(s.world_size, s.time_us, s.in_cuda_graph) for s in read_collective_table(old)] == [(2, 30.0, False),
                                                                                               (2, 29.0, False)]


def _s(nbytes, t, *, graph=False, world=8, op="all_reduce"):
    return CollectiveSample(op=op, bytes=nbytes, time_us=t, world_size=world, backend="nccl", in_cuda_graph=graph)


def test_fit_prefers_graph_and_is_monotone():
    eager = [_s(1024, 40.0), _s(1024, 44.0), _s(2048, 41.0)]
    graph = [_s(1024, 12.0, graph=True), _s(1024, 30.0, graph=True), _s(1024, 13.0, graph=True),
             _s(2048, 11.0, graph=True), _s(4096, 14.0, graph=True), _s(1 << 24, 500.0, graph=True)]
    c = fit_collective_curve(eager + graph)
    # medians 13 (3 samples) and 11 (1 sample) pooled, weighted by their samples: 12.5
    assert c.points_bytes_us[:3] == [(1024.0, 12.5), (2048.0, 12.5), (4096.0, 14.0)]
    check_curve_points(c.points_bytes_us)
    e = fit_collective_curve(eager + graph, prefer_graph=False, source="mine")
    assert e.points_bytes_us == [(1024.0, pytest.approx(125 / 3)), (2048.0, pytest.approx(125 / 3))]
    assert e.source.startswith("mine: ")
    assert e.bus_bandwidth_gbps == pytest.approx(bus_bandwidth_gbps(2048, 41.0, 8) / 2 + bus_bandwidth_gbps(
        1024, 42.0, 8) / 2)


def test_fit_and_table_errors(tmp_path):
    with pytest.raises(InputError) as e:
        fit_collective_curve([_s(8, 10.0, world=2), _s(8, 12.0, world=4)])
    assert e.value.key == "world_size"
    assert fit_collective_curve([_s(8, 10.0, world=2), _s(8, 12.0, world=4), _s(1 << 20, 40.0, world=4)],
                                world_size=4).measured_gpus == 4
    with pytest.raises(InputError) as e:  # one message size: no latency and bandwidth to tell apart
        fit_collective_curve([_s(8, 10.0), _s(8, 11.0)])
    assert e.value.key == "bytes" and "at least 2 different sizes" in e.value.message
    with pytest.raises(InputError):
        fit_collective_curve([_s(8, 10.0, world=1)])
    with pytest.raises(InputError) as e:
        fit_collective_curve([_s(8, 10.0, op="all_gather")])
    assert e.value.key == "op"
    bad = tmp_path / "bad.csv"
    bad.write_text("# x\nbytes,time_us,world_size,backend,in_cuda_graph,op\n8,12.5,2,gloo,false,all_reduce\n"
                   "16,fast,2,gloo,false,all_reduce\n")
    with pytest.raises(InputError) as e:
        read_collective_table(bad)
    assert e.value.file == str(bad) and e.value.key == "line 4"
    nohead = tmp_path / "nohead.csv"
    nohead.write_text("8,12.5,2\n")
    with pytest.raises(InputError) as e:
        read_collective_table(nohead)
    assert "bytes,time_us,world_size,backend" in e.value.message
    empty = tmp_path / "empty.csv"
    empty.write_text("bytes,time_us,world_size,backend\n")
    with pytest.raises(InputError):
        read_collective_table(empty)
    one_rank = tmp_path / "one.csv"
    one_rank.write_text("bytes,time_us,world_size,backend\n8,1.0,1,nccl\n")
    with pytest.raises(InputError) as e:
        fit_collective_table(one_rank)
    assert e.value.file == str(one_rank) and "2 ranks" in e.value.message
