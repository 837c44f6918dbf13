"""run(resolved scenario) -> SimulationResult. Pure: reads no files, writes no files, prints nothing."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
import simpy

from simspec.acceptance.models import (
    AcceptanceDistribution,
    AcceptanceSampler,
    ContextAcceptance,
    acceptance_distribution,
)
from simspec.engine import ServingEngine
from simspec.engine.admission import decode_tokens_per_request
from simspec.errors import InputError
from simspec.scenario.loader import ResolvedScenario, resolve
from simspec.scenario.schema import Speculative
from simspec.timing import IterationModel
from simspec.workload import make_requests


@dataclass(frozen=True)
class SimulationResult:
    resolved: ResolvedScenario
    iterations: pd.DataFrame  # one row per engine iteration (see engine/recorder.py)
    requests: pd.DataFrame  # one row per request
    itl_gaps_ms: np.ndarray  # distinct gaps between streamed chunks
    itl_weights: np.ndarray  # how many chunks had each gap
    acceptance: AcceptanceDistribution | ContextAcceptance | None
    makespan_ms: float


def acceptance_for(rs: ResolvedScenario) -> AcceptanceDistribution | ContextAcceptance | None:
    acc = rs.scenario.acceptance
    if not rs.speculative or acc is None:
        return None
    if rs.replayed is not None:  # acceptance.ngram_replay, replayed when the scenario was resolved
        counts = np.asarray(rs.replayed.histogram, dtype=float)[: rs.max_accepted_drafts + 1]
        return AcceptanceDistribution(counts / counts.sum())
    return acceptance_distribution(acc, max_drafts=rs.max_accepted_drafts, num_steps=rs.num_steps,
                                   topk=rs.topk, num_draft_tokens=rs.num_draft_tokens)


def run(rs: ResolvedScenario, model: IterationModel | None = None) -> SimulationResult:
    sc = rs.scenario
    # independent streams: the workload is the same whatever the algorithm, so baseline and speculative
    # runs of one scenario and seed serve identical requests
    workload_seq, accept_seq = np.random.SeedSequence(sc.seed).spawn(2)
    specs = make_requests(sc.workload, np.random.default_rng(workload_seq))
    longest = int((specs.input_tokens + specs.output_tokens).max())
    if longest >= rs.kv_capacity_tokens:  # SGLang admits a request only if it needs fewer tokens than are free
        raise InputError(f"a sampled request needs {longest} KV tokens but the cache holds {rs.kv_capacity_tokens};"
                         " lower the length distributions' max", file=rs.path, key="workload")
    dist = acceptance_for(rs)
    sampler = AcceptanceSampler(dist, np.random.default_rng(accept_seq)) if dist is not None else None
    env = simpy.Environment()
    arrival = sc.workload.arrival
    engine = ServingEngine(
        env, model or IterationModel(rs), specs, sampler, max_running=rs.max_running_requests,
        kv_capacity_tokens=rs.kv_capacity_tokens, chunked_prefill_tokens=rs.chunked_prefill_size,
        concurrency=arrival.concurrency if arrival.type == "closed" else None,
        schedule_conservativeness=sc.server.schedule_conservativeness,
        decode_tokens_per_request=decode_tokens(rs),
        retract_latest_first=rs.speculative,
        turns=sc.workload.turns,
        shared_prefix_tokens=sc.workload.shared_prefix_tokens,
        overlap=rs.overlap,
        recv_interval=sc.server.scheduler_recv_interval,
    )
    env.run(until=engine.done)
    gaps, weights = engine.rec.inter_token_latencies_ms()
    return SimulationResult(
        resolved=rs, iterations=engine.rec.iterations(), requests=engine.rec.requests(), itl_gaps_ms=gaps,
        itl_weights=weights, acceptance=dist, makespan_ms=env.now,
    )


def decode_tokens(rs: ResolvedScenario) -> int:
    """Free KV tokens each running request needs before a decode step (engine/admission.py)."""
    return decode_tokens_per_request(rs.algorithm, rs.num_steps, rs.topk, rs.num_draft_tokens,
                                     rs.scenario.speculative.ngram.max_bfs_breadth)


def baseline_of(rs: ResolvedScenario) -> ResolvedScenario:
    """The same scenario without speculation: same hardware, model, server, workload and seed, and the same
    admission cap. SGLang lowers max_running_requests to 48 for speculation only; keeping the speculative
    run's cap in the baseline compares per-request rates at the same batch sizes, so the speedup measures
    speculation, not admission."""
    server = rs.scenario.server.model_copy(update={"max_running_requests": rs.max_running_requests})
    sc = rs.scenario.model_copy(update={"speculative": Speculative(), "acceptance": None, "server": server})
    # the same box: the coefficients and all-reduce curve the speculative scenario runs with, which a fit or a
    # what-if may have set on it after resolving (re-resolving alone would read them from its files again)
    return dataclasses.replace(resolve(sc, rs.path), coefficients=rs.coefficients, all_reduce=rs.all_reduce)
