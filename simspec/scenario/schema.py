"""The scenario schema (pydantic v2). Unknown keys are errors; units are in field names or docstrings.

Checks that need presets (does the model fit, is tp <= num_gpus, is the accept length reachable with this
tree) live in loader.py, which knows the presets; this module only checks what a field alone can say.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, model_validator

from simspec.scenario.releases import MODELLED_TEXT, VERSION_PATTERN, minor_patch, release_key

Algorithm = Literal["none", "eagle", "eagle3", "mtp", "ngram", "standalone"]
EAGLE_FAMILY = ("eagle", "eagle3", "mtp", "standalone")


ACCEPTANCE_FORMS = ("accept_length", "accept_length_by_context", "chain_rates", "cumulative_rates", "positional_rates",
                    "histogram", "ngram_replay")

MAX_TOKENS = 10_000_000  # longest prompt or output a length distribution may describe
MAX_CONCURRENCY = 100_000  # most clients a closed loop may have
MAX_REQUESTS = 10_000_000  # most requests a workload may have
MAX_GPUS = 64  # most GPUs (and the deepest tensor parallelism) a box may have
MAX_NUM_STEPS = 64  # deepest speculative.num_steps


class StrictModel(BaseModel):
    """Base of every user-facing file schema: unknown keys are errors, NaN and infinity are not numbers."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)



def _version_form(value: Any) -> Any:
    """An SGLang version's form, with the modelled releases spelled out (pydantic's own report gives neither)."""
    if isinstance(value, str) and re.match(VERSION_PATTERN, value):
        return value
    quote = (" (YAML reads an unquoted version with one dot as a number: quote it, e.g. '0.5.10')"
             if isinstance(value, int | float) and not isinstance(value, bool) else "")
    raise ValueError(f"{value!r} is not an SGLang version 0.M.P[.postN]{quote}; allowed: {MODELLED_TEXT}")


SglangVersion = Annotated[str, BeforeValidator(_version_form)]


def _file_path(value: Any) -> Any:
    """A path a scenario names (profile, corpus, tokenizer): an empty one would resolve to the scenario's folder."""
    if isinstance(value, str) and not value.strip():
        raise ValueError(f"{value!r} must be a path to a file (relative to the scenario file)")
    return value


FilePath = Annotated[str, BeforeValidator(_file_path)]


def _on_off(value: Any) -> Any:
    """YAML 1.1 reads an unquoted on/off (and yes/no, true/false) as a boolean: the intent is unambiguous."""
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else value


class Hardware(StrictModel):
    gpu: str = Field(description="GPU preset name (simspec presets)")
    num_gpus: StrictInt = Field(ge=1, le=MAX_GPUS)
    interconnect: str = Field(description="interconnect preset: link and collective implementation")


class Server(StrictModel):
    """SGLang server settings that change the time of an iteration."""

    tp: StrictInt = Field(ge=1, le=MAX_GPUS, description="tensor-parallel degree")
    sglang_version: SglangVersion = Field(default="0.5.10", pattern=VERSION_PATTERN,
                                description="modelled: " + MODELLED_TEXT + " (simspec/scenario/releases.py)")
    cuda_graph: StrictBool = True
    cuda_graph_max_bs: StrictInt | None = Field(default=None, ge=1, le=4096,
                                                description="None = SGLang's default for the GPU memory and tp")
    max_running_requests: StrictInt | None = Field(default=None, ge=1)
    overlap_schedule: Annotated[Literal["auto", "on", "off"], BeforeValidator(_on_off)] = "auto"
    spec_v2: StrictBool | None = Field(default=None, description="SGLANG_ENABLE_SPEC_V2; None = version default")
    mem_fraction_static: StrictFloat | None = Field(default=None, gt=0.0, le=1.0,
                                              description="None = SGLang's default for this GPU, tp and drafter")
    chunked_prefill_size: StrictInt | None = Field(default=None, ge=64,
                                                   description="None = SGLang's default for the GPU memory")
    kv_cache_dtype: Literal["auto", "bf16", "bfloat16", "fp8_e4m3", "fp8_e5m2"] = Field(
        default="auto", description="--kv-cache-dtype: auto = the model's dtype (BF16 for every simspec preset); an"
                                    " FP8 cache halves the bytes a token's KV takes, read and stored")
    scheduler_recv_interval: StrictInt = Field(
        default=1, ge=1, le=10_000,
        description="--scheduler-recv-interval: the scheduler takes in new requests only every this many loop"
                    " turns while it decodes (at once after a prefill or when idle); 1 = every turn, SGLang's"
                    " default (simspec/engine/engine.py)")
    schedule_conservativeness: StrictFloat = Field(
        default=1.0, gt=0.0, le=100.0,
        description="--schedule-conservativeness: scales the share of running requests' outputs SGLang keeps free"
                    " in the KV cache when it admits new ones (simspec/engine/admission.py)")

    @property
    def version_minor_patch(self) -> tuple[int, int]:
        return minor_patch(self.sglang_version)  # the field pattern guarantees the form

    @property
    def release(self) -> tuple[int, int, int]:
        """(minor, patch, post): for the few rules that changed within a patch release (scenario/releases.py)."""
        return release_key(self.sglang_version)


