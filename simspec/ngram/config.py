"""NgramConfig: one SGLang n-gram speculative configuration, validated as SGLang validates it.

Field names follow simspec.scenario.schema.NgramSettings (SGLang's --speculative-ngram-* flags) plus
`num_draft_tokens` (--speculative-num-draft-tokens) and `sglang_version`, which picks the drafter behaviour
read from that release's source:

- "0.5.10": sglang/jit_kernel/csrc/ngram_corpus/{trie,ngram,result}.cpp + srt/speculative/ngram_worker.py.
  Overlap scheduling is off for NGRAM (server_args.py `_handle_speculative_decoding`), so the tokens a verify
  accepts are inserted before the next step matches.
- "0.5.23": kernels/jit/csrc/ngram_corpus/trie.cpp. Same trie and insertion, but (1) the suffix anchors are a
  per-request `MatchState` advanced incrementally (Trie::match / advanceMatchState_), which finds a depth only
  if the previous step found the depth below it; (2) overlap scheduling is on by default, and the worker
  (ngram_worker.py `_update_ngram_corpus`) inserts `output_ids + prev_tokens`, i.e. the context as it was when
  this step matched: the tokens a verify accepts reach the trie one step later.
- "0.5.8": srt/speculative/cpp_ngram/ngram.cpp (`branch_length` = max_trie_depth). Matching is limited to
  suffixes of `min_match_window_size`..`max_match_window_size` tokens (defaults 1 and 12), the BFS breadth scale
  is (max_bfs - min_bfs) / (max_window - min_window + 1), insertion skips the suffixes of the window no longer
  than `min_match_window_size`, and the worker never passes --speculative-ngram-match-type to the cache (always
  BFS; a PROB request is replayed as BFS and the result says so).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

from simspec.errors import InputError
from simspec.scenario.releases import release_key

MATCH_TYPES = ("BFS", "PROB")
VERSIONS = ("0.5.8", "0.5.10", "0.5.23")
MAX_TOKEN_ID = 2**31 - 1  # SGLang hands token ids to the trie as int32
# Upper bounds. SGLang's drafter (ngram.cpp's constructor, server_args.py) sets none on these flags, only lower
# ones; these are simspec's practical limits, shared with the scenario schema (simspec/scenario/schema.py
# Speculative.num_draft_tokens and NgramSettings). A verify step of more than 1024 tokens per request is past any
# served configuration, and the replay allocates per draft token, breadth and depth, so larger values only
# exhaust memory. Breadth above num_draft_tokens - 1 adds no node to a tree of at most num_draft_tokens.
MAX_DRAFT_TOKENS = 1024
MAX_BFS_BREADTH = 1024
MAX_TRIE_DEPTH = 1024


@dataclass(frozen=True)
class NgramConfig:
    """One n-gram drafter configuration (defaults: SGLang 0.5.10's server_args.py, 12 draft tokens)."""

    num_draft_tokens: int = 12
    min_bfs_breadth: int = 1
    max_bfs_breadth: int = 10
    max_trie_depth: int = 18
    match_type: str = "BFS"
    capacity: int = 10_000_000
    sglang_version: str = "0.5.10"
    # 0.5.8 only (--speculative-ngram-{min,max}-match-window-size); later releases match at every depth.
    min_match_window_size: int = 1
    max_match_window_size: int = 12

    def __post_init__(self) -> None:
        self.validate()

    # ------------------------------------------------------------------ validation

    def validate(self) -> None:
        """Raise InputError (key = the field) where SGLang would refuse the setting (ngram.cpp's constructor)."""
        for name in ("num_draft_tokens", "min_bfs_breadth", "max_bfs_breadth", "max_trie_depth", "capacity",
                     "min_match_window_size", "max_match_window_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InputError(f"must be a whole number, got {value!r}", key=name)
        if self.num_draft_tokens < 1:
            raise InputError(f"must be >= 1 (the verified tokens per request, root included), "
                             f"got {self.num_draft_tokens}", key="num_draft_tokens")
        if self.num_draft_tokens > MAX_DRAFT_TOKENS:
            raise InputError(f"must be <= {MAX_DRAFT_TOKENS} (simspec's limit on the verified tokens per request, "
                             f"root included), got {self.num_draft_tokens}", key="num_draft_tokens")
        if self.min_bfs_breadth < 1:
            raise InputError(f"must be >= 1, got {self.min_bfs_breadth}", key="min_bfs_breadth")
        if self.max_bfs_breadth > MAX_BFS_BREADTH:
            raise InputError(f"must be 1 .. {MAX_BFS_BREADTH} (simspec's limit: SGLang sets none, and a draft tree "
                             f"holds at most {MAX_DRAFT_TOKENS - 1} nodes besides its root), got "
                             f"{self.max_bfs_breadth}", key="max_bfs_breadth")
        if self.min_bfs_breadth > self.max_bfs_breadth:
            raise InputError(f"min_bfs_breadth ({self.min_bfs_breadth}) must be <= max_bfs_breadth "
                             f"({self.max_bfs_breadth})", key="min_bfs_breadth")
        if self.max_trie_depth < 2:
            raise InputError(f"must be >= 2 (SGLang requires max_trie_depth > 1), got {self.max_trie_depth}",
                             key="max_trie_depth")
        if self.max_trie_depth > MAX_TRIE_DEPTH:
            raise InputError(f"must be 2 .. {MAX_TRIE_DEPTH} (simspec's limit: SGLang sets none; SGLang's default "
                             f"is 18), got {self.max_trie_depth}", key="max_trie_depth")
        if self.match_type not in MATCH_TYPES:
            raise InputError(f"must be one of {', '.join(MATCH_TYPES)}, got {self.match_type!r}", key="match_type")
        if self.sglang_version not in VERSIONS:
            raise InputError(f"n-gram replay follows the drafter of SGLang {', '.join(VERSIONS)}, got "
                             f"{self.sglang_version!r}: give the nearest read one (nearest_read_version: 0.5.10 for "
                             f"0.5.9 .. 0.5.22, an assumption)",
                             key="sglang_version")
        if self.capacity <= self.max_trie_depth:
            # Trie::squeeze throws when a path of max_trie_depth nodes cannot be made room for (the root is
            # one of the `capacity` nodes).
            raise InputError(f"must be > max_trie_depth ({self.max_trie_depth}): SGLang's trie needs room for "
                             f"one inserted path besides its root, got {self.capacity}", key="capacity")
        if self.sglang_version == "0.5.8":
            if self.min_match_window_size < 1:
                raise InputError(f"must be >= 1, got {self.min_match_window_size}", key="min_match_window_size")
            if self.min_match_window_size > self.max_match_window_size:
                raise InputError(f"min_match_window_size ({self.min_match_window_size}) must be <= "
                                 f"max_match_window_size ({self.max_match_window_size})",
                                 key="min_match_window_size")
            if self.max_match_window_size >= self.max_trie_depth:
                raise InputError(f"0.5.8 requires max_match_window_size ({self.max_match_window_size}) < "
                                 f"branch_length = max_trie_depth ({self.max_trie_depth})",
                                 key="max_match_window_size")

    # ------------------------------------------------------------------ derived figures

    @property
    def effective_match_type(self) -> str:
        """0.5.8's NGRAMWorker builds NgramCache without match_type: it is always BFS there."""
        return "BFS" if self.sglang_version == "0.5.8" else self.match_type

    @property
    def draft_budget(self) -> int:
        """Draft nodes per request besides the root (Param::get_draft_token_num: draft_token_num - 1)."""
        return self.num_draft_tokens - 1

    def label(self) -> str:
        """A short name for tables: the fields that differ from the defaults."""
        base = NgramConfig(sglang_version=self.sglang_version)
        parts = [f"{k}={v}" for k, v in asdict(self).items() if v != getattr(base, k)]
        return ", ".join(parts) or "defaults"

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if self.sglang_version != "0.5.8":
            d.pop("min_match_window_size")
            d.pop("max_match_window_size")
        return d

    def with_(self, **changes: Any) -> NgramConfig:
        return replace(self, **changes)

    @classmethod
    def from_settings(cls, settings: Any, num_draft_tokens: int, sglang_version: str = "0.5.10") -> NgramConfig:
        """From a simspec.scenario.schema.NgramSettings (or anything with its five attributes)."""
        return cls(num_draft_tokens=num_draft_tokens, min_bfs_breadth=settings.min_bfs_breadth,
                   max_bfs_breadth=settings.max_bfs_breadth, max_trie_depth=settings.max_trie_depth,
                   match_type=settings.match_type, capacity=settings.capacity, sglang_version=sglang_version)


def nearest_read_version(version: str) -> str:
    """The release whose drafter n-gram replay follows for an SGLang version "0.5.N" or "0.5.N.postM".

    0.5.8, 0.5.10 and 0.5.23 were read for the replay: 0.5.8 and earlier -> "0.5.8", 0.5.9 .. 0.5.22 -> "0.5.10",
    0.5.23 and later -> "0.5.23". 0.5.3-0.5.7 were read since and run 0.5.8's drafter (speculative/cpp_ngram,
    --speculative-ngram-* defaults unchanged). For 0.5.9-0.5.22 this is an assumption (when max_trie_depth,
    MatchState and overlap scheduling for NGRAM arrived was not checked), not a reading.
    """
    try:
        minor, patch, _ = release_key(version)
    except ValueError:
        minor = patch = -1
    if minor != 5:
        raise InputError(f"expected an SGLang version 0.5.N[.postM], got {version!r}", key="sglang_version")
    if patch <= 8:
        return "0.5.8"
    if patch < 23:
        return "0.5.10"
    return "0.5.23"
