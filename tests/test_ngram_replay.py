"""n-gram replay: hand-computed cases, properties, and agreement with a slow reference written here.

The reference below transcribes SGLang 0.5.10's sources as plainly as possible, with no shortcut:
- jit_kernel/csrc/ngram_corpus/trie.cpp: Trie::insert, squeeze, match, buildRecency, buildFrequency
  (std::list as a Python list, front = index 0; std::priority_queue as libstdc++'s push_heap/pop_heap);
- result.cpp fillResult (BFS layout, zero padding, ancestor mask);
- sgl-kernel reconstruct_indices_from_tree_mask + VerifyTreeGreedy (first matching sibling by index);
- srt/speculative/ngram_worker.py: match all requests, verify, then insert each request's last
  max_trie_depth tokens.
"""

from __future__ import annotations

import random
from collections import deque

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simspec.errors import InputError
from simspec.ngram import NgramConfig, Sequence, replay

# ----------------------------------------------------------------------------------------- the reference


class RefNode:
    def __init__(self, token, parent):
        self.token = token
        self.parent = parent
        self.child = {}
        self.lru = []  # std::list<TrieNode*> lru: front (index 0) = most recently touched
        self.freq = 0


class RefTrie:
    def __init__(self, capacity, max_trie_depth):
        self.depth = max_trie_depth
        self.free = capacity - 1  # the root is one of the preallocated nodes
        self.root = RefNode(None, None)
        self.global_lru = []  # front = most recently used

    def insert(self, tokens):
        for i in range(len(tokens)):
            end = i + min(len(tokens) - i, self.depth)
            if end - i > self.free:
                self.squeeze(end - i - self.free)
            cursor = self.root
            path = []
            for token in tokens[i:end]:
                if token not in cursor.child:
                    node = RefNode(token, cursor)
                    cursor.child[token] = node
                    cursor.lru.insert(0, node)  # lru.emplace_front
                    self.global_lru.append(node)  # global_lru_.emplace_back
                    node.freq = 1
                    self.free -= 1
                else:
                    node = cursor.child[token]
                    node.freq += 1
                    cursor.lru.remove(node)  # lru.splice(lru.begin(), ...)
                    cursor.lru.insert(0, node)
                cursor = node
                path.append(node)
            for node in reversed(path):  # global_lru_.splice(begin, ...) in reverse path order
                self.global_lru.remove(node)
                self.global_lru.insert(0, node)

    def squeeze(self, count):
        for _ in range(count):
            last = self.global_lru.pop()
            assert not last.child, "SGLang throws: the node to release still has children"
            last.parent.lru.remove(last)
            del last.parent.child[last.token]
            self.free += 1

    def match(self, context):
        result = []
        for d in range(min(len(context), self.depth), 0, -1):
            cursor = self.root
            for token in context[len(context) - d:]:
                cursor = cursor.child.get(token)
                if cursor is None:
                    break
            if cursor is not None and cursor.child:
                result.append((cursor, d))
        return result


def ref_build_recency(trie, context, budget, min_bfs, max_bfs):
    anchors = trie.match(context)
    max_match_depth = max(1, trie.depth - 1)
    scale = float(max_bfs - min_bfs) / max_match_depth
    tree = [{} for _ in range(budget + 1)]  # std::vector<Node> tree(draft_token_num + 1)
    cursor = 1
    for node, depth in anchors:
        queue = deque([(0, (max_match_depth - depth) * scale + min_bfs, node)])
        while queue and cursor <= budget:
            parent, cur_breadth, tnode = queue.popleft()
            breadth = max(1, int(cur_breadth))
            i = 0
            while i < breadth and i < len(tnode.lru) and cursor <= budget:
                child = tnode.lru[i]
                if child.token in tree[parent]:
                    pos = tree[parent][child.token]
                else:
                    pos = cursor
                    tree[parent][child.token] = cursor
                    cursor += 1
                queue.append((pos, cur_breadth - scale, child))
                i += 1
    return tree