class NgramSettings(StrictModel):
    """SGLang's --speculative-ngram-* flags (0.5.8 calls max_trie_depth branch_length).

    They change no duration: an n-gram verify always covers num_draft_tokens per request, however the trie
    matched. They shape acceptance: `acceptance: {ngram_replay: ...}` replays the drafter with them over real
    outputs (simspec/ngram); other acceptance forms give the result directly."""

    # upper bounds: simspec's practical limits (SGLang sets none), the same as simspec ngram's (ngram/config.py)
    min_bfs_breadth: StrictInt = Field(default=1, ge=1, le=1024)
    max_bfs_breadth: StrictInt = Field(default=10, ge=1, le=1024)
    max_trie_depth: StrictInt = Field(default=18, ge=2, le=1024)
    match_type: Literal["BFS", "PROB"] = "BFS"
    capacity: StrictInt = Field(default=10_000_000, ge=1)

    @model_validator(mode="after")
    def _breadth_order(self) -> NgramSettings:
        if self.min_bfs_breadth > self.max_bfs_breadth:
            raise ValueError(
                f"min_bfs_breadth ({self.min_bfs_breadth}) must be <= max_bfs_breadth ({self.max_bfs_breadth})"
            )
        return self


class Speculative(StrictModel):
    algorithm: Algorithm = "none"
    drafter: str | None = Field(
        default=None, description="eagle/eagle3: drafter preset; standalone: model preset of the draft model"
    )
    num_steps: StrictInt | None = Field(default=None, ge=1, le=MAX_NUM_STEPS)
    topk: StrictInt | None = Field(default=None, ge=1, le=64)
    num_draft_tokens: StrictInt | None = Field(default=None, ge=2, le=1024)
    ngram: NgramSettings = NgramSettings()
    hypothetical_mtp_head: StrictBool = Field(
        default=False, description="model a trained NextN-style MTP head for a model that ships none"
    )


class NgramReplay(StrictModel):
    """Acceptance from replaying SGLang's n-gram drafter over real model outputs (simspec ngram)."""

    corpus: FilePath = Field(description="JSONL of output token ids (or text), relative to the scenario file")
    tokenizer: FilePath | None = Field(default=None, description="tokenizer.json for a text corpus (default: bytes)")
    concurrency: StrictInt | None = Field(
        default=None, ge=1, description="requests sharing the trie; default: the workload's closed-loop concurrency")


class ContextPoint(StrictModel):
    """One point of an accept length that changes with a request's context (acceptance.accept_length_by_context)."""

    context_tokens: StrictInt = Field(
        ge=0, le=MAX_TOKENS, description="the request's KV context at the verify step: prompt + generated tokens")
    accept_length: StrictFloat = Field(
        ge=1.0, description="mean tokens committed per verify step at that context, the bonus token included")


