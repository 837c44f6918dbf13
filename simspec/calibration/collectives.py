"""Measured collective tables -> CollectiveSample -> the all-reduce curve a profile carries (CollectiveCurve).

Two table formats:
- the CSV calibration/collective_bench.py writes: `#` comment lines (`# key=value ...`: host, torch, date, ...),
  then `bytes,time_us,world_size,backend,in_cuda_graph,op` (extra columns ignored; in_cuda_graph and op optional);
- nccl-tests' text output (`all_reduce_perf -b 8 -e 64M -f 2 -g N`): the `# nThread 1 nGpus 8 ... graph: 0`
  header, one `#  Rank  r Group ...` line per rank, and rows `size count type redop root time algbw busbw
  #wrong time algbw busbw #wrong` (out-of-place, then in-place; versions without the root column too). Both
  the out-of-place and the in-place time of a row become samples (SGLang's all-reduces are in place).

How the curve is used (simspec/timing/collectives.py): linear between points, flat below the first, above the
last `t_last + 2(p-1)/p x extra bytes / busbw`; points must be positive, sorted, and never fall
(simspec/presets check_curve_points).
"""

from __future__ import annotations

import math
import re
import statistics
from pathlib import Path

from simspec.calibration.measurements import CollectiveSample, Measurements
from simspec.errors import InputError
from simspec.scenario.profile import CollectiveCurve

CSV_COLUMNS = ("bytes", "time_us", "world_size", "backend", "in_cuda_graph", "op")
_NCCL_HEADER = re.compile(r"^#\s*nThread\s+(?P<threads>\d+)\s+nGpus\s+(?P<gpus>\d+)")
_NCCL_GRAPH = re.compile(r"graph:\s*(?P<graph>\d+)")
_NCCL_RANK = re.compile(r"^#\s+Rank\s+\d+\s")
_NCCL_OP = re.compile(r"(?:Collective test starting:\s*)?(?P<op>all_reduce|all_gather|reduce_scatter|alltoall|"
                      r"broadcast|reduce|sendrecv)_perf")
# A curve is a latency (its flat start below the first point) and a bandwidth (its slope, and the bus bandwidth
# that prices messages past the last point): one message size pins neither apart from the other.
MIN_SIZES = 2
_BOOL = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}


def _lines(path: str | Path) -> list[str]:
    p = Path(path)
    try:
        return p.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror or err}", file=str(p)) from None


def is_nccl_tests(lines: list[str]) -> bool:
    return any(_NCCL_HEADER.match(ln) or "out-of-place" in ln for ln in lines[:200])


def table_header(path: str | Path) -> dict[str, str]:
    """`key=value` pairs of the `#` comment lines (collective_bench.py's host, torch, date, ...)."""
    out: dict[str, str] = {}
    for ln in _lines(path):
        if not ln.startswith("#"):
            continue
        for m in re.finditer(r"(\w[\w.-]*)=(\S+)", ln):
            out.setdefault(m.group(1), m.group(2))
    return out


def _read_csv(lines: list[str], file: str) -> list[CollectiveSample]:
    header: list[str] | None = None
    out: list[CollectiveSample] = []
    for n, ln in enumerate(lines, start=1):
        if not ln.strip() or ln.lstrip().startswith("#"):
            continue
        cells = [c.strip() for c in ln.split(",")]
        if header is None:
            header = [c.lower() for c in cells]
            missing = [c for c in ("bytes", "time_us", "world_size", "backend") if c not in header]
            if missing:
                raise InputError(f"expected a CSV header with columns {','.join(CSV_COLUMNS)} (missing "
                                 f"{', '.join(missing)}), or nccl-tests output", file=file, key=f"line {n}")
            continue
        if len(cells) != len(header):
            raise InputError(f"{len(cells)} cells where the header has {len(header)}", file=file, key=f"line {n}")
        row = dict(zip(header, cells, strict=True))
        try:
            nbytes, time_us, world = int(row["bytes"]), float(row["time_us"]), int(row["world_size"])
        except ValueError:
            raise InputError("bytes and world_size must be integers, time_us a number", file=file,
                             key=f"line {n}") from None
        if nbytes <= 0 or not (math.isfinite(time_us) and time_us > 0) or world < 1:
            raise InputError("bytes and time_us must be positive (and finite), world_size at least 1", file=file,
                             key=f"line {n}")
        graph = _BOOL.get(row.get("in_cuda_graph", "false").lower())
        if graph is None:
            raise InputError(f"in_cuda_graph must be true or false, got {row['in_cuda_graph']!r}", file=file,
                             key=f"line {n}")
        out.append(CollectiveSample(op=row.get("op") or "all_reduce", bytes=nbytes, time_us=time_us,
                                    world_size=world, backend=row["backend"], in_cuda_graph=graph))
    if header is None:
        raise InputError(f"no CSV header ({','.join(CSV_COLUMNS)}) and no nccl-tests table", file=file)
    return out


