"""n-gram replay as a scenario's acceptance (`acceptance: {ngram_replay: {corpus: ...}}`).

The scenario's own n-gram settings, draft budget and SGLang version configure the replayed drafter; the
corpus is replayed at the workload's concurrency (requests share one trie, as on the server). Results are
kept per process, keyed by the corpus file's identity and the configuration, so a sweep replays each
(corpus, configuration) once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from simspec.errors import InputError
from simspec.ngram.config import NgramConfig, nearest_read_version
from simspec.ngram.corpus import load_corpus
from simspec.ngram.replayer import replay
from simspec.scenario.reading import relative_to_scenario

if TYPE_CHECKING:
    from simspec.scenario.schema import Scenario

_CACHE: dict[tuple, tuple[list[float], str]] = {}


def replay_for_scenario(sc: Scenario, num_draft_tokens: int, scenario_path: str) -> tuple[list[float], str]:
    """(histogram of accepted drafts per verify step, a source line naming the corpus and configuration)."""
    acc = sc.acceptance
    assert acc is not None and acc.ngram_replay is not None
    spec = acc.ngram_replay
    corpus = relative_to_scenario(spec.corpus, scenario_path)
    if not corpus.exists():
        raise InputError(f"corpus {spec.corpus!r} not found (looked at {corpus})", file=scenario_path,
                         key="acceptance.ngram_replay.corpus")
    tokenizer = relative_to_scenario(spec.tokenizer, scenario_path) if spec.tokenizer else None
    arrival = sc.workload.arrival
    # open-loop arrivals have no fixed concurrency: replay one request at a time unless told (the source says so)
    concurrency = spec.concurrency or (arrival.concurrency if arrival.type == "closed" else 1)
    ng = sc.speculative.ngram
    try:
        config = NgramConfig(num_draft_tokens=num_draft_tokens, min_bfs_breadth=ng.min_bfs_breadth,
                             max_bfs_breadth=ng.max_bfs_breadth, max_trie_depth=ng.max_trie_depth,
                             match_type=ng.match_type, capacity=ng.capacity,
                             sglang_version=nearest_read_version(sc.server.sglang_version))
    except InputError as err:
        raise InputError(err.message, file=scenario_path, key=f"speculative.ngram.{err.key}") from None
    stat = corpus.stat()
    tok_stat = (tokenizer.stat().st_mtime_ns, tokenizer.stat().st_size) if tokenizer and tokenizer.exists() else None
    key = (str(corpus), stat.st_mtime_ns, stat.st_size, str(tokenizer), tok_stat, concurrency, repr(config))
    hit = _CACHE.get(key)
    if hit is None:
        try:
            sequences, tokenization = load_corpus(corpus, tokenizer)
        except InputError as err:
            key = "acceptance.ngram_replay.tokenizer" if err.key == "--tokenizer" else (
                err.key or "acceptance.ngram_replay.corpus")
            raise InputError(err.message, file=err.file or str(corpus), key=key) from None
        result = replay(sequences, config, concurrency)
        if result.verify_steps == 0:
            raise InputError("nothing to replay: no request has 2 or more output tokens (a request is verified only"
                             " from its second output token on)", file=str(corpus),
                             key="acceptance.ngram_replay.corpus")
        source = (f"n-gram replay of {corpus.name} ({len(sequences)} requests, {result.verify_steps} verify steps,"
                  f" {tokenization}) at concurrency {concurrency}, {num_draft_tokens} draft tokens, breadth"
                  f" {ng.min_bfs_breadth}-{ng.max_bfs_breadth}, depth {ng.max_trie_depth}, {ng.match_type},"
                  f" SGLang {config.sglang_version} drafter: mean accept length {result.mean_accept_length:.3f}"
                  + (" (open-loop arrivals: replayed one request at a time; set ngram_replay.concurrency)"
                     if spec.concurrency is None and arrival.type != "closed" else ""))
        hit = ([float(c) for c in result.histogram], source)
        _CACHE[key] = hit
    return list(hit[0]), hit[1]
