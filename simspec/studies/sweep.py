"""Sweeps: one scenario, many variations, one table of predictions (one row per point).

A sweep file (YAML) names a base scenario and what to vary:

    name: draft-budget                      # optional
    description: ...                        # optional
    base: ../eagle3.yaml                    # a scenario file, relative to this file; or
    # scenario: {...}                       #   an inline scenario mapping (its calibration path is then
                                            #   relative to this file)
    setups:                                 # optional: named change sets, one coherent setup each
      baseline: {speculative: {algorithm: none}, acceptance: null}
      eagle3: {speculative.num_draft_tokens: 4, acceptance.accept_length: 1.8}
    points:                                 # optional: a list of change sets, each one point
      - {speculative.num_steps: 1, speculative.num_draft_tokens: 2}
      - {speculative.num_steps: 3, speculative.num_draft_tokens: 4}
    grid:                                   # optional: field path -> list of values (cartesian product)
      acceptance.accept_length: [1.5, 2.0, 2.5]
      workload.arrival.concurrency: [1, 8, 64]

Field paths are those of `simspec predict --set` (checked against the scenario schema before anything runs). A
value may be a scalar, a list or a mapping: a mapping replaces the whole section it names (`acceptance: {...}`
drops the base's acceptance figures), `null` clears a field. The points are setups x points x grid (the
last grid key varies fastest); each point applies its setup's changes, then its point's, then its grid values,
so a later one wins where two set the same field.

The table has, in this order: `point` (0, 1, ...), `setup` (when setups are given), one column per varied field
path holding the value the point actually used (lists and mappings as JSON), `error` (empty unless the point
failed validation), then the prediction flattened (`simspec predict --json`: its setup figures unprefixed,
nested figures as `breakdown_ms.cpu`, the baseline's as `baseline.iteration_ms`), and three derived columns:
`concurrency` (closed loop) or `arrival_rate_per_s` (Poisson), `allreduce_token_us` (one all-reduce of one
token's hidden state on this box: the interconnect's small-message time) and `allreduce_verify_us` (one
all-reduce of one request's verify, num_draft_tokens hidden states; a plain decode's one token without
speculation). Columns left of `error` are a point's inputs; plots rely on that order.
"""

from __future__ import annotations

import copy
import importlib.util
import itertools
import json
import math
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from simspec.errors import InputError

if TYPE_CHECKING:
    import pandas as pd

SWEEP_KEYS = ("name", "description", "base", "scenario", "setups", "points", "grid")
BACKENDS = ("local", "ray")
RAY_ADDRESS_WORDS = ("auto", "local")
RAY_CONNECT_TIMEOUT_S = 10.0  # how long --address gets to accept a connection before the sweep gives up
ADDRESS_FORMS = ("expected host:port of a running Ray head's GCS (`ray start --head` prints it, port 6379 by default),"
                 " ray://host:port (Ray Client), 'auto' (the cluster this machine runs or RAY_ADDRESS names) or"
                 " 'local' (start one here)")
FIXED_COLUMNS = ("point", "setup", "error")
# How many points a sweep may expand to unless --max-points raises it. Per-point times are measured with
# `python benchmarks/sweep_speed.py [--fast]` (its cpu_ms_per_point; add `--concurrency 1` for single-stream points):
# a point takes a few ms with --fast (3.7 ms there, 1,000 points) and from ~0.05 s (concurrency 8-64) to ~0.4 s
# (single stream) or more with the discrete-event engine: longer workloads scale with their tokens. Every point
# keeps ~8 KB (its changes, inputs and ~60 figures) in memory until the table is written. 100,000 fast points are
# roughly 5-20 min on one core (a few minutes on a 16-core box) and ~1 GB; 10,000 single-stream engine points are
# an hour or more on one core. Beyond that a sweep is more likely a typo (a grid axis of 1000 values) than a plan,
# and a 10^12-point grid would only exhaust memory while it is expanded.
MAX_POINTS_FAST = 100_000
MAX_POINTS_ENGINE = 10_000
# predict()'s entries that are not figures of one point
_SKIPPED_RESULT_KEYS = ("sources",)


# ------------------------------------------------------------------------------------------ the sweep file


@dataclass(frozen=True)
class Point:
    index: int
    setup: str | None
    changes: tuple[tuple[str, Any], ...]  # (field path, value), applied in order
    inputs: dict[str, Any]  # varied field path -> the value this point used (JSON text for lists/mappings)
    sources: tuple[str, ...] = ()  # per change, the sweep file's key it came from (grid.seed[2], points[0].seed)


