"""The best configuration: per concurrency, the algorithm and (num_steps, topk, num_draft_tokens) that give the
most throughput (throughput_tokens_per_s) or per-request tok/s (tokens_per_s), under an optional latency bound.

The search space is a fixed grid per algorithm; the loader rejects the points SGLang would not run, and they
are counted:
- eagle, eagle3, mtp, standalone: num_steps 1..max_steps (default 5, SGLang's deepest automatic choice),
  topk in {1, 2, 4, 8}; with topk 1 num_draft_tokens = num_steps + 1 (SGLang forces it), with topk > 1
  num_draft_tokens in {4, 8, 16, 32, 64, num_steps x topk + 1}, keeping those <= num_steps x topk + 1.
- ngram: num_draft_tokens; the BFS breadth and trie depth stay as set (they change no duration in simspec,
  and acceptance comes from the acceptance section, so varying them would repeat the same point).
- none: one point.
A grid point needs an accept length, and acceptance is never invented: it must follow from the acceptance
section (simspec.acceptance.models):
- positional_rates describe any EAGLE tree: the whole grid, with topk up to the number of ranks given.
- chain_rates / cumulative_rates describe a chain position by position: topk 1 (n-gram: num_draft_tokens) up
  to as deep as the rates go, a shorter chain using the first rates.
- accept_length / histogram describe one tree only: that algorithm keeps the scenario's own setting.
The scenario's own setting is always a grid point. Other algorithms than the scenario's need their own
acceptance: a setups file maps algorithm -> scenario changes (speculative settings, acceptance, ...).
"""

from __future__ import annotations

import copy
import math
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simspec.errors import InputError
from simspec.predict import hypothetical_interconnect
from simspec.scenario.loader import ResolvedScenario, parse_scenario, resolve
from simspec.scenario.reading import apply_overrides, read_yaml
from simspec.scenario.schema import ACCEPTANCE_FORMS, MAX_NUM_STEPS, Algorithm
from simspec.workload import whole_conversations

OBJECTIVES = {"throughput": "throughput_tokens_per_s", "per_request": "tokens_per_s"}
LATENCY_STATS = ("p50", "p90", "p99", "mean")
ALGORITHMS: tuple[str, ...] = typing.get_args(Algorithm)
TREE_ALGORITHMS = ("eagle", "eagle3", "mtp", "standalone")
DEFAULT_MAX_STEPS = 5  # SGLang's deepest automatic choice: (5, 4, 8) for Llama and Grok
TOPK_VALUES = (1, 2, 4, 8)
DRAFT_TOKEN_VALUES = (4, 8, 16, 32, 64)  # with topk > 1; plus num_steps x topk + 1
KEPT_METRICS = ("tokens_per_s", "throughput_tokens_per_s", "accept_length", "iteration_ms", "mean_batch_size",
                "itl_ms", "tpot_ms", "ttft_ms")


@dataclass(frozen=True)
class Candidate:
    """One grid point: an algorithm's setting and the full scenario mapping that describes it."""

    algorithm: str
    num_steps: int | None
    topk: int | None
    num_draft_tokens: int | None
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def label(self) -> str:
        if self.algorithm == "none":
            return "none"
        if self.algorithm == "ngram":
            return f"ngram N={self.num_draft_tokens}"
        return f"{self.algorithm} ({self.num_steps}, {self.topk}, {self.num_draft_tokens})"

    def describe(self) -> dict[str, Any]:
        return {"label": self.label, "algorithm": self.algorithm, "num_steps": self.num_steps, "topk": self.topk,
                "num_draft_tokens": self.num_draft_tokens}


@dataclass(frozen=True)
class Group:
    """The grid at one concurrency: the points to simulate and the ones the loader rejected."""

    concurrency: int | None
    workload: str
    valid: list[Candidate]
    rejected: list[dict[str, str]]


@dataclass(frozen=True)
class Plan:
    path: str
    scenario: str
    algorithms: list[str]
    grid_notes: dict[str, dict[str, Any]]
    notes: list[str]
    groups: list[Group]

    @property
    def num_simulations(self) -> int:
        return sum(len(g.valid) for g in self.groups)


# ------------------------------------------------------------------------------------------ parsing input


