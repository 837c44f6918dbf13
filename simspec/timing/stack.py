"""Decoder stacks as one GPU of the tensor-parallel group sees them: bytes, FLOPs and collectives per forward.

Sharding follows SGLang's TP layout: attention heads, MLP columns, every routed expert's intermediate
dimension and the vocabulary are split over the TP ranks; MLA's low-rank A projections (fused_qkv_a_proj)
are replicated, as is the MLA latent KV cache (one latent head cannot be split).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from simspec.presets import DrafterPreset, GqaAttention, KernelRelease, MlaAttention, ModelPreset, kernel_counts
from simspec.scenario import releases
from simspec.scenario.releases import minor_patch

# bytes per parameter and the tensor-core type the weights are multiplied in
WEIGHT_FORMATS: dict[str, tuple[float, str]] = {
    "bf16": (2.0, "bf16"),
    "fp8": (1.0, "fp8"),
    "fp8-block128": (1.0 + 4.0 / (128 * 128), "fp8"),  # one fp32 scale per 128x128 block
    "int4-g32": (0.5 + 2.0 / 32, "bf16"),  # W4A16: one bf16 scale per 32 weights, bf16 math (Marlin)
}
ACTIVATION_BYTES = 2  # bf16 activations, KV cache and collective payloads
DEFAULT_RELEASE = (5, 10)  # SGLang release whose kernels a stack launches unless told (presets/kernels.yaml)


@dataclass(frozen=True, slots=True)
class WeightGroup:
    """Weights read in full by every forward pass, on one GPU."""

    name: str
    bytes_per_gpu: float
    flops_per_token: float  # on one GPU: 2 x parameters used per token
    compute: str
    extend_only: bool = False  # EAGLE-3's fc runs only where target hidden states come in


@dataclass(frozen=True, slots=True)
class Stack:
    name: str
    tp: int
    num_layers: int
    hidden_size: int
    logits_vocab: int
    groups: tuple[WeightGroup, ...]
    num_moe_layers: int
    num_experts: int
    experts_per_token: int
    expert_bytes_per_gpu: float  # one routed expert in one layer
    expert_flops_per_token: float  # all MoE layers, experts_per_token experts
    expert_compute: str
    kv_bytes_per_token_per_gpu: float  # all layers
    attn_flops_per_pair: float  # one query token against one context token, all layers, one GPU
    weight_bytes_per_gpu: float  # stored, all experts included
    total_params: float  # whole model, unsharded
    kernels_per_forward: float = 0.0  # kernels one decode forward launches (presets/kernels.yaml)
    small_kernels_per_forward: float = 0.0  # of which move almost no bytes (norms, rotary, quant, top-k...)
    small_kernels_from_two_rows: float = 0.0  # small copies added once a forward has 2+ query rows (0.4.x)
    # copies of the shared expert among the fused MoE's experts (releases.fused_shared_expert_copies): each token
    # routes to one of them besides its experts_per_token routed ones; 0 = the shared expert is its own MLP group
    shared_expert_copies: int = 0
    # bytes one token moves through the elementwise kernels between the GEMMs, all layers, one GPU
    # (elementwise_bytes_per_token): DRAM traffic once a prefill's activations outgrow the L2
    elementwise_bytes_per_token: float = 0.0

    @property
    def all_reduces_per_forward(self) -> int:
        """Two per decoder layer (attention output, MLP/MoE output) + the vocab-parallel embedding."""
        return 0 if self.tp == 1 else 2 * self.num_layers + 1

    @property
    def graph_nodes_per_forward(self) -> float:
        """Nodes one forward adds to a CUDA graph: its kernels, its all-reduces and, at TP > 1, the logits'
        all-gather."""
        return self.kernels_per_forward + self.all_reduces_per_forward + (1 if self.tp > 1 else 0)


def _fmt(name: str) -> tuple[float, str]:
    return WEIGHT_FORMATS[name]


def _attention(att: MlaAttention | GqaAttention, h: int, tp: int) -> tuple[float, float, float, float]:
    """(replicated params, sharded params per GPU, KV bytes per token per GPU, attention FLOPs per pair)."""
    if isinstance(att, MlaAttention):
        replicated = float(h * att.q_lora_rank + h * (att.kv_lora_rank + att.qk_rope_head_dim))
        sharded = (att.q_lora_rank * att.num_heads * (att.qk_nope_head_dim + att.qk_rope_head_dim)
                   + att.kv_lora_rank * att.num_heads * (att.qk_nope_head_dim + att.v_head_dim)
                   + att.num_heads * att.v_head_dim * h) / tp
        kv = float((att.kv_lora_rank + att.qk_rope_head_dim) * ACTIVATION_BYTES)
        heads = att.num_heads / tp
        # absorbed MLA decode: QK over kv_lora + rope dims, PV over kv_lora dims, per local head
        flops = 2 * heads * (att.kv_lora_rank + att.qk_rope_head_dim) + 2 * heads * att.kv_lora_rank
        return replicated, sharded, kv, flops
    kv_heads_local = max(1.0, att.num_kv_heads / tp)  # KV heads are replicated when tp > num_kv_heads
    sharded = 2 * h * att.num_heads * att.head_dim / tp + 2 * h * att.head_dim * kv_heads_local
    kv = 2 * kv_heads_local * att.head_dim * ACTIVATION_BYTES
    flops = 2 * 2 * (att.num_heads / tp) * att.head_dim
    return 0.0, sharded, kv, flops


def with_kv_cache_dtype(stack: Stack | None, kv_cache_dtype: str) -> Stack | None:
    """`stack` with its KV cache in SGLang's --kv-cache-dtype: the stacks count BF16 entries (ACTIVATION_BYTES); an
    FP8 cache stores one byte an element, so every token's KV is read and kept at half the bytes. (The attention
    core stays at the BF16 peak: whether it computes in FP8 depends on the backend, which simspec does not model.)"""
    if stack is None or not kv_cache_dtype.startswith("fp8"):
        return stack
    return dataclasses.replace(stack, kv_bytes_per_token_per_gpu=stack.kv_bytes_per_token_per_gpu / ACTIVATION_BYTES)


def _fp8(fmt: str) -> bool:
    return fmt in ("fp8", "fp8-block128")


def release_kernels(version: tuple[int, int]) -> KernelRelease | None:
    """The kernel counts SGLang release `version` launches differently (kernels.yaml `releases`), if any."""
    return kernel_counts().releases.get(f"0.{version[0]}.{version[1]}")


def _count_parts(parts: list[tuple[str, int, str | None]], version: tuple[int, int],
                 architecture: str | None = None, mla_rope_apart: bool = False) -> tuple[int, int, int]:
    """(kernels, small kernels, small copies from two query rows) of `parts`, each (model part in kernels.yaml
    per_layer, layers, weight format or None), in SGLang release `version` (kernels.yaml `releases` replaces the
    counts of the parts a release launches differently): one activation-quantisation kernel more per linear of
    FP8 weights (fp8_quant_per_linear). `architecture`: the model's, whose rotary kernel may store K and V itself
    (kernels.yaml fused_kv_store; a draft head passes None). `mla_rope_apart`: the MLA attention backend takes
    q_rope and k_rope apart (releases.mla_takes_rope_apart; kernels.yaml mla_rope_apart)."""
    kc = kernel_counts()
    release = release_kernels(version)
    fused = kc.fused_kv_store
    fused_store = architecture in fused.architectures and version >= minor_patch(fused.since)
    kernels = small = copies = 0
    for part, layers, fmt in parts:
        count = kc.per_layer[part]  # type: ignore[index]
        if fused_store and part == "gqa_attention":
            count = fused.gqa_attention
        elif mla_rope_apart and part == "mla_attention":
            count = kc.mla_rope_apart
        elif release is not None:
            count = release.per_layer.get(part, count)  # type: ignore[call-overload]
            copies += release.small_from_two_rows.get(part, 0) * layers  # type: ignore[call-overload]
        quant = kc.fp8_quant_per_linear.get(part, 0) if fmt is not None and _fp8(fmt) else 0  # type: ignore[call-overload]
        kernels += (count.kernels + quant) * layers
        small += (count.small + quant) * layers
    return kernels, small, copies


def part_kernels(part: str, fmt: str | None, version: tuple[int, int] = DEFAULT_RELEASE) -> tuple[int, int]:
    """(kernels, small kernels) one layer's `part` (kernels.yaml per_layer) launches with weights of format `fmt`
    in SGLang release `version`."""
    kernels, small, _ = _count_parts([(part, 1, fmt)], version)
    return kernels, small


def _kernel_count(model: ModelPreset, num_layers: int, num_dense_layers: int,
                  version: tuple[int, int], mla_rope_apart: bool = False,
                  shared_fused: bool = False) -> tuple[int, int, int]:
    """(kernels, small kernels, small copies from two query rows) of one decode forward of `model`'s stack, from
    presets/kernels.yaml. `shared_fused`: the shared expert runs inside the routed experts' kernel (no MLP of its
    own to launch)."""
    kc = kernel_counts()
    w = model.weights
    moe_layers = num_layers - num_dense_layers
    att = "mla_attention" if isinstance(model.attention, MlaAttention) else "gqa_attention"
    parts: list[tuple[str, int, str | None]] = [("norms", num_layers, None), (att, num_layers, w.attention),
                                                ("dense_mlp", num_dense_layers, w.dense_mlp),
                                                ("moe", moe_layers, w.routed_experts)]
    if model.architecture in kc.qk_norm_architectures:
        parts.append(("qk_norm", num_layers, None))
    if model.num_shared_experts and not shared_fused:
        parts.append(("shared_experts", moe_layers, w.shared_experts))
    kernels, small, copies = _count_parts(parts, version, model.architecture, mla_rope_apart)
    if moe_layers and shared_fused and model.architecture in kc.unfused_router.architectures:
        # the router's top-k runs as a torch.compile'd chain, not one gate kernel (kernels.yaml unfused_router)
        kernels += kc.unfused_router.kernels * moe_layers
        small += kc.unfused_router.small * moe_layers
    return kernels + kc.per_forward.kernels, small + kc.per_forward.small, copies


def elementwise_bytes_per_token(model: ModelPreset, tp: int, shared_apart: bool = False) -> float:
    """Bytes one token moves, on one GPU over all layers, through the kernels between the GEMMs that
    presets/kernels.yaml counts per layer: the two fused_add_rmsnorm (each reads the hidden state and the residual
    and writes both), the rotary embedding (reads and writes q and k), the KV-cache store (reads k and v, writes
    the cache), the attention kernel's q in and output out, Qwen3's q/k norm (reads and writes q and k), a dense
    MLP's silu_and_mul (reads 2 x intermediate, writes 1 x; a shared expert run as its own MLP, `shared_apart`,
    likewise), and one per_token_group_quant_fp8 before each linear whose weights are FP8 (reads its BF16 input,
    writes it in FP8). MLA's: its two latent layernorms, the rotary
    parts, the latent KV store and the attention's q in and output out. The routed experts' own kernels
    (silu_and_mul, moe_sum_reduce and their activations) are ForwardModel.moe_kernels'; the GEMMs' own inputs and
    outputs are left in their rooflines. Activations are BF16 (ACTIVATION_BYTES). A decode or verify step's rows
    (a few hundred at most) stay in the L2 between these kernels; a prefill chunk of thousands of tokens does not
    (8,192 tokens of a 5,120-wide hidden state are 84 MB against an H100's 50 MB of L2), so ForwardModel charges
    these bytes to prefills only. Left out: that a rotary kernel which stores K and V itself (kernels.yaml
    fused_kv_store) spares the store's reads, an FP8 KV cache's halved writes, and MLA's prefill path (SGLang
    prefills MLA as multi-head attention over decompressed K and V: its copies are the GEMMs'); EAGLE heads, one
    layer each, are not charged (eagle_stack)."""
    a, h, w = ACTIVATION_BYTES, model.hidden_size, model.weights
    quant_bytes = 1 + ACTIVATION_BYTES  # per input element of an FP8 linear: BF16 read, FP8 written
    att = model.attention
    per_layer = 2 * 4 * h * a  # input_layernorm and post_attention_layernorm, fused with the residual add
    if isinstance(att, MlaAttention):
        heads = att.num_heads / tp
        q = heads * (att.qk_nope_head_dim + att.qk_rope_head_dim)
        per_layer += 2 * (att.q_lora_rank + att.kv_lora_rank) * a  # q_a_layernorm, kv_a_layernorm
        per_layer += 2 * (heads + 1) * att.qk_rope_head_dim * a  # rotary over q_pe and k_pe
        per_layer += 2 * (att.kv_lora_rank + att.qk_rope_head_dim) * a  # the latent KV store
        per_layer += (q + heads * att.v_head_dim) * a  # attention: q in, output out
        linear_inputs = h + att.q_lora_rank + heads * att.v_head_dim  # fused_qkv_a_proj, q_b_proj, o_proj
    else:
        q = att.num_heads * att.head_dim / tp
        kv = max(1.0, att.num_kv_heads / tp) * att.head_dim
        per_layer += 2 * (q + kv) * a  # rotary
        per_layer += 4 * kv * a  # KV store: k and v read, the cache written
        per_layer += 2 * q * a  # attention: q in, output out
        if model.architecture in kernel_counts().qk_norm_architectures:
            per_layer += 2 * (q + kv) * a
        linear_inputs = h + q  # qkv_proj, o_proj
    total = per_layer * model.num_layers
    if _fp8(w.attention):
        total += linear_inputs * quant_bytes * model.num_layers
    inter = model.dense_intermediate_size / tp
    if model.num_dense_layers:
        dense = 3 * inter * a  # silu_and_mul
        if _fp8(w.dense_mlp):
            dense += (h + inter) * quant_bytes  # gate_up_proj, down_proj
        total += dense * model.num_dense_layers
    if shared_apart and model.num_moe_layers:
        shared = model.num_shared_experts * model.moe_intermediate_size / tp
        apart = 3 * shared * a
        if _fp8(w.shared_experts):
            apart += (h + shared) * quant_bytes
        total += apart * model.num_moe_layers
    return total


def _attention_params(att: MlaAttention | GqaAttention, h: int) -> float:
    rep, shard, _, _ = _attention(att, h, 1)
    return rep + shard


def target_stack(model: ModelPreset, tp: int, *, name: str | None = None,
                 version: tuple[int, int] = DEFAULT_RELEASE, mla_rope_apart: bool = False,
                 shared_expert_copies: int = 0) -> Stack:
    """`model` on one GPU of a tp group; `version` is the SGLang release whose kernels it launches, `mla_rope_apart`
    whether its MLA attention backend takes the rotary parts apart (releases.mla_takes_rope_apart),
    `shared_expert_copies` how many copies of the shared expert the routed experts' kernel holds in its place
    (releases.fused_shared_expert_copies; 0: its own MLP)."""
    h = model.hidden_size
    w = model.weights
    rep, shard, kv, aflops = _attention(model.attention, h, tp)
    groups: list[WeightGroup] = []
    att_b, att_c = _fmt(w.attention)
    L = model.num_layers
    groups.append(WeightGroup("attention", (rep + shard) * L * att_b, 2 * (rep + shard) * L, att_c))
    if model.num_dense_layers:
        b, c = _fmt(w.dense_mlp)
        p = 3 * h * model.dense_intermediate_size / tp * model.num_dense_layers
        groups.append(WeightGroup("dense_mlp", p * b, 2 * p, c))
    moe_layers = model.num_moe_layers
    if moe_layers and model.num_shared_experts and not shared_expert_copies:
        b, c = _fmt(w.shared_experts)
        p = model.num_shared_experts * 3 * h * model.moe_intermediate_size / tp * moe_layers
        groups.append(WeightGroup("shared_experts", p * b, 2 * p, c))
    b, c = _fmt(w.lm_head)
    head = model.vocab_size * h / tp
    groups.append(WeightGroup("lm_head", head * b, 2 * head, c))

    eb, ec = _fmt(w.routed_experts)
    expert_params = 3 * h * model.moe_intermediate_size / tp if moe_layers else 0.0
    stored = sum(g.bytes_per_gpu for g in groups)
    stored += (model.num_routed_experts + shared_expert_copies) * moe_layers * expert_params * eb
    if not model.tie_word_embeddings:
        stored += model.vocab_size * h / tp * _fmt(w.embedding)[0]

    total = (_attention_params(model.attention, h) * L
             + 3 * h * model.dense_intermediate_size * model.num_dense_layers
             + (model.num_routed_experts + model.num_shared_experts) * 3 * h * model.moe_intermediate_size
             * moe_layers
             + model.vocab_size * h * (1 if model.tie_word_embeddings else 2))
    kernels, small, copies = _kernel_count(model, L, model.num_dense_layers, version, mla_rope_apart,
                                           shared_fused=shared_expert_copies > 0)
    return Stack(
        name=name or model.display_name, tp=tp, num_layers=L, hidden_size=h, logits_vocab=model.vocab_size,
        groups=tuple(groups), num_moe_layers=moe_layers, num_experts=model.num_routed_experts,
        experts_per_token=model.experts_per_token, expert_bytes_per_gpu=expert_params * eb,
        expert_flops_per_token=2 * expert_params * model.experts_per_token * moe_layers, expert_compute=ec,
        kv_bytes_per_token_per_gpu=kv * L, attn_flops_per_pair=aflops * L, weight_bytes_per_gpu=stored,
        total_params=total, kernels_per_forward=kernels, small_kernels_per_forward=small,
        small_kernels_from_two_rows=copies, shared_expert_copies=shared_expert_copies if moe_layers else 0,
        elementwise_bytes_per_token=elementwise_bytes_per_token(
            model, tp, shared_apart=bool(model.num_shared_experts) and not shared_expert_copies),
    )


def eagle_stack(d: DrafterPreset, tp: int, version: tuple[int, int] = DEFAULT_RELEASE) -> Stack:
    """One Llama-style decoder layer + fc over concatenated target hidden states + draft LM head."""
    h = d.hidden_size
    b, c = _fmt(d.weights)
    att = GqaAttention(kind="gqa", num_heads=d.num_heads, num_kv_heads=d.num_kv_heads, head_dim=d.head_dim)
    _, shard, kv, aflops = _attention(att, h, tp)
    _, shard1, _, _ = _attention(att, h, 1)
    if d.algorithm == "eagle3":
        # EAGLE-3's q/k/v projections read [token embedding; hidden state], 2h wide (o_proj stays h wide)
        shard += d.num_heads * d.head_dim * h / tp + 2 * d.head_dim * h * max(1.0, d.num_kv_heads / tp)
        shard1 += (d.num_heads + 2 * d.num_kv_heads) * d.head_dim * h
    mlp = 3 * h * d.intermediate_size / tp
    head = d.draft_vocab_size * h / tp
    fc = d.fc_input_multiplier * h * h  # a plain (replicated) nn.Linear in SGLang's EAGLE heads
    eagle3 = d.algorithm == "eagle3"
    groups = (
        WeightGroup("attention", shard * b, 2 * shard, c),
        WeightGroup("dense_mlp", mlp * b, 2 * mlp, c),
        WeightGroup("lm_head", head * b, 2 * head, c),
        # EAGLE-3 applies fc only where 3h-wide target hidden states come in (llama_eagle3.py: the extend);
        # EAGLE-1/2 apply fc(cat(embedding, hidden)) on every forward (llama_eagle.py)
        WeightGroup("fc", fc * b, 2 * fc, c, extend_only=eagle3),
    )
    stored = sum(g.bytes_per_gpu for g in groups)
    if not eagle3:  # EAGLE-1/2 heads share the target's LM head (eagle_worker set_embed_and_head)
        stored -= head * b
    total = shard1 + 3 * h * d.intermediate_size + d.draft_vocab_size * h + fc
    # one Llama decoder layer, the head, and what llama_eagle.py / llama_eagle3.py add (kernels.yaml heads)
    kc = kernel_counts()
    kernels, small, copies = _count_parts([("norms", 1, None), ("gqa_attention", 1, d.weights),
                                           ("dense_mlp", 1, d.weights)], version)
    for extra in (kc.per_forward, kc.heads[d.algorithm]):
        kernels += extra.kernels
        small += extra.small
    return Stack(
        name=d.display_name, tp=tp, num_layers=1, hidden_size=h, logits_vocab=d.draft_vocab_size,
        groups=groups, num_moe_layers=0, num_experts=0, experts_per_token=0, expert_bytes_per_gpu=0.0,
        expert_flops_per_token=0.0, expert_compute=c, kv_bytes_per_token_per_gpu=kv,
        attn_flops_per_pair=aflops, weight_bytes_per_gpu=stored, total_params=total,
        kernels_per_forward=kernels, small_kernels_per_forward=small, small_kernels_from_two_rows=copies,
    )


def mtp_stack(model: ModelPreset, tp: int, version: tuple[int, int] = DEFAULT_RELEASE,
              mla_rope_apart: bool = False, shared_expert_copies: int = 0) -> Stack:
    """A NextN/MTP head: one decoder layer of the target's own kind (MoE if the target is), eh_proj (2h -> h,
    replicated) and the target's full-vocabulary LM head, shared with the target (DeepSeek-V3 style)."""
    one = model.model_copy(update={"num_layers": 1, "num_dense_layers": 0 if model.num_moe_layers else 1,
                                   "tie_word_embeddings": True})
    base = target_stack(one, tp, name=f"MTP head of {model.display_name}", version=version,
                        mla_rope_apart=mla_rope_apart, shared_expert_copies=shared_expert_copies)
    b, c = _fmt(model.weights.attention)
    eh = 2 * model.hidden_size * model.hidden_size
    groups = base.groups + (WeightGroup("eh_proj", eh * b, 2 * eh, c),)
    # embedding and LM head are shared with the target: not stored again
    shared_head = model.vocab_size * model.hidden_size / tp * _fmt(model.weights.lm_head)[0]
    stored = base.weight_bytes_per_gpu - shared_head + eh * b
    head = kernel_counts().heads["mtp"]
    return Stack(
        name=base.name, tp=tp, num_layers=1, hidden_size=model.hidden_size, logits_vocab=model.vocab_size,
        groups=groups, num_moe_layers=base.num_moe_layers, num_experts=base.num_experts,
        experts_per_token=base.experts_per_token, expert_bytes_per_gpu=base.expert_bytes_per_gpu,
        expert_flops_per_token=base.expert_flops_per_token, expert_compute=base.expert_compute,
        kv_bytes_per_token_per_gpu=base.kv_bytes_per_token_per_gpu, attn_flops_per_pair=base.attn_flops_per_pair,
        weight_bytes_per_gpu=stored, total_params=base.total_params - model.vocab_size * model.hidden_size + eh,
        # + eh_proj's GEMM, the enorm / hnorm of the embedding and the hidden state, their concat (kernels.yaml)
        kernels_per_forward=base.kernels_per_forward + head.kernels,
        small_kernels_per_forward=base.small_kernels_per_forward + head.small,
        small_kernels_from_two_rows=base.small_kernels_from_two_rows, shared_expert_copies=base.shared_expert_copies,
        elementwise_bytes_per_token=base.elementwise_bytes_per_token,
    )