def _read_nccl_tests(lines: list[str], file: str) -> list[CollectiveSample]:
    world = None
    graph = False
    ranks = 0
    op = None
    for ln in lines:
        m = _NCCL_HEADER.match(ln)
        if m:
            world = int(m["threads"]) * int(m["gpus"])
            g = _NCCL_GRAPH.search(ln)
            graph = bool(g and int(g["graph"]) > 0)
        if _NCCL_RANK.match(ln):
            ranks += 1
        if op is None and (m2 := _NCCL_OP.search(ln)):
            op = m2["op"]
    if op is None and (m3 := _NCCL_OP.search(Path(file).name)):
        op = m3["op"]
    world = ranks or world  # one "# Rank" line per rank, across MPI processes too
    if not world:
        raise InputError("nccl-tests output without the '# nThread N nGpus G' header or '#  Rank' lines: the"
                         " world size is unknown", file=file)
    out: list[CollectiveSample] = []
    for n, ln in enumerate(lines, start=1):
        tok = ln.split()
        if not tok or not tok[0].isdigit():
            continue
        if len(tok) == 13:
            t_oop, t_ip = tok[5], tok[9]  # with the root column
        elif len(tok) == 12:
            t_oop, t_ip = tok[4], tok[8]
        else:
            raise InputError(f"an nccl-tests row has {len(tok)} columns; expected size count type redop [root] "
                             "time algbw busbw #wrong time algbw busbw #wrong", file=file, key=f"line {n}")
        try:
            nbytes, times = int(tok[0]), [float(t_oop), float(t_ip)]
        except ValueError:
            raise InputError("size must be an integer and the times numbers (us)", file=file,
                             key=f"line {n}") from None
        if nbytes <= 0:
            continue  # nccl-tests prints size-0 rows when the count rounds to 0; they carry no timing
        for t in times:
            if not (math.isfinite(t) and t > 0):
                raise InputError(f"time {t} us must be a positive, finite number", file=file, key=f"line {n}")
            out.append(CollectiveSample(op=op or "all_reduce", bytes=nbytes, time_us=t, world_size=world,
                                        backend="nccl-tests", in_cuda_graph=graph))
    return out


def read_collective_table(path: str | Path) -> list[CollectiveSample]:
    """Samples from a collective_bench.py CSV or an nccl-tests text output (told apart by their content)."""
    file = str(path)
    lines = _lines(path)
    samples = _read_nccl_tests(lines, file) if is_nccl_tests(lines) else _read_csv(lines, file)
    if not samples:
        raise InputError("the table has no data row", file=file)
    return samples


def read_collectives(path: str | Path) -> Measurements:
    """The table as Measurements (collectives + a sources line with its header)."""
    samples = read_collective_table(path)
    info = table_header(path)
    extra = ", ".join(f"{k}={info[k]}" for k in ("host", "torch", "date") if k in info)
    return Measurements(collectives=samples,
                        sources=[f"collectives:{path}: {len(samples)} samples" + (f" ({extra})" if extra else "")])


def _isotonic(values: list[float], weights: list[float]) -> list[float]:
    """Least-squares non-decreasing fit (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, weight, length]
    for v, w in zip(values, weights, strict=True):
        blocks.append([v, w, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    out: list[float] = []
    for v, _, n in blocks:
        out += [v] * int(n)
    return out


def bus_bandwidth_gbps(nbytes: float, time_us: float, world_size: int) -> float:
    """nccl-tests' all-reduce bus bandwidth: bytes / time x 2(p-1)/p, in GB/s."""
    return nbytes / (time_us * 1e-6) * 2 * (world_size - 1) / world_size / 1e9


def time_from_bus_bandwidth_us(nbytes: float, busbw_gbps: float, world_size: int) -> float:
    """The all-reduce time a reported bus bandwidth stands for: the inverse of bus_bandwidth_gbps."""
    return nbytes / (busbw_gbps * 1e9) * 2 * (world_size - 1) / world_size * 1e6


