"""The GPU kernels a piece of torch code launches, from a torch profiler (CUPTI) trace: shared by the benchmarks
in this folder, which run on a GPU node with torch alone."""

from __future__ import annotations

import json
import os
import tempfile


def kernel_events(run, with_cpu: bool = False) -> list[dict]:
    """Every GPU kernel `run()` launches, as the trace's events (name, ts and dur in us), by start time."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, ProfilerActivity.CUDA] if with_cpu else [ProfilerActivity.CUDA]
    torch.cuda.synchronize()
    with profile(activities=activities) as prof:
        run()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        path = f.name
    try:
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    finally:
        os.unlink(path)
    return sorted((e for e in events if e.get("cat") == "kernel" and "dur" in e), key=lambda e: float(e["ts"]))
