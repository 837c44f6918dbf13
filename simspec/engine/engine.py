"""One SimPy process per serving engine, as SGLang's scheduler loop runs it.

Each turn: admit waiting requests (up to max_running_requests and the KV cache's estimated room) and prefill
them, or run one decode iteration over the running batch (draft -> verify -> accept for speculative
algorithms). The duration of every iteration comes from IterationModel; acceptance is sampled for the whole
batch at once (per request at its own context when the acceptance depends on it). Prefill has priority over
decode, as in SGLang's default scheduling (speculation disables mixed chunked prefill, so prefill and decode never
share an iteration).

KV admission follows SGLang (engine/admission.py): a request is admitted against an estimate of what the
running ones will still generate, not their whole max_new_tokens, and a decode step that finds no room retracts
requests back to the waiting queue; they are prefilled again (prompt and generated tokens) when room returns.
Of the radix cache, two reuses are modelled: the prompt prefix every request shares (workload.shared_prefix_tokens),
which after the first prefill has computed it the KV cache holds once, and a conversation's turns so far
(arrival.followup_tokens), which its next turn finds cached. Either way a prefill computes only what follows the
cached part, attending to it, and decode reads the whole prompt. Eviction is not modelled: what was cached stays
(a retracted request's prompt is recomputed whole, less those two).

The running batch is kept as parallel arrays (ids, tokens still to generate, decode iterations seen at
admission) so that one iteration costs a handful of vector operations whatever the batch size.

A request reaches the scheduler only when its loop next receives (Scheduler.recv_requests, non-blocking, at the top
of each turn), not when it is sent. A closed-loop client's next request leaves after its previous one's last token
has been streamed (detokenizer, tokenizer manager, HTTP, the client, tokenizing: a few ms), so the turn that follows
that step has already looked and the request waits for the next one. With overlap scheduling the turn picks the
batch after next while the GPU still runs the current one (event_loop_overlap): what it receives at the end of a
step is what arrived before that step began, and its prefill runs after the step already launched. So a request
waits about one step (two in a closed loop) before its prefill, none when the engine was idle. With
--scheduler-recv-interval N the scheduler receives only every N turns while it decodes or verifies, at once after a
prefill (SchedulerRecvSkipper: weight 1 per decode, verify or idle turn, 1000 otherwise); the idle turns spin in
microseconds, so an idle engine still receives at once. Not modelled: the finished requests that an overlapped
decode step still carries (their end is known one step late).
"""

from __future__ import annotations

from collections import deque

import numpy as np
import simpy

from simspec.acceptance.models import AcceptanceSampler
from simspec.engine.admission import NewTokenRatio, output_estimate
from simspec.engine.recorder import Recorder
from simspec.timing.iteration import IterationModel
from simspec.workload import RequestSpecs