def _push_heap(c, value):  # libstdc++ __push_heap after push_back; comp(a, b) = a.prob < b.prob
    hole = len(c)
    c.append(value)
    parent = (hole - 1) // 2
    while hole > 0 and c[parent][2] < value[2]:
        c[hole] = c[parent]
        hole = parent
        parent = (hole - 1) // 2
    c[hole] = value


def _pop_heap(c):  # std::pop_heap + pop_back: __pop_heap / __adjust_heap / __push_heap
    if len(c) > 1:
        last = len(c) - 1
        value = c[last]
        c[last] = c[0]
        length, hole, second = last, 0, 0
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if c[second][2] < c[second - 1][2]:
                second -= 1
            c[hole] = c[second]
            hole = second
        if length % 2 == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            c[hole] = c[second - 1]
            hole = second - 1
        parent = (hole - 1) // 2
        while hole > 0 and c[parent][2] < value[2]:
            c[hole] = c[parent]
            hole = parent
            parent = (hole - 1) // 2
        c[hole] = value
    return c.pop()


def ref_build_frequency(trie, context, budget, max_bfs):
    anchors = trie.match(context)
    heap = []
    tree = [{} for _ in range(budget + 1)]
    cursor = 1

    def add_to_heap(parent, tnode, prob):
        ordered = sorted(tnode.child.values(), key=lambda n: (-n.freq, n.token))  # CompareByFreq
        top = ordered[:max_bfs]
        total = float(sum(n.freq for n in top)) or 1.0
        for n in top:
            _push_heap(heap, (parent, n, n.freq / total * prob))

    for node, _ in anchors:
        add_to_heap(0, node, 1.0)
        while heap and cursor <= budget:
            parent, tnode, prob = heap[0]
            _pop_heap(heap)
            if tnode.token in tree[parent]:
                pos = tree[parent][tnode.token]
            else:
                pos = cursor
                cursor += 1
                tree[parent][tnode.token] = pos
            add_to_heap(pos, tnode, prob)
    return tree


def ref_fill_result(last_token, n, tree):
    tokens, prevs = [last_token], [-1]
    queue = deque((tok, nxt, 0) for tok, nxt in tree[0].items())
    while queue:
        tok, nxt, prev = queue.popleft()
        tokens.append(tok)
        prevs.append(prev)
        for t, m in tree[nxt].items():
            queue.append((t, m, len(tokens) - 1))
    while len(tokens) < n:
        tokens.append(0)
        prevs.append(0)
    mask = [[0] * n for _ in range(n)]
    mask[0][0] = 1
    for i in range(n):
        if prevs[i] != -1:
            mask[i][: prevs[i] + 1] = mask[prevs[i]][: prevs[i] + 1]
        mask[i][i] = 1
    return tokens, mask


def ref_verify_greedy(tokens, mask, actual):
    """reconstruct_indices_from_tree_mask + VerifyTreeGreedy; `actual` = what the target produces next
    (the target's argmax is only ever read on the accepted path)."""
    n = len(tokens)
    next_token, next_sibling = [-1] * n, [-1] * n
    for tid in range(n):
        parent = next((i for i in range(tid - 1, -1, -1) if mask[tid][i]), -1)
        next_token[tid] = next((i for i in range(tid + 1, n) if mask[i][tid]), -1)
        if parent != -1:
            for i in range(tid + 1, n):
                if mask[i][parent] and not any(mask[i][parent + 1:i]):
                    next_sibling[tid] = i
                    break
    accepted, cur = 0, 0
    for _ in range(1, n):
        if accepted >= len(actual):
            break
        cur = next_token[cur]
        while cur != -1:
            if tokens[cur] == actual[accepted]:
                accepted += 1
                break
            cur = next_sibling[cur]
        if cur == -1:
            break
    return accepted


