"""THE boundary between the engine and the time model: one engine iteration's shape -> its cost breakdown.

The SimPy engine never computes a duration; it asks IterationModel. What one iteration contains follows
SGLang's workers (shared/reference/sglang.md, "One EAGLE / EAGLE3 / NEXTN iteration"):
  EAGLE, EAGLE-3, MTP (NEXTN), standalone: num_steps - 1 draft forwards over bs * topk tokens, the draft
    extend over the accepted tokens (v1: padded to num_steps + 1 per request; v2: num_draft_tokens), and one
    target verify over bs * num_draft_tokens tokens. Each draft forward pays its own TP collectives.
  n-gram: a CPU trie lookup per request and a verify over bs * num_draft_tokens tokens (always padded to
    num_draft_tokens, whatever matched).
  none: one target decode over bs tokens.
CPU scheduling work is exposed unless overlap scheduling hides it behind the GPU; so is the host time of each
CUDA graph's launch, which grows with the graph's nodes when the graph has branches
(releases.decode_graph_branches).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from simspec import presets
from simspec.scenario import releases
from simspec.scenario.loader import ResolvedScenario
from simspec.timing.collectives import Collectives
from simspec.timing.forward import Efficiencies, ForwardCost, ForwardModel, ForwardShape, moe_grid, moe_small_tiles
from simspec.timing.stack import draft_layers_model, served_stacks


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


class PlannedForward(NamedTuple):
    """One kind of forward in a decode iteration at a fixed batch size, as a function of the context."""

    is_draft: bool
    repeats: int  # forwards of this kind per iteration
    tokens_per_request: int
    requests: int
    compute_ms: float  # one forward, excluding attention over the KV cache and the launch overhead
    comm_ms: float  # one forward
    roofline_ms: float  # one forward, excluding the KV cache
    kv_ms_per_token: float
    attention_ms_per_pair: float
    roofline_ms_per_token: float
    launch_ms: float  # GPU time around the launch, all `repeats` forwards together
    logit_tokens_per_request: int = 1  # tokens whose logits are computed and all-gathered
    launch_host_ms: float = 0.0  # host time of the CUDA graph's launch (cudaGraphLaunch); 0 for eager forwards
    extend: bool = False  # the draft's extend over the verified tokens


def captured_batch_sizes(max_bs: int, speculative: bool, release: tuple[int, int, int] = (5, 10, 0)) -> list[int]:
    """SGLang's CUDA-graph batch sizes (server_args._generate_cuda_graph_batch_sizes, 0.5.10), always including
    max_bs. Speculative: 1-8, 10-32 step 2, 40-64 step 4 (40-60 until 0.5.4.post2:
    releases.SPEC_GRAPH_64_FROM), 72-256 step 8, then step 16. Otherwise: 1, 2, 4, 8, 12, 16-256 step 8, 272-496
    step 16, then step 32 from 512."""
    if speculative:
        last = 65 if release >= releases.SPEC_GRAPH_64_FROM else 64
        sizes = list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, last, 4)) + list(range(72, 257, 8))
        sizes += list(range(272, max_bs + 1, 16))
    else:
        sizes = [1, 2, 4, 8, 12] + list(range(16, 257, 8)) + list(range(272, 512, 16))
        sizes += list(range(512, max_bs + 1, 32))
    sizes = [s for s in sizes if s <= max_bs]
    return sizes if max_bs in sizes else sorted(sizes + [max_bs])


def early_captured_batch_sizes(version: tuple[int, int], speculative: bool, max_bs: int, request_pool: int,
                               gpu_mib: float) -> list[int]:
    """The CUDA-graph batch sizes of 0.4.4 / 0.4.6 (cuda_graph_runner.get_batch_sizes_to_capture), at most max_bs
    and the request pool (max_running_requests + 1 slots; its last two sizes are added when the list goes past
    it).
    - 0.4.4: 1, 2, 4, then 8-160 step 8 without speculation; with EAGLE only 1-32, and EAGLE turns CUDA-graph
      padding off, so every other batch size runs eagerly (every size up to 32 is in the list).
    - 0.4.6: 1, 2, 4, 8, then 16-160 step 8 without speculation; with it 1-8, 10-32 step 2, 40-152 step 16,
      padded as usual; both lists gain 160-256 step 8 on GPUs above 81,920 MiB."""
    if version == (4, 4):
        sizes = list(range(1, 33)) if speculative else [1, 2, 4] + list(range(8, 161, 8))
    else:
        sizes = (list(range(1, 9)) + list(range(10, 33, 2)) + list(range(40, 161, 16)) if speculative
                 else [1, 2, 4, 8] + list(range(16, 161, 8)))
        if gpu_mib > 81920:
            sizes += list(range(160, 257, 8))
    if max(sizes) > request_pool:
        sizes += [request_pool - 1, request_pool]
    return [s for s in sorted(set(sizes)) if s <= request_pool and s <= max_bs]


class IterationModel:
    def __init__(self, rs: ResolvedScenario):
        self.rs = rs
        c = rs.coefficient
        tp = rs.scenario.server.tp
        self.eff = Efficiencies.from_coefficients(c)
        self.collectives = Collectives(rs.all_reduce, tp, rs.interconnect.link)
        srv = rs.scenario.server
        version = srv.version_minor_patch  # the release's kernels, CUDA-graph sizes and eager draft extend
        release = srv.release
        early = releases.is_early(version)
        gpu = rs.gpu.display_name
        mla_rope_apart = releases.mla_takes_rope_apart(version, gpu)
        model = rs.model
        target_triton = releases.target_moe_runs_triton(release, gpu, model.architecture,
                                                        model.weights.routed_experts)
        tstack, dstack = served_stacks(rs.algorithm, model, rs.drafter, rs.draft_model, tp, release, gpu,
                                       srv.kv_cache_dtype, mla_rope_apart)
        tgrid = moe_grid(rs.scenario.hardware.gpu, model, tstack, release) if target_triton else None
        self.target = ForwardModel(tstack, rs.gpu, self.collectives, self.eff,
                                   moe_small_tiles(rs.gpu, tstack, tgrid, version), tgrid)
        # an EAGLE head has no experts (moe_grid reads none from its stack): the target stands in
        layers = draft_layers_model(rs.algorithm, model, rs.draft_model)
        # a graph's launch costs the host per node when the graph branches; an EAGLE head is Llama-shaped
        self.target_graph_branches = releases.decode_graph_branches(model.architecture, version, tp)
        self.draft_graph_branches = releases.decode_graph_branches(layers.architecture if layers else None, version, tp)
        draft_triton = releases.draft_moe_runs_triton(release, target_triton)
        layers = layers if layers is not None else model
        dgrid = (moe_grid(rs.scenario.hardware.gpu, layers, dstack, release)
                 if dstack and draft_triton else None)
        self.draft = (ForwardModel(dstack, rs.gpu, self.collectives, self._draft_efficiencies(),
                                   moe_small_tiles(rs.gpu, dstack, dgrid, version), dgrid)
                      if dstack else None)
        if not srv.cuda_graph:
            self._graph_sizes: list[int] = []
        elif early:
            self._graph_sizes = early_captured_batch_sizes(version, rs.speculative, rs.cuda_graph_max_bs,
                                                           rs.max_running_requests + 1, rs.gpu.memory_mib)
        else:
            self._graph_sizes = captured_batch_sizes(rs.cuda_graph_max_bs, rs.speculative, release)
        # 0.4.x runs the draft's extend after a verify eagerly (eagle_worker.forward_draft_extend_after_decode calls
        # the draft ModelRunner, which captured no graph); so do v2 workers before 0.5.5.post3 (EAGLEWorkerV2
        # calls the draft model's forward)
        self._eager_draft_extend = early or (rs.spec_v2 and releases.v2_draft_extend_eager(release))
        self._v2_wait = (releases.v2_verify_wait(release, gpu, model.attention.kind == "mla") if rs.spec_v2
                         else None)
        self._launch_ms = self.eff.forward_overhead_ms
        self._graph_launch_ms = c("graph_launch_us") / 1e3
        self._graph_node_ms = c("graph_launch_per_node_us") / 1e3
        self._graph_gpu_ms = c("graph_replay_gpu_us") / 1e3
        self._sched_ms = c("scheduler_cpu_ms")
        # at TP > 1 a loop turn that takes in requests also broadcasts them to the other ranks (gloo): every turn,
        # or with --scheduler-recv-interval N one decode turn in N (and the turn after a prefill: SGLang's
        # SchedulerRecvSkipper weighs a decode or verify turn 1, a prefill 1000)
        self._broadcast_ms = c("tp_request_broadcast_us") / 1e3 if tp > 1 else 0.0
        self._recv_interval = srv.scheduler_recv_interval
        self._sched_per_req_ms = c("scheduler_cpu_per_request_ms")
        self._spec_cpu_ms = c("spec_cpu_ms")
        self._spec_tree_cpu_ms = c("spec_tree_cpu_ms") if rs.topk > 1 else 0.0
        self._spec_cpu_per_token_ms = c("spec_cpu_per_verified_token_us") / 1e3
        self._ngram_ms_per_req = c("ngram_cpu_per_request_us") / 1e3
        self._host_per_output_token_ms = c("host_per_output_token_us") / 1e3
        self._gpu_per_req_ms = c("decode_per_request_us") / 1e3
        self.steps, self.topk, self.n = rs.num_steps, rs.topk, rs.num_draft_tokens
        self._extend_tokens = self.n if rs.spec_v2 else self.steps + 1
        self._plans: dict[int, tuple[PlannedForward, ...]] = {}

    # ----------------------------------------------------------------------------------------- helpers
    def _draft_efficiencies(self) -> Efficiencies:
        """A standalone draft model routes its own experts: its own measured locality and popularity spread, else
        the defaults (the target's figures, from its preset or a profile of the box serving it, say nothing about
        the drafter's)."""
        draft_model = self.rs.draft_model
        if draft_model is None or not draft_model.num_moe_layers:
            return self.eff
        defaults = presets.default_coefficients()
        measured = draft_model.measured_routing()
        value = {name: measured[name].value if name in measured else defaults[name].value
                 for name in ("moe_routing_locality", "moe_routing_spread")}
        return replace(self.eff, routing_locality=value["moe_routing_locality"],
                       routing_spread=value["moe_routing_spread"])

    def padded(self, bs: int) -> tuple[int, bool]:
        """Batch size the kernels run at, and whether a CUDA graph is replayed."""
        sizes = self._graph_sizes
        if sizes and bs <= sizes[-1]:
            return sizes[bisect_left(sizes, bs)], True
        return bs, False

    def _sched(self, bs: int, decode: bool = True) -> float:
        """The scheduler's host work per iteration at batch size bs (a decode turn's share of the receive's
        broadcast, or a whole one after a prefill)."""
        broadcast = self._broadcast_ms / self._recv_interval if decode else self._broadcast_ms
        return self._sched_ms + broadcast + self._sched_per_req_ms * bs

    def _cpu(self, bs: int, gpu_ms: float, extra_ms: float, decode: bool = True) -> float:
        cpu = self._sched(bs, decode) + extra_ms
        return max(0.0, cpu - gpu_ms) if self.rs.overlap else cpu

    def plan(self, bs: int) -> tuple[PlannedForward, ...]:
        """The forwards of one decode iteration at batch size bs, cached per bs. SGLang replays the
        num_steps - 1 draft forwards as ONE CUDA graph (EAGLEDraftCudaGraphRunner), the draft extend and the
        verify as one graph each, so a graph pays one launch however many forwards it holds: graph_launch_us of
        host time, plus graph_launch_per_node_us for each of its nodes when it branches, and graph_replay_gpu_us
        of GPU time around it. An eager forward pays forward_overhead_ms of GPU time each."""
        plan = self._plans.get(bs)
        if plan is not None:
            return plan
        pbs, graph = self.padded(bs)
        # model, is_draft, repeats, tokens per request, logits per request, extend
        forwards: list[tuple[ForwardModel, bool, int, int, int, bool]] = []
        if not self.rs.speculative:
            forwards.append((self.target, False, 1, 1, 1, False))
        else:
            if self.draft is not None:
                if self.steps > 1:
                    forwards.append((self.draft, True, self.steps - 1, self.topk, self.topk, False))
                # v1 keeps only each request's last position for the extend's logits; v2 keeps them all
                q = self._extend_tokens
                forwards.append((self.draft, True, 1, q, q if self.rs.spec_v2 else 1, True))
            forwards.append((self.target, False, 1, self.n, self.n, False))
        rows = []
        measured_draft = self.rs.profile.draft_forward_ms if self.rs.profile is not None else None
        for fm, is_draft, repeats, q, logits, extend in forwards:
            in_graph = graph and not (extend and self._eager_draft_extend)
            fbs = pbs if in_graph else bs
            shape = ForwardShape(num_seqs=fbs, tokens=fbs * q, real_seqs=bs, real_tokens=bs * q,
                                 logit_tokens=fbs * logits, graph=in_graph, extend=extend)
            compute, comm, roof, kv_rate, attn_rate, roof_kv_rate = fm.fixed_and_rates(shape)
            launch, launch_host = self._launch_ms * repeats, 0.0
            if in_graph:
                branches = self.draft_graph_branches if is_draft else self.target_graph_branches
                nodes = repeats * fm.stack.graph_nodes_per_forward
                launch = self._graph_gpu_ms
                launch_host = self._graph_launch_ms + (self._graph_node_ms * nodes if branches else 0.0)
            if is_draft and not extend and measured_draft is not None:
                # a profiled draft step: its measured time replaces compute, communication and launch alike
                compute, comm, kv_rate, attn_rate, launch = measured_draft.value, 0.0, 0.0, 0.0, 0.0
                launch_host = 0.0
                roof, roof_kv_rate = min(roof, compute), 0.0  # keep the roofline a bound on the modelled time
            rows.append(PlannedForward(is_draft, repeats, q, bs, compute, comm, roof, kv_rate, attn_rate,
                                       roof_kv_rate, launch, logits, launch_host, extend))
        plan = tuple(rows)
        self._plans[bs] = plan
        return plan

    # ----------------------------------------------------------------------------------------- iterations
    def decode(self, bs: int, context_sum: float, committed_tokens: float = 0.0) -> IterationCost:
        """One decode iteration of `bs` running requests whose contexts sum to context_sum tokens: a plain
        decode forward, or draft -> verify for a speculative algorithm. committed_tokens: the tokens it commits
        (bs without speculation; accepted drafts plus bonus tokens with it), charged host_per_output_token_us
        each on the critical path; 0 (the default) leaves that term out."""
        d_compute = d_comm = v_compute = v_comm = roof = launch_host = 0.0
        extend_gpu = draft_launch_host = verify_launch_host = 0.0
        for (is_draft, repeats, q, seqs, compute, comm, froof, kv_rate, attn_rate, roof_kv_rate,
             launch, _, graph_launch, extend) in self.plan(bs):
            launch_host += graph_launch
            kv_tokens = context_sum + seqs * q
            pairs = q * context_sum + seqs * q * (q + 1) / 2  # causal: each new token sees the ones before
            compute += kv_tokens * kv_rate if kv_tokens * kv_rate > pairs * attn_rate else pairs * attn_rate
            froof += kv_tokens * roof_kv_rate
            if is_draft:
                d_compute += repeats * compute + launch
                d_comm += repeats * comm
                if extend:
                    extend_gpu = compute + launch + comm
                else:
                    draft_launch_host = graph_launch
            else:
                v_compute += compute + launch
                v_comm += comm
                verify_launch_host = graph_launch
            roof += repeats * froof
        v_compute += self._gpu_per_req_ms * bs
        extra = 0.0
        if self.rs.speculative:
            extra = self._spec_cpu_ms + self._spec_tree_cpu_ms
            extra += self._ngram_ms_per_req * bs if self.draft is None else 0.0
            extra += self._spec_cpu_per_token_ms * bs * self.n
        if self._v2_wait is None:
            cpu = self._cpu(bs, d_compute + d_comm + v_compute + v_comm, extra + launch_host)
        else:
            draft_gpu = d_compute + d_comm - extend_gpu
            cpu = self._v2_exposed(bs, extend_gpu, draft_gpu, v_compute + v_comm, extra + launch_host,
                                   draft_launch_host, verify_launch_host)
        cpu += self._host_per_output_token_ms * committed_tokens  # serial: overlap scheduling does not hide it
        return IterationCost(d_compute, d_comm, v_compute, v_comm, cpu, roof)

    def _v2_exposed(self, bs: int, extend_gpu: float, draft_gpu: float, verify_gpu: float, extra_host: float,
                    draft_launch: float, verify_launch: float) -> float:
        """Host time a v2 iteration exposes when its host work waits for the last verify (releases.v2_verify_wait).
        From the verify's end the GPU has only the draft extend left (extend_gpu); the host builds the next batch
        (when the wait precedes it), prepares the draft (spec_cpu_ms) and launches its graph; the draft runs
        (draft_gpu) once both are done; the verify starts when the draft has run and its own launch has returned.
        The rest of the host work (the results' processing, the extend's launch, the batch building when the wait
        follows it) overlaps the verify. The iteration is that critical path or the host's whole loop, whichever is
        longer; what it adds to the GPU's time is exposed."""
        sched = self._sched(bs)
        before_draft = self._spec_cpu_ms + draft_launch + (sched if self._v2_wait == "schedule" else 0.0)
        draft_start = max(before_draft, extend_gpu)
        verify_start = max(draft_start + draft_gpu, before_draft + verify_launch)
        cycle = max(verify_start + verify_gpu, sched + extra_host)
        return cycle - (extend_gpu + draft_gpu + verify_gpu)

    def prefill(self, prompt_tokens: list[int], cached: Sequence[float] | None = None) -> IterationCost:
        """A prefill (extend) iteration over new prompt tokens, run eagerly. EAGLE-family drafters prefill too.
        cached: per prompt, the KV tokens it attends to beyond its own (earlier chunks, a prefix served from the
        radix cache); none by default."""
        seqs = len(prompt_tokens)
        tokens = int(sum(prompt_tokens))
        cached = [0.0] * seqs if cached is None else cached
        pairs = sum(q * (q + 1) / 2 + q * c for q, c in zip(prompt_tokens, cached, strict=True))
        cached_context = float(sum(cached))
        shape = ForwardShape(num_seqs=seqs, tokens=tokens, real_seqs=seqs, real_tokens=tokens,
                             logit_tokens=seqs, graph=False, prefill=True)
        v = self.target.cost(shape, cached_context + tokens, pairs)
        d = ForwardCost(0.0, 0.0, 0.0)
        if self.draft is not None:
            d = self.draft.cost(ForwardShape(num_seqs=seqs, tokens=tokens, real_seqs=seqs, real_tokens=tokens,
                                             logit_tokens=seqs, graph=False, extend=True, prefill=True),
                                cached_context + tokens, pairs)
        gpu = v.compute_ms + v.comm_ms + d.compute_ms + d.comm_ms
        return IterationCost(draft_compute_ms=d.compute_ms, draft_comm_ms=d.comm_ms,
                             verify_compute_ms=v.compute_ms, verify_comm_ms=v.comm_ms,
                             cpu_ms=self._cpu(seqs, gpu, 0.0, decode=False), roofline_ms=v.roofline_ms + d.roofline_ms)