def parse_concurrency(text: str) -> list[int]:
    """'1,8,32' -> [1, 8, 32]: positive whole numbers, each once."""
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1 or int(part) > 100_000:
            raise InputError(f"--concurrency expects comma-separated whole numbers 1..100000 like 1,8,32;"
                             f" got {text!r}")
        if int(part) in out:
            raise InputError(f"--concurrency lists {part} twice")
        out.append(int(part))
    return out


def parse_algorithms(text: str) -> list[str]:
    out: list[str] = []
    for part in text.split(","):
        name = part.strip()
        if name not in ALGORITHMS:
            raise InputError(f"unknown algorithm {name!r} in --algorithms; allowed: {', '.join(ALGORITHMS)}")
        if name not in out:
            out.append(name)
    return out


def read_setups(path: str) -> dict[str, dict[str, Any]]:
    """A setups file: a mapping algorithm -> the scenario changes that set it up (acceptance included)."""
    data = read_yaml(path)
    for alg, changes in data.items():
        if alg not in ALGORITHMS:
            raise InputError(f"unknown algorithm; allowed: {', '.join(ALGORITHMS)}", file=path, key=str(alg))
        if changes is None:
            data[alg] = {}
        elif not isinstance(changes, dict):
            raise InputError("expects a mapping of scenario changes (speculative, acceptance, ...)", file=path,
                             key=str(alg))
    return data


def _merge(into: dict[str, Any], changes: dict[str, Any]) -> None:
    for k, v in changes.items():
        if isinstance(v, dict) and isinstance(into.get(k), dict):
            _merge(into[k], v)
        else:
            into[k] = copy.deepcopy(v)


def seed_mapping(base: dict[str, Any], algorithm: str, base_algorithm: str,
                 changes: dict[str, Any] | None, setups_path: str | None) -> dict[str, Any]:
    """The scenario mapping for `algorithm`: the scenario's own speculative and acceptance sections for its own
    algorithm, replaced by the setups file's for any other (with the file's other changes merged in)."""
    raw = copy.deepcopy(base)
    changes = copy.deepcopy(changes or {})
    spec_changes = changes.pop("speculative", None) or {}
    acceptance = changes.pop("acceptance", None)
    if not isinstance(spec_changes, dict):
        raise InputError("expects a mapping", file=setups_path, key=f"{algorithm}.speculative")
    if spec_changes.get("algorithm", algorithm) != algorithm:
        raise InputError(f"is set up under {algorithm!r} but names algorithm {spec_changes['algorithm']!r}",
                         file=setups_path, key=f"{algorithm}.speculative.algorithm")
    own = algorithm == base_algorithm
    spec = {**(raw.get("speculative") or {}), **spec_changes} if own else dict(spec_changes)
    spec["algorithm"] = algorithm
    raw["speculative"] = spec
    if acceptance is not None:
        raw["acceptance"] = acceptance
    elif not own:
        raw.pop("acceptance", None)
    _merge(raw, changes)
    return raw


# ------------------------------------------------------------------------------------------------- the grid


def _with(raw: dict[str, Any], algorithm: str, steps: int | None, topk: int | None, n: int | None,
          acceptance: dict[str, Any] | None = None) -> Candidate:
    raw = copy.deepcopy(raw)
    spec = raw["speculative"]
    if algorithm == "ngram":
        spec["num_draft_tokens"] = n
    elif algorithm != "none":
        spec.update(num_steps=steps, topk=topk, num_draft_tokens=n)
    if acceptance is not None:
        raw["acceptance"] = acceptance
    return Candidate(algorithm, steps, topk, n, raw)


def tree_settings(max_steps: int, max_topk: int) -> list[tuple[int, int, int]]:
    """The documented (num_steps, topk, num_draft_tokens) grid for EAGLE-style drafting."""
    out = []
    for steps in range(1, max_steps + 1):
        for topk in TOPK_VALUES:
            if topk > max_topk:
                continue
            if topk == 1:
                out.append((steps, 1, steps + 1))
                continue
            top = steps * topk + 1
            out.extend((steps, topk, n) for n in sorted({*DRAFT_TOKEN_VALUES, top}) if 2 <= n <= top)
    return out


