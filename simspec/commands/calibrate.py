"""`simspec calibrate`: measure a live SGLang server (or read its logs, benchmarks and traces), fit a profile,
write a scenario that reproduces the server, and say how well the model then predicts what was measured."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import click

from simspec.errors import InputError

DEFAULT_DIR = Path("calibration") / "profiles"


def _int_list(value: str, flag: str) -> list[int]:
    try:
        out = [int(v) for v in value.split(",") if v.strip()]
    except ValueError:
        raise InputError(f"must be a comma-separated list of positive integers, e.g. 1,2,4,8 (got {value!r})",
                         key=flag) from None
    if not out or any(v < 1 for v in out):
        raise InputError(f"must be a comma-separated list of positive integers, e.g. 1,2,4,8 (got {value!r})",
                         key=flag)
    return sorted(set(out))


_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")


def _check_name(name: str) -> None:
    """--name is a plain file stem: it becomes calibration/profiles/NAME.yaml, never a path elsewhere."""
    if not _NAME.fullmatch(name) or ".." in name:
        raise InputError(f"{name!r} is not a plain profile name: allowed are letters, digits, '.', '_' and '-',"
                         " starting with a letter or digit, without '..' or a path separator (use --out PATH to"
                         " write elsewhere)", key="--name")


def _check_presets(model: str | None, drafter: str | None) -> None:
    """--model and --drafter name presets: checked before any file is read or anything measured."""
    from simspec import presets

    if model is not None and model not in presets.models():
        raise InputError(f"unknown model preset {model!r}; known: {', '.join(sorted(presets.models()))}",
                         key="--model")
    if drafter is not None and drafter not in presets.drafters() and drafter not in presets.models():
        raise InputError(f"unknown drafter preset {drafter!r}; known: EAGLE drafters"
                         f" {', '.join(sorted(presets.drafters()))} (or, for a standalone draft model, a model"
                         " preset)", key="--drafter")


def _outputs(out: str | None, name: str) -> tuple[Path, Path, Path]:
    profile = Path(out) if out else DEFAULT_DIR / f"{name}.yaml"
    if profile.suffix not in (".yaml", ".yml"):
        raise InputError("the profile is YAML: give a path ending in .yaml", file=str(profile), key="--out")
    scenario = profile.with_name(profile.stem + ".scenario.yaml")
    measurements = profile.with_name(profile.stem + ".measurements.json")
    return profile, scenario, measurements


def _check_overwrite(paths: list[Path], force: bool, resume: bool) -> None:
    """Never overwrite earlier results without --force. --resume continues an earlier run: its files are all
    rebuilt from the saved measurements, so they may be replaced."""
    if force or resume:
        return
    for p in paths:
        if p.exists():
            raise InputError("exists; pass --force to overwrite it (or --out to write elsewhere)", file=str(p),
                             key="--out")


def _resume_hint(err: InputError, measurements: Path, profile: Path, out: str | None, named: bool) -> str:
    """What to do after a live run's fit is refused: its measurements are saved, and --resume refits them without
    measuring again. The fit is deterministic, so when a flag may be the cause (step times the model cannot reach
    are often a wrong --model, --gpu or --tp; fitting.py refuses them under the key "step times") that flag is
    corrected first. The default profile path is named after --model, --gpu and --tp, so the corrected run is
    pointed at the saved measurements with --out."""
    if err.key == "step times":
        flags = "if --model, --gpu or --tp is wrong, correct it first, then re-run"
    elif (err.key or "").startswith("--"):
        flags = f"correct {err.key} first, then re-run"
    else:
        return f"the measurements are saved in {measurements}: re-run with --resume to fit them again"
    resume = "--resume"
    if out is None and not named:
        resume += f" --out {profile} (the default path follows --model, --gpu and --tp)"
    return f"the measurements are saved in {measurements}: {flags} with {resume} to fit them again without measuring"


def _prepare_directory(path: Path) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise InputError(f"cannot create the output directory {path.parent}: {exc.strerror or exc}",
                         file=str(path), key="--out") from None


def _profile_traces(host: str, steps: int, trace_dir: str | None, ssh: str | None, timeout: float,
                    concurrency: int, prompts: list[dict[str, Any]], max_new_tokens: int) -> Path:
    """Ask the server to profile `steps` iterations while a short workload runs, then find its traces: in
    trace_dir (a directory the server writes to, visible here) or copied over ssh from the server host."""
    import httpx

    from simspec.calibration.live import normalise_base_url, run_workload

    base = normalise_base_url(host)
    remote_dir = f"/tmp/simspec-profile-{int(time.time())}"
    out_dir = trace_dir or remote_dir
    body = {"output_dir": out_dir, "num_steps": steps, "activities": ["CPU", "GPU"], "with_stack": True,
            "record_shapes": False}
    try:
        resp = httpx.post(f"{base}/start_profile", json=body, timeout=timeout, trust_env=False)
    except httpx.HTTPError as exc:
        raise InputError(f"POST {base}/start_profile failed: {exc}", key="--profile-steps") from None
    if resp.status_code >= 400:
        raise InputError(f"POST {base}/start_profile answered {resp.status_code}: {resp.text[:200]}"
                         " (is the server started with a profiler-capable build?)", key="--profile-steps")
    # the profiler records the next `steps` forward passes: give it traffic
    run_workload(host, prompts, [concurrency], max_new_tokens=max_new_tokens, num_requests=concurrency,
                 progress=False, timeout=timeout, warmup=0, flush_cache=False)
    if ssh:
        local = Path(tempfile.mkdtemp(prefix="simspec-traces-"))
        if shutil.which("scp") is None:
            raise InputError("scp is not installed here; copy the traces yourself and pass --from-trace DIR",
                             key="--ssh")
        deadline = time.monotonic() + timeout
        while True:
            res = subprocess.run(["scp", "-q", "-o", "BatchMode=yes", f"{ssh}:{out_dir}/*.trace.json*", str(local)],
                                 capture_output=True, text=True, timeout=timeout)
            if res.returncode == 0 or time.monotonic() > deadline:
                break
            time.sleep(2.0)
        if res.returncode != 0:
            raise InputError(f"could not copy the traces from {ssh}:{out_dir}: {res.stderr.strip()[:200]}",
                             key="--ssh")
        return local
    path = Path(out_dir)
    deadline = time.monotonic() + timeout
    while not any(path.glob("*.trace.json*")):
        if time.monotonic() > deadline:
            raise InputError(f"no *.trace.json(.gz) appeared in {path} within {timeout:g} s: is it the directory"
                             " the server writes to (same filesystem)? Otherwise use --ssh USER@HOST",
                             key="--trace-dir")
        time.sleep(1.0)
    time.sleep(2.0)  # the server writes one file per TP rank; let the others land
    return path


def _write_outputs(meas: Any, profile_path: Path) -> Path | None:
    """The streamed output token ids, one request per line: the corpus `simspec ngram` and
    `acceptance: {ngram_replay: ...}` replay SGLang's n-gram drafter over."""
    rows = [r for r in meas.requests if r.output_ids]
    if not rows:
        return None
    path = profile_path.with_name(profile_path.stem + ".outputs.jsonl")
    tmp = path.with_name(path.name + ".tmp")
    with tmp.open("w") as f:
        for i, r in enumerate(rows):
            f.write(json.dumps({"id": f"c{r.concurrency}-{i}", "concurrency": r.concurrency,
                                "output_ids": r.output_ids}) + "\n")
    tmp.replace(path)
    return path


