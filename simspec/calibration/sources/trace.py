"""torch-profiler Chrome traces (SGLang's /start_profile output) -> KernelSplit per phase, ms per iteration.

SGLang writes one trace per rank, `{profile_id}-TP-{rank}[-DP-d][-PP-p][-EP-e][-{STAGE}].trace.json.gz`
(0.5.8 srt/managers/scheduler_profiler_mixin.py, 0.5.23 srt/managers/scheduler_components/profiler_manager.py),
plus `merged-{profile_id}.trace.json.gz` with merge_profiles (srt/utils/profile_merger.py), left out here when
the per-rank files are read too (it holds the same events again).

Kernels. GPU events (`cat` "kernel", "gpu_memcpy", "gpu_memset") are sorted by name into communication (NCCL
`ncclDevKernel_*`/`ncclKernel_*`, custom all-reduce `cross_device_reduce_*`, other all-reduce/all-gather
kernels), attention (FlashInfer `Batch{Prefill,Decode}WithPagedKVCache*`, `flash*`/fmha, MLA, Triton's
`_fwd_*kernel*`), moe_gemm (`fused_moe_kernel`, Marlin, CUTLASS/cuBLAS/xmma/nvjet GEMMs, matmul) and other.
A trace without GPU kernels (a CPU-only profile) is read from its CPU ops instead: the outermost `cpu_op` of
each call, `aten::mm`/`addmm`/`linear`/... -> moe_gemm, `c10d::allreduce_`/gloo/nccl -> communication,
scaled-dot-product attention -> attention, and a collective's work ranges on the backend's threads
(`gloo:all_reduce`) -> communication; the times are then CPU time.

Phases. Each kernel belongs to the CPU call that launched it (its `correlation` id matches the
`cudaLaunchKernel` / `cudaGraphLaunch` runtime event; kernels of a replayed CUDA graph carry the graph launch's
id), and through it to the CPU ranges open at that moment: `record_function` ranges (`user_annotation`) and,
with `with_stack`, Python function spans (`python_function`, named `path(line): function`). The outermost
range with a phase name decides:
- 0.5.23 names its ranges (srt/utils/profile_utils.py `build_step_span_name`, speculative/spec_utils.py
  `spec_stage_span`): `draft`, `draft_extend` stage spans, `step[VERIFY bs=N]`, `step[DRAFT bs=N]`,
  `step[DECODE bs=N]`, `step[EXTEND bs=N toks=T]`.
- 0.5.8/0.5.10 have no record_function ranges in these paths; with `with_stack` the EAGLE worker's methods
  (speculative/eagle_worker.py) give them: `draft` (also `draft_forward`, `_draft_preprocess_decode`),
  `verify`, `forward_draft_extend_after_decode`, `forward_target_extend` / `forward_draft_extend` (prefill),
  and the model runner's `forward_decode` / `forward_extend`.
Name -> phase, first match wins: "draft" with "extend" -> draft_extend, "verify" -> verify, "draft" -> draft,
"decode" -> decode, "extend"/"prefill" -> prefill (Python functions need "forward" too for decode and prefill,
so helpers like prepare_for_decode do not count). A draft_extend range that directly follows a prefill range
is the prefill's draft extend and counted as prefill. Each outermost range of a phase is one iteration of it.
Kernels under no phase range count only in phase "all", whose iterations are the verify iterations (else
decode, else the scheduler's `run_batch` calls (0.5.23 observability/scheduler_stage_metrics.py names its range
`scheduler.run_batch`), else ProfilerStep#N, else 1).

Graph launches. Each `cudaGraphLaunch` runtime event is one replay: its duration is the launch's host time, its
nodes the GPU events carrying its correlation id, its phase the range open at the call (as for kernels; "other"
outside any). They are grouped by (phase, nodes) with the median duration (GraphLaunch), from which calibration
fits the host cost of a launch (defaults.yaml graph_launch_us, graph_launch_per_node_us). The profiler's own
callbacks add to each call, so the figure is an upper bound.
"""

from __future__ import annotations

import gzip
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from simspec.calibration.measurements import GraphLaunch, KernelSplit, Measurements
from simspec.errors import InputError

