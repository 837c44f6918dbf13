"""The literal engine: SGLang's n-gram trie node by node, for every version, match type and capacity.

This is the obvious transcription of Trie::insert / Trie::squeeze / Trie::match (0.5.10 and 0.5.23
kernels/jit/csrc/ngram_corpus/trie.cpp; 0.5.8 srt/speculative/cpp_ngram/ngram.cpp), written independently
in Python. Every insertion walks every path of its window (max_trie_depth * (max_trie_depth + 1) / 2 node
touches per request and step), which is what SGLang does and why this engine is slow; simspec.ngram.compiled
does the same in compiled code, and the tests hold the two to each other.

State, as in trie.h:
- each node's children in a dict ordered by recency (the `lru` list): a touched or new child moves to the
  end, so reversed() iterates most recently touched first;
- `freq`: 1 when created, +1 each time an insertion walks through it (PROB's sorted_children key);
- the global LRU (`global_lru_`): new and touched nodes of one inserted path end up in front, shallowest
  first; squeeze() evicts from the back, which is always a leaf;
- `free`: capacity - 1 - live nodes (the root is one of the `capacity` preallocated nodes).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from simspec.ngram.config import NgramConfig
from simspec.ngram.draft import Tree, bfs_breadth_params, build_bfs, build_prob


class Node:
    __slots__ = ("tok", "parent", "kids", "freq", "dead")

    def __init__(self, tok: int, parent: Node | None) -> None:
        self.tok = tok
        self.parent = parent
        self.kids: dict[int, Node] = {}
        self.freq = 1
        self.dead = False


class LiteralTrie:
    """One global trie shared by all requests (Ngram::trie_), plus the per-request state each version keeps."""

    name = "literal"

    def __init__(self, config: NgramConfig) -> None:
        self.config = config
        self.depth = config.max_trie_depth
        self.version = config.sglang_version
        self.root = Node(-1, None)
        self.lru: OrderedDict[Node, None] = OrderedDict()  # last = most recently used
        self.free = config.capacity - 1
        self.scale, self.top_depth = bfs_breadth_params(config)
        self.prob = config.effective_match_type == "PROB"

    # ------------------------------------------------------------------ requests

    def begin(self, req: Any) -> None:
        # 0.5.23 MatchState (trie.h): trie_epoch 0 never equals the trie's (1), so the first match rebuilds.
        req.match_epoch = 0
        req.match_processed = 0
        req.match_anchors = []

    def finish(self, req: Any) -> None:
        pass

    # ------------------------------------------------------------------ insertion (Trie::insert)

    def insert(self, req: Any, tokens: list[int], end: int) -> None:
        """Insert the window the worker hands over: the last max_trie_depth tokens of tokens[:end]
        (ngram_worker.py `_update_ngram_corpus` -> `_efficient_concat_last_n(prompt, output, depth)`)."""
        depth = self.depth
        window = tokens[max(0, end - depth):end]
        n = len(window)
        if self.version == "0.5.8":
            # ngram.cpp Ngram::insert: `for (i = 0; i + min_match_window_size < size; ++i)`
            starts = range(max(0, n - self.config.min_match_window_size))
        else:
            starts = range(n)
        lru = self.lru
        for i in starts:
            plen = min(n - i, depth)
            if plen > self.free:
                self._squeeze(plen - self.free)
            cur = self.root
            path = []
            for t in window[i:i + plen]:
                kids = cur.kids
                child = kids.get(t)
                if child is None:
                    child = Node(t, cur)
                    kids[t] = child  # lru.emplace_front
                    self.free -= 1
                else:
                    del kids[t]  # lru.splice(begin, ...) : most recent
                    kids[t] = child
                    child.freq += 1
                path.append(child)
                cur = child
            # global_lru_.splice(begin, ...) for the path in reverse: the shallowest ends up most recent
            for node in reversed(path):
                lru[node] = None
                lru.move_to_end(node)

    def _squeeze(self, count: int) -> None:
        """Trie::squeeze: release `count` nodes from the back of the global LRU (each one a leaf)."""
        for _ in range(count):
            node, _ = self.lru.popitem(last=False)
            if node.kids:  # SGLang throws here; the LRU order makes it impossible
                raise RuntimeError("n-gram trie: least recently used node still has children")
            del node.parent.kids[node.tok]
            node.dead = True
            self.free += 1

    # ------------------------------------------------------------------ matching

    def _walk(self, suffix: list[int]) -> Node | None:
        cur = self.root
        for t in suffix:
            cur = cur.kids.get(t)
            if cur is None:
                return None
        return cur

    def anchors(self, req: Any, tokens: list[int], end: int) -> list[tuple[Node, int]]:
        """Matched suffix nodes with children, longest first: (node, match depth)."""
        if self.version == "0.5.23":
            return self._anchors_0523(req, tokens, end)
        if self.version == "0.5.8":
            # ngram.cpp Ngram::match over the last max_match_window_size tokens, windows max..min, every
            # matched node kept (one without children adds nothing to the tree).
            lo = self.config.min_match_window_size
            hi = min(end, self.config.max_match_window_size)
            out = []
            for d in range(hi, lo - 1, -1):
                node = self._walk(tokens[end - d:end])
                if node is not None:
                    out.append((node, d))
            return out
        # 0.5.10 Trie::match over the last max_trie_depth tokens: every depth, longest first, kept if it has
        # children.
        out = []
        for d in range(min(end, self.depth), 0, -1):
            node = self._walk(tokens[end - d:end])
            if node is not None and node.kids:
                out.append((node, d))
        return out

    def _anchors_0523(self, req: Any, tokens: list[int], end: int) -> list[tuple[Node, int]]:
        """0.5.23 Trie::match with the request's MatchState (trie.cpp match / advanceMatchState_ /
        rebuildMatchState_ / getExpandableAnchors_). `end` is the request's total length (total_lens)."""
        depth = self.depth
        tail_len = min(end, depth)
        appended = end - req.match_processed if end >= req.match_processed else 0
        can_advance = (req.match_epoch == 1 and end >= req.match_processed and appended <= tail_len
                       and len(req.match_anchors) == min(req.match_processed, depth))
        if not (can_advance and self._advance(req, tokens, end, appended)):
            # rebuildMatchState_: every depth of the tail, leaves included
            anchors: list[Node | None] = []
            for d in range(1, tail_len + 1):
                anchors.append(self._walk(tokens[end - d:end]))
            req.match_anchors = anchors
            req.match_epoch = 1
            req.match_processed = end
        out = []
        for d in range(len(req.match_anchors), 0, -1):
            node = req.match_anchors[d - 1]
            if node is not None and not node.dead and node.kids:
                out.append((node, d))
        return out

    def _advance(self, req: Any, tokens: list[int], end: int, appended: int) -> bool:
        anchors = req.match_anchors
        if any(a is not None and a.dead for a in anchors):  # validateMatchState_: a cached node was evicted
            return False
        depth = self.depth
        for t in tokens[end - appended:end]:
            nd = min(len(anchors) + 1, depth)
            nxt: list[Node | None] = [None] * nd
            nxt[0] = self.root.kids.get(t)
            for d in range(1, nd):
                prev = anchors[d - 1]
                if prev is not None:
                    nxt[d] = prev.kids.get(t)
            anchors = nxt
        req.match_anchors = anchors
        req.match_processed = end
        return True

    # ------------------------------------------------------------------ drafting

    @staticmethod
    def _recent(node: Node) -> Iterator[tuple[int, Node]]:
        return reversed(node.kids.items())

    @staticmethod
    def _by_freq(node: Node, k: int) -> list[tuple[int, Node, int]]:
        kids = sorted(node.kids.values(), key=lambda c: (-c.freq, c.tok))[:k]
        return [(c.tok, c, c.freq) for c in kids]

    def draft(self, req: Any, tokens: list[int], end: int) -> Tree:
        anchors = self.anchors(req, tokens, end)
        cfg = self.config
        if self.prob:
            return build_prob(anchors, self._by_freq, cfg.draft_budget, cfg.max_bfs_breadth)
        return build_bfs(anchors, self._recent, cfg.draft_budget, self.scale, self.top_depth, cfg.min_bfs_breadth)

    def node_count(self) -> int:
        return self.config.capacity - 1 - self.free