class Acceptance(StrictModel):
    """How many drafted tokens the target accepts. Exactly one of the figures is given.

    accept_length counts the bonus token, as SGLang does: 1.0 means no gain. accept_length_by_context gives it
    at two or more context lengths, for drafters whose acceptance falls as a request's context grows (EAGLE-3
    heads trained on short sequences: simspec.acceptance.models).
    """

    accept_length: StrictFloat | None = Field(default=None, ge=1.0)
    accept_length_by_context: list[ContextPoint] | None = Field(
        default=None, min_length=2,
        description="accept length at increasing context lengths; linear between points, flat beyond the ends")
    chain_rates: list[Annotated[StrictFloat, Field(ge=0.0, le=1.0)]] | None = Field(
        default=None, min_length=1, description="conditional P(accept draft i | drafts < i accepted)"
    )
    cumulative_rates: list[Annotated[StrictFloat, Field(ge=0.0, le=1.0)]] | None = Field(
        default=None, min_length=1, description="marginal P(draft i accepted), as papers publish them"
    )
    positional_rates: list[Annotated[StrictFloat, Field(ge=0.0, le=1.0)]] | None = Field(
        default=None, min_length=1, description="tree: P(target token is the draft's rank-r candidate)"
    )
    histogram: list[Annotated[StrictFloat, Field(ge=0.0, le=1e15)]] | None = Field(
        default=None, min_length=1, description="verify steps that accepted k = 0, 1, ... drafts"
    )
    ngram_replay: NgramReplay | None = Field(
        default=None, description="n-gram only: replay the drafter over a corpus of real outputs")
    source: str | None = Field(default=None, description="where the figure comes from, or that it is assumed")

    @model_validator(mode="after")
    def _exactly_one(self) -> Acceptance:
        given = [k for k in ACCEPTANCE_FORMS if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of {', '.join(ACCEPTANCE_FORMS)} (got {', '.join(given) if given else 'none'})"
            )
        if self.accept_length_by_context is not None:
            contexts = [p.context_tokens for p in self.accept_length_by_context]
            if any(b <= a for a, b in zip(contexts, contexts[1:], strict=False)):
                raise ValueError("accept_length_by_context: context_tokens must increase from point to point"
                                 f" (got {contexts})")
        if self.cumulative_rates is not None:
            rates = self.cumulative_rates
            if any(b > a + 1e-12 for a, b in zip(rates, rates[1:], strict=False)):
                raise ValueError("cumulative_rates must not increase with position (P(accept >= i) shrinks)")
        if self.positional_rates is not None and sum(self.positional_rates) > 1.0 + 1e-9:
            raise ValueError("positional_rates are exclusive events per tree level: their sum must be <= 1")
        if self.histogram is not None and sum(self.histogram) <= 0:
            raise ValueError("histogram needs at least one verify step (a positive count)")
        return self


BENCH_SERVING_RANDOM = "bench_serving_random"


class LengthDistribution(StrictModel):
    """Token-length distribution: fixed, uniform [low, high], normal(mean, std), lognormal(mean, std), or
    bench_serving_random: the lengths SGLang's `bench_serving --dataset-name random` draws for
    `--random-input-len` / `--random-output-len` = value, `--random-range-ratio` and `--seed`, replayed draw for
    draw (the prompt and the output lengths together; see workload.bench_serving_random_lengths).

    Samples are rounded and clipped to [min, max].
    """

    dist: Literal["fixed", "uniform", "normal", "lognormal", "bench_serving_random"] = "fixed"
    value: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS)
    low: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS)
    high: StrictInt | None = Field(default=None, ge=1, le=MAX_TOKENS)
    mean: StrictFloat | None = Field(default=None, gt=0, le=MAX_TOKENS)
    std: StrictFloat | None = Field(default=None, ge=0, le=MAX_TOKENS)
    min: StrictInt = Field(default=1, ge=1, le=MAX_TOKENS)
    max: StrictInt = Field(default=MAX_TOKENS, ge=1, le=MAX_TOKENS)
    # bench_serving_random only
    range_ratio: StrictFloat = Field(default=0.0, ge=0.0, le=1.0, description="--random-range-ratio (bench_serving's"
                                                                         " default 0.0)")
    seed: StrictInt = Field(default=1, ge=0, le=2**32 - 1, description="--seed (bench_serving's default 1)")
    zero_floor: StrictBool = Field(
        default=False, description="output lengths of bench_serving before SGLang 0.5.8, which draws them from"
                                   " int(value x range_ratio) (0 at the default ratio) where 0.5.8's"
                                   " compute_random_lens draws from at least 1: the draws differ from the first one")

    @model_validator(mode="after")
    def _params(self) -> LengthDistribution:
        need = {"fixed": ("value",), "uniform": ("low", "high"), "normal": ("mean", "std"),
                "lognormal": ("mean", "std"), BENCH_SERVING_RANDOM: ("value",)}[self.dist]
        missing = [k for k in need if getattr(self, k) is None]
        if missing:
            raise ValueError(f"dist '{self.dist}' needs {', '.join(need)} (missing {', '.join(missing)})")
        stray = {"range_ratio", "seed", "zero_floor"} & self.model_fields_set
        if stray and self.dist != BENCH_SERVING_RANDOM:
            raise ValueError(f"{', '.join(sorted(stray))} belong to dist '{BENCH_SERVING_RANDOM}' only")
        if self.dist == "uniform" and self.low > self.high:  # type: ignore[operator]
            raise ValueError(f"low ({self.low}) must be <= high ({self.high})")
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) must be <= max ({self.max})")
        return self

    @property
    def shortest(self) -> int:
        """The shortest length a sample can take (workload.sample_lengths clips to [min, max])."""
        if self.dist == "fixed":
            return min(max(self.value, self.min), self.max)  # type: ignore[type-var]
        if self.dist == "uniform":
            return min(max(self.low, self.min), self.max)  # type: ignore[type-var]
        if self.dist == BENCH_SERVING_RANDOM:
            assert self.value is not None
            return min(max(int(self.value * self.range_ratio), 1, self.min), self.max)
        return self.min