def ref_replay(seqs, n_draft, min_bfs, max_bfs, depth, match_type, capacity, concurrency):
    """Histogram per request (same order as seqs)."""
    trie = RefTrie(capacity, depth)
    waiting = list(enumerate(seqs))
    running = []
    hists = [[0] * n_draft for _ in seqs]
    while waiting or running:
        while len(running) < concurrency and waiting:
            i, (prompt, output) = waiting.pop(0)
            if len(output) > 1:
                running.append({"i": i, "ctx": list(prompt) + output[:1], "rest": list(output[1:])})
        trees = []
        for r in running:
            context = r["ctx"][-depth:]
            if match_type == "BFS":
                trees.append(ref_build_recency(trie, context, n_draft - 1, min_bfs, max_bfs))
            else:
                trees.append(ref_build_frequency(trie, context, n_draft - 1, max_bfs))
        for r, tree in zip(running, trees, strict=True):
            tokens, mask = ref_fill_result(r["ctx"][-1], n_draft, tree)
            k = ref_verify_greedy(tokens, mask, r["rest"])
            produced = min(k + 1, len(r["rest"]))  # a request stops at its last recorded token
            hists[r["i"]][produced - 1] += 1
            r["ctx"] += r["rest"][:produced]
            r["rest"] = r["rest"][produced:]
        for r in running:
            trie.insert(r["ctx"][-depth:])
        running = [r for r in running if r["rest"]]
    return hists


# ----------------------------------------------------------------------------------------- helpers


def hist_of(seqs, config, concurrency=1, engine="auto"):
    result = replay(seqs, config, concurrency, engine=engine)
    return [r.histogram for r in result.requests]


def first_step_k(result, request=0):
    """Drafts the first verify step of a request accepted, when it is that request's only step with k>0."""
    return [k for k, n in enumerate(result.requests[request].histogram) if n]


CHAIN = dict(min_bfs_breadth=1, max_bfs_breadth=1)
TREE = dict(min_bfs_breadth=1, max_bfs_breadth=10)

# ----------------------------------------------------------------------------------------- hand-computed cases


@pytest.mark.parametrize("engine", ["literal", "compiled"])
def test_hand_computed_cycle(engine):
    # max_trie_depth 3, 4 draft tokens (3 drafts), chain. Output 1 2 3 1 2 3 1 2 3 (1 from the prefill).
    # step 1: context [1], empty trie -> no draft, k=0; insert [1 2]: nodes 1-2, 2.
    # step 2: context [1 2]; "1 2" and "2" have no children -> k=0; insert [1 2 3]: 1-2-3, 2-3, 3.
    # step 3: context [1 2 3]; no suffix has children -> k=0; insert [2 3 1]: 2-3-1, 3-1, 1.
    # step 4: context ..2 3 1: only "1" has children (2, then 2-3): drafts 2,3 -> accepts 2 3, bonus 1 (k=2).
    # step 5: same drafts 2,3; only 2 tokens left: accepts 2, bonus 3 (k=1, as SGLang counts a finishing step).
    cfg = NgramConfig(num_draft_tokens=4, max_trie_depth=3, **CHAIN)
    result = replay([Sequence([1, 2, 3, 1, 2, 3, 1, 2, 3])], cfg, engine=engine)
    assert result.histogram == [3, 1, 1, 0]
    assert result.verify_steps == 5
    assert result.mean_accept_length == pytest.approx((3 * 1 + 2 + 3) / 5)
    r = result.requests[0]
    assert r.spec_accept_length == pytest.approx(9 / 5)  # SGLang's completion_tokens / spec_verify_ct
    assert ref_replay([((), [1, 2, 3, 1, 2, 3, 1, 2, 3])], 4, 1, 1, 3, "BFS", 10**6, 1) == [[3, 1, 1, 0]]