def _write_yaml(path: Path, data: dict, header: str, key: str = "--out") -> None:
    import yaml

    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(header + yaml.safe_dump(data, sort_keys=False, width=110))
        tmp.replace(path)
    except OSError as exc:
        raise InputError(f"cannot write: {exc.strerror or exc}", file=str(path), key=key) from None


def _overrides_at(meas: Any, c: int) -> list[str]:
    """What the written scenario needs to stand for the run at concurrency c: its clients and requests, the mean
    prompt and output its requests had, and the acceptance they realised."""
    from simspec.calibration.fitting import histogram_from_requests, max_drafts_of

    at_c = [r for r in meas.requests if r.concurrency == c]
    n = len(at_c) or 4 * c
    overrides = [f"workload.arrival.concurrency={c}", f"workload.num_requests={max(n, c)}"]
    if at_c:
        prompt = max(1, round(sum(r.prompt_tokens for r in at_c) / len(at_c)))
        output = max(2, round(sum(r.completion_tokens for r in at_c) / len(at_c)))
        overrides += [f"workload.input_tokens.value={prompt}", f"workload.output_tokens.value={output}"]
        # the acceptance these requests realised: a few hundred verify steps per concurrency drift a few %
        # from the pooled histogram, and the comparison is about time, not about sampling luck
        hist = histogram_from_requests(at_c, max_drafts_of(meas.server))
        if hist is not None:
            overrides.append(f"acceptance={{histogram: {hist}, source: 'measured at concurrency {c}'}}")
    return overrides