class ClosedLoop(StrictModel):
    """`concurrency` clients, each sending its next request when the previous one finishes.

    With `turns` > 1 the requests come in conversations of that many turns (requests 0..turns-1 are the first
    conversation, and so on): a client sends a conversation's turns one after another and only then takes the
    next conversation nobody has started, as multi-turn benchmarks do (MT-bench's two turns on a pool of client
    threads). Without `followup_tokens` each turn's lengths are drawn like any request's and reuse nothing. With
    it a later turn's prompt is the conversation so far (the previous turn's prompt and its output) followed by a
    new message of `followup_tokens`, and SGLang's radix cache serves the conversation so far: the turn's prefill
    computes the new message alone, attending to the rest (as a chat client resending the whole history does)."""

    type: Literal["closed"]
    concurrency: StrictInt = Field(ge=1, le=MAX_CONCURRENCY)
    turns: StrictInt = Field(default=1, ge=1, le=1000, description="requests per conversation (num_requests must"
                                                                    " be a multiple)")
    followup_tokens: LengthDistribution | None = Field(
        default=None, description="turns after the first: the new message's length; the prompt carries the"
                                  " conversation so far, served from the radix cache")

    @model_validator(mode="after")
    def _followups_need_turns(self) -> ClosedLoop:
        if self.followup_tokens is not None and self.turns < 2:
            raise ValueError("followup_tokens describes the later turns of a conversation: it needs turns >= 2")
        if self.followup_tokens is not None and self.followup_tokens.dist == BENCH_SERVING_RANDOM:
            raise ValueError(f"followup_tokens cannot be '{BENCH_SERVING_RANDOM}': bench_serving's random dataset"
                             " draws single-turn prompts")
        return self


class Poisson(StrictModel):
    """Open-loop Poisson arrivals."""

    type: Literal["poisson"]
    rate_per_s: StrictFloat = Field(ge=1e-6, le=1e6)


class Workload(StrictModel):
    arrival: ClosedLoop | Poisson = Field(discriminator="type")
    num_requests: StrictInt = Field(ge=1, le=MAX_REQUESTS)
    input_tokens: LengthDistribution
    output_tokens: LengthDistribution
    shared_prefix_tokens: StrictInt = Field(
        default=0, ge=0, le=MAX_TOKENS,
        description="leading prompt tokens every request shares (a few-shot block, a system prompt): SGLang's radix"
                    " cache serves them from cache once a prefill has computed them")

    @property
    def turns(self) -> int:
        """Requests per conversation: a closed loop's turns; every Poisson arrival is a conversation of one."""
        return self.arrival.turns if self.arrival.type == "closed" else 1

    @model_validator(mode="after")
    def _whole_conversations(self) -> Workload:
        turns = self.turns
        if self.num_requests % turns:
            raise ValueError(f"num_requests ({self.num_requests}) must be a multiple of arrival.turns ({turns}):"
                             " whole conversations")
        return self

    @model_validator(mode="after")
    def _bench_serving_draws_both(self) -> Workload:
        """bench_serving seeds numpy once and draws every prompt length, then every output length: replaying
        its draws takes both distributions, with one seed and one range ratio."""
        i, o = self.input_tokens, self.output_tokens
        kinds = (i.dist == BENCH_SERVING_RANDOM, o.dist == BENCH_SERVING_RANDOM)
        if any(kinds) and not all(kinds):
            raise ValueError(f"'{BENCH_SERVING_RANDOM}' replays bench_serving's prompt and output draws together:"
                             " give it for both input_tokens and output_tokens")
        if all(kinds):
            if (i.seed, i.range_ratio) != (o.seed, o.range_ratio):
                raise ValueError(f"'{BENCH_SERVING_RANDOM}': input_tokens and output_tokens must share seed and"
                                 " range_ratio (bench_serving has one of each)")
            if i.zero_floor:
                raise ValueError("zero_floor applies to output_tokens only: bench_serving draws every prompt"
                                 " length from at least 1")
        return self


class Scenario(StrictModel):
    name: str
    description: str = ""
    hardware: Hardware
    model: str = Field(description="model preset name")
    server: Server
    speculative: Speculative = Speculative()
    acceptance: Acceptance | None = None
    workload: Workload
    calibration: FilePath | None = Field(default=None, description="calibration profile YAML, relative to this file")
    seed: StrictInt = Field(default=0, ge=0)
