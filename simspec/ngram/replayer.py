"""Replaying SGLang's n-gram drafter over the tokens a model actually produced (temperature 0).

At temperature 0 greedy verification accepts the longest draft path that matches what the target produced
next, so the recorded output fixes every step: match the request's suffix in the shared trie, build the draft
tree, accept what matches the next output tokens (+ 1 bonus token), insert the window, repeat.

The server loop modelled (SGLang 0.5.10 srt/speculative/ngram_worker.py NGRAMWorker.forward_batch_generation,
run once per decode iteration for the whole running batch):
1. every running request, in batch order, is matched against the trie as it stands (`batch_get`, after
   `synchronize()` waited for the insertions of the previous step);
2. one target verify for the batch; each request appends its accepted drafts and the bonus token
   (ngram_info.py `_fill_requests`; a request that reaches its last recorded token stops there, and the
   step is recorded with the drafts it kept, as SGLang's spec_accept_histogram does);
3. every request of the batch, finished ones included, inserts the last max_trie_depth tokens of prompt +
   output (`_update_ngram_corpus`). 0.5.23 (overlap scheduling) inserts the context it matched with instead.

A new request is prefilled (no insertion: prompts are not bulk-inserted) and produces its first output token
before its first verify; its prompt tail is part of its matching context and of its inserted windows. At
concurrency C, C requests are in flight; a finished request is replaced by the next one, which joins the
batch at the next step (appended at the end of the batch, as ScheduleBatch.merge_batch does).
"""

from __future__ import annotations

import gc
import math
import numbers
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from simspec.errors import InputError
from simspec.ngram.config import MAX_TOKEN_ID, NgramConfig
from simspec.ngram.draft import accepted_drafts


@dataclass(frozen=True)
class Sequence:
    """One recorded request: the tokens the model produced, and the prompt it was given (optional)."""

    output_ids: list[int]
    prompt_ids: list[int] = field(default_factory=list)
    name: str | None = None


@dataclass
class RequestResult:
    """Per-request figures. `accept_length` is the mean of (accepted drafts + 1) over its verify steps;
    `spec_accept_length` is SGLang's meta_info figure, completion_tokens / spec_verify_ct (the prefill token
    counts in the numerator)."""

    name: str
    prompt_tokens: int
    output_tokens: int
    verify_steps: int
    accepted_drafts: int
    histogram: list[int]

    @property
    def accept_length(self) -> float:
        return (self.accepted_drafts + self.verify_steps) / self.verify_steps if self.verify_steps else math.nan

    @property
    def spec_accept_length(self) -> float:
        return self.output_tokens / self.verify_steps if self.verify_steps else math.nan

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "prompt_tokens": self.prompt_tokens, "output_tokens": self.output_tokens,
                "verify_steps": self.verify_steps, "accepted_drafts": self.accepted_drafts,
                "accept_length": _num(self.accept_length), "spec_accept_length": _num(self.spec_accept_length),
                "histogram": list(self.histogram)}


@dataclass
class ReplayResult:
    """`histogram[k]`: verify steps that accepted k drafts (k = 0 .. num_draft_tokens - 1), over all requests.
    `mean_accept_length`: mean of (accepted drafts + 1) per request per verify step, SGLang's "accept len"."""

    config: NgramConfig
    concurrency: int
    histogram: list[int]
    requests: list[RequestResult]
    engine: str
    batch_steps: int = 0  # decode iterations of the whole batch (= verify_steps at concurrency 1)
    notes: list[str] = field(default_factory=list)

    @property
    def verify_steps(self) -> int:
        return sum(self.histogram)

    @property
    def accepted_drafts(self) -> int:
        return sum(k * n for k, n in enumerate(self.histogram))

    @property
    def mean_accept_length(self) -> float:
        steps = self.verify_steps
        return (self.accepted_drafts + steps) / steps if steps else math.nan

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    def to_dict(self) -> dict[str, Any]:
        return {"config": self.config.to_dict(), "concurrency": self.concurrency, "engine": self.engine,
                "verify_steps": self.verify_steps, "batch_steps": self.batch_steps,
                "accepted_drafts": self.accepted_drafts, "output_tokens": self.output_tokens,
                "mean_accept_length": _num(self.mean_accept_length), "histogram": list(self.histogram),
                "notes": list(self.notes), "requests": [r.to_dict() for r in self.requests]}


def _num(x: float) -> float | None:
    return None if math.isnan(x) else x


class _Req:
    """A request in flight: `tokens` = prompt + whole recorded output, `end` = tokens produced so far."""

    def __init__(self, index: int, seq: Sequence, n_draft: int) -> None:
        self.index = index
        self.rid = index
        self.tokens = list(seq.prompt_ids) + list(seq.output_ids)
        self.prompt_len = len(seq.prompt_ids)
        self.total = len(self.tokens)
        self.end = self.prompt_len + 1  # the prefill produced the first output token
        self.match_end = self.end
        self.steps = 0
        self.accepted = 0
        self.hist = [0] * n_draft


ENGINES = ("auto", "compiled", "literal")


def resolve_engine(engine: str = "auto") -> str:
    """Which engine replays: "compiled" (simspec.ngram.compiled, numba), "literal" (simspec.ngram.literal, pure
    Python, ~10x slower: the independent transcription the compiled engine is checked against), or "auto":
    compiled where numba imports, else literal. Both cover every version, match type and capacity."""
    if engine not in ENGINES:
        raise InputError(f"engine must be one of {', '.join(ENGINES)}, got {engine!r}", key="engine")
    if engine == "literal":
        return engine
    from simspec.ngram import compiled

    if compiled.AVAILABLE:
        return "compiled"
    if engine == "compiled":
        raise InputError("the compiled engine needs numba (pip install numba)", key="engine")
    return "literal"