class ServingEngine:
    def __init__(self, env: simpy.Environment, model: IterationModel, specs: RequestSpecs,
                 sampler: AcceptanceSampler | None, *, max_running: int, kv_capacity_tokens: int,
                 chunked_prefill_tokens: int, concurrency: int | None, schedule_conservativeness: float = 1.0,
                 decode_tokens_per_request: int = 1, retract_latest_first: bool = False, turns: int = 1,
                 shared_prefix_tokens: int = 0, overlap: bool = False, recv_interval: int = 1):
        self.env = env
        self.model = model
        self.sampler = sampler
        self.max_running = max_running
        self.kv_capacity = kv_capacity_tokens
        self.chunk = chunked_prefill_tokens
        n = len(specs.input_tokens)
        self.inputs = specs.input_tokens
        self.outputs = specs.output_tokens
        # a later turn's conversation so far, which the radix cache serves (workload arrival.followup_tokens)
        self.carried = specs.carried_tokens if specs.carried_tokens is not None else np.zeros(n, dtype=np.int64)
        self.rec = Recorder(n)
        self.rec.input_tokens[:] = specs.input_tokens
        self.waiting: deque[int] = deque()
        # sent, not yet received by the scheduler (its socket from the tokenizer manager), in arrival order
        self.inbox: deque[int] = deque()
        self.overlap = overlap
        self.recv_interval = recv_interval
        self.recv_counter = recv_interval  # SchedulerRecvSkipper starts at its threshold: the first turn receives
        self.last_kind: str | None = None  # the iteration the scheduler ran last: "prefill", "decode" or None
        self.last_start = 0.0  # when it began
        # tokens each request still has to generate when it (re)joins the batch: its output, or what was left
        # when it was retracted (while it runs, run_remaining holds the live count)
        self.left_at_admission = specs.output_tokens.astype(np.int64)
        self.last_emit_ms = np.zeros(n)  # when a retracted request last streamed a token
        self.prefill_end_ms = np.zeros(n)  # when each request's latest prefill ended
        self.ratio = NewTokenRatio.for_server(schedule_conservativeness)
        self.decode_tokens = decode_tokens_per_request
        # SGLang retracts the request with the fewest generated tokens (the longest prompt among ties); with
        # speculation its batch can only drop requests from the back, so the latest admitted goes first
        self.retract_latest_first = retract_latest_first
        # batch_is_full: a prefill found no room (or the request cap); none is tried again until the batch has
        # shrunk, which SGLang notices when it next builds a decode batch (update_running_batch)
        self.batch_full = False
        self.shrunk = False
        # the running batch, as parallel arrays
        self.run_ids = np.zeros(0, dtype=np.int64)
        self.run_remaining = np.zeros(0, dtype=np.int64)  # tokens still to generate
        self.run_joined = np.zeros(0, dtype=np.int64)  # decode iterations done when the request joined
        self.context_sum = 0  # KV tokens the running batch's attention reads (prompts + generated)
        # a prompt prefix every request shares: once a prefill has computed it, the radix cache serves it (a
        # request's prefill computes only the rest and attends to it) and holds it once, whoever runs
        self.shared_prefix = shared_prefix_tokens
        self.cached_prefix = 0  # of it, what the cache holds: none until the first prefill, then all of it
        self.decode_iterations = 0
        self.roofline_ms = 0.0  # running sum of every iteration's roofline time
        self.last_decode_end = 0.0
        self.fresh: list[tuple[float, int]] = []  # (first-token time, count) of requests not yet decoded
        # closed loop: conversations of `turns` consecutive requests; a client runs one conversation's turns in
        # order, then takes the next conversation nobody has started
        self.turns = turns
        self.conversations = n // turns
        self.next_conversation = 0
        self.finished = 0
        self._closed = concurrency is not None
        self._wake: simpy.Event | None = None
        self.done = env.event()
        if concurrency is not None:  # closed loop: keep `concurrency` clients busy
            for _ in range(min(concurrency, self.conversations)):
                self._start_conversation()
        else:
            assert specs.arrival_s is not None, "open-loop workloads carry arrival times"
            env.process(self._open_loop(specs.arrival_s))
        env.process(self._loop())

    # ------------------------------------------------------------------------------------- arrivals
    def _start_conversation(self) -> None:
        self._arrive(self.next_conversation * self.turns)
        self.next_conversation += 1

    def _client_continues(self, rid: int) -> None:
        """A closed-loop client whose request `rid` finished sends its conversation's next turn, or starts the
        next conversation."""
        if (rid + 1) % self.turns:
            self._arrive(rid + 1)
        elif self.next_conversation < self.conversations:
            self._start_conversation()

    def _arrive(self, rid: int) -> None:
        self.rec.arrival_ms[rid] = self.env.now
        self.inbox.append(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()

    def _open_loop(self, arrivals_s: np.ndarray):
        for rid, t in enumerate(arrivals_s):
            delay = t * 1e3 - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            self._arrive(rid)

    # ------------------------------------------------------------------------------------- scheduling
    def _recv(self, idle: bool) -> None:
        """Scheduler.recv_requests at the top of a loop turn: the requests sent before the moment it looks."""
        arrival = self.rec.arrival_ms
        inbox = self.inbox
        if idle:  # the idle turns spin until the request is there, and count 1 each towards the interval
            while inbox:
                self.waiting.append(inbox.popleft())
            self.recv_counter = 0
            return
        if self.recv_interval > 1:
            self.recv_counter += 1000 if self.last_kind == "prefill" else 1
            if self.recv_counter < self.recv_interval:
                return
            self.recv_counter = 0
        # without overlap it looks as the step ends; with it, as the step began (it scheduled the next one then).
        # Strictly before: a request sent at the very instant (a closed-loop client's next one) is not yet there.
        looked = self.last_start if self.overlap else self.env.now
        while inbox and arrival[inbox[0]] < looked:
            self.waiting.append(inbox.popleft())

    def _admit(self) -> list[int]:
        """PrefillAdder.add_one_req over the waiting queue, first come first served."""
        admitted: list[int] = []
        if self.batch_full or not self.waiting:
            return admitted
        # room = free KV - the running requests' estimated remaining output (schedule_policy.PrefillAdder)
        room = (self.kv_capacity - self._kv_held()
                - self.ratio.value * float(output_estimate(self.run_remaining).sum()))
        if not len(self.run_ids):
            room -= self.cached_prefix  # evictable while nobody runs; the first request admitted locks it again
        prompt_tokens = 0
        while self.waiting:
            if len(self.run_ids) + len(admitted) >= self.max_running:
                self.batch_full = True
                break
            rid = self.waiting[0]
            extend = self._extend_tokens(rid)
            # what it will hold: its prompt (a cached conversation so far included, which admitting it locks out
            # of the evictable cache; the shared prefix only if nobody holds it) and its whole (clipped) output
            need = self._held_tokens(rid) + int(output_estimate(self.left_at_admission[rid]))
            if need >= room:
                self.batch_full = True  # AddReqResult.NO_TOKEN
                break
            if admitted and prompt_tokens + extend > self.chunk:
                break
            self.waiting.popleft()
            room -= need
            prompt_tokens += extend
            admitted.append(rid)
        return admitted

    def _context_tokens(self, rid: int) -> int:
        """Its prompt, and what it had generated if it was retracted: the KV context its prefill restores (the
        radix cache may still hold a retracted prompt; recomputing it all is the assumption here)."""
        return int(self.inputs[rid] + self.outputs[rid] - self.left_at_admission[rid])

    def _extend_tokens(self, rid: int) -> int:
        """Tokens a prefill of this request computes: its context less what the radix cache serves."""
        return self._context_tokens(rid) - self._cached_tokens(rid)

    def _cached_tokens(self, rid: int) -> int:
        """Leading prompt tokens of this request the radix cache holds: its conversation so far (which opens with
        the shared prefix), or the shared prefix once a prefill has computed it."""
        return max(int(self.carried[rid]), self.cached_prefix)

    def _held_tokens(self, rid: int) -> int:
        """KV tokens this request's prompt (and what it had generated) will hold once running, the cached shared
        prefix counted with the batch (_kv_held), not with each request."""
        return self._context_tokens(rid) - self.cached_prefix

    def _kv_held(self) -> int:
        """KV tokens the running batch holds: what its attention reads, with the cached shared prefix once."""
        return self.context_sum - self.cached_prefix * max(len(self.run_ids) - 1, 0)

    def _loop(self):
        env = self.env
        total = len(self.inputs)
        while self.finished < total:
            idle = not self.waiting and len(self.run_ids) == 0
            if idle:
                self.ratio.idle()
                self.batch_full = self.shrunk = False
                self.last_kind = None
                if not self.inbox:
                    self._wake = env.event()
                    yield self._wake
                    self._wake = None
                    continue
            self._recv(idle)
            admitted = self._admit()
            if admitted:
                yield from self._prefill(admitted)
            elif len(self.run_ids):
                self._make_room_for_decode()
                yield from self._decode()
            elif self.shrunk:  # the batch emptied: update_running_batch clears the flag on an empty batch
                self.batch_full = self.shrunk = False
            else:  # the loader and simulate() guarantee any single request fits an empty cache
                raise RuntimeError("a waiting request cannot fit the KV cache of an idle engine")
        self.done.succeed()

    def _prefill(self, admitted: list[int]):
        env, rec = self.env, self.rec
        prompts = [self._extend_tokens(r) for r in admitted]
        hits = [self._cached_tokens(r) for r in admitted]  # each prompt attends to what the cache served it
        # a prompt longer than the chunk runs as several chunks, each attending to the ones before
        pieces: list[tuple[list[int], list[float]]] = []
        if len(prompts) == 1 and prompts[0] > self.chunk:
            done = 0
            while done < prompts[0]:
                step = min(self.chunk, prompts[0] - done)
                pieces.append(([step], [float(hits[0] + done)]))
                done += step
        else:
            pieces.append((prompts, [float(h) for h in hits]))
        for chunk_prompts, cached in pieces:
            start = self.last_start = env.now
            self.last_kind = "prefill"
            cost = self.model.prefill(chunk_prompts, cached)
            yield env.timeout(cost.total_ms)
            self.roofline_ms += cost.roofline_ms
            rec.iteration(start, env.now, "prefill", len(chunk_prompts), len(chunk_prompts), cost)
        ids = np.asarray(admitted, dtype=np.int64)
        rec.prefill_tokens[ids] += np.asarray(prompts, dtype=np.int64)
        rec.cached_tokens[ids] += np.asarray(hits, dtype=np.int64)
        now = env.now
        new = np.isnan(rec.first_token_ms[ids])
        rec.first_token_ms[ids[new]] = now
        rec.roofline_at_first_ms[ids[new]] = self.roofline_ms
        for rid in ids[~new]:  # a retracted request's prefill streams its next token
            rec.itl_gaps.append((now - self.last_emit_ms[rid], 1))
        self.prefill_end_ms[ids] = now
        self.fresh.append((now, len(ids)))
        self.run_ids = np.concatenate([self.run_ids, ids])
        self.run_remaining = np.concatenate([self.run_remaining, self.left_at_admission[ids] - 1])
        self.run_joined = np.concatenate([self.run_joined, np.full(len(ids), self.decode_iterations)])
        self.context_sum += sum(prompts) + sum(hits) + len(ids)
        self.cached_prefix = self.shared_prefix
        if self._retire(now):  # requests done at their prefill leave before any decode: the flag clears now
            self.batch_full = self.shrunk = False

    def _make_room_for_decode(self) -> None:
        """Scheduler.update_running_batch: ScheduleBatch.check_decode_mem, then retract_decode when the next
        step's tokens do not fit; the batch_is_full flag clears once the batch has shrunk."""
        if self.shrunk:
            self.batch_full = self.shrunk = False
        free = self.kv_capacity - self._kv_held()
        if free >= len(self.run_ids) * self.decode_tokens:
            self.ratio.decode_step()
            return
        generated = self.outputs[self.run_ids] - self.run_remaining  # so far, the prefill's first token included
        if self.retract_latest_first:
            order = np.arange(len(self.run_ids))
        else:  # sorted by (generated, -prompt) descending; retract_decode pops from the end
            order = np.lexsort((self.inputs[self.run_ids], -generated))
        keep = len(order)
        while keep > 1:  # at least one, then until the survivors' next step fits (check_decode_mem)
            keep -= 1
            rid = int(self.run_ids[order[keep]])
            # its own tokens; the cached shared prefix stays with the requests that remain
            free += int(self.inputs[rid]) + int(generated[order[keep]]) - self.cached_prefix
            if free >= keep * self.decode_tokens:
                break
        gone, stay = order[keep:][::-1], np.sort(order[:keep])  # gone: in the order they were popped
        rec = self.rec
        for i in gone:
            rid = int(self.run_ids[i])
            self.left_at_admission[rid] = self.run_remaining[i]
            if self.run_joined[i] < self.decode_iterations:  # it took part in the last decode step
                self.last_emit_ms[rid] = self.last_decode_end
            else:  # prefilled since: no longer among the fresh requests the next step streams to
                self.last_emit_ms[rid] = self.prefill_end_ms[rid]
                self._unfresh(self.prefill_end_ms[rid])
            rec.verify_steps[rid] += self.decode_iterations - self.run_joined[i]
            rec.retractions[rid] += 1
            self.waiting.append(rid)  # Scheduler._add_request_to_queue: the back of the queue
        self.context_sum -= int((self.inputs[self.run_ids[gone]] + generated[gone]).sum())
        self.run_ids, self.run_remaining, self.run_joined = (
            self.run_ids[stay], self.run_remaining[stay], self.run_joined[stay])
        self.ratio.after_retraction(generated[stay], self.outputs[self.run_ids])
        self.batch_full = False

    def _unfresh(self, prefill_end: float) -> None:
        for k, (t, count) in enumerate(self.fresh):
            if t == prefill_end:
                if count > 1:
                    self.fresh[k] = (t, count - 1)
                else:
                    del self.fresh[k]
                return
        raise AssertionError("a request prefilled since the last decode step is among the fresh ones")

    def _decode(self):
        env, rec = self.env, self.rec
        bs = len(self.run_ids)
        # what the iteration commits is drawn first: the host's time per committed token is part of its cost
        if self.sampler is not None:
            if self.sampler.context_dependent:  # each request's KV context: prompt + what it has generated
                context = self.inputs[self.run_ids] + self.outputs[self.run_ids] - self.run_remaining
                drafts = self.sampler.sample(bs, context)
            else:
                drafts = self.sampler.sample(bs)
            tokens = np.minimum(drafts + 1, self.run_remaining)
        else:
            tokens = np.minimum(1, self.run_remaining)
        emitted = int(tokens.sum())
        cost = self.model.decode(bs, self.context_sum, emitted)
        start = self.last_start = env.now
        self.last_kind = "decode"
        yield env.timeout(cost.total_ms)
        now = env.now
        self.roofline_ms += cost.roofline_ms
        self.decode_iterations += 1
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

    def _retire(self, now: float) -> bool:
        """Finished requests leave the batch (their KV goes to the radix cache, free to reuse); True if any."""
        done_mask = self.run_remaining <= 0
        if not done_mask.any():
            return False
        finished = self.run_ids[done_mask]
        rec = self.rec
        rec.finish_ms[finished] = now
        rec.roofline_at_finish_ms[finished] = self.roofline_ms
        rec.output_tokens[finished] = self.outputs[finished]
        rec.verify_steps[finished] += self.decode_iterations - self.run_joined[done_mask]
        keep = ~done_mask
        self.run_ids, self.run_remaining, self.run_joined = (
            self.run_ids[keep], self.run_remaining[keep], self.run_joined[keep])
        self.context_sum -= int((self.inputs[finished] + self.outputs[finished]).sum())  # all generated by now
        self.finished += len(finished)
        self.shrunk = True
        if self._closed:  # each finished request's client sends its next one
            for rid in finished.tolist():
                self._client_continues(rid)
        if self._wake is not None and not self._wake.triggered:
            self._wake.succeed()
        return True