def test_hand_computed_prompt_tail_is_matched():
    # The prompt is never inserted at prefill, but it is the start of the matched context and of the first
    # inserted window. Request A inserts "7 8 9" (via its windows); B's prompt ends with 7, its first output
    # token is 8: context [.. 7 8] matches "7 8" -> drafts 9 (and the bonus).
    a = Sequence([7, 8, 9, 5], name="A")
    b = Sequence([8, 9, 6], prompt_ids=[3, 7], name="B")
    cfg = NgramConfig(num_draft_tokens=3, max_trie_depth=4)
    result = replay([a, b], cfg)
    # B: step 1 context [3 7 8]; "7 8" -> child 9, then 9 -> 5: drafts 9, 5; actual 9, 6: accept 9, bonus 6.
    assert result.requests[1].histogram == [0, 1, 0]
    # without A's text B has nothing to match
    assert replay([b], cfg).requests[0].histogram == [2, 0, 0]


@pytest.mark.parametrize("engine", ["literal", "compiled"])
def test_padding_token_zero_is_a_draft(engine):
    # result.cpp pads the tree with token 0 under the root: with an empty trie a target token 0 is accepted.
    cfg = NgramConfig(num_draft_tokens=4)
    assert replay([Sequence([7, 0, 9])], cfg, engine=engine).histogram == [0, 1, 0, 0]
    assert replay([Sequence([7, 5, 9])], cfg, engine=engine).histogram == [2, 0, 0, 0]
    # a full tree has no padding: with one draft token there is nothing to pad
    assert replay([Sequence([7, 0, 9])], NgramConfig(num_draft_tokens=1)).histogram == [2]


def _history_then_probe():
    # History: X is followed by a1, a2, a3 and, most recently, by "b c d". Probe: context ends "q X" (q new).
    X, b, c, d, e = 50, 60, 61, 62, 63
    history = [X, 1, 2, 3, X, 4, 5, 6, X, 11, 12, 13, X, b, c, d, 20, 21, 22]
    return X, b, c, d, e, history


def test_chain_reaches_deeper_with_the_same_budget():
    # Budget 3 drafts. Only "X" matches the probe's context (depth 1).
    # chain (breadth 1): X's most recent child b, then b's child c, then d -> drafts b c d; actual b c d e:
    #   accepts 3 (k=3).
    # tree (breadth 1..10): at depth 1 breadth int(16 * 9/17 + 1) = 9 -> X's children b, 11, 4 fill the
    #   budget at the first level -> accepts b only (k=1).
    X, b, c, d, e = _history_then_probe()[:5]
    history = _history_then_probe()[5]
    probe = Sequence([X, b, c, d, e], prompt_ids=[99])
    chain = replay([Sequence(history), probe], NgramConfig(num_draft_tokens=4, **CHAIN))
    tree = replay([Sequence(history), probe], NgramConfig(num_draft_tokens=4, **TREE))
    # tree, step 2: context ..X b c; "X b c" drafts d 20 21; actual d e -> accepts d, the last token (k=1).
    assert chain.requests[1].histogram == [0, 0, 0, 1]
    assert tree.requests[1].histogram == [0, 2, 0, 0]
    assert chain.requests[1].accept_length > tree.requests[1].accept_length


def test_tree_accepts_more_where_contexts_branch():
    # Same history, but the probe continues with X's second most recent continuation (11 12 ...):
    # chain drafts b c d -> k=0; tree drafts b, 11, 4 -> accepts 11 (k=1).
    X = 50
    history = _history_then_probe()[5]
    probe = Sequence([X, 11, 30, 31], prompt_ids=[99])
    chain = replay([Sequence(history), probe], NgramConfig(num_draft_tokens=4, **CHAIN))
    tree = replay([Sequence(history), probe], NgramConfig(num_draft_tokens=4, **TREE))
    # chain, step 2: "X 11" drafts 12 13 X, actual 30 -> k=0; step 3: "30" is new -> k=0.
    # tree, step 2: nothing ends in "11 30" -> k=0.
    assert chain.requests[1].histogram == [3, 0, 0, 0]
    assert tree.requests[1].histogram == [1, 1, 0, 0]
    assert tree.requests[1].accept_length > chain.requests[1].accept_length