def _token_list(ids: Any, where: str) -> list[int]:
    """Token ids as a list of Python ints (numpy integers accepted), or one InputError."""
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    ids = list(ids)
    if not all(type(t) is int for t in ids):
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, numbers.Integral):
                raise InputError(f"token ids must be integers in 0 .. {MAX_TOKEN_ID}, got {t!r}", key=where)
        ids = [int(t) for t in ids]
    if ids and (min(ids) < 0 or max(ids) > MAX_TOKEN_ID):
        bad = next(t for t in ids if t < 0 or t > MAX_TOKEN_ID)
        raise InputError(f"token ids must be integers in 0 .. {MAX_TOKEN_ID}, got {bad!r}", key=where)
    return ids


def _check_sequences(sequences: Iterable[Sequence]) -> list[Sequence]:
    out = []
    for i, s in enumerate(sequences):
        out.append(Sequence(output_ids=_token_list(s.output_ids, f"sequences[{i}].output_ids"),
                            prompt_ids=_token_list(s.prompt_ids, f"sequences[{i}].prompt_ids"), name=s.name))
    return out


def replay(sequences: Iterable[Sequence], config: NgramConfig, concurrency: int = 1, *,
           engine: str = "auto") -> ReplayResult:
    """Replay the n-gram drafter over `sequences` served `concurrency` at a time (sharing one trie)."""
    if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
        raise InputError(f"must be a whole number >= 1, got {concurrency!r}", key="concurrency")
    seqs = _check_sequences(sequences)
    if resolve_engine(engine) == "compiled":
        return _run_compiled(seqs, config, concurrency)
    from simspec.ngram.literal import LiteralTrie

    trie = LiteralTrie(config)
    # The literal trie allocates millions of small objects that live long; Python's cyclic collector would
    # rescan them again and again (a third of the run time at 1M tokens). It collects them once re-enabled.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run(seqs, config, concurrency, trie)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run_compiled(seqs: list[Sequence], config: NgramConfig, concurrency: int) -> ReplayResult:
    from simspec.ngram.compiled import replay_arrays

    # more slots than requests change nothing, and the compiled loop allocates one per slot
    slots = min(concurrency, max(1, len(seqs)))
    hist, steps, accepted, hists, batch_steps, _nodes = replay_arrays(seqs, config, slots)
    requests = [RequestResult(name=s.name if s.name is not None else str(i), prompt_tokens=len(s.prompt_ids),
                              output_tokens=len(s.output_ids), verify_steps=int(steps[i]),
                              accepted_drafts=int(accepted[i]), histogram=hists[i].tolist())
                for i, s in enumerate(seqs)]
    return ReplayResult(config=config, concurrency=concurrency, histogram=hist.tolist(), requests=requests,
                        engine="compiled", batch_steps=int(batch_steps), notes=_notes(config))


def _notes(config: NgramConfig) -> list[str]:
    notes = []
    if config.sglang_version == "0.5.8" and config.match_type == "PROB":
        notes.append("SGLang 0.5.8's NGRAMWorker never passes match_type to its cache: replayed as BFS")
    if config.sglang_version == "0.5.23":
        notes.append("0.5.23 inserts with overlap scheduling: accepted tokens reach the trie one step later, and "
                     "a request's last accepted tokens are never inserted")
    return notes


def _run(seqs: list[Sequence], config: NgramConfig, concurrency: int, trie: Any) -> ReplayResult:
    n_draft = config.num_draft_tokens
    lag = config.sglang_version == "0.5.23"
    hist = [0] * n_draft
    results: list[RequestResult | None] = [None] * len(seqs)
    pending = deque(enumerate(seqs))
    running: list[_Req] = []
    batch_steps = 0

    def record(req: _Req | None, index: int) -> None:
        seq = seqs[index]
        h = req.hist if req is not None else [0] * n_draft
        results[index] = RequestResult(
            name=seq.name if seq.name is not None else str(index), prompt_tokens=len(seq.prompt_ids),
            output_tokens=len(seq.output_ids), verify_steps=req.steps if req else 0,
            accepted_drafts=req.accepted if req else 0, histogram=h)

    draft = trie.draft
    insert = trie.insert
    while pending or running:
        while len(running) < concurrency and pending:
            index, seq = pending.popleft()
            if len(seq.output_ids) <= 1:  # finished at prefill: never verified
                record(None, index)
                continue
            req = _Req(index, seq, n_draft)
            trie.begin(req)
            running.append(req)
        if not running:
            break
        batch_steps += 1
        # every request drafts against the trie as it stands, before any of this step's insertions
        ks = [accepted_drafts(draft(req, req.tokens, req.end), req.tokens, req.end, req.total, n_draft)
              for req in running]
        for req, k in zip(running, ks, strict=True):
            end = req.end
            produced = min(k + 1, req.total - end)
            k = produced - 1
            req.match_end = end
            req.end = end + produced
            req.steps += 1
            req.accepted += k
            req.hist[k] += 1
            hist[k] += 1
        still = []
        for req in running:
            insert(req, req.tokens, req.match_end if lag else req.end)
        for req in running:
            if req.end >= req.total:
                trie.finish(req)
                record(req, req.index)
            else:
                still.append(req)
        running = still
    return ReplayResult(config=config, concurrency=concurrency, histogram=hist,
                        requests=[r for r in results if r is not None], engine=trie.name,
                        batch_steps=batch_steps, notes=_notes(config))