CATEGORIES = ("communication", "attention", "moe_gemm", "other")
PHASES = ("draft", "verify", "draft_extend", "decode", "prefill")

_COMM = re.compile(r"nccl|cross_device_reduce|all_?reduce|all_?gather|reduce_?scatter|alltoall|all_to_all"
                   r"|custom_ar|quickreduce|mscclpp|one_?shot|two_?shot|c10d::|gloo|broadcast", re.I)
_ATTN = re.compile(r"attention|attn|flash|fmha|paged_?kv|prefillwith|decodewith|(?<![a-z])mla|_fwd_\w*kernel"
                   r"|scaled_dot_product|sdpa|merge_state", re.I)
_GEMM_GPU = re.compile(r"gemm|gemv|moe|marlin|cutlass|xmma|cublas|matmul|nvjet|wgmma|s16816|s1688|sm\d\d_\w*_tn"
                       r"|splitk", re.I)
_GEMM_CPU = re.compile(r"^aten::(mm|addmm|bmm|baddbmm|addbmm|matmul|linear|einsum|_addmm_activation|addmv|mv"
                       r"|_scaled_mm|_int_mm)$|gemm|moe|marlin|matmul|mkldnn_linear", re.I)

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "hip_runtime", "runtime"}
RANGE_CATS = {"user_annotation", "python_function"}


def classify_kernel(name: str, *, cpu: bool = False) -> str:
    """Kernel (or, with cpu=True, CPU op) name -> communication | attention | moe_gemm | other."""
    if _COMM.search(name):
        return "communication"
    if _ATTN.search(name):
        return "attention"
    if (_GEMM_CPU if cpu else _GEMM_GPU).search(name):
        return "moe_gemm"
    return "other"


def phase_of(name: str, cat: str) -> str | None:
    """Range name -> phase, or None (see the module docstring)."""
    if cat == "python_function":
        if name.startswith("<") or "): " not in name:
            return None  # built-ins and C methods
        name = name.rsplit("): ", 1)[1]
    tokens = set(re.split(r"[^a-z0-9]+", name.lower()))
    if "draft" in tokens and "extend" in tokens:
        return "draft_extend"
    if "verify" in tokens:
        return "verify"
    if "draft" in tokens:
        return "draft"
    needs_forward = cat == "python_function"
    if "decode" in tokens and (not needs_forward or "forward" in tokens):
        return "decode"
    if ("extend" in tokens or "prefill" in tokens) and (not needs_forward or "forward" in tokens):
        return "prefill"
    return None


def _iteration_marker(name: str, cat: str) -> str | None:
    if cat == "user_annotation" and name.startswith("ProfilerStep#"):
        return "profiler_step"
    if (cat == "python_function" and name.endswith("): run_batch")) or name == "scheduler.run_batch":
        return "run_batch"  # Scheduler.run_batch; 0.5.23 also wraps it in a `scheduler.run_batch` range
    return None


@dataclass
class _Range:
    ts: float
    end: float
    phase: str | None  # own phase
    marker: str | None
    eff: str | None = None  # the outermost phase open at this range
    top: int = -1  # index of the outermost phase range this one sits in


@dataclass
class FileSplit:
    """What one trace file holds: kernel time per (phase, category) in microseconds and iterations per phase."""

    path: str
    mode: str  # "gpu" (kernels) or "cpu" (CPU ops)
    time_us: dict[str, dict[str, float]] = field(default_factory=lambda: defaultdict(lambda: defaultdict(float)))
    iterations: dict[str, int] = field(default_factory=dict)
    markers: dict[str, int] = field(default_factory=dict)
    items: int = 0
    unassigned: int = 0
    uncorrelated: int = 0
    graph_launches: list[tuple[str, int, float]] = field(default_factory=list)  # (phase, nodes, host us) each


def _load(path: Path) -> list[dict]:
    try:
        if path.name.endswith(".gz"):
            with gzip.open(path, "rt", encoding="utf-8") as fh:
                doc = json.load(fh)
        else:
            doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"not a readable Chrome trace (JSON, optionally gzip): {err}", file=str(path)) from None
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if not isinstance(events, list):
        raise InputError("expected a Chrome trace: a JSON object with a 'traceEvents' list (or a list of events)",
                         file=str(path), key="traceEvents")
    return events


