"""Building one request's draft tree from its suffix anchors, and greedy verification against what came next.

A draft tree is a list of dicts: `tree[i]` maps a token to the index of that child of node i; node 0 is the
root (the request's last token). Only the tree's shape matters for acceptance: SGLang's fillResult
(result.cpp) lays it out breadth-first from unordered_maps, but the verify walks children by token.

Sources (SGLang 0.5.10, sglang/jit_kernel/csrc/ngram_corpus/; 0.5.8 and 0.5.23 are the same here):
- trie.cpp Trie::buildRecency (match_type BFS): anchors longest first, one FIFO queue per anchor, each entry
  (tree parent, breadth, trie node); a node's first `max(1, int(breadth))` children in recency order (its
  `lru` list, most recently touched first) are merged into the tree under the parent (an existing token is
  reused without spending budget), and queued with `breadth - scale`. Stops when `draft_token_num - 1`
  nodes besides the root exist.
- trie.cpp Trie::buildFrequency (match_type PROB): one std::priority_queue shared by all anchors, keyed by
  path probability; a node pushes its top `max_bfs_breadth` children by frequency (sorted_children: freq
  descending, then token ascending) with probability freq / (sum of those children's freq) x the node's own.
  Ties between equal probabilities are broken exactly as libstdc++'s push_heap/pop_heap break them, so the
  heap below reimplements those two algorithms (bits/stl_heap.h).
- result.cpp fillResult: pads to draft_token_num nodes with token 0, each a child of the root.
- sgl-kernel speculative/eagle_utils.cu VerifyTreeGreedy (+ ngram_utils.cu reconstruct_indices_from_tree_mask):
  from the root, follow the child (siblings in index order) whose token is the target's argmax, up to
  draft_token_num - 1 accepted drafts. Padding nodes come after every real node, so a real root child with
  token 0 is tried first; otherwise a target token 0 is accepted by a padding node (one draft, no children).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

Tree = list[dict[int, int]]


def bfs_breadth_params(config: Any) -> tuple[float, int]:
    """(scale, top depth): a node matched at depth d starts with breadth (top - d) * scale + min_bfs_breadth.

    0.5.10 / 0.5.23 (trie.cpp buildRecency): top = max(1, max_trie_depth - 1), scale = (max - min) / top.
    0.5.8 (ngram.cpp matchBFS): top = max_match_window_size, scale = (max - min) / (max_w - min_w + 1).
    """
    spread = float(config.max_bfs_breadth - config.min_bfs_breadth)
    if config.sglang_version == "0.5.8":
        return spread / (config.max_match_window_size - config.min_match_window_size + 1), \
            config.max_match_window_size
    top = max(1, config.max_trie_depth - 1)
    return spread / top, top


def build_bfs(anchors: Iterable[tuple[Any, int]], recent_children: Callable[[Any], Iterable[tuple[int, Any]]],
              budget: int, scale: float, top_depth: int, min_bfs: int) -> Tree:
    """Trie::buildRecency. `recent_children(node)` yields (token, child) most recently touched first."""
    tree: Tree = [{}]
    cursor = 1  # index the next new tree node gets; `cursor <= budget` while there is room
    for node, depth in anchors:
        if cursor > budget:
            break
        queue = deque(((0, (top_depth - depth) * scale + min_bfs, node),))
        while queue and cursor <= budget:
            parent, cur, tnode = queue.popleft()
            breadth = int(cur)  # int32_t(double): truncation toward zero
            if breadth < 1:
                breadth = 1
            taken = 0
            nxt = tree[parent]
            nb = cur - scale
            for tok, child in recent_children(tnode):
                if taken >= breadth or cursor > budget:
                    break
                pos = nxt.get(tok)
                if pos is None:
                    pos = cursor
                    nxt[tok] = pos
                    tree.append({})
                    cursor += 1
                queue.append((pos, nb, child))
                taken += 1
    return tree


# ---------------------------------------------------------------------------- libstdc++'s binary heap
# std::priority_queue<tuple<double parent, const TrieNode*, double prob>, vector, CompareByLastDouble>:
# comp(a, b) = a.prob < b.prob, top() is the front. Entries here are (prob, parent, node).


def _sift_up(h: list, hole: int, value: tuple) -> None:
    """__push_heap(first, hole, 0, value): move `value` up from `hole` to where its key belongs."""
    vp = value[0]
    while hole > 0:
        parent = (hole - 1) // 2
        if not h[parent][0] < vp:
            break
        h[hole] = h[parent]
        hole = parent
    h[hole] = value


def _heap_push(h: list, value: tuple) -> None:
    """push_back + std::push_heap -> __push_heap(first, len - 1, 0, value)."""
    h.append(value)
    _sift_up(h, len(h) - 1, value)


def _heap_pop(h: list) -> tuple:
    """front() + std::pop_heap + pop_back: __pop_heap -> __adjust_heap(first, 0, len - 1, last) -> __push_heap."""
    top = h[0]
    n = len(h)
    if n > 1:
        value = h[n - 1]
        h[n - 1] = h[0]
        length = n - 1
        hole = 0
        second = 0
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if h[second][0] < h[second - 1][0]:
                second -= 1
            h[hole] = h[second]
            hole = second
        if (length & 1) == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            h[hole] = h[second - 1]
            hole = second - 1
        _sift_up(h, hole, value)
    h.pop()
    return top


def build_prob(anchors: Iterable[tuple[Any, int]], freq_children: Callable[[Any, int], list[tuple[int, Any, int]]],
               budget: int, top_k: int) -> Tree:
    """Trie::buildFrequency. `freq_children(node, k)` -> its first k children by (freq desc, token asc) as
    (token, child, freq)."""
    tree: Tree = [{}]
    cursor = 1
    heap: list = []  # declared once, outside the anchor loop, as in trie.cpp

    def add(parent: int, tnode: Any, prob: float) -> None:
        kids = freq_children(tnode, top_k)
        total = 0.0
        for _tok, _child, freq in kids:
            total += float(freq)
        if total <= 0:
            total = 1.0
        for tok, child, freq in kids:
            _heap_push(heap, (float(freq) / total * prob, parent, child, tok))

    for node, _depth in anchors:
        add(0, node, 1.0)
        while heap and cursor <= budget:
            prob, parent, child, tok = _heap_pop(heap)
            nxt = tree[parent]
            pos = nxt.get(tok)
            if pos is None:
                pos = cursor
                nxt[tok] = pos
                tree.append({})
                cursor += 1
            add(pos, child, prob)
    return tree


def accepted_drafts(tree: Tree, tokens: list[int], start: int, end: int, num_draft_tokens: int) -> int:
    """Drafts greedy verification accepts when the target then produces tokens[start:end] (VerifyTreeGreedy)."""
    node = 0
    k = 0
    limit = min(num_draft_tokens - 1, end - start)
    while k < limit:
        nxt = tree[node].get(tokens[start + k])
        if nxt is None:
            break
        node = nxt
        k += 1
    if k == 0 and limit > 0 and len(tree) < num_draft_tokens and tokens[start] == 0:
        # result.cpp fillResult pads with token 0 under the root; such a node is a valid one-token draft
        # (the real root children come first, and none has token 0 here, or it would have matched above).
        k = 1
    return k
