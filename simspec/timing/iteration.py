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

    @staticmethod
    def _pairs(q: int, seqs: int, context_sum: float) -> float:
        """Query x key pairs when each of `seqs` sequences appends q tokens to its context (causal)."""
        return q * context_sum + seqs * q * (q + 1) / 2

    def _uniform(self, fm: ForwardModel, pbs: int, bs: int, q: int, graph: bool, context_sum: float,
                 extend: bool = False) -> ForwardCost:
        shape = ForwardShape(num_seqs=pbs, tokens=pbs * q, real_seqs=bs, real_tokens=bs * q,
                             logit_tokens=pbs * q, graph=graph, extend=extend)
        return fm.cost(shape, context_sum + bs * q, self._pairs(q, bs, context_sum))

    # ----------------------------------------------------------------------------------------- iterations
    def decode(self, bs: int, context_sum: float) -> IterationCost:
        """One decode iteration of `bs` running requests whose contexts sum to context_sum tokens."""
        if self.rs.speculative:
            return self._speculative(bs, context_sum)
        pbs, graph = self.padded(bs)
        v = self._uniform(self.target, pbs, bs, 1, graph, context_sum)
        gpu = v.compute_ms + v.comm_ms
        return IterationCost(verify_compute_ms=v.compute_ms, verify_comm_ms=v.comm_ms,
                             cpu_ms=self._cpu(bs, gpu, 0.0), roofline_ms=v.roofline_ms)

    def _speculative(self, bs: int, context_sum: float) -> IterationCost:
        pbs, graph = self.padded(bs)
        verify = self._uniform(self.target, pbs, bs, self.n, graph, context_sum)
        d_compute = d_comm = d_roof = 0.0
        extra_cpu = self._spec_cpu_ms
        if self.draft is not None:
            for _ in range(self.steps - 1):
                f = self._uniform(self.draft, pbs, bs, self.topk, graph, context_sum)
                d_compute += f.compute_ms
                d_comm += f.comm_ms
                d_roof += f.roofline_ms
            f = self._uniform(self.draft, pbs, bs, self._extend_tokens, graph, context_sum, extend=True)
            d_compute += f.compute_ms
            d_comm += f.comm_ms
            d_roof += f.roofline_ms
        else:  # n-gram: trie lookup and host-to-device copy on the CPU, no draft forward
            extra_cpu += self._ngram_ms_per_req * bs
        gpu = d_compute + d_comm + verify.compute_ms + verify.comm_ms
        return IterationCost(draft_compute_ms=d_compute, draft_comm_ms=d_comm,
                             verify_compute_ms=verify.compute_ms, verify_comm_ms=verify.comm_ms,
                             cpu_ms=self._cpu(bs, gpu, extra_cpu), roofline_ms=verify.roofline_ms + d_roof)

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