def _complete(e: dict) -> bool:
    return (isinstance(e, dict) and e.get("ph") == "X" and isinstance(e.get("ts"), int | float)
            and isinstance(e.get("dur"), int | float))


def _sweep(ranges: list[_Range], queries: list[tuple[float, int]]) -> tuple[list[int], list[_Range]]:
    """For each query (ts, id) on one thread: the index (into the returned top-range list) of the outermost
    phase range open at ts, or -1. Ranges must nest (they do on one thread)."""
    order = sorted([(r.ts, 0, -r.end, i) for i, r in enumerate(ranges)] + [(t, 1, 0.0, q) for t, q in queries])
    stack: list[_Range] = []
    tops: list[_Range] = []
    answer = [-1] * len(queries)
    for ts, kind, _, i in order:
        # a range that starts exactly where the open one ends is its sibling, not its child (SGLang's stage
        # ranges can touch: draft ends where verify begins)
        while stack and (stack[-1].end < ts or (kind == 0 and stack[-1].end <= ts)):
            stack.pop()
        if kind == 0:
            r = ranges[i]
            outer = stack[-1] if stack else None
            if outer is not None and outer.eff is not None:
                r.eff, r.top = outer.eff, outer.top
            elif r.phase is not None:
                r.eff, r.top = r.phase, len(tops)
                tops.append(r)
            stack.append(r)
        else:
            answer[i] = stack[-1].top if stack else -1
    return answer, tops


def _relabel(tops: list[_Range]) -> tuple[list[str], list[bool]]:
    """Final phase of each outermost phase range, and whether it starts an iteration: a draft_extend right after
    a prefill is part of that prefill's iteration."""
    out: list[str] = []
    starts: list[bool] = []
    for i, r in enumerate(tops):
        phase = r.phase or "other"
        folded = phase == "draft_extend" and i > 0 and out[i - 1] == "prefill"
        out.append("prefill" if folded else phase)
        starts.append(not folded)
    return out, starts