def fit_collective_curve(samples: list[CollectiveSample], *, prefer_graph: bool = True, world_size: int | None = None,
                         source: str | None = None, bandwidth_points: int = 3) -> CollectiveCurve:
    """All-reduce samples -> CollectiveCurve.

    Uses the all_reduce samples of one world size (pass world_size when the table holds several), those
    measured inside a CUDA graph when there are any and prefer_graph (SGLang replays decode and verify as CUDA
    graphs), else the eager ones. Points: the median time per message size, made non-decreasing by a
    least-squares monotone fit (timing noise at small sizes must not make a larger message cheaper).
    bus_bandwidth_gbps: the median bus bandwidth (bytes / time x 2(p-1)/p) of the `bandwidth_points` largest
    sizes; it prices messages above the last point, so sweep far enough that these are bandwidth-bound.
    """
    ar = [s for s in samples if s.op.lower().replace("-", "_") in ("all_reduce", "allreduce")]
    if not ar:
        raise InputError(f"no all_reduce sample (ops present: {sorted({s.op for s in samples})})", key="op")
    sizes = sorted({s.world_size for s in ar})
    if world_size is None:
        if len(sizes) > 1:
            raise InputError(f"samples from several world sizes {sizes}: choose one (world_size=)", key="world_size")
        world_size = sizes[0]
    ar = [s for s in ar if s.world_size == world_size]
    if not ar:
        raise InputError(f"no all_reduce sample at world size {world_size} (have {sizes})", key="world_size")
    if world_size < 2:
        raise InputError("an all-reduce curve needs at least 2 ranks (the table was measured on 1)", key="world_size")
    in_graph = prefer_graph and any(s.in_cuda_graph for s in ar)
    chosen = [s for s in ar if s.in_cuda_graph == in_graph]
    by_size: dict[int, list[float]] = {}
    for s in chosen:
        by_size.setdefault(s.bytes, []).append(s.time_us)
    xs = sorted(by_size)
    if len(xs) < MIN_SIZES:
        kind = "inside a CUDA graph" if in_graph else "eager"
        raise InputError(f"the all-reduce samples ({kind}, {world_size} ranks) have {len(xs)} message size"
                         f"{'s' if len(xs) != 1 else ''} ({', '.join(map(str, xs))} B); a curve needs at least"
                         f" {MIN_SIZES} different sizes: a small, latency-bound one and a large, bandwidth-bound one"
                         " (sweep e.g. 1 KiB to 256 MiB, as collective_bench.py and all_reduce_perf -b 8 -e 256M"
                         " -f 2 do)", key="bytes")
    medians = [statistics.median(by_size[x]) for x in xs]
    times = _isotonic(medians, [float(len(by_size[x])) for x in xs])
    points = [(float(x), float(t)) for x, t in zip(xs, times, strict=True)]
    top = list(zip(xs, medians, strict=True))[-max(1, bandwidth_points):]
    busbw = statistics.median(bus_bandwidth_gbps(x, t, world_size) for x, t in top)
    backends = ", ".join(sorted({s.backend for s in chosen}))
    what = (f"{backends} all-reduce on {world_size} ranks, {'inside a CUDA graph' if in_graph else 'eager'}, median"
            f" of {len(chosen)} samples over {len(xs)} sizes ({xs[0]}-{xs[-1]} B), monotone fit; bus bandwidth from"
            f" the {len(top)} largest sizes")
    return CollectiveCurve(measured_gpus=world_size, points_bytes_us=points, bus_bandwidth_gbps=busbw,
                           source=f"{source}: {what}" if source else what)


def fit_collective_table(path: str | Path, *, prefer_graph: bool = True, world_size: int | None = None
                         ) -> CollectiveCurve:
    """read_collective_table + fit_collective_curve, the source naming the file and its host/torch/date."""
    info = table_header(path)
    extra = ", ".join(f"{k} {info[k]}" for k in ("host", "torch", "date") if k in info)
    try:
        return fit_collective_curve(read_collective_table(path), prefer_graph=prefer_graph, world_size=world_size,
                                    source=f"collective table {Path(path).name}" + (f" ({extra})" if extra else ""))
    except InputError as err:
        raise InputError(err.message, file=str(path), key=err.key) from None