def test_repetitive_text_accepts_more_than_random_tokens():
    rng = random.Random(0)
    phrase = [rng.randrange(1, 5000) for _ in range(40)]
    repetitive = Sequence(phrase * 8)
    noise = Sequence([rng.randrange(1, 5000) for _ in range(320)])
    cfg = NgramConfig()
    rep = replay([repetitive], cfg)
    rnd = replay([noise], cfg)
    assert rnd.mean_accept_length < 1.05
    assert rep.mean_accept_length > 3.0


@pytest.mark.parametrize("engine", ["literal", "compiled"])
def test_capacity_eviction_forgets_old_text(engine):
    # P (20 distinct tokens), 60 distinct filler tokens, P again. With room, the second P is drafted from the
    # first; with 200 nodes (each new token adds max_trie_depth nodes) the first P is evicted before it recurs,
    # and no step accepts anything.
    p = list(range(100, 120))
    filler = list(range(200, 260))
    seq = [Sequence(p + filler + p)]
    roomy = replay(seq, NgramConfig(max_trie_depth=4), engine=engine)
    tight = replay(seq, NgramConfig(max_trie_depth=4, capacity=200), engine=engine)
    assert roomy.accepted_drafts >= 10
    assert tight.accepted_drafts == 0
    assert tight.histogram[0] == tight.verify_steps == 99


def test_eviction_is_least_recently_used():
    # max_trie_depth 2, capacity 4 (3 nodes besides the root). Output 5 6 5 6 ...: after the first steps
    # the trie holds 5-6, 6-5 ... and must evict; the reference decides which node goes.
    seqs = [Sequence([5, 6, 5, 6, 7, 5, 6, 5, 6, 7, 5, 6])]
    for cap in (3, 4, 5, 6, 8):
        cfg = NgramConfig(num_draft_tokens=3, max_trie_depth=2, capacity=cap)
        expect = ref_replay([((), s.output_ids) for s in seqs], 3, 1, 10, 2, "BFS", cap, 1)
        assert hist_of(seqs, cfg, engine="literal") == expect
        assert hist_of(seqs, cfg, engine="compiled") == expect


def test_interleaved_requests_share_the_trie():
    # A writes P (no repetition of its own); B first writes 40 tokens of its own, then P. At concurrency 2, A
    # has inserted P's beginning by the time B reaches it, so B drafts from A's text; alone, B gets nothing.
    rng = random.Random(1)
    p = rng.sample(range(1000, 9000), 100)
    a = Sequence(p, name="A")
    b = Sequence(rng.sample(range(10000, 20000), 40) + p, name="B")
    cfg = NgramConfig()
    together = replay([a, b], cfg, concurrency=2)
    assert together.requests[0].accepted_drafts == 0  # A has nothing to match
    # B catches up with A through P at up to 11 drafts a step, then they go in lockstep
    assert together.requests[1].accepted_drafts >= 30
    assert replay([b], cfg).requests[0].accepted_drafts == 0
    assert together.batch_steps < together.verify_steps


def test_insertions_are_seen_only_at_the_next_step():
    # Two identical requests in lockstep: each step matches before either inserts, so each accepts exactly
    # what it accepts alone (the trie differs only in touch counts, which BFS does not read).
    rng = random.Random(2)
    phrase = [rng.randrange(1, 50) for _ in range(15)]
    a = Sequence(phrase * 4)
    alone = replay([a], NgramConfig()).requests[0].histogram
    both = replay([a, a], NgramConfig(), concurrency=2)
    assert [r.histogram for r in both.requests] == [alone, alone]


def test_finished_at_prefill_and_empty_outputs():
    result = replay([Sequence([]), Sequence([4]), Sequence([4, 5])], NgramConfig())
    assert [r.verify_steps for r in result.requests] == [0, 0, 1]
    assert result.requests[0].to_dict()["accept_length"] is None
    assert result.verify_steps == 1