@dataclass(frozen=True)
class Sweep:
    file: str
    name: str
    description: str
    base_path: str  # what the scenario is resolved against: the base file, or the sweep file for `scenario:`
    base: dict[str, Any]
    has_setups: bool
    fields: tuple[str, ...]  # varied field paths, in column order
    points: tuple[Point, ...]

    @property
    def input_columns(self) -> list[str]:
        return ["point"] + (["setup"] if self.has_setups else []) + list(self.fields)


def _schema_models(annotation: Any) -> tuple[Any, ...]:
    """The pydantic model classes a field annotation can hold (several for a union, none for a scalar/list)."""
    import types
    import typing

    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return (annotation,)
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if isinstance(a, type) and issubclass(a, BaseModel))
    return ()


def _path_fields(path: Any, file: str, key: str) -> list[Any]:
    """The schema fields (pydantic FieldInfo) a `--set` field path names: one, or several where a union's members
    share the name (workload.arrival.type); InputError naming `key` when the path is not a scenario field."""
    from simspec.scenario.schema import Scenario

    if not isinstance(path, str) or not path or any(not part for part in path.split(".")):
        raise InputError(f"{path!r} is not a field path; write it like workload.arrival.concurrency", file=file,
                         key=key)
    parts = path.split(".")
    models: tuple[Any, ...] = (Scenario,)
    fields: list[Any] = []
    for i, part in enumerate(parts):
        if not models:
            raise InputError(f"{'.'.join(parts[:i])} is a single value, not a section: set it whole", file=file,
                             key=key)
        fields = [m.model_fields[part] for m in models if part in m.model_fields]
        if not fields:
            allowed = sorted({f for m in models for f in m.model_fields})
            where = ".".join(parts[:i]) or "the top level of a scenario"
            raise InputError(f"unknown scenario field {part!r} in {where}; allowed there: {', '.join(allowed)}",
                             file=file, key=key)
        models = tuple(dict.fromkeys(m for f in fields for m in _schema_models(f.annotation)))
    return fields


def check_field_path(path: Any, file: str, key: str) -> str:
    """A scenario field path as `--set` takes it (`workload.arrival.concurrency`), checked against the schema."""
    _path_fields(path, file, key)
    return path


def check_field_value(path: str, value: Any, file: str, key: str) -> None:
    """The value a sweep gives a field path, checked against that field's own schema (its type and bounds; a
    section given as a mapping, as that whole section) before anything runs. What depends on the other fields
    (the tree fits the draft budget, the model fits the GPU) is checked per point when it runs."""
    from typing import Annotated

    from pydantic import ConfigDict, TypeAdapter, ValidationError

    from simspec.scenario.reading import error_text

    problems = []
    for field in _path_fields(path, file, key):
        holds_models = bool(_schema_models(field.annotation))  # models bring their own config
        config = None if holds_models else ConfigDict(allow_inf_nan=False)
        try:
            TypeAdapter(Annotated[field.annotation, field], config=config).validate_python(value)
            return
        except ValidationError as exc:
            err = exc.errors()[0]
            where = ".".join(str(p) for p in err["loc"])
            problems.append(f"{where}: {error_text(err)}" if where else error_text(err))
    raise InputError(f"not a value {path} can take: {problems[0]}", file=file, key=key)


def _changes(mapping: Any, file: str, key: str) -> tuple[tuple[str, Any], ...]:
    if mapping is None:
        return ()
    if not isinstance(mapping, dict):
        raise InputError(f"must be a mapping of field paths to values, got {type(mapping).__name__}", file=file,
                         key=key)
    out = []
    for k, v in mapping.items():
        check_field_value(check_field_path(k, file, f"{key}.{k}"), v, file, f"{key}.{k}")
        out.append((k, v))
    return tuple(out)


def apply_changes(data: dict[str, Any], changes: Sequence[tuple[str, Any] | str], file: str) -> dict[str, Any]:
    """A copy of `data` with the changes applied in order: (path, value) pairs, or `path=value` strings
    exactly as `simspec predict --set` takes them."""
    from simspec.scenario.reading import apply_overrides, set_field

    out = copy.deepcopy(data)
    for change in changes:
        if isinstance(change, str):
            out = apply_overrides(out, [change], file)
        else:
            path, value = change
            set_field(out, path, value, file)
    return out