def _compare(scenario_path: Path, meas: Any, held_out: frozenset[int] = frozenset()) -> list[dict]:
    """Predict the written scenario at every measured concurrency: measured vs predicted tok/s and step time;
    `held_out` marks the concurrencies the fit did not see."""
    from simspec.predict import predict
    from simspec.scenario.loader import load_scenario

    rows = []
    # measured step time per batch size: every observation of it (from any concurrency's run, its drain
    # included), weighted by the iterations it covers
    pooled: dict[int, list[float]] = {}
    for o in meas.step_times:
        acc = pooled.setdefault(o.batch_size, [0.0, 0.0])
        acc[0] += o.seconds * 1e3 * max(o.samples, 1)
        acc[1] += max(o.samples, 1)
    step_at = {b: (t / n, None) for b, (t, n) in pooled.items()}
    for point in sorted(meas.throughput, key=lambda t: t.concurrency):
        c = point.concurrency
        result = predict(load_scenario(scenario_path, _overrides_at(meas, c)))
        measured_step = step_at.get(c, (None, None))[0]
        rows.append({
            "concurrency": c, "source": point.source, "held_out": c in held_out,
            "measured_tokens_per_s": point.tokens_per_s, "predicted_tokens_per_s": result["tokens_per_s"],
            "error_pct": (result["tokens_per_s"] / point.tokens_per_s - 1) * 100 if point.tokens_per_s else None,
            "measured_iteration_ms": measured_step, "predicted_iteration_ms": result["iteration_ms"],
            "measured_accept_length": point.accept_length, "predicted_accept_length": result["accept_length"],
        })
    return rows


def _for_fit(meas: Any, held_out: frozenset[int]) -> Any:
    """What the fit may see when concurrencies are held out (--hold-out): their requests, throughput, iteration
    times and traces left out (a live run's iteration times and --profile-steps traces name the concurrency they
    came from, a run's drain included), the per-step accept lengths read again from the kept requests, and the
    /metrics counters, which count the whole run, dropped. The comparison still predicts every concurrency."""
    if not held_out:
        return meas
    from simspec.calibration.live import accept_lengths_from_records, max_step_tokens

    unattributed = sorted({o.source for o in [*meas.step_times, *meas.kernel_splits, *meas.graph_launches]
                           if o.concurrency is None})
    if unattributed:
        raise InputError("held-out concurrencies need every iteration time and trace to name the run it came from;"
                         f" {', '.join(unattributed)} do not (measurements saved by an older simspec: measure"
                         " again without --resume)", key="--hold-out")
    measured = {t.concurrency for t in meas.throughput}
    missing = sorted(held_out - measured)
    if missing:
        raise InputError(f"nothing was measured at concurrency {', '.join(map(str, missing))} (measured:"
                         f" {', '.join(map(str, sorted(measured))) or 'none'})", key="--hold-out")
    kept = [r for r in meas.requests if r.concurrency not in held_out]
    accept = (accept_lengths_from_records(kept, max_step_tokens=max_step_tokens(meas.server))
              if meas.accept_lengths else [])
    return meas.model_copy(update={
        "requests": kept,
        "step_times": [o for o in meas.step_times if o.concurrency not in held_out],
        # a trace of a held-out run (saved by an earlier --profile-steps, back through --resume) stays out too
        "kernel_splits": [k for k in meas.kernel_splits if k.concurrency not in held_out],
        "graph_launches": [g for g in meas.graph_launches if g.concurrency not in held_out],
        "throughput": [t for t in meas.throughput if t.concurrency not in held_out],
        "accept_lengths": accept,
        "prometheus": {},
    })


def _latencies_at(meas: Any, c: int) -> list[dict[str, Any]]:
    """The run's latencies at concurrency c as a case's also_measured figures, each as `simspec predict` defines
    it (analysis/metrics.py, the same percentiles): time to first token from submission, time per output token
    after the first (per request), and the gaps between streamed chunks (one chunk an iteration)."""
    import numpy as np

    from simspec.analysis.metrics import percentiles

    at_c = [r for r in meas.requests if r.concurrency == c and r.chunk_times and r.e2e_latency is not None]
    ttft = [(r.chunk_times[0] - (r.chunk_times[-1] - r.e2e_latency)) * 1e3 for r in at_c]
    tpot = [(r.chunk_times[-1] - r.chunk_times[0]) * 1e3 / (r.completion_tokens - 1) for r in at_c
            if r.completion_tokens > 1 and len(r.chunk_times) >= 2]
    itl = [g * 1e3 for r in at_c for g in np.diff(r.chunk_times)]
    out = []
    for metric, values in (("ttft_ms", ttft), ("tpot_ms", tpot), ("itl_ms", itl)):
        if values:
            p = percentiles(np.array(values))
            out += [{"metric": f"{metric}.{k}", "value": round(p[k], 4)} for k in ("mean", "p50") if p[k] > 0]
    return out


