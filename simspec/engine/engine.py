"""One SimPy process per serving engine, as SGLang's scheduler loop runs it.

Each turn: admit waiting requests (up to max_running_requests and the KV-cache budget) and prefill them, or
run one decode iteration over the running batch (draft -> verify -> accept for speculative algorithms). The
duration of every iteration comes from IterationModel; acceptance is sampled for the whole batch at once.
Prefill has priority over decode, as in SGLang's default scheduling (speculation disables mixed chunked
prefill, so prefill and decode never share an iteration).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from simspec.acceptance.models import AcceptanceSampler
from simspec.engine.recorder import Recorder
from simspec.timing.iteration import IterationModel
from simspec.workload import RequestSpecs


class ServingEngine:
    def __init__(self, env: simpy.Environment, model: IterationModel, specs: RequestSpecs,
                 sampler: AcceptanceSampler | None, *, max_running: int, kv_capacity_tokens: int,
                 chunked_prefill_tokens: int, concurrency: int | None):
        self.env = env
        self.model = model
        self.sampler = sampler
        self.max_running = max_running
        self.kv_capacity = kv_capacity_tokens
        self.chunk = chunked_prefill_tokens
        n = len(specs.input_tokens)
        self.inputs = specs.input_tokens
        self.outputs = specs.output_tokens
        self.rec = Recorder(n)
        self.rec.input_tokens[:] = specs.input_tokens
        self.generated = np.zeros(n, dtype=np.int64)
        self.last_emit_ms = np.zeros(n)
        self.waiting: deque[int] = deque()
        self.running = np.zeros(0, dtype=np.int64)
        self.kv_reserved = 0
        self.roofline_ms = 0.0  # running sum of every iteration's roofline time
        self.next_request = 0
        self.finished = 0
        self._wake: simpy.Event | None = None
        self.done = env.event()
        self._closed = concurrency is not None
        if concurrency is not None:  # closed loop: keep `concurrency` requests in the system
            for _ in range(min(concurrency, n)):
                self._arrive()
        else:
            env.process(self._open_loop(specs.arrival_s))
        env.process(self._loop())

    # ------------------------------------------------------------------------------------- arrivals
    def _arrive(self) -> None:
        rid = self.next_request
        self.next_request += 1
        self.rec.arrival_ms[rid] = self.env.now
        self.waiting.append(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _open_loop(self, arrivals_s: np.ndarray):
        for t in arrivals_s:
            delay = t * 1e3 - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            self._arrive()

    # ------------------------------------------------------------------------------------- scheduling
    def _admit(self) -> list[int]:
        admitted: list[int] = []
        prompt_tokens = 0
        while self.waiting and len(self.running) + len(admitted) < self.max_running:
            rid = self.waiting[0]
            need = int(self.inputs[rid] + self.outputs[rid])  # reserve the whole request: no preemption
            if self.kv_reserved + need > self.kv_capacity:
                break
            if admitted and prompt_tokens + self.inputs[rid] > self.chunk:
                break
            self.waiting.popleft()
            self.kv_reserved += need
            prompt_tokens += int(self.inputs[rid])
            admitted.append(rid)
        return admitted

    def _loop(self):
        env = self.env
        total = len(self.inputs)
        while self.finished < total:
            if not self.waiting and len(self.running) == 0:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            admitted = self._admit()
            if admitted:
                yield from self._prefill(admitted)
            elif len(self.running):
                yield from self._decode()
            else:  # the loader and simulate() guarantee any single request fits an empty cache
                raise RuntimeError("a waiting request cannot fit the KV cache of an idle engine")
        self.done.succeed()

    def _prefill(self, admitted: list[int]):
        env, rec = self.env, self.rec
        prompts = [int(self.inputs[r]) for r in admitted]
        # a prompt longer than the chunk runs as several chunks, each attending to the ones before
        pieces: list[tuple[list[int], float]] = []
        if len(prompts) == 1 and prompts[0] > self.chunk:
            done = 0
            while done < prompts[0]:
                step = min(self.chunk, prompts[0] - done)
                pieces.append(([step], float(done)))
                done += step
        else:
            pieces.append((prompts, 0.0))
        for chunk_prompts, cached in pieces:
            start = env.now
            cost = self.model.prefill(chunk_prompts, cached)
            yield env.timeout(cost.total_ms)
            self.roofline_ms += cost.roofline_ms
            rec.iteration(start, env.now, "prefill", len(chunk_prompts), len(chunk_prompts), cost)
        ids = np.asarray(admitted, dtype=np.int64)
        now = env.now
        rec.first_token_ms[ids] = now
        rec.roofline_at_first_ms[ids] = self.roofline_ms
        self.generated[ids] = 1
        self.last_emit_ms[ids] = now
        self.running = np.concatenate([self.running, ids])
        self._retire(now)

    def _decode(self):
        env, rec = self.env, self.rec
        run = self.running
        bs = len(run)
        context = float(self.inputs[run].sum() + self.generated[run].sum())
        cost = self.model.decode(bs, context)
        start = env.now
        yield env.timeout(cost.total_ms)
        now = env.now
        self.roofline_ms += cost.roofline_ms
        tokens = self.sampler.sample(bs) + 1 if self.sampler is not None else np.ones(bs, dtype=np.int64)
        tokens = np.minimum(tokens, self.outputs[run] - self.generated[run])
        self.generated[run] += tokens
        rec.verify_steps[run] += 1
        rec.itl_chunks.append(now - self.last_emit_ms[run])
        self.last_emit_ms[run] = now
        rec.iteration(start, now, "decode", bs, int(tokens.sum()), cost)
        self._retire(now)

    def _retire(self, now: float) -> None:
        run = self.running
        done_mask = self.generated[run] >= self.outputs[run]
        if not done_mask.any():
            return
        finished = run[done_mask]
        self.running = run[~done_mask]
        rec = self.rec
        rec.finish_ms[finished] = now
        rec.roofline_at_finish_ms[finished] = self.roofline_ms
        rec.output_tokens[finished] = self.generated[finished]
        self.kv_reserved -= int((self.inputs[finished] + self.outputs[finished]).sum())
        self.finished += len(finished)
        total = len(self.inputs)
        for _ in range(len(finished)):  # closed loop: each finished request's client sends the next one
            if self._closed and self.next_request < total:
                self._arrive()
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