def _get_field(data: dict[str, Any], path: str) -> Any:
    node: Any = data
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _cell(value: Any) -> Any:
    """A table cell: scalars as they are, lists and mappings as compact JSON text."""
    if isinstance(value, dict | list | tuple):
        return json.dumps(value, separators=(", ", ": "), default=str)
    return value


def point_cap(fast: bool) -> int:
    """The most points a sweep may have unless --max-points says otherwise (see MAX_POINTS_FAST)."""
    return MAX_POINTS_FAST if fast else MAX_POINTS_ENGINE


def check_no_cycles(value: Any, file: str, key: str = "") -> None:
    """A YAML anchor used inside itself (`seed: &g [1, *g]`) makes data that contains itself: pydantic, deepcopy
    and JSON would fail on it with a traceback (or recurse without end). InputError naming the key that holds it."""
    on_path: dict[int, str] = {}  # the mappings and lists from the top down to the one being read -> their keys

    def walk(node: Any, where: str) -> None:
        if not isinstance(node, dict | list):
            return
        if id(node) in on_path:
            raise InputError("refers to itself (a YAML anchor used inside its own value, like `&a [1, *a]`): an"
                             " alias may only repeat a value outside it", file=file, key=on_path[id(node)] or None)
        on_path[id(node)] = where
        for k, v in (node.items() if isinstance(node, dict) else enumerate(node)):
            walk(v, f"{where}[{k}]" if isinstance(node, list) else (f"{where}.{k}" if where else str(k)))
        del on_path[id(node)]

    walk(value, key)