def grid_for(algorithm: str, rs: ResolvedScenario, raw: dict[str, Any], max_steps: int
             ) -> tuple[list[Candidate], str]:
    """The candidates for one algorithm and a note saying what is searched and why."""
    if algorithm == "none":
        return [_with(raw, "none", None, None, None)], "no speculation: one point"
    acc = rs.scenario.acceptance
    assert acc is not None  # the loader requires it for a speculative algorithm
    own = (rs.num_steps, rs.topk, rs.num_draft_tokens)
    key = "chain_rates" if acc.chain_rates is not None else "cumulative_rates"
    rates = acc.chain_rates if acc.chain_rates is not None else acc.cumulative_rates
    source = {"source": acc.source} if acc.source else {}

    def chain_acceptance(depth: int) -> dict[str, Any]:
        return {key: list(rates[:depth]), **source}  # type: ignore[index]

    if algorithm == "ngram" and acc.ngram_replay is not None:
        # replayed acceptance is defined for every draft budget: the drafter is replayed at each N
        ns = sorted({2, 4, 6, 8, 12, 16, own[2]})
        return ([_with(raw, "ngram", None, None, n) for n in ns],
                f"num_draft_tokens in {{{', '.join(map(str, ns))}}}, acceptance replayed from the corpus at each")
    form = next(f for f in ACCEPTANCE_FORMS if getattr(acc, f) is not None)
    fixed_note = (f"acceptance given as {form}:"
                  " another tree has no defined accept length, so the scenario's own setting is kept (give"
                  " chain_rates, cumulative_rates or positional_rates to search it)")
    if algorithm == "ngram":
        if rates is None:
            return [_with(raw, "ngram", None, None, own[2])], fixed_note
        ns = list(range(2, len(rates) + 2))
        cands = [_with(raw, "ngram", None, None, n, chain_acceptance(n - 1)) for n in ns]
        if own[2] not in ns:
            cands.append(_with(raw, "ngram", None, None, own[2]))
        return cands, (f"num_draft_tokens 2..{len(rates) + 1} (the first N-1 of the {len(rates)} {key}); BFS"
                       " breadth and trie depth kept as set: they change no duration in simspec")
    if acc.positional_rates is not None:
        ranks = len(acc.positional_rates)
        settings = tree_settings(max_steps, ranks)
        note = (f"num_steps 1..{max_steps}, topk in {{{', '.join(str(k) for k in TOPK_VALUES if k <= ranks)}}}"
                f" (positional_rates give {ranks} rank{'s' if ranks > 1 else ''}), num_draft_tokens as documented")
        cands = [_with(raw, algorithm, s, k, n) for s, k, n in settings]
    elif rates is not None:
        depth = min(max_steps, len(rates))
        settings = [(s, 1, s + 1) for s in range(1, depth + 1)]
        note = (f"a chain (topk 1) of num_steps 1..{depth}: {key} describe one draft per position, not a wider"
                " tree")
        cands = [_with(raw, algorithm, s, 1, s + 1, chain_acceptance(s)) for s in range(1, depth + 1)]
    else:
        return [_with(raw, algorithm, *own)], fixed_note
    if own not in settings:
        cands.append(_with(raw, algorithm, *own))
    return cands, note


# ------------------------------------------------------------------------------------------------- planning


def _at_concurrency(raw: dict[str, Any], concurrency: int | None) -> dict[str, Any]:
    if concurrency is None:
        return raw
    raw = copy.deepcopy(raw)
    wl = raw["workload"]
    old = wl.get("arrival") or {}
    turns = int(old.get("turns", 1)) if old.get("type") == "closed" else 1  # keep the conversations' turns
    wl["arrival"] = {"type": "closed", "concurrency": concurrency, "turns": turns}
    wl["num_requests"] = whole_conversations(int(wl["num_requests"]), concurrency, turns)
    return raw


def _workload(rs: ResolvedScenario) -> str:
    wl = rs.scenario.workload
    arr = wl.arrival
    how = f"closed loop, concurrency {arr.concurrency}" if arr.type == "closed" else f"Poisson {arr.rate_per_s:g}/s"
    return f"{how}, {wl.num_requests} requests"