def split_file(path: str | Path) -> FileSplit:
    """Kernel (or CPU op) time per phase and category, and iteration counts, of one trace file."""
    p = Path(path)
    events = [e for e in _load(p) if _complete(e)]
    gpu = [e for e in events if e.get("cat") in GPU_CATS]
    result = FileSplit(path=str(p), mode="gpu" if gpu else "cpu")
    ranges_by_thread: dict[tuple, list[_Range]] = defaultdict(list)
    markers: dict[str, list[tuple]] = defaultdict(list)
    for e in events:
        if e.get("cat") not in RANGE_CATS:
            continue
        name = str(e.get("name", ""))
        ph, mk = phase_of(name, e["cat"]), _iteration_marker(name, e["cat"])
        if ph or mk:
            ranges_by_thread[(e.get("pid"), e.get("tid"))].append(
                _Range(ts=float(e["ts"]), end=float(e["ts"]) + float(e["dur"]), phase=ph, marker=mk))

    # items: (thread, ts, category, dur_us)
    items: list[tuple[tuple, float, str, float]] = []
    main = max(ranges_by_thread, key=lambda k: len(ranges_by_thread[k]), default=None)
    # graph replays: (thread, ts, host us, nodes)
    graph_calls: list[tuple[tuple, float, float, int]] = []
    if gpu:
        launches: dict[object, tuple[tuple, float]] = {}
        graph_host_us: dict[object, float] = {}  # correlation -> the cudaGraphLaunch call's duration
        for e in events:
            if e.get("cat") in RUNTIME_CATS:
                corr = (e.get("args") or {}).get("correlation")
                if corr is not None:
                    launches[corr] = ((e.get("pid"), e.get("tid")), float(e["ts"]))
                    if str(e.get("name", "")).startswith("cudaGraphLaunch"):  # CUPTI may suffix a version (_v10000)
                        graph_host_us[corr] = float(e["dur"])
        nodes: dict[object, int] = defaultdict(int)
        for e in gpu:
            cat = classify_kernel(str(e.get("name", ""))) if e["cat"] == "kernel" else "other"
            corr = (e.get("args") or {}).get("correlation")
            launch = launches.get(corr)
            if launch is None:
                result.uncorrelated += 1
                launch = (main, float(e["ts"]))  # fall back to the kernel's own time on the busiest thread
            elif corr in graph_host_us:
                nodes[corr] += 1
            items.append((launch[0], launch[1], cat, float(e["dur"])))
        graph_calls = [(*launches[c], dur, nodes[c]) for c, dur in graph_host_us.items() if nodes[c]]
    else:
        # A collective's work runs on the backend's threads (`gloo:all_reduce` ranges); the calling thread's
        # c10d::* op only enqueues it. With those ranges present they are the communication time, placed on the
        # phase-carrying thread when they start, and the enqueue ops are left out.
        work = [e for e in events if e.get("cat") == "user_annotation"
                and str(e.get("name", "")).startswith(("gloo:", "nccl:", "mpi:", "ucc:"))]
        for e in work:
            items.append((main, float(e["ts"]), "communication", float(e["dur"])))
        ops_by_thread: dict[tuple, list[dict]] = defaultdict(list)
        for e in events:
            if e.get("cat") == "cpu_op":
                ops_by_thread[(e.get("pid"), e.get("tid"))].append(e)
        for thread, ops in ops_by_thread.items():
            ops.sort(key=lambda e: (e["ts"], -e["dur"]))
            open_end = float("-inf")
            for e in ops:  # the outermost op of each nest only, so nothing is counted twice
                if e["ts"] < open_end:
                    continue
                open_end = float(e["ts"]) + float(e["dur"])
                name = str(e.get("name", ""))
                if work and name.startswith("c10d::"):
                    continue
                items.append((thread, float(e["ts"]), classify_kernel(name, cpu=True), float(e["dur"])))
    result.items = len(items)

    by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i, (thread, *_rest) in enumerate(items):
        by_thread[thread].append(i)
    graphs_by_thread: dict[tuple, list[int]] = defaultdict(list)
    for i, (thread, *_rest) in enumerate(graph_calls):
        graphs_by_thread[thread].append(i)
    phases_of_item = [None] * len(items)
    iterations: dict[str, int] = defaultdict(int)
    for thread in set(by_thread) | set(ranges_by_thread) | set(graphs_by_thread):
        ranges = ranges_by_thread.get(thread, [])
        idx = by_thread.get(thread, [])
        gidx = graphs_by_thread.get(thread, [])
        # one sweep places the kernels' launches and the graph launches alike (queries past len(idx): graphs)
        answer, tops = _sweep(ranges, [(items[i][1], k) for k, i in enumerate(idx)]
                              + [(graph_calls[i][1], len(idx) + k) for k, i in enumerate(gidx)])
        final, starts = _relabel(tops)
        for ph, start in zip(final, starts, strict=True):
            iterations[ph] += start
        for k, i in enumerate(idx):
            phases_of_item[i] = final[answer[k]] if answer[k] >= 0 else None
        for k, i in enumerate(gidx):
            top = answer[len(idx) + k]
            _t, _ts, dur, n = graph_calls[i]
            result.graph_launches.append((final[top] if top >= 0 else "other", n, dur))
        for r in ranges:
            if r.marker:
                markers[r.marker].append((r.ts, r.end))
    for i, (_t, _ts, cat, dur) in enumerate(items):
        ph = phases_of_item[i]
        if ph is None:
            result.unassigned += 1
        else:
            result.time_us[ph][cat] += dur
        result.time_us["all"][cat] += dur
    result.iterations = dict(iterations)
    result.markers = {k: len(v) for k, v in markers.items()}
    return result


def _all_iterations(fs: FileSplit) -> tuple[int, str]:
    for key, why in (("verify", "verify iterations"), ("decode", "decode iterations")):
        if fs.iterations.get(key):
            return fs.iterations[key], why
    for key, why in (("run_batch", "run_batch calls"), ("profiler_step", "profiler steps")):
        if fs.markers.get(key):
            return fs.markers[key], why
    return 1, "iterations unknown: totals"