def load_sweep(path: str | Path, max_points: int = MAX_POINTS_FAST) -> Sweep:
    """Read and check a sweep file, and expand it into its points. Every problem with the file itself is an
    InputError naming the file and the key; problems of single points show up when they are predicted. A sweep
    of more than `max_points` points is refused before it is expanded."""
    from simspec.scenario.reading import read_yaml

    file = str(path)
    spec = read_yaml(path)
    check_no_cycles(spec, file)
    unknown = [k for k in spec if k not in SWEEP_KEYS]
    if unknown:
        raise InputError(f"unknown key; allowed keys in a sweep file: {', '.join(SWEEP_KEYS)}", file=file,
                         key=str(unknown[0]))
    here = Path(file).parent
    if ("base" in spec) == ("scenario" in spec):
        raise InputError("give exactly one of `base:` (a scenario file, relative to this sweep file) or"
                         " `scenario:` (an inline scenario mapping)", file=file, key="base")
    if "base" in spec:
        base_ref = spec["base"]
        if not isinstance(base_ref, str) or not base_ref.strip():
            raise InputError("must be the path of a scenario file, relative to this sweep file", file=file,
                             key="base")
        base_path = os.path.normpath(here / base_ref)
        if not Path(base_path).is_file():
            raise InputError(f"scenario file {base_ref!r} not found (looked at {base_path})", file=file, key="base")
        base = read_yaml(base_path)
        check_no_cycles(base, base_path)
    else:
        base = spec["scenario"]
        if not isinstance(base, dict):
            raise InputError("must be a scenario mapping (name, hardware, model, server, workload, ...)",
                             file=file, key="scenario")
        base_path = file

    setups = spec.get("setups")
    setup_list: list[tuple[str | None, tuple[tuple[str, Any], ...]]] = [(None, ())]
    if setups is not None:
        if not isinstance(setups, dict) or not setups:
            raise InputError("must be a non-empty mapping of setup names to change sets"
                             " (e.g. eagle3: {speculative.algorithm: eagle3, ...})", file=file, key="setups")
        setup_list = [(str(name), _changes(ch, file, f"setups.{name}")) for name, ch in setups.items()]

    points = spec.get("points")
    point_list: list[tuple[tuple[str, Any], ...]] = [()]
    point_fields: list[str] = []
    if points is not None:
        if not isinstance(points, list) or not points:
            raise InputError("must be a non-empty list of change sets (field path -> value)", file=file,
                             key="points")
        point_list = [_changes(p, file, f"points[{i}]") for i, p in enumerate(points)]
        for ch in point_list:
            point_fields += [k for k, _ in ch if k not in point_fields]

    grid = spec.get("grid")
    grid_keys: list[str] = []
    grid_values: list[list[Any]] = []
    if grid is not None:
        if not isinstance(grid, dict) or not grid:
            raise InputError("must be a non-empty mapping of field paths to lists of values", file=file, key="grid")
        for k, values in grid.items():
            check_field_path(k, file, f"grid.{k}")
            if not isinstance(values, list) or not values:
                raise InputError("must be a non-empty list of values (one per point; a list value is written"
                                 " as a list inside the list)", file=file, key=f"grid.{k}")
            if k in point_fields:
                raise InputError("is set by both `points` and `grid`: vary it in one of them", file=file,
                                 key=f"grid.{k}")
            for i, value in enumerate(values):
                check_field_value(k, value, file, f"grid.{k}[{i}]")
            grid_keys.append(k)
            grid_values.append(values)

    if setups is None and points is None and grid is None:
        raise InputError("nothing to sweep: give `grid:`, `points:` or `setups:` (or several)", file=file)

    # counted before anything is expanded: a grid of a few long axes multiplies to more points than fit in memory
    factors = ([len(setup_list)] if setups is not None else []) + ([len(point_list)] if points is not None else [])
    factors += [len(v) for v in grid_values]
    total = math.prod(factors)
    if total > max_points:
        parts = (["setups"] if setups is not None else []) + (["points"] if points is not None else []) + [
            f"grid.{k}" for k in grid_keys]
        product = " x ".join(f"{n:,} {what}" for n, what in zip(factors, parts, strict=True))
        raise InputError(f"{total:,} points ({product}) is more than the {max_points:,} a sweep may have (about"
                         " 12 ms a point with --fast, 1 s or more with the engine, per core, and ~8 KB of memory"
                         " each); sweep"
                         " fewer values, split it into several sweeps, or raise the cap with --max-points N",
                         file=file, key="grid" if grid is not None else ("points" if points is not None else "setups"))

    fields = tuple(point_fields + grid_keys)
    expanded: list[Point] = []
    label = base_path
    setup_sources = [tuple(f"setups.{name}.{k}" for k, _ in ch) for name, ch in setup_list]
    point_sources = [tuple(f"points[{i}].{k}" for k, _ in ch) if points is not None else () for i, ch in
                     enumerate(point_list)]
    for (setup, setup_changes), s_sources in zip(setup_list, setup_sources, strict=True):
        for point_changes, p_sources in zip(point_list, point_sources, strict=True):
            for combo in itertools.product(*(range(len(v)) for v in grid_values)):
                grid_changes = tuple((k, grid_values[n][j]) for n, (k, j) in enumerate(zip(grid_keys, combo,
                                                                                          strict=True)))
                changes = setup_changes + point_changes + grid_changes
                sources = s_sources + p_sources + tuple(f"grid.{k}[{j}]" for k, j in zip(grid_keys, combo,
                                                                                          strict=True))
                try:
                    merged = apply_changes(base, changes, label)
                    inputs = {f: _cell(_get_field(merged, f)) for f in fields}
                except InputError:  # the point fails when it runs, and says why there
                    inputs = {f: _cell(dict(changes).get(f)) for f in fields}
                expanded.append(Point(len(expanded), setup, changes, inputs, sources))
    name = spec.get("name")
    return Sweep(file=file, name=str(name) if name is not None else Path(file).stem,
                 description=str(spec.get("description") or ""), base_path=base_path, base=base,
                 has_setups=setups is not None, fields=fields, points=tuple(expanded))


# ------------------------------------------------------------------------------------------ one point


def _blame(err: InputError, overrides: Sequence[tuple[str, Any] | str], sources: Sequence[str],
           sweep_file: str) -> InputError:
    """The error of a point whose bad value came from the sweep file (a grid, point or setup value) names that
    file and the key the value was given at (grid.server.tp[1]), not the base scenario it was applied to."""
    key = err.key or ""
    for change, source in reversed(list(zip(overrides, sources, strict=False))):  # the last change of a field wins
        if isinstance(change, str):
            continue
        path = change[0]
        if key == path or key.startswith(path + "."):  # the field itself, or inside a section the sweep replaced
            return InputError(err.message, file=sweep_file, key=source + key[len(path):])
    return err