def plan(path: str, overrides: list[str] | None = None, *, concurrencies: list[int] | None = None,
         algorithms: list[str] | None = None, setups_path: str | None = None,
         max_steps: int = DEFAULT_MAX_STEPS) -> Plan:
    """Every grid point at every concurrency, validated by the loader (bad input raises InputError; a grid
    point SGLang would not run is counted as rejected)."""
    if not 1 <= max_steps <= MAX_NUM_STEPS:
        raise InputError(f"{max_steps} is not a num_steps the scenario schema allows: allowed 1..{MAX_NUM_STEPS}",
                         key="--max-steps")
    base = read_yaml(path)
    if overrides:
        base = apply_overrides(base, overrides, path)
    rs_base = resolve(parse_scenario(base, path), path)
    base_alg = rs_base.algorithm
    setups = read_setups(setups_path) if setups_path else {}
    if algorithms is None:
        algorithms = list(dict.fromkeys([base_alg, "none", *setups]))
    for alg in algorithms:
        if alg not in (base_alg, "none") and alg not in setups:
            raise InputError(f"algorithm {alg} needs its own acceptance (and settings): give them under {alg}: in"
                             f" a --setups file; without one only {base_alg} (the scenario's) and none are searched")

    candidates: list[Candidate] = []
    grid_notes: dict[str, dict[str, Any]] = {}
    for alg in algorithms:
        raw = seed_mapping(base, alg, base_alg, setups.get(alg), setups_path)
        try:
            rs = resolve(parse_scenario(raw, path), path)
        except InputError as err:
            origin = f" as set up in {setups_path}" if alg in setups else ""
            raise InputError(f"{err} (algorithm {alg}{origin})") from None
        cands, note = grid_for(alg, rs, raw, max_steps)
        candidates.extend(cands)
        grid_notes[alg] = {"points": len(cands), "note": note}

    notes = []
    hypothetical = hypothetical_interconnect(rs_base)
    if hypothetical:  # every point shares the box: say once that it does not exist
        notes.append(f"hypothetical interconnect: {hypothetical}")
    if concurrencies is not None and any(c > rs_base.scenario.workload.num_requests for c in concurrencies):
        notes.append(f"num_requests raised to the concurrency where it was below it"
                     f" (the scenario has {rs_base.scenario.workload.num_requests})")
    groups = []
    for c in concurrencies if concurrencies is not None else [None]:
        valid, rejected = [], []
        workload = ""
        for cand in candidates:
            raw = _at_concurrency(cand.raw, c)
            try:
                rs = resolve(parse_scenario(raw, path), path)
            except InputError as err:
                rejected.append({**cand.describe(), "reason": ": ".join(p for p in (err.key, err.message) if p)})
                continue
            workload = workload or _workload(rs)
            valid.append(Candidate(cand.algorithm, cand.num_steps, cand.topk, cand.num_draft_tokens, raw))
        groups.append(Group(c, workload, valid, rejected))
    return Plan(path, rs_base.scenario.name, algorithms, grid_notes, notes, groups)


# ---------------------------------------------------------------------------------------------- evaluating


def evaluate(raw: dict[str, Any], path: str) -> dict[str, Any]:
    """Simulate one grid point (a module-level function, so a process pool can run it)."""
    from simspec.analysis.metrics import summarize
    from simspec.simulate import run

    try:
        summary = summarize(run(resolve(parse_scenario(raw, path), path)))
    except InputError as err:
        return {"error": ": ".join(p for p in (err.key, err.message) if p)}
    return {k: summary[k] for k in KEPT_METRICS}


def simulate_all(p: Plan, *, jobs: int = 1, on_done: Callable[[], None] | None = None
                 ) -> list[list[dict[str, Any]]]:
    """Metrics of every valid grid point, group by group, in grid order; sequential or on `jobs` processes."""
    if jobs < 1:
        raise InputError(f"--jobs must be at least 1, got {jobs}")
    tasks = [(gi, ci, cand.raw) for gi, g in enumerate(p.groups) for ci, cand in enumerate(g.valid)]
    out: list[list[dict[str, Any]]] = [[{} for _ in g.valid] for g in p.groups]
    if jobs == 1 or len(tasks) <= 1:
        for gi, ci, raw in tasks:
            out[gi][ci] = evaluate(raw, p.path)
            if on_done:
                on_done()
        return out
    from concurrent.futures import ProcessPoolExecutor, as_completed

    with ProcessPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(evaluate, raw, p.path): (gi, ci) for gi, ci, raw in tasks}
        for fut in as_completed(futures):
            gi, ci = futures[fut]
            out[gi][ci] = fut.result()
            if on_done:
                on_done()
    return out