def _case_ids(stem: str, concurrencies: list[int]) -> list[str]:
    """The ids --cases gives, one per measured point in this order: the profile's file name and the concurrency,
    numbered where two sources measured the same concurrency (a live run and a benchmark file, or a file with two
    points at one), so that no case replaces another."""
    from collections import Counter

    seen: Counter[int] = Counter()
    total = Counter(concurrencies)
    ids = []
    for c in concurrencies:
        seen[c] += 1
        ids.append(f"{stem}-c{c}" if total[c] == 1 else f"{stem}-c{c}-{seen[c]}")
    return ids


def _write_cases(cases: Path, stem: str, comparison: list[dict], scenario_path: Path, profile_path: Path,
                 measurements_path: Path, meas: Any, host: str | None, notes: list[str]) -> list[Path]:
    """One validation case per measured concurrency (validation.Case), for `simspec validate`: the written
    scenario at that concurrency's clients, lengths and realised acceptance, its measured mean per-request decode
    rate, fitted: false where the fit held the concurrency out. A box measured this way is a controlled case:
    its server, flags, lengths and acceptance are what was run, not a reading of a published one. A concurrency
    without a measured rate gets no case, and `notes` says so."""
    import datetime as _dt
    import os

    import yaml

    from simspec.scenario.reading import apply_overrides

    base = yaml.safe_load(scenario_path.read_text(encoding="utf-8"))
    hw, server = base["hardware"], base["server"]
    version = server.get("sglang_version", "(version not stated)")
    box = f"{base['model']} on {hw.get('num_gpus', server['tp'])} x {hw['gpu']}, TP {server['tp']}, SGLang {version}"
    algorithm = (base.get("speculative") or {}).get("algorithm", "no speculation")
    profile = os.path.relpath(profile_path.resolve(), cases.resolve())
    today = _dt.date.today().isoformat()
    written = []
    ids = _case_ids(stem, [row["concurrency"] for row in comparison])
    for row, case_id in zip(comparison, ids, strict=True):
        c, value = row["concurrency"], row["measured_tokens_per_s"]
        if not value or value <= 0:
            notes.append(f"no case for concurrency {c}: no request there decoded past its first chunk, so no"
                         " per-request decode rate was measured")
            continue
        scenario = apply_overrides(base, _overrides_at(meas, c), str(scenario_path))
        scenario["name"] = case_id
        scenario["calibration"] = profile
        n = sum(1 for r in meas.requests if r.concurrency == c)
        quote = f"mean per-request decode rate {value:.2f} tok/s"
        if row["measured_accept_length"]:
            quote += f", accept length {row['measured_accept_length']:.3f}"
        if row["measured_iteration_ms"] is not None:
            quote += f", {row['measured_iteration_ms']:.3f} ms an iteration at batch {c}"
        held = row["held_out"]
        run = (f"live run against {host}: {n} requests at concurrency {c}" if row["source"] == "live" else
               f"from {row['source']}: concurrency {c}")
        workload = ("workload: the requests' mean prompt and output lengths at this concurrency, fixed (their spread"
                    " is not replayed)" if n else
                    "workload: the written scenario's lengths (the source gives none per request)")
        assumptions = [
            workload,
            "fitted: false: the profile was fitted without this concurrency's requests, iterations, throughput and"
            " traces (simspec calibrate --hold-out)" if held else
            "fitted: true: the profile was fitted to the measurements this case comes from (simspec calibrate)",
        ]
        if "acceptance" in scenario:
            assumptions.insert(1, "acceptance: the histogram these requests realised")
        case = {
            "id": case_id,
            "title": f"{box}, {algorithm}, concurrency {c}: mean per-request decode tok/s"
                     f" ({'held out of' if held else 'fitted by'} simspec calibrate)",
            "source": {
                "citation": f"simspec calibrate, {run}; raw measurements {measurements_path.name}, profile"
                            f" {profile_path.name}",
                "url": None, "quote": quote, "accessed": today},
            "fitted": not held,
            "measured": {"metric": "tokens_per_s", "value": round(value, 4)},
            "also_measured": _latencies_at(meas, c),
            "assumptions": assumptions,
            "scenario": scenario,
        }
        path = cases / f"{case_id}.yaml"
        _write_yaml(path, case, "# Written by simspec calibrate --cases: a measured case for `simspec validate`.\n",
                    key="--cases")
        written.append(path)
    return written


