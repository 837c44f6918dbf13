"""N-gram replay: SGLang's n-gram drafter replayed over recorded model outputs, for exact accept lengths at
temperature 0 without a GPU.

    from simspec.ngram import NgramConfig, Sequence, load_corpus, replay

    sequences, tokenization = load_corpus("outputs.jsonl")          # or text + tokenizer="tokenizer.json"
    result = replay(sequences, NgramConfig(num_draft_tokens=8), concurrency=4)
    result.histogram            # [steps that accepted 0 drafts, 1 draft, ..., num_draft_tokens - 1]
    result.mean_accept_length   # accepted drafts + 1 bonus, per request and verify step (SGLang's accept len)
    result.requests             # per-request figures

Modules: config (NgramConfig, validated like SGLang), replayer (the server loop, results), draft (draft-tree
building and greedy verification), literal (the trie node by node, every version, in Python: the reference),
compiled (the same trie and loop in flat arrays compiled by numba, ~10x faster), corpus (reading JSONL token
ids or text).
"""

from simspec.ngram.config import NgramConfig, nearest_read_version
from simspec.ngram.corpus import load_corpus
from simspec.ngram.replayer import ReplayResult, RequestResult, Sequence, replay

__all__ = ["NgramConfig", "ReplayResult", "RequestResult", "Sequence", "load_corpus", "nearest_read_version",
           "replay"]
