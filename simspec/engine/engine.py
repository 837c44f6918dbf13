"""One SimPy process per serving engine, as SGLang's scheduler loop runs it.

Each turn: admit waiting requests (up to max_running_requests and the KV-cache budget) and prefill them, or
run one decode iteration over the running batch (draft -> verify -> accept for speculative algorithms). The
duration of every iteration comes from IterationModel; acceptance is sampled for the whole batch at once.
Prefill has priority over decode, as in SGLang's default scheduling (speculation disables mixed chunked
prefill, so prefill and decode never share an iteration).

The running batch is kept as parallel arrays (ids, tokens still to generate, decode iterations seen at
admission) so that one iteration costs a handful of vector operations whatever the batch size.
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
        self.waiting: deque[int] = deque()
        # the running batch, as parallel arrays
        self.run_ids = np.zeros(0, dtype=np.int64)
        self.run_remaining = np.zeros(0, dtype=np.int64)  # tokens still to generate
        self.run_joined = np.zeros(0, dtype=np.int64)  # decode iterations done when the request joined
        self.context_sum = 0  # KV tokens of the running batch (prompts + generated)
        self.decode_iterations = 0
        self.kv_reserved = 0
        self.roofline_ms = 0.0  # running sum of every iteration's roofline time
        self.last_decode_end = 0.0
        self.fresh: list[tuple[float, int]] = []  # (first-token time, count) of requests not yet decoded
        self.next_request = 0
        self.finished = 0
        self._closed = concurrency is not None
        self._wake: simpy.Event | None = None
        self.done = env.event()
        if concurrency is not None:  # closed loop: keep `concurrency` requests in the system
            for _ in range(min(concurrency, n)):
                self._arrive()
        else:
            assert specs.arrival_s is not None, "open-loop workloads carry arrival times"
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
        while self.waiting and len(self.run_ids) + len(admitted) < self.max_running:
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
            if not self.waiting and len(self.run_ids) == 0:
                self._wake = env.event()
                yield self._wake
                self._wake = None
                continue
            admitted = self._admit()
            if admitted:
                yield from self._prefill(admitted)
            elif len(self.run_ids):
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
        self.fresh.append((now, len(ids)))
        self.run_ids = np.concatenate([self.run_ids, ids])
        self.run_remaining = np.concatenate([self.run_remaining, self.outputs[ids] - 1])
        self.run_joined = np.concatenate([self.run_joined, np.full(len(ids), self.decode_iterations)])
        self.context_sum += int(self.inputs[ids].sum()) + len(ids)
        self._retire(now)

    def _decode(self):
        env, rec = self.env, self.rec
        bs = len(self.run_ids)
        cost = self.model.decode(bs, self.context_sum)
        start = env.now
        yield env.timeout(cost.total_ms)
        now = env.now
        self.roofline_ms += cost.roofline_ms
        self.decode_iterations += 1
        if self.sampler is not None:
            tokens = np.minimum(self.sampler.sample(bs) + 1, self.run_remaining)
        else:
            tokens = np.minimum(1, self.run_remaining)
        emitted = int(tokens.sum())
        self.run_remaining -= tokens
        self.context_sum += emitted
        # streamed-chunk gaps: requests decoded last iteration waited since its end, fresh ones since prefill
        n_fresh = 0
        for t, count in self.fresh:
            rec.itl_gaps.append((now - t, count))
            n_fresh += count
        self.fresh.clear()
        if bs > n_fresh:
            rec.itl_gaps.append((now - self.last_decode_end, bs - n_fresh))
        self.last_decode_end = now
        rec.iteration(start, now, "decode", bs, emitted, cost)
        self._retire(now)

    def _retire(self, now: float) -> None:
        done_mask = self.run_remaining <= 0
        if not done_mask.any():
            return
        finished = self.run_ids[done_mask]
        rec = self.rec
        rec.finish_ms[finished] = now
        rec.roofline_at_finish_ms[finished] = self.roofline_ms
        rec.output_tokens[finished] = self.outputs[finished]
        rec.verify_steps[finished] = self.decode_iterations - self.run_joined[done_mask]
        keep = ~done_mask
        self.run_ids, self.run_remaining, self.run_joined = (
            self.run_ids[keep], self.run_remaining[keep], self.run_joined[keep])
        footprint = int((self.inputs[finished] + self.outputs[finished]).sum())  # all generated by now
        self.context_sum -= footprint
        self.kv_reserved -= footprint
        self.finished += len(finished)
        total = len(self.inputs)
        for _ in range(len(finished)):  # closed loop: each finished request's client sends the next one
            if self._closed and self.next_request < total:
                self._arrive()
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