@click.command()
@click.option("--host", default=None, help="SGLang server: HOST, HOST:PORT or a URL.")
@click.option("--port", type=click.IntRange(1, 65535), default=None, help="Port when --host has none (30000).")
@click.option("--concurrency", "concurrency_text", default="1,2,4,8", show_default=True,
              help="Concurrencies to measure, comma-separated.")
@click.option("--prompts", type=click.Path(dir_okay=False), default=None,
              help="JSONL prompts (text, input_ids or messages); default: the shipped chat prompts.")
@click.option("--max-new-tokens", type=click.IntRange(min=2), default=256, show_default=True)
@click.option("--num-requests", type=click.IntRange(min=1), default=None,
              help="Requests per concurrency (default 3 waves).")
@click.option("--timeout", type=click.FloatRange(min=0.1), default=60.0, show_default=True,
              help="Seconds to wait for any one server answer.")
@click.option("--from-log", "logs", multiple=True, type=click.Path(dir_okay=False),
              help="An SGLang server log (decode-log lines; repeatable).")
@click.option("--from-bench", "benches", multiple=True, type=click.Path(dir_okay=False),
              help="bench_serving / bench_one_batch(_server) output (repeatable).")
@click.option("--from-trace", "traces", multiple=True, type=click.Path(),
              help="A directory or file of torch-profiler traces (repeatable).")
@click.option("--from-metrics", "metrics", multiple=True, type=click.Path(dir_okay=False),
              help="A saved /metrics scrape (Prometheus text; repeatable).")
@click.option("--collectives", type=click.Path(dir_okay=False), default=None,
              help="Table from calibration/collective_bench.py or nccl-tests: fitted into the all-reduce curve"
                   " (and collective_bench.py's gloo broadcast rows into tp_request_broadcast_us).")
@click.option("--profile-steps", type=click.IntRange(min=1), default=None,
              help="Profile N server iterations with /start_profile and split GPU time from the traces.")
@click.option("--trace-dir", type=click.Path(file_okay=False), default=None,
              help="Where the server writes profiler traces, when visible from here.")
@click.option("--ssh", default=None, metavar="USER@HOST", help="Copy profiler traces from the server host over ssh.")
@click.option("--gpu", required=True, help="GPU preset of the box (simspec presets).")
@click.option("--interconnect", required=True, help="Interconnect preset of the box (simspec presets).")
@click.option("--num-gpus", type=click.IntRange(min=1), default=None, help="GPUs in the box (default: tp).")
@click.option("--model", default=None, help="Model preset (default: matched from the server's model path).")
@click.option("--drafter", default=None, help="Drafter preset (default: matched from the server's draft model).")
@click.option("--tp", type=click.IntRange(min=1), default=None, help="TP degree when no source says it.")
@click.option("--name", default=None, help="Profile name (default: <model>-<gpu>-tp<N>-<algorithm>).")
@click.option("--out", default=None, help="Profile path (default calibration/profiles/NAME.yaml).")
@click.option("--force", is_flag=True, help="Overwrite an existing profile, scenario and measurements file.")
@click.option("--resume", is_flag=True, help="Continue a stopped live run from its saved measurements.")
@click.option("--bootstrap", type=click.IntRange(min=0), default=200, show_default=True,
              help="Bootstrap resamples for the 95% intervals.")
@click.option("--hold-out", "hold_out", default=None, metavar="C[,C...]",
              help="Concurrencies of the live run to measure but leave out of the fit: the comparison then tests"
                   " the profile on runs it was not fitted to.")
