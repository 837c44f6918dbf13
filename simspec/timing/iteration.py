"""THE boundary between the engine and the time model: one engine iteration's shape -> its cost breakdown.

The SimPy engine never computes a duration; it asks IterationModel. What one iteration contains follows
SGLang's workers (shared/reference/sglang.md, "One EAGLE / EAGLE3 / NEXTN iteration"):
  EAGLE, EAGLE-3, MTP (NEXTN), standalone: num_steps - 1 draft forwards over bs * topk tokens, the draft
    extend over the accepted tokens (v1: padded to num_steps + 1 per request; v2: num_draft_tokens), and one
    target verify over bs * num_draft_tokens tokens. Each draft forward pays its own TP collectives.
  n-gram: a CPU trie lookup per request and a verify over bs * num_draft_tokens tokens (always padded to
    num_draft_tokens, whatever matched).
  none: one target decode over bs tokens.
CPU scheduling work is exposed unless overlap scheduling hides it behind the GPU.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

from simspec.scenario.loader import ResolvedScenario
from simspec.timing.collectives import Collectives
from simspec.timing.forward import Efficiencies, ForwardCost, ForwardModel, ForwardShape
from simspec.timing.stack import draft_stack, target_stack


@dataclass(frozen=True, slots=True)
class IterationCost:
    """Milliseconds of one engine iteration by component. For no speculation, verify_* is the plain decode
    forward; for prefill iterations, verify_* is the target's prefill and draft_* the draft model's."""

    draft_compute_ms: float = 0.0
    draft_comm_ms: float = 0.0
    verify_compute_ms: float = 0.0
    verify_comm_ms: float = 0.0
    cpu_ms: float = 0.0  # exposed CPU time (not hidden by overlap scheduling)
    roofline_ms: float = 0.0  # every forward at full memory bandwidth, free communication, no overhead

    @property
    def total_ms(self) -> float:
        return self.draft_compute_ms + self.draft_comm_ms + self.verify_compute_ms + self.verify_comm_ms + self.cpu_ms


BREAKDOWN_KEYS = ("draft_compute", "draft_comm", "verify_compute", "verify_comm", "cpu")


def captured_batch_sizes(max_bs: int) -> list[int]:
    """SGLang's CUDA-graph batch sizes: 1-8, 10-32 step 2, 40-64 step 4, 72-256 step 8, then step 16."""
    sizes = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 65, 4)) + list(range(72, 257, 8))
    sizes += list(range(272, max(max_bs, 272) + 1, 16))
    return [s for s in sizes if s <= max_bs]