def test_version_0523_inserts_one_step_late():
    # A token loop 5 5 5 ...: 0.5.10 inserts what a step accepted before the next match; 0.5.23 (overlap
    # scheduling) inserts the context it matched with, so the loop's own tokens reach the trie a step later.
    # step 1 (both): context [5], empty trie -> k=0.
    # 0.5.10: insert [5 5]; step 2 matches "5" -> child 5: drafts 5 (then 5-5 has no child) -> k=1 ...
    # 0.5.23: insert [5] (the context of step 1); step 2: "5" has no child -> k=0.
    seq = [Sequence([5] * 8)]
    cfg10 = NgramConfig(num_draft_tokens=4, max_trie_depth=4)
    cfg23 = cfg10.with_(sglang_version="0.5.23")
    r10 = replay(seq, cfg10)
    r23 = replay(seq, cfg23)
    assert r10.requests[0].histogram[0] == 1
    assert r23.requests[0].histogram[0] == 2
    assert r23.mean_accept_length < r10.mean_accept_length
    assert r23.notes


def test_0523_match_state_grows_one_depth_per_token():
    # 0.5.23 Trie::match advances each request's cached anchors by the tokens appended since its last match: a
    # depth it did not find then can only come back one token deeper. A request matched "7 8" on an empty trie
    # (nothing found); another request then inserts "7 8 9 5"; the first, now at "7 8 9", finds only the depth-1
    # anchor "9" (its depth-1 and depth-2 anchors were empty), where 0.5.10 re-walks every depth and finds all three.
    from types import SimpleNamespace

    from simspec.ngram.literal import LiteralTrie

    depths = {}
    for version in ("0.5.10", "0.5.23"):
        trie = LiteralTrie(NgramConfig(max_trie_depth=4, sglang_version=version))
        me, other = SimpleNamespace(), SimpleNamespace()
        trie.begin(me)
        trie.begin(other)
        assert trie.anchors(me, [7, 8, 9], 2) == []
        trie.insert(other, [7, 8, 9, 5], 4)
        depths[version] = [d for _, d in trie.anchors(me, [7, 8, 9], 3)]
    assert depths == {"0.5.10": [3, 2, 1], "0.5.23": [1]}


def test_058_matches_windows_and_always_uses_bfs():
    seqs = [Sequence([1, 2, 3, 4] * 10)]
    r = replay(seqs, NgramConfig(sglang_version="0.5.8", match_type="PROB"))
    assert any("0.5.8" in n for n in r.notes)
    assert r.histogram == replay(seqs, NgramConfig(sglang_version="0.5.8")).histogram
    with pytest.raises(InputError, match="max_match_window_size"):
        NgramConfig(sglang_version="0.5.8", max_trie_depth=12)


# ----------------------------------------------------------------------------------------- configuration


@pytest.mark.parametrize(("kwargs", "key"), [
    (dict(num_draft_tokens=0), "num_draft_tokens"),
    (dict(num_draft_tokens=-3), "num_draft_tokens"),
    (dict(min_bfs_breadth=3, max_bfs_breadth=2), "min_bfs_breadth"),
    (dict(min_bfs_breadth=0), "min_bfs_breadth"),
    (dict(max_trie_depth=1), "max_trie_depth"),
    (dict(match_type="DFS"), "match_type"),
    (dict(capacity=18), "capacity"),
    (dict(sglang_version="0.4.0"), "sglang_version"),
    (dict(num_draft_tokens=2.5), "num_draft_tokens"),
])
def test_config_rejects_what_sglang_rejects(kwargs, key):
    with pytest.raises(InputError) as err:
        NgramConfig(**kwargs)
    assert err.value.key == key