def trace_files(dir_or_files: str | Path | Iterable[str | Path]) -> list[Path]:
    """The trace files a directory holds (`*.trace.json`, `*.trace.json.gz`; merged-* only if alone), or the
    files given."""
    if isinstance(dir_or_files, str | Path):
        p = Path(dir_or_files)
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.name.endswith((".trace.json", ".trace.json.gz")))
            per_rank = [q for q in found if not q.name.startswith("merged-")]
            files = per_rank or found
            if not files:
                raise InputError("no *.trace.json or *.trace.json.gz file in this directory", file=str(p))
            return files
        paths = [p]
    else:
        paths = [Path(x) for x in dir_or_files]
    if not paths:
        raise InputError("no trace file given")
    for q in paths:
        if not q.is_file():
            raise InputError("no such trace file", file=str(q))
    return paths


def read_traces(dir_or_files: str | Path | Iterable[str | Path], *, per_file: bool = False) -> Measurements:
    """torch-profiler Chrome traces -> one KernelSplit per phase (and "all"), ms per iteration.

    Several files (one per TP rank) are pooled: a phase's ms per iteration is its kernel time over all files /
    its iterations over all files, and `iterations` is that total. per_file=True gives one split per file
    instead. A trace with neither GPU kernels nor CPU ops is an InputError.
    """
    files = trace_files(dir_or_files)
    splits = [split_file(f) for f in files]
    for s in splits:
        if s.items == 0:
            raise InputError("the trace holds no GPU kernel and no CPU op event (ph 'X', cat 'kernel' or 'cpu_op')",
                             file=s.path, key="traceEvents")
    groups = [[s] for s in splits] if per_file else [splits]
    out: list[KernelSplit] = []
    sources: list[str] = []
    for group in groups:
        names = ", ".join(Path(s.path).name for s in group)
        modes = {s.mode for s in group}
        what = "GPU kernel time" if modes == {"gpu"} else "CPU op time (no GPU kernels in the trace)"
        for phase in PHASES:
            iters = sum(s.iterations.get(phase, 0) for s in group)
            if not iters:
                continue
            out.append(KernelSplit(
                phase=phase, iterations=iters,
                category_ms={c: sum(s.time_us[phase][c] for s in group) / iters / 1000.0 for c in CATEGORIES},
                source=f"trace:{names} ({what} per {phase} iteration)"))
        all_iters = [_all_iterations(s) for s in group]
        total_iters = sum(n for n, _ in all_iters)
        out.append(KernelSplit(
            phase="all", iterations=total_iters,
            category_ms={c: sum(s.time_us["all"][c] for s in group) / total_iters / 1000.0 for c in CATEGORIES},
            source=f"trace:{names} ({what}, every event, per {all_iters[0][1]})"))
        unassigned = sum(s.unassigned for s in group)
        uncorrelated = sum(s.uncorrelated for s in group)
        unit = "GPU kernels/copies" if modes == {"gpu"} else "outermost CPU ops"
        sources.append(f"trace:{names}: {sum(s.items for s in group)} {unit}, "
                       f"{unassigned} outside any phase range"
                       + (f", {uncorrelated} GPU events without a launch correlation (placed by their own time)"
                          if uncorrelated else ""))
    return Measurements(kernel_splits=out, sources=sources, graph_launches=graph_launches(splits))


def graph_launches(splits: list[FileSplit]) -> list[GraphLaunch]:
    """The files' graph replays pooled (every rank launches its own copy of each graph) and grouped by phase and
    node count, each group with its median host time."""
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for s in splits:
        for phase, n, dur in s.graph_launches:
            groups[(phase, n)].append(dur)
    names = ", ".join(Path(s.path).name for s in splits)
    return [GraphLaunch(phase=phase, nodes=n, host_us=statistics.median(durs), launches=len(durs),
                        source=f"trace:{names} (cudaGraphLaunch, {phase} phase, {n} nodes)")
            for (phase, n), durs in sorted(groups.items())]
