"""torch-profiler traces -> KernelSplit: real CPU traces made here, and a GPU trace in Kineto's event layout."""

from __future__ import annotations

import gzip
import json
import shutil

import pytest

from simspec.calibration.sources.trace import classify_kernel, phase_of, read_traces
from simspec.errors import InputError

torch = pytest.importorskip("torch", reason="torch is needed to make real profiler traces (pip install torch)")
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x, attend=False):
        h = self.down(torch.relu(self.up(x)))
        if attend:
            q = h.view(1, 1, -1, 32)
            h = torch.nn.functional.scaled_dot_product_attention(q, q, q).view(-1, 32)
        return h


def _by_phase(m):
    return {k.phase: k for k in m.kernel_splits}


def test_cpu_trace_with_sglang_0523_range_names(tmp_path):
    """record_function ranges named as SGLang 0.5.23 names them (spec_stage_span, build_step_span_name)."""
    model = Tiny()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        with record_function("step[EXTEND bs=1 toks=16]"):
            model(torch.randn(16, 32), attend=True)
        with record_function("draft_extend"), record_function("step[DRAFT bs=1]"):  # the prefill's draft extend
            model(torch.randn(16, 32))
        for _ in range(3):
            with record_function("draft"), record_function("step[DRAFT bs=1]"):
                model(torch.randn(1, 32))
            with record_function("step[VERIFY bs=1]"):
                model(torch.randn(4, 32), attend=True)
            with record_function("draft_extend"), record_function("step[DRAFT bs=1]"):
                model(torch.randn(4, 32))
    out = tmp_path / "1234-TP-0.trace.json"
    prof.export_chrome_trace(str(out))
    m = read_traces(out)
    splits = _by_phase(m)
    assert {p: s.iterations for p, s in splits.items()} == {"draft": 3, "verify": 3, "draft_extend": 3, "prefill": 1,
                                                            "all": 3}
    assert splits["verify"].category_ms["attention"] > 0 and splits["verify"].category_ms["moe_gemm"] > 0
    assert splits["draft"].category_ms["attention"] == 0 and splits["draft"].category_ms["moe_gemm"] > 0
    assert splits["prefill"].category_ms["attention"] > 0
    assert all(s.category_ms["communication"] == 0 for s in splits.values())
    assert "CPU op time" in splits["verify"].source and "1234-TP-0.trace.json" in splits["verify"].source
    total = sum(sum(s.category_ms.values()) * s.iterations for p, s in splits.items() if p != "all")
    assert total == pytest.approx(sum(splits["all"].category_ms.values()) * 3)
    assert any("0 outside any phase range" in x for x in m.sources)


def draft(model, x):  # named like SGLang 0.5.8's EAGLEWorker methods (speculative/eagle_worker.py)
    return model(x)


def verify(model, x):
    return model(x, attend=True)


def forward_draft_extend_after_decode(model, x):
    return model(x)


def test_cpu_trace_python_function_spans_gz_dir(tmp_path):
    """0.5.8/0.5.10 have no record_function ranges: with_stack's Python function spans carry the phases."""
    model = Tiny()
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        for _ in range(2):
            draft(model, torch.randn(1, 32))
            verify(model, torch.randn(4, 32))
            forward_draft_extend_after_decode(model, torch.randn(4, 32))
        model(torch.randn(2, 32))  # outside any phase
    raw = tmp_path / "raw.json"
    prof.export_chrome_trace(str(raw))
    traces = tmp_path / "traces"
    traces.mkdir()
    for rank in (0, 1):
        with open(raw, "rb") as src, gzip.open(traces / f"1700000000.1-TP-{rank}.trace.json.gz", "wb") as dst:
            shutil.copyfileobj(src, dst)
    shutil.copy(traces / "1700000000.1-TP-0.trace.json.gz", traces / "merged-1700000000.1.trace.json.gz")
    m = read_traces(traces)
    splits = _by_phase(m)
    assert {p: s.iterations for p, s in splits.items()} == {"draft": 4, "verify": 4, "draft_extend": 4, "all": 4}
    assert splits["verify"].category_ms["attention"] > 0
    assert "merged" not in splits["all"].source and "TP-1" in splits["all"].source
    assert any("outside any phase range" in x and not x.endswith(" 0 outside any phase range") for x in m.sources)
    per_file = read_traces(sorted(traces.glob("*-TP-*")), per_file=True)
    assert len([k for k in per_file.kernel_splits if k.phase == "verify"]) == 2