def _predict_point(base_path: str, overrides: Sequence[tuple[str, Any] | str], fast: bool,
                   data: dict[str, Any] | None = None, label: str | None = None, sources: Sequence[str] = (),
                   sweep_file: str | None = None) -> dict[str, Any]:
    """Predict one point: the base scenario (read from base_path unless its mapping is given) with the
    overrides applied, validated and resolved like `simspec predict --set`. Returns the flattened figures;
    bad input raises InputError naming `label` (default: base_path), or `sweep_file` and the key in `sources`
    (one per override) where the offending value is one the sweep gave."""
    from simspec.scenario.loader import parse_scenario, resolve
    from simspec.scenario.reading import read_yaml

    file = label or base_path
    try:
        raw = read_yaml(base_path) if data is None else data
        raw = apply_changes(raw, overrides, file)
        rs = resolve(parse_scenario(raw, file), base_path)
        if fast:
            from simspec.fastpath import predict_fast

            result = predict_fast(rs)
        else:
            from simspec.predict import predict

            result = predict(rs)
    except InputError as err:
        if err.file in (base_path, file) and sweep_file is not None:
            blamed = _blame(err, overrides, sources, sweep_file)
            if blamed is not err:
                raise blamed from None
        if err.file == base_path and file != base_path:
            raise InputError(err.message, file=file, key=err.key) from None
        raise
    return flatten_result(result) | derived_figures(rs) | cost_columns(result, rs)


COST_COLUMNS = ("price_per_gpu_hour_usd", "box_usd_per_hour", "usd_per_mtok", "baseline_usd_per_mtok",
                "saving_usd_per_mtok")


def cost_columns(result: dict[str, Any], rs: Any) -> dict[str, Any]:
    """$ per million output tokens for the point and its baseline at the GPU preset's price (simspec cost
    for other prices and the drafter-training investment)."""
    from simspec.studies.cost import cost_figures

    figures = cost_figures(result, rs)["figures"]
    return {name: figures[name]["value"] for name in COST_COLUMNS}


def flatten_result(result: dict[str, Any]) -> dict[str, Any]:
    """predict()'s dictionary as one flat row: setup figures unprefixed, nested ones dotted, `sources`
    dropped, the baseline's figures under `baseline.` (those already given as `baseline_*` once)."""
    row: dict[str, Any] = {}

    def put(prefix: str, value: Any) -> None:
        if isinstance(value, dict):
            for k, v in value.items():
                put(f"{prefix}.{k}" if prefix else str(k), v)
        else:
            row[prefix] = value.item() if hasattr(value, "item") else value

    put("", result.get("setup", {}))
    for key, value in result.items():
        if key in ("setup", "baseline") or key in _SKIPPED_RESULT_KEYS:
            continue
        put(key, value)
    for key, value in (result.get("baseline") or {}).items():
        if f"baseline_{key}" not in result:
            put(f"baseline.{key}", value)
    return row


def derived_figures(rs: Any) -> dict[str, Any]:
    """The load and the interconnect's latency at this point's message sizes (see the module docstring)."""
    from simspec.timing.collectives import Collectives
    from simspec.timing.stack import ACTIVATION_BYTES

    arrival = rs.scenario.workload.arrival
    out: dict[str, Any] = {}
    if arrival.type == "closed":
        out["concurrency"] = arrival.concurrency
    else:
        out["arrival_rate_per_s"] = arrival.rate_per_s
    coll = Collectives(rs.all_reduce, rs.scenario.server.tp, rs.interconnect.link)
    token_bytes = rs.model.hidden_size * ACTIVATION_BYTES
    out["allreduce_token_us"] = coll.all_reduce_us(token_bytes)
    out["allreduce_verify_us"] = coll.all_reduce_us(token_bytes * (rs.num_draft_tokens if rs.speculative else 1))
    return out


@dataclass(frozen=True)
class Task:
    index: int
    base_path: str
    label: str
    data: dict[str, Any]
    overrides: tuple[tuple[str, Any], ...]
    fast: bool
    sources: tuple[str, ...] = ()
    sweep_file: str | None = None


def _run_task(task: Task) -> tuple[int, dict[str, Any] | None, str | None]:
    """(index, figures, None), or (index, None, reason) when the point fails validation. Any other exception
    is a bug and ends the sweep."""
    try:
        return task.index, _predict_point(task.base_path, task.overrides, task.fast, task.data, task.label,
                                          task.sources, task.sweep_file), None
    except InputError as err:
        return task.index, None, str(err)


# ------------------------------------------------------------------------------------------ running


def _tasks(sweep: Sweep, fast: bool, absolute: bool = False) -> list[Task]:
    path = os.path.abspath(sweep.base_path) if absolute else sweep.base_path
    return [Task(p.index, path, sweep.base_path, sweep.base, p.changes, fast, p.sources, sweep.file)
            for p in sweep.points]