def draft_layers_model(algorithm: str, model: ModelPreset, draft_model: ModelPreset | None) -> ModelPreset | None:
    """The model preset whose layers (and experts) the draft stack is built from: the target's for MTP (its NextN
    layer), the draft model's for a standalone drafter; None for an EAGLE head (its own drafter preset) and
    for n-gram (no draft forward)."""
    if algorithm == "mtp":
        return model
    if algorithm == "standalone":
        return draft_model
    return None


def draft_stack(algorithm: str, model: ModelPreset, drafter: DrafterPreset | None,
                draft_model: ModelPreset | None, tp: int, version: tuple[int, int] = DEFAULT_RELEASE,
                mla_rope_apart: bool = False, shared_expert_copies: int = 0) -> Stack | None:
    if algorithm in ("eagle", "eagle3") and drafter is not None:
        return eagle_stack(drafter, tp, version)
    layers = draft_layers_model(algorithm, model, draft_model)
    if layers is None:
        return None
    if algorithm == "mtp":
        return mtp_stack(layers, tp, version, mla_rope_apart, shared_expert_copies)
    return target_stack(layers, tp, version=version, mla_rope_apart=mla_rope_apart,
                        shared_expert_copies=shared_expert_copies)


def served_stacks(algorithm: str, model: ModelPreset, drafter: DrafterPreset | None, draft_model: ModelPreset | None,
                  tp: int, release: tuple[int, int, int], gpu_display_name: str, kv_cache_dtype: str,
                  mla_rope_apart: bool = False) -> tuple[Stack, Stack | None]:
    """(target, draft) stacks as an SGLang release serves them on this GPU: each layer's experts with the shared
    expert where the release fuses it (releases.shared_expert_copies), the KV cache in `kv_cache_dtype`; the kernels
    of `release` and its MLA backend's rope handling (`mla_rope_apart`)."""
    version = release[:2]
    target = target_stack(model, tp, version=version, mla_rope_apart=mla_rope_apart,
                          shared_expert_copies=releases.shared_expert_copies(release, gpu_display_name, model, tp))
    layers = draft_layers_model(algorithm, model, draft_model)
    dshared = (releases.shared_expert_copies(release, gpu_display_name, layers, tp, draft_of=model)
               if layers is not None else 0)
    draft = draft_stack(algorithm, model, drafter, draft_model, tp, version, mla_rope_apart, dshared)
    served = with_kv_cache_dtype(target, kv_cache_dtype)
    assert served is not None
    return served, with_kv_cache_dtype(draft, kv_cache_dtype)