def test_cpu_trace_collective_is_communication(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = Tiny()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(2):
                with record_function("step[DECODE bs=2]"):
                    h = model(torch.randn(2, 32))
                    dist.all_reduce(h)
        out = tmp_path / "t.trace.json"
        prof.export_chrome_trace(str(out))
    finally:
        dist.destroy_process_group()
    splits = _by_phase(read_traces(out))
    assert splits["decode"].iterations == 2 and splits["decode"].category_ms["communication"] > 0


def _gpu_trace() -> dict:
    """Kineto's layout: CPU ranges and cuda_runtime launches on the host thread, kernels on a stream, joined by
    args.correlation; a CUDA graph's kernels share their cudaGraphLaunch's correlation."""
    host = {"pid": 100, "tid": 100}
    gpu = {"pid": 0, "tid": 7}
    ev = []

    def x(cat, name, ts, dur, where, **args):
        ev.append({"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, **where, "args": args})

    corr = [0]

    def launch(ts, kernels, api="cudaLaunchKernel"):
        corr[0] += 1
        x("cuda_runtime", api, ts, 5, host, correlation=corr[0])
        for name, kts, kdur in kernels:
            x("kernel", name, kts, kdur, gpu, correlation=corr[0], stream=7)

    for i in range(2):
        t = 1000 * i
        x("user_annotation", "draft", t, 100, host)
        launch(t + 10, [("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize64x64x64", t + 120, 20),
                        ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevKernelArgsStorage<4096ul>)", t + 140, 30)],
               api="cudaGraphLaunch")
        x("user_annotation", "step[VERIFY bs=1]", t + 200, 200, host)
        launch(t + 210, [("BatchPrefillWithPagedKVCacheKernel", t + 300, 40)])
        launch(t + 220, [("fused_moe_kernel", t + 340, 60)])
        launch(t + 230, [("cross_device_reduce_1stage<__nv_bfloat16, 8>", t + 400, 10)])
        launch(t + 240, [("void at::native::vectorized_elementwise_kernel<4>", t + 410, 5)])
        x("user_annotation", "draft_extend", t + 450, 100, host)
        launch(t + 460, [("flash_fwd_kernel", t + 560, 8)])
    x("kernel", "ncclDevKernel_AllGather_RING_LL", 3000, 50, gpu, stream=7)  # no correlation: placed by its time
    x("gpu_memcpy", "Memcpy DtoH (Device -> Pinned)", 1700, 4, gpu, correlation=999)
    return {"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}


def test_gpu_trace_correlation(tmp_path):
    p = tmp_path / "gpu.trace.json"
    p.write_text(json.dumps(_gpu_trace()))
    m = read_traces(p)
    s = _by_phase(m)
    assert s["draft"].iterations == 2 and s["draft"].category_ms == pytest.approx(
        {"communication": 0.030, "attention": 0.0, "moe_gemm": 0.020, "other": 0.0})
    assert s["verify"].category_ms == pytest.approx(
        {"communication": 0.010, "attention": 0.040, "moe_gemm": 0.060, "other": 0.005})
    assert s["draft_extend"].category_ms == pytest.approx(
        {"communication": 0.0, "attention": 0.008, "moe_gemm": 0.0, "other": 0.0})
    assert s["all"].iterations == 2  # the verify iterations
    assert s["all"].category_ms["communication"] == pytest.approx((2 * 0.040 + 0.050) / 2)
    assert s["all"].category_ms["other"] == pytest.approx((2 * 0.005 + 0.004) / 2)
    assert "GPU kernel time" in s["verify"].source
    assert any("2 GPU events without a launch correlation" in x for x in m.sources)  # the AllGather, the copy


def test_names():
    assert classify_kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert classify_kernel("cross_device_reduce_2stage<float, 8>") == "communication"
    assert classify_kernel("BatchDecodeWithPagedKVCacheKernel") == "attention"
    assert classify_kernel("_fwd_grouped_kernel_stage1") == "attention"
    assert classify_kernel("cutlass_mla_decode_kernel") == "attention"
    assert classify_kernel("Marlin<256, 1, 8, 8, 4, 8>") == "moe_gemm"
    assert classify_kernel("nvjet_tst_128x64_64x8_2x1_v_bz_TNN") == "moe_gemm"
    assert classify_kernel("triton_red_fused_add_rmsnorm_0") == "other"
    assert classify_kernel("aten::addmm", cpu=True) == "moe_gemm"
    assert classify_kernel("aten::add", cpu=True) == "other"
    assert classify_kernel("c10d::allreduce_", cpu=True) == "communication"
    py = "python_function"
    assert phase_of("sglang/srt/speculative/eagle_worker.py(523): draft", py) == "draft"
    assert phase_of("sglang/srt/speculative/eagle_worker.py(889): forward_draft_extend_after_decode", py) == \
        "draft_extend"
    assert phase_of("sglang/srt/speculative/eagle_worker.py(376): _draft_preprocess_decode", py) == "draft"
    assert phase_of("sglang/srt/model_executor/model_runner.py(1900): forward_decode", py) == "decode"
    assert phase_of("sglang/srt/managers/schedule_batch.py(1500): prepare_for_decode", py) is None
    assert phase_of("<built-in method decode of bytes object at 0x7f>", py) is None
    assert phase_of("step[EXTEND bs=2 toks=512]", "user_annotation") == "prefill"
    assert phase_of("ProfilerStep#3", "user_annotation") is None


def test_trace_errors(tmp_path):
    bad = tmp_path / "a.trace.json"
    bad.write_text("{not json")
    with pytest.raises(InputError) as e:
        read_traces(bad)
    assert e.value.file == str(bad) and "Chrome trace" in e.value.message
    wrong = tmp_path / "b.trace.json"
    wrong.write_text(json.dumps({"events": []}))
    with pytest.raises(InputError) as e:
        read_traces(wrong)
    assert e.value.key == "traceEvents"
    empty = tmp_path / "c.trace.json"
    empty.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name"}]}))
    with pytest.raises(InputError) as e:
        read_traces(empty)
    assert "no GPU kernel and no CPU op" in e.value.message
    (tmp_path / "none").mkdir()
    with pytest.raises(InputError):
        read_traces(tmp_path / "none")
    with pytest.raises(InputError):
        read_traces([tmp_path / "missing.trace.json"])