def _warm_up(fast: bool) -> None:
    """Import the simulator and read the presets once, before forking: every worker inherits them instead of
    spending its first ~2 s on imports."""
    from simspec import presets
    from simspec.predict import predict  # noqa: F401
    from simspec.timing.collectives import Collectives  # noqa: F401

    presets.catalog()
    presets.default_coefficients()
    if fast:
        importlib.import_module("simspec.fastpath")


def _worker_init() -> None:
    """A pool worker leaves Ctrl-C to the parent (which stops the pool and keeps the finished points) and dies
    quietly when the parent terminates it: no traceback per worker."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_pool(pool: Any) -> None:
    """Cancel what has not started and end the workers now, running points included (their work is lost
    anyway: the sweep is being stopped)."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes:
        proc.terminate()
    for proc in processes:
        proc.join(timeout=5)


def _run_local(tasks: list[Task], jobs: int, tick: Callable[[], None], out: list[tuple]) -> None:
    """Run the tasks, appending each result to `out` as it finishes (so that an interrupted sweep still has
    every finished point)."""
    if jobs <= 1 or len(tasks) <= 1:
        for t in tasks:
            out.append(_run_task(t))
            tick()
        return
    import multiprocessing
    import sys
    from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

    # Linux: fork, so that workers inherit the imported simulator instead of importing it again (elsewhere the
    # platform's default; the tasks are plain data and _run_task is importable)
    ctx = multiprocessing.get_context("fork") if sys.platform.startswith("linux") else None
    _warm_up(tasks[0].fast)
    workers = min(jobs, len(tasks))
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_worker_init)
    # a few tasks per worker in flight, more submitted as they finish: the first results (and the progress bar)
    # come at once however many points there are, and stopping has little to cancel
    todo = iter(tasks)
    pending: set[Future] = set()
    done: set[Future] = set()
    try:
        pending = {pool.submit(_run_task, t) for t in itertools.islice(todo, 4 * workers)}
        while pending:
            done, pending = wait(pending, return_when=FIRST_COMPLETED)
            while done:
                fut = done.pop()
                out.append(fut.result())
                pending |= {pool.submit(_run_task, t) for t in itertools.islice(todo, 1)}
                tick()
    except BaseException:
        # keep the points that finished but were not collected yet
        out.extend(f.result() for f in pending | done if f.done() and not f.cancelled() and f.exception() is None)
        _stop_pool(pool)
        raise
    pool.shutdown()


def _run_ray(tasks: list[Task], jobs: int | None, address: str | None, tick: Callable[[], None],
             out: list[tuple]) -> None:
    try:
        import ray
    except ImportError:
        raise InputError("the ray backend needs ray: pip install 'simspec[ray]' (or pip install ray)",
                         key="--backend") from None
    started = False
    if not ray.is_initialized():
        if address:
            _probe_ray_head(address)
            try:
                ray.init(address=address, log_to_driver=False)
            except (ConnectionError, ValueError, RuntimeError, TimeoutError) as err:
                raise InputError(f"cannot connect to a Ray cluster at {address!r} ({err}); {ADDRESS_FORMS}",
                                 key="--address") from None
        else:
            ray.init(num_cpus=jobs or os.cpu_count(), include_dashboard=False, log_to_driver=False)
        started = True
    try:
        remote = ray.remote(num_cpus=1)(_run_task)
        pending = [remote.remote(t) for t in tasks]
        try:
            while pending:
                done, pending = ray.wait(pending, num_returns=1)
                for ref in done:
                    out.append(ray.get(ref))
                    tick()
        except BaseException:
            for ref in pending:
                ray.cancel(ref, force=True)
            raise
    finally:
        if started:
            ray.shutdown()


def _host_port(address: str) -> tuple[str, int] | None:
    """(host, port) of a `host:port` or `ray://host:port` address ([v6]:port too); None for another form."""
    rest = address.removeprefix("ray://")
    host, sep, port = rest.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or any(c.isspace() or c in "/[]@?#" for c in host) or not port.isdigit():
        return None
    return (host, int(port)) if 0 < int(port) < 65536 else None


def check_address(address: str) -> None:
    """A Ray address's form, before anything runs: ray's own parser answers a malformed one with a traceback."""
    if address in RAY_ADDRESS_WORDS:
        return
    if _host_port(address) is None:
        raise InputError(f"{address!r} is not a Ray address; {ADDRESS_FORMS}", key="--address")