class IterationModel:
    def __init__(self, rs: ResolvedScenario):
        self.rs = rs
        c = rs.coefficient
        tp = rs.scenario.server.tp
        self.eff = Efficiencies(
            memory_bandwidth=c("memory_bandwidth_efficiency"), compute=c("compute_efficiency"),
            routing_locality=c("moe_routing_locality"), forward_overhead_ms=c("forward_overhead_ms"),
            layer_overhead_graph_us=c("layer_overhead_graph_us"), layer_overhead_eager_us=c("layer_overhead_eager_us"),
        )
        self.collectives = Collectives(rs.all_reduce, tp, rs.interconnect.link)
        self.target = ForwardModel(target_stack(rs.model, tp), rs.gpu, self.collectives, self.eff)
        dstack = draft_stack(rs.algorithm, rs.model, rs.drafter, rs.draft_model, tp)
        self.draft = ForwardModel(dstack, rs.gpu, self.collectives, self.eff) if dstack else None
        srv = rs.scenario.server
        self._graph_sizes = captured_batch_sizes(srv.cuda_graph_max_bs) if srv.cuda_graph else []
        self._sched_ms = c("scheduler_cpu_ms")
        self._sched_per_req_ms = c("scheduler_cpu_per_request_ms")
        self._spec_cpu_ms = c("spec_cpu_ms")
        self._ngram_ms_per_req = c("ngram_cpu_per_request_us") / 1e3
        self.steps, self.topk, self.n = rs.num_steps, rs.topk, rs.num_draft_tokens
        self._extend_tokens = self.n if rs.spec_v2 else self.steps + 1
        self._plans: dict[int, tuple[tuple, ...]] = {}

    # ----------------------------------------------------------------------------------------- helpers
    def padded(self, bs: int) -> tuple[int, bool]:
        """Batch size the kernels run at, and whether a CUDA graph is replayed."""
        sizes = self._graph_sizes
        if sizes and bs <= sizes[-1]:
            return sizes[bisect_left(sizes, bs)], True
        return bs, False

    def _cpu(self, bs: int, gpu_ms: float, extra_ms: float) -> float:
        cpu = self._sched_ms + self._sched_per_req_ms * bs + extra_ms
        return max(0.0, cpu - gpu_ms) if self.rs.overlap else cpu

    def _plan(self, bs: int) -> tuple[tuple, ...]:
        """The forwards of one decode iteration at batch size bs, each as
        (is_draft, repeats, q, seqs, compute, comm, roof, kv_rate, attn_rate, roof_kv_rate), cached per bs."""
        plan = self._plans.get(bs)
        if plan is not None:
            return plan
        pbs, graph = self.padded(bs)
        forwards: list[tuple[ForwardModel, bool, int, int, bool]] = []  # model, is_draft, repeats, q, extend
        if not self.rs.speculative:
            forwards.append((self.target, False, 1, 1, False))
        else:
            if self.draft is not None:
                if self.steps > 1:
                    forwards.append((self.draft, True, self.steps - 1, self.topk, False))
                forwards.append((self.draft, True, 1, self._extend_tokens, True))
            forwards.append((self.target, False, 1, self.n, False))
        rows = []
        measured_draft = self.rs.profile.draft_forward_ms if self.rs.profile is not None else None
        for fm, is_draft, repeats, q, extend in forwards:
            shape = ForwardShape(num_seqs=pbs, tokens=pbs * q, real_seqs=bs, real_tokens=bs * q,
                                 logit_tokens=pbs * q, graph=graph, extend=extend)
            compute, comm, roof, kv_rate, attn_rate, roof_kv_rate = fm.fixed_and_rates(shape)
            if is_draft and measured_draft is not None:
                # a profiled draft forward: its measured time replaces compute and communication alike
                compute, comm, kv_rate, attn_rate = measured_draft.value, 0.0, 0.0, 0.0
                roof, roof_kv_rate = min(roof, compute), 0.0  # the roofline stays a bound on every time
            rows.append((is_draft, repeats, q, bs, compute, comm, roof, kv_rate, attn_rate, roof_kv_rate))
        plan = tuple(rows)
        self._plans[bs] = plan
        return plan

    # ----------------------------------------------------------------------------------------- iterations
    def decode(self, bs: int, context_sum: float) -> IterationCost:
        """One decode iteration of `bs` running requests whose contexts sum to context_sum tokens: a plain
        decode forward, or draft -> verify for a speculative algorithm."""
        d_compute = d_comm = v_compute = v_comm = roof = 0.0
        for is_draft, repeats, q, seqs, compute, comm, froof, kv_rate, attn_rate, roof_kv_rate in self._plan(bs):
            kv_tokens = context_sum + seqs * q
            pairs = q * context_sum + seqs * q * (q + 1) / 2  # causal: each new token sees the ones before
            compute += kv_tokens * kv_rate if kv_tokens * kv_rate > pairs * attn_rate else pairs * attn_rate
            froof += kv_tokens * roof_kv_rate
            if is_draft:
                d_compute += repeats * compute
                d_comm += repeats * comm
            else:
                v_compute += compute
                v_comm += comm
            roof += repeats * froof
        extra = 0.0
        if self.rs.speculative:
            extra = self._spec_cpu_ms + (self._ngram_ms_per_req * bs if self.draft is None else 0.0)
        cpu = self._cpu(bs, d_compute + d_comm + v_compute + v_comm, extra)
        return IterationCost(d_compute, d_comm, v_compute, v_comm, cpu, roof)

    def prefill(self, prompt_tokens: list[int], cached_context: float = 0.0) -> IterationCost:
        """A prefill (extend) iteration over new prompts, run eagerly. EAGLE-family drafters prefill too."""
        seqs = len(prompt_tokens)
        tokens = int(sum(prompt_tokens))
        pairs = sum(q * (q + 1) / 2 for q in prompt_tokens) + tokens * (cached_context / max(seqs, 1))
        shape = ForwardShape(num_seqs=seqs, tokens=tokens, real_seqs=seqs, real_tokens=tokens,
                             logit_tokens=seqs, graph=False)
        v = self.target.cost(shape, cached_context + tokens, pairs)
        d = ForwardCost(0.0, 0.0, 0.0)
        if self.draft is not None:
            d = self.draft.cost(ForwardShape(num_seqs=seqs, tokens=tokens, real_seqs=seqs, real_tokens=tokens,
                                             logit_tokens=seqs, graph=False, extend=True),
                                cached_context + tokens, pairs)
        gpu = v.compute_ms + v.comm_ms + d.compute_ms + d.comm_ms
        return IterationCost(draft_compute_ms=d.compute_ms, draft_comm_ms=d.comm_ms,
                             verify_compute_ms=v.compute_ms, verify_comm_ms=v.comm_ms,
                             cpu_ms=self._cpu(seqs, gpu, 0.0), roofline_ms=v.roofline_ms + d.roofline_ms)