def choose(points: list[dict[str, Any]], metric: str) -> tuple[dict | None, dict | None, float | None]:
    """(winner, runner-up, margin %) among the feasible points: the highest `metric` wins; ties go to the
    earlier grid point."""
    ranked = sorted((pt for pt in points if pt["feasible"]), key=lambda pt: -pt[metric])
    winner = ranked[0] if ranked else None
    runner = ranked[1] if len(ranked) > 1 else None
    margin = None
    if winner is not None and runner is not None and runner[metric] > 0:
        margin = 100.0 * (winner[metric] - runner[metric]) / runner[metric]
    return winner, runner, margin


def optimize(p: Plan, *, objective: str = "throughput", max_itl_ms: float | None = None,
             max_tpot_ms: float | None = None, latency_stat: str = "p99", jobs: int = 1,
             on_done: Callable[[], None] | None = None) -> dict[str, Any]:
    """Simulate the plan and pick, per concurrency, the best feasible point, its runner-up and the margin."""
    if objective not in OBJECTIVES:
        raise InputError(f"unknown objective {objective!r}; allowed: {', '.join(OBJECTIVES)}")
    if latency_stat not in LATENCY_STATS:
        raise InputError(f"unknown latency statistic {latency_stat!r}; allowed: {', '.join(LATENCY_STATS)}")
    if max_itl_ms is not None and max_tpot_ms is not None:
        raise InputError("give --max-itl-ms or --max-tpot-ms, not both")
    bound: dict[str, Any] | None = None
    for name, value, option in (("itl_ms", max_itl_ms, "--max-itl-ms"), ("tpot_ms", max_tpot_ms, "--max-tpot-ms")):
        if value is not None:
            if not (math.isfinite(value) and value > 0):
                raise InputError(f"{option} must be a positive number of milliseconds, got {value:g}")
            bound = {"metric": name, "stat": latency_stat, "max_ms": value}
    metric = OBJECTIVES[objective]
    results = simulate_all(p, jobs=jobs, on_done=on_done)

    groups = []
    for g, metrics in zip(p.groups, results, strict=True):
        points, failed = [], list(g.rejected)
        for cand, m in zip(g.valid, metrics, strict=True):
            if "error" in m:
                failed.append({**cand.describe(), "reason": m["error"]})
                continue
            pt = {**cand.describe(), **m, "value": m[metric]}
            if bound is not None:
                latency = m[bound["metric"]][bound["stat"]]
                pt["latency_ms"] = latency
                pt["feasible"] = bool(latency <= bound["max_ms"])  # NaN: not feasible
            else:
                pt["feasible"] = True
            points.append(pt)
        winner, runner, margin = choose(points, metric)
        groups.append({
            "concurrency": g.concurrency, "workload": g.workload, "evaluated": len(points),
            "rejected": failed, "over_bound": sum(not pt["feasible"] for pt in points),
            "winner": winner, "runner_up": runner, "margin_pct": margin,
            "message": _message(points, winner, runner, failed, bound),
            "points": sorted(points, key=lambda pt: (not pt["feasible"], -pt[metric])),
        })
    return {"scenario": p.scenario, "file": p.path, "objective": objective, "metric": metric,
            "latency_bound": bound, "algorithms": p.algorithms, "grid": p.grid_notes, "notes": p.notes,
            "concurrencies": groups}


def _message(points: list[dict], winner: dict | None, runner: dict | None, rejected: list[dict],
             bound: dict | None) -> str:
    if not points:
        return f"no valid point: all {len(rejected)} grid points were rejected"
    if winner is None:
        assert bound is not None
        best = min(points, key=lambda pt: pt["latency_ms"] if math.isfinite(pt["latency_ms"]) else math.inf)
        name = bound["metric"].removesuffix("_ms").upper()
        return (f"no feasible point: none of the {len(points)} evaluated points has {name}"
                f" {bound['stat']} <= {bound['max_ms']:g} ms (the lowest is {best['latency_ms']:.2f} ms,"
                f" {best['label']})")
    if runner is None:
        return f"{winner['label']} is the only feasible point"
    return f"{winner['label']} beats {runner['label']}"