def _probe_ray_head(address: str) -> None:
    """Fail fast on a host:port nothing answers on: ray.init retries an unreachable head for minutes."""
    import socket

    hp = _host_port(address)
    if hp is None:  # "auto" or "local": ray finds (or starts) the cluster itself and says so when it cannot
        return
    try:
        conn = socket.create_connection(hp, timeout=RAY_CONNECT_TIMEOUT_S)
    except OSError as err:
        reason = "timed out" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        raise InputError(f"nothing answers at {address!r} within {RAY_CONNECT_TIMEOUT_S:g} s ({reason}); is the Ray"
                         f" head running there? {ADDRESS_FORMS}", key="--address") from None
    with conn:
        if os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true"):
            return  # a TLS head answers nothing to plain HTTP/2; ray.init's own checks apply
        # Ray's GCS and its client server speak gRPC: HTTP/2 answers the connection preface with a SETTINGS frame.
        # Something else listening there would leave ray.init retrying for minutes.
        try:
            conn.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")
            reply = conn.recv(9)
        except OSError:
            reply = b""
    if len(reply) < 4 or reply[3] != 0x04:
        raise InputError(f"something answers at {address!r} but not as a Ray head (no gRPC reply within"
                         f" {RAY_CONNECT_TIMEOUT_S:g} s); {ADDRESS_FORMS}", key="--address")


def check_backend(backend: str, address: str | None) -> None:
    if backend not in BACKENDS:
        raise InputError(f"unknown backend {backend!r}; allowed: {', '.join(BACKENDS)}", key="--backend")
    if address and backend != "ray":
        raise InputError("--address applies only to --backend ray", key="--address")
    if address:
        check_address(address)


class SweepInterrupted(Exception):
    """Ctrl-C (or SIGTERM) stopped a sweep: `table` holds the points that finished (with their point numbers),
    `total` how many the sweep has, `signum` the signal."""

    def __init__(self, table: pd.DataFrame, total: int, signum: int):
        super().__init__(f"interrupted after {len(table)} of {total} points")
        self.table = table
        self.total = total
        self.signum = signum


class _Terminated(KeyboardInterrupt):
    """SIGTERM, turned into an interrupt of the main thread so that it stops a sweep the way Ctrl-C does."""


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated()


def run_points(sweep: Sweep, jobs: int | None = None, backend: str = "local", address: str | None = None,
               fast: bool = False, progress: bool | Callable[[int, int], None] = False) -> pd.DataFrame:
    """Predict every point of a loaded sweep and return the table (rows in point order). Ctrl-C or SIGTERM
    stops the workers and raises SweepInterrupted holding the table of the points that finished."""
    import signal
    import threading
    import time

    check_backend(backend, address)
    tasks = _tasks(sweep, fast, absolute=backend == "ray")
    total = len(tasks)
    njobs = jobs or os.cpu_count() or 1
    done = 0
    results: list[tuple] = []

    def run(tick: Callable[[], None]) -> None:
        if backend == "ray":
            _run_ray(tasks, jobs, address, tick, results)
        else:
            _run_local(tasks, njobs, tick, results)

    main_thread = threading.current_thread() is threading.main_thread()
    old_term = signal.signal(signal.SIGTERM, _raise_terminated) if main_thread else None
    try:
        if progress is True:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
            # redrawn as points finish (at most 10 times a second) rather than by a refresh thread: no thread
            # runs when the pool forks
            with Progress(*columns, console=Console(stderr=True), transient=True, auto_refresh=False) as bar:
                task_id = bar.add_task(f"sweep {sweep.name}", total=total)
                bar.refresh()
                last = time.monotonic()

                def advance() -> None:
                    nonlocal last
                    bar.advance(task_id)
                    if time.monotonic() - last >= 0.1:
                        last = time.monotonic()
                        bar.refresh()

                run(advance)
        else:
            callback = progress if callable(progress) else None

            def tick() -> None:
                nonlocal done
                done += 1
                if callback is not None:
                    callback(done, total)

            run(tick)
    except KeyboardInterrupt as exc:
        signum = signal.SIGTERM if isinstance(exc, _Terminated) else signal.SIGINT
        raise SweepInterrupted(to_frame(sweep, results), total, int(signum)) from None
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, old_term)
    return to_frame(sweep, results)