def test_config_from_ngram_settings():
    from simspec.scenario.schema import NgramSettings

    cfg = NgramConfig.from_settings(NgramSettings(max_bfs_breadth=4, match_type="PROB"), num_draft_tokens=6)
    assert (cfg.max_bfs_breadth, cfg.match_type, cfg.num_draft_tokens, cfg.max_trie_depth) == (4, "PROB", 6, 18)


def test_replay_rejects_bad_arguments():
    with pytest.raises(InputError, match="concurrency"):
        replay([Sequence([1, 2])], NgramConfig(), concurrency=0)
    with pytest.raises(InputError, match="token ids"):
        replay([Sequence([1, -2])], NgramConfig())
    with pytest.raises(InputError, match="engine"):
        replay([Sequence([1, 2])], NgramConfig(), engine="fast")


def test_engine_choice():
    # numba is a dependency: auto takes the compiled engine for every configuration
    for cfg in (NgramConfig(), NgramConfig(match_type="PROB"), NgramConfig(capacity=100),
                NgramConfig(sglang_version="0.5.23"), NgramConfig(sglang_version="0.5.8")):
        assert replay([Sequence([1, 2])], cfg).engine == "compiled"
    assert replay([Sequence([1, 2])], NgramConfig(), engine="literal").engine == "literal"


# ----------------------------------------------------------------------------------------- against the reference


@st.composite
def cases(draw):
    vocab = draw(st.integers(1, 6))
    n_seq = draw(st.integers(1, 4))
    seqs = []
    for _ in range(n_seq):
        length = draw(st.integers(0, 40))
        out: list[int] = []
        while len(out) < length:
            if out and draw(st.booleans()):
                a = draw(st.integers(0, len(out) - 1))
                out.extend(out[a:a + draw(st.integers(1, 6))])  # repeat something: matches happen
            else:
                out.append(draw(st.integers(0, vocab)))
        prompt = draw(st.lists(st.integers(0, vocab), max_size=5))
        seqs.append((prompt, out[:length]))
    depth = draw(st.integers(2, 6))
    n_draft = draw(st.integers(1, 8))
    min_bfs = draw(st.integers(1, 3))
    max_bfs = draw(st.integers(min_bfs, 6))
    match_type = draw(st.sampled_from(["BFS", "PROB"]))
    capacity = draw(st.one_of(st.integers(depth + 1, depth + 30), st.just(10**6)))
    concurrency = draw(st.integers(1, 3))
    return seqs, depth, n_draft, min_bfs, max_bfs, match_type, capacity, concurrency


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_agrees_with_the_reference(case):
    seqs, depth, n_draft, min_bfs, max_bfs, match_type, capacity, concurrency = case
    expect = ref_replay(seqs, n_draft, min_bfs, max_bfs, depth, match_type, capacity, concurrency)
    cfg = NgramConfig(num_draft_tokens=n_draft, min_bfs_breadth=min_bfs, max_bfs_breadth=max_bfs,
                      max_trie_depth=depth, match_type=match_type, capacity=capacity)
    sequences = [Sequence(out, prompt_ids=prompt) for prompt, out in seqs]
    assert hist_of(sequences, cfg, concurrency, engine="literal") == expect
    assert hist_of(sequences, cfg, concurrency, engine="compiled") == expect


@settings(max_examples=120, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cases(), st.sampled_from(["0.5.8", "0.5.23"]), st.data())
def test_compiled_engine_agrees_with_the_literal_one_on_other_versions(case, version, data):
    # The reference transcribes 0.5.10; for 0.5.8 (match windows, no short-suffix insertion) and 0.5.23
    # (incremental MatchState, whose cached anchors die with evicted nodes, and lagged insertion) the compiled
    # engine is held to the literal one, request by request, the batch steps included.
    seqs, depth, n_draft, min_bfs, max_bfs, match_type, capacity, concurrency = case
    windows = {}
    if version == "0.5.8":
        hi = data.draw(st.integers(1, depth - 1))
        windows = {"max_match_window_size": hi, "min_match_window_size": data.draw(st.integers(1, hi))}
    cfg = NgramConfig(num_draft_tokens=n_draft, min_bfs_breadth=min_bfs, max_bfs_breadth=max_bfs,
                      max_trie_depth=depth, match_type=match_type, capacity=capacity, sglang_version=version,
                      **windows)
    sequences = [Sequence(out, prompt_ids=prompt) for prompt, out in seqs]
    literal = replay(sequences, cfg, concurrency, engine="literal")
    compiled = replay(sequences, cfg, concurrency, engine="compiled")
    assert [r.histogram for r in compiled.requests] == [r.histogram for r in literal.requests]
    assert compiled.batch_steps == literal.batch_steps
    assert compiled.notes == literal.notes