@click.option("--cases", type=click.Path(file_okay=False), default=None,
              help="Write one validation case per measured concurrency into this directory (fitted: false for"
                   " the held-out ones), for `simspec validate DIR`.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
def calibrate(host: str | None, port: int | None, concurrency_text: str, prompts: str | None, max_new_tokens: int,
              num_requests: int | None, timeout: float, logs: tuple[str, ...], benches: tuple[str, ...],
              traces: tuple[str, ...], metrics: tuple[str, ...], collectives: str | None,
              profile_steps: int | None, trace_dir: str | None, ssh: str | None, gpu: str, interconnect: str,
              num_gpus: int | None, model: str | None, drafter: str | None, tp: int | None, name: str | None,
              out: str | None, force: bool, resume: bool, bootstrap: int, hold_out: str | None, cases: str | None,
              as_json: bool) -> None:
    """Measure an SGLang server and write the profile the time model uses, so predictions speak for that box.

    Sources combine: a live server (--host), its logs, benchmark files, profiler traces, /metrics scrapes and a
    collective microbenchmark table. Writes the profile, a scenario reproducing the measured server and
    workload (PROFILE.scenario.yaml), the raw measurements (PROFILE.measurements.json) and the streamed output
    token ids (PROFILE.outputs.jsonl, for `simspec ngram`), then prints measured vs predicted tok/s and
    iteration time per concurrency. With --hold-out some concurrencies are measured but not fitted, and --cases
    writes every concurrency as a validation case.
    """
    args = dict(locals())
    from simspec.cli import fail

    try:
        _run(**args)
    except InputError as err:
        fail(err)


def _run(*, host: str | None, port: int | None, concurrency_text: str, prompts: str | None, max_new_tokens: int,
         num_requests: int | None, timeout: float, logs: tuple[str, ...], benches: tuple[str, ...],
         traces: tuple[str, ...], metrics: tuple[str, ...], collectives: str | None, profile_steps: int | None,
         trace_dir: str | None, ssh: str | None, gpu: str, interconnect: str, num_gpus: int | None,
         model: str | None, drafter: str | None, tp: int | None, name: str | None, out: str | None, force: bool,
         resume: bool, bootstrap: int, hold_out: str | None, cases: str | None, as_json: bool) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from simspec import presets
    from simspec.calibration.fitting import GRAPH_LAUNCH_COEFFICIENTS, Box, check_box, fit
    from simspec.calibration.measurements import Measurements

    if not any((host, logs, benches, traces, metrics, collectives)):
        raise InputError("nothing to calibrate from: give --host, --from-log, --from-bench, --from-trace,"
                         " --from-metrics or --collectives")
    if profile_steps and not host:
        raise InputError("--profile-steps profiles a live server: give --host too", key="--profile-steps")
    if profile_steps and not (trace_dir or ssh):
        raise InputError("--profile-steps needs --trace-dir DIR (the server's profiler directory, visible here) or"
                         " --ssh USER@HOST (to copy the traces)", key="--profile-steps")
    if resume and not host:
        raise InputError("--resume continues a live run: give --host too", key="--resume")
    for flag, value, table in (("--gpu", gpu, presets.gpus()), ("--interconnect", interconnect,
                                                                presets.interconnects())):
        if value not in table:
            raise InputError(f"unknown preset {value!r}; known: {', '.join(sorted(table))}", key=flag)
    concurrencies = _int_list(concurrency_text, "--concurrency")
    held_out: frozenset[int] = frozenset()
    if hold_out is not None:
        if not host:
            raise InputError("--hold-out leaves concurrencies of a live run out of the fit: give --host too",
                             key="--hold-out")
        if logs or benches or traces or metrics:
            raise InputError("a file's measurements cannot be told apart by the run's concurrency: hold out with"
                             " the live run alone (--collectives may stay)", key="--hold-out")
        held_out = frozenset(_int_list(hold_out, "--hold-out"))
        if not held_out <= set(concurrencies):
            raise InputError(f"{', '.join(map(str, sorted(held_out - set(concurrencies))))} is not among --concurrency"
                             f" {','.join(map(str, concurrencies))}: a held-out concurrency is measured too",
                             key="--hold-out")
        if held_out == set(concurrencies):
            raise InputError("every concurrency is held out: the fit needs at least one", key="--hold-out")
    if name is not None:
        _check_name(name)
    _check_presets(model, drafter)
    if host and port and ":" not in host.split("//")[-1]:
        host = f"{host}:{port}"

    console = Console(stderr=True)
    meas = Measurements()
    tp_said_by: str | None = None  # the first source that said the server's tp

    def add(more: Measurements, path: str) -> Measurements:
        nonlocal tp_said_by
        if tp_said_by is None and more.server.tp is not None:
            tp_said_by = path
        return meas.merge(more)

    for path in logs:
        from simspec.calibration.sources import read_decode_log
        meas = add(read_decode_log(path), path)
    for path in benches:
        from simspec.calibration.sources import read_bench
        meas = add(read_bench(path), path)
    for path in traces:
        from simspec.calibration.sources import read_traces
        meas = add(read_traces(path), path)
    for path in metrics:
        from simspec.calibration.sources import read_metrics
        meas = add(read_metrics(path), path)
    curve = None
    if collectives:
        from simspec.calibration.collectives import fit_collective_table, read_collectives
        meas = add(read_collectives(collectives), collectives)
        curve = fit_collective_table(collectives)
    if tp is not None and meas.server.tp is None:
        meas = meas.model_copy(update={"server": meas.server.model_copy(update={"tp": tp})})
    elif tp is not None and meas.server.tp != tp:
        raise InputError(f"{tp} but the server ran tp {meas.server.tp} (as read from {tp_said_by}):"
                         " --tp is for sources that do not say; leave it out, or give files from the server meant",
                         key="--tp")

    # the profile's name needs the server's description: ask it first when live
    live_server = None
    if host:
        from simspec.calibration.live import describe_server
        live_server = describe_server(host, timeout=min(timeout, 30.0))
        if tp is not None and live_server.tp is not None and live_server.tp != tp:
            raise InputError(f"{tp} but the server at {host} reports tp {live_server.tp} (/server_info):"
                             " --tp is for sources that do not say; leave it out", key="--tp")
    # the server as the fit will see it: live first, the files fill its gaps
    server = Measurements(server=live_server).merge(meas).server if live_server else meas.server
    if server.tp is None and tp is not None:
        server = server.model_copy(update={"tp": tp})
    box = Box(gpu=gpu, interconnect=interconnect, num_gpus=num_gpus, model=model, drafter=drafter)
    # every flag and the server description checked before anything is measured or written
    check_box(server, box)
    algorithm = server.algorithm if server else "none"
    named = name is not None
    if name is None:
        model_name = model or (server.model_path or "model").rstrip("/").split("/")[-1].lower()
        name = f"{model_name}-{gpu}-tp{server.tp or tp or 1}-{algorithm}"
    profile_path, scenario_path, measurements_path = _outputs(out, name)
    outputs = profile_path.with_name(profile_path.stem + ".outputs.jsonl")
    _check_overwrite([profile_path, scenario_path, measurements_path, outputs], force, resume)
    if cases is not None:
        # one point per live concurrency and per file point, in the comparison's order (live first at a tie)
        measured_at = sorted((concurrencies if host else []) + [t.concurrency for t in meas.throughput])
        if not measured_at:
            raise InputError("one case per measured concurrency: these sources measured no throughput (give --host"
                             " or a --from-bench file)", key="--cases")
        if Path(cases).resolve() == profile_path.resolve().parent:
            raise InputError(f"is where the profile and its scenario go ({profile_path.parent}); simspec validate"
                             " would read the scenario as a case: give the cases a directory of their own",
                             file=cases, key="--cases")
        for p in (Path(cases) / f"{i}.yaml" for i in _case_ids(profile_path.stem, measured_at)):
            if p.exists() and not (force or resume):
                raise InputError("exists; pass --force to overwrite it (or --cases DIR to write elsewhere)",
                                 file=str(p), key="--cases")
        try:
            Path(cases).mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise InputError(f"cannot create the directory: {exc.strerror or exc}", file=cases, key="--cases") from None
    _prepare_directory(profile_path)

    if host:
        from simspec.calibration.live import load_prompts, run_workload
        previous = None
        if resume:
            if not measurements_path.exists():
                raise InputError("nothing to resume: no saved measurements", file=str(measurements_path),
                                 key="--resume")
            previous = Measurements.load(measurements_path)
        prompt_list = load_prompts(prompts)
        live = run_workload(host, prompt_list, concurrencies, max_new_tokens=max_new_tokens,
                            num_requests=num_requests, measurements=previous, save_path=str(measurements_path),
                            progress=not as_json, timeout=timeout, server=live_server)
        if profile_steps:
            # at the largest concurrency the fit sees: a held-out run's kernels stay out of it too
            fitted_at = max(c for c in concurrencies if c not in held_out)
            found = _profile_traces(host, profile_steps, trace_dir, ssh, timeout, fitted_at, prompt_list,
                                    max_new_tokens)
            from simspec.calibration.sources import read_traces
            traced = read_traces(found)
            traced = traced.model_copy(update={
                "kernel_splits": [k.model_copy(update={"concurrency": fitted_at}) for k in traced.kernel_splits],
                "graph_launches": [g.model_copy(update={"concurrency": fitted_at}) for g in traced.graph_launches]})
            live = live.merge(traced)
        # live measurements first: the server's own description wins over what files said
        meas = live.merge(meas)

    def save() -> Path | None:
        try:
            meas.save(measurements_path)
            return _write_outputs(meas, profile_path)
        except OSError as exc:
            raise InputError(f"cannot write: {exc.strerror or exc}", file=str(measurements_path),
                             key="--out") from None

    if host:
        # a live run's measurements are work: saved before the fit can refuse them (--resume refits them)
        outputs_path = save()
        try:
            result = fit(_for_fit(meas, held_out), box, name=name, collective_curve=curve, bootstrap=bootstrap,
                         host=host)
        except InputError as err:
            raise InputError(f"{err.message} ({_resume_hint(err, measurements_path, profile_path, out, named)})",
                             file=err.file, key=err.key) from None
    else:
        # offline, the files are the evidence: a refused fit writes nothing, so a corrected re-run needs no --force
        result = fit(meas, box, name=name, collective_curve=curve, bootstrap=bootstrap, host=host)
        outputs_path = save()
    profile_data = result.profile.model_dump(exclude_none=True, mode="json")
    _write_yaml(profile_path, profile_data,
                "# Written by simspec calibrate. Fitted figures carry their 95% bootstrap interval and evidence;\n"
                f"# the raw measurements are in {measurements_path.name}.\n")
    scenario = dict(result.scenario)
    scenario["calibration"] = profile_path.name
    _write_yaml(scenario_path, scenario,
                "# Written by simspec calibrate: reproduces the measured server and workload. Change the workload\n"
                "# (or --set it) to ask what-if questions of this box.\n")
    comparison = _compare(scenario_path, meas, held_out)
    written_cases = (_write_cases(Path(cases), profile_path.stem, comparison, scenario_path, profile_path,
                                  measurements_path, meas, host, result.notes) if cases is not None else [])

    # read from a profiler trace, not fitted to the step times
    from_trace = {n: c.value for n, c in result.profile.coefficients.items() if n in GRAPH_LAUNCH_COEFFICIENTS}
    if result.profile.draft_forward_ms is not None:
        from_trace["draft_forward_ms"] = result.profile.draft_forward_ms.value
    summary = {
        "profile": str(profile_path), "scenario": str(scenario_path), "measurements": str(measurements_path),
        "outputs": str(outputs_path) if outputs_path else None,
        "sources": meas.sources,
        "parameters": {k: {"value": v, "interval_95": iv} for k, (v, iv) in result.parameters.items()},
        "from_trace": from_trace,
        "step_times": [{"batch_size": b, "measured_ms": m, "fitted_ms": p} for b, m, p in result.residuals_pct],
        "comparison": comparison, "held_out": sorted(held_out), "cases": [str(p) for p in written_cases],
        "notes": result.notes,
    }
    if as_json:
        click.echo(json.dumps(summary, indent=2))
        return
    out_console = Console()
    t = Table(title="fitted coefficients", title_justify="left")
    for col in ("coefficient", "value", "95% interval"):
        t.add_column(col)
    for k, (v, iv) in result.parameters.items():
        t.add_row(k, f"{v:.4g}", "n/a" if iv is None else f"[{iv[0]:.4g}, {iv[1]:.4g}]")
    for k, v in from_trace.items():
        t.add_row(k, f"{v:.4g}", "from the trace")
    if curve is not None:
        t.add_row("all_reduce curve", f"{len(curve.points_bytes_us)} points", escape(curve.source))
    out_console.print(t)
    c = Table(title="measured vs predicted (the written scenario)", title_justify="left")
    for col in ("concurrency", "tok/s measured", "tok/s predicted", "error", "iteration ms measured",
                "iteration ms predicted", "fit"):
        c.add_column(col, justify="right")
    for row in comparison:
        err = row["error_pct"]
        c.add_row(str(row["concurrency"]), f"{row['measured_tokens_per_s']:.2f}",
                  f"{row['predicted_tokens_per_s']:.2f}", "n/a" if err is None else f"{err:+.1f}%",
                  "n/a" if row["measured_iteration_ms"] is None else f"{row['measured_iteration_ms']:.3f}",
                  f"{row['predicted_iteration_ms']:.3f}", "held out" if row["held_out"] else "fitted")
    out_console.print(c)
    for note in result.notes:
        console.print(f"[yellow]note:[/] {escape(note)}", soft_wrap=True)
    written = [profile_path, scenario_path, measurements_path, *([outputs_path] if outputs_path else []),
               *written_cases]
    console.print("wrote " + ", ".join(escape(str(p)) for p in written), highlight=False)