def to_frame(sweep: Sweep, results: list[tuple]) -> pd.DataFrame:
    """The table: inputs, error, then every figure in the order it first appears (rows in point order; only the
    points that have a result, when a sweep was interrupted)."""
    import pandas as pd

    by_index = {i: (figures, err) for i, figures, err in results}
    inputs = sweep.input_columns
    rows: list[dict[str, Any]] = []
    figure_columns: dict[str, None] = {}
    for p in sweep.points:
        if p.index not in by_index:
            continue
        figures, err = by_index[p.index]
        row: dict[str, Any] = {"point": p.index}
        if sweep.has_setups:
            row["setup"] = p.setup
        row |= p.inputs
        row["error"] = err
        for k, v in (figures or {}).items():
            name = k if k not in row else f"setup.{k}"  # an input of the same name keeps its name
            row[name] = v
            figure_columns.setdefault(name, None)
        rows.append(row)
    columns = inputs + ["error"] + list(figure_columns)
    return pd.DataFrame(rows, columns=columns)


def run_sweep(spec_path: str | Path, jobs: int | None = None, backend: str = "local", address: str | None = None,
              fast: bool = False, progress: bool | Callable[[int, int], None] = False,
              max_points: int | None = None) -> pd.DataFrame:
    """Run a sweep file and return its table (pandas DataFrame, one row per point, in point order).

    jobs: worker processes (local) or CPUs for a local Ray instance (default: all cores); backend: "local"
    (a process pool) or "ray" (Ray tasks on `address`, or on a local Ray started for the sweep); fast: use the
    analytic fast path instead of the engine; progress: True for a progress bar on stderr, or a callable
    (done, total); max_points: refuse a sweep of more points (default: point_cap(fast)). Points that fail
    validation come back with `error` filled and no figures; Ctrl-C raises SweepInterrupted (the finished points).
    """
    spec = load_sweep(spec_path, max_points=max_points or point_cap(fast))
    return run_points(spec, jobs=jobs, backend=backend, address=address, fast=fast, progress=progress)


# ------------------------------------------------------------------------------------------ tables


def _for_parquet(df: pd.DataFrame) -> pd.DataFrame:
    """Object columns holding more than one kind of value (a field swept over 4 and "auto") become text."""
    out = df.copy()
    for col in out.columns:
        if out[col].dtype != object:
            continue
        kinds = {type(v) for v in out[col] if v is not None and not (isinstance(v, float) and math.isnan(v))}
        if len(kinds) > 1:
            out[col] = [None if v is None else str(v) for v in out[col]]
    return out


def write_csv(df: pd.DataFrame, path: str | Path) -> None:
    try:
        df.to_csv(path, index=False)
    except OSError as err:
        raise InputError(f"cannot write the table: {err.strerror or err}", file=str(path), key="--out") from None


def require_pyarrow() -> None:
    try:
        import pyarrow  # type: ignore[import-untyped]  # noqa: F401
    except ImportError:
        raise InputError("writing or reading Parquet needs pyarrow: pip install pyarrow", key="--parquet") from None


def write_parquet(df: pd.DataFrame, path: str | Path) -> None:
    require_pyarrow()
    try:
        _for_parquet(df).to_parquet(path, index=False)
    except OSError as err:
        raise InputError(f"cannot write the table: {err.strerror or err}", file=str(path), key="--parquet") from None


def read_table(path: str | Path) -> pd.DataFrame:
    """A sweep table written by `simspec sweep` (.csv, or .parquet with pyarrow)."""
    import pandas as pd

    file = str(path)
    p = Path(path)
    if not p.is_file():
        raise InputError("file not found", file=file)
    try:
        if p.suffix.lower() in (".parquet", ".pq"):
            require_pyarrow()
            df = pd.read_parquet(p)
        else:
            df = pd.read_csv(p)
    except InputError:
        raise
    except (ValueError, OSError, UnicodeDecodeError) as err:
        raise InputError(f"cannot read it as a sweep table (.csv or .parquet): {err}", file=file) from None
    missing = [c for c in ("point", "error") if c not in df.columns]
    if missing:
        raise InputError(f"not a table written by `simspec sweep`: no {', '.join(missing)} column", file=file)
    return df


def failed_points(df: pd.DataFrame) -> pd.DataFrame:
    err = df["error"]
    return df[err.notna() & (err.astype(str) != "")]