def test_engines_agree_on_a_larger_corpus():
    # a few thousand tokens of Markov text with copied spans, eviction included
    rng = random.Random(5)
    succ = {t: [rng.randrange(60) for _ in range(3)] for t in range(60)}
    seqs = []
    for _ in range(6):
        out = [rng.randrange(60)]
        while len(out) < 500:
            if rng.random() < 0.05:
                a = rng.randrange(len(out))
                out.extend(out[a:a + rng.randint(3, 25)])
            else:
                out.append(rng.choice(succ[out[-1]]))
        seqs.append(Sequence(out[:500], prompt_ids=[rng.randrange(60) for _ in range(20)]))
    for concurrency in (1, 3):
        for capacity in (10**6, 2000):  # 2,000 nodes: eviction all the time
            for match_type, version in (("BFS", "0.5.10"), ("PROB", "0.5.10"), ("BFS", "0.5.23")):
                cfg = NgramConfig(capacity=capacity, match_type=match_type, sglang_version=version)
                assert hist_of(seqs, cfg, concurrency, "literal") == hist_of(seqs, cfg, concurrency, "compiled")


def test_compiled_engine_edges_agree_with_the_literal_one():
    # PROB's heap outgrowing its first allocation (one node with 29 children, each seen 20 times), token ids at
    # the int32 limit SGLang hands the trie (the compiled engine packs (parent, token) into one key), and a
    # concurrency far above the number of requests
    from simspec.ngram.config import MAX_TOKEN_ID

    wide = [Sequence([0] * 20 + [t]) for t in range(1, 30)] + [Sequence([0] * 40 + [5])]
    top = [Sequence([MAX_TOKEN_ID, MAX_TOKEN_ID - 1, 0, MAX_TOKEN_ID] * 12)]
    for seqs, cfg, conc in ((wide, NgramConfig(match_type="PROB"), 1),
                            (wide, NgramConfig(match_type="PROB", num_draft_tokens=64), 1),
                            (top, NgramConfig(), 1), (top * 3, NgramConfig(), 10**12)):
        assert hist_of(seqs, cfg, conc, "literal") == hist_of(seqs, cfg, conc, "compiled")
    assert replay(top, NgramConfig()).accepted_drafts > 0


@settings(max_examples=60, derandomize=True, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(1, 400)), max_size=300))
def test_compiled_engine_hash_table_behaves_like_a_dict(ops):
    # (parent, token) -> child: puts, deletes (backward shift, no tombstones) and growth, against a dict
    import numpy as np

    from simspec.ngram.compiled import _ht_delete, _ht_find, _ht_grown, _ht_put, new_table

    ht, shift, model = new_table(8), 61, {}
    for put, key in ops:
        if put and key not in model:
            if 2 * (len(model) + 1) > ht.shape[0]:
                ht, shift = _ht_grown(ht, shift), shift - 1
            _ht_put(ht, np.int64(key), np.int64(-key), shift)
            model[key] = -key
        elif not put and key in model:
            _ht_delete(ht, np.int64(key), shift)
            del model[key]
        for probe in (key, key + 1):
            assert _ht_find(ht, np.int64(probe), shift) == model.get(probe, -1)
    assert sorted(int(k) for k in ht[:, 0] if k) == sorted(model)
