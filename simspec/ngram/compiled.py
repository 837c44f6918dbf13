"""The compiled engine: simspec.ngram.literal's trie and replay loop in flat arrays, compiled by numba.

Same state and the same order of operations as the literal engine (SGLang's Trie::insert / squeeze / match /
buildRecency / buildFrequency and VerifyTreeGreedy, every version and match type), so it gives exactly its
answers (the tests check it against the literal engine and an independent transcription of SGLang's source).
Only the representation differs:

- a node is a row of one int64 array (token, parent, touch count, sibling and LRU links: 64 bytes, one cache
  line); an evicted node's row is reused, and a per-row generation counter tells a 0.5.23 MatchState that
  its cached anchor died (validateMatchState_);
- each node's children form a doubly linked list, most recently touched first (trie.h's per-node `lru`),
  and one open-addressing hash table maps (parent, token) to the child (SGLang: an unordered_map per node);
  the list head is checked before the table, since re-walking last step's paths finds it there;
- the global LRU (global_lru_) is a doubly linked list through all nodes, most recent at the head.

Why compiled: an insertion walks max_trie_depth * (max_trie_depth + 1) / 2 nodes per request and step, as
SGLang does; in Python that costs ~60 us per replayed token, here ~10 us (benchmarks/ngram_speed.py; most of
it is memory latency: drafting reads trie nodes last touched long ago). numba compiles the loop the first
time it runs in a fresh environment (~20 s) and caches the machine code on disk.
"""

from __future__ import annotations

import numpy as np

try:  # numba is a dependency; the import is guarded so that a platform without it still replays (slowly)
    import numba

    _njit = numba.njit(cache=True)
    AVAILABLE = True
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None
    AVAILABLE = False

    def _njit(f):  # type: ignore[no-untyped-def]
        return f

_VERSION_CODE = {"0.5.8": 0, "0.5.10": 1, "0.5.23": 2}
_HASH_MUL = -7046029254386353131  # 0x9E3779B97F4A7C15 (Fibonacci hashing) as a signed 64-bit integer
# the columns of a node's row
TOK = 0  # its token
PAR = 1  # its parent
FREQ = 2  # 1 when created, +1 each time an insertion walks through it (PROB's key)
KHEAD = 3  # its most recently touched child, -1 if none
KNEXT = 4  # next older sibling
KPREV = 5  # next newer sibling
LNEXT = 6  # global LRU: toward less recent
LPREV = 7  # global LRU: toward more recent


# ---------------------------------------------------------------------------- (parent, token) -> child


# One open-addressing table (linear probing) for the whole trie: rows (key, child), key = (parent << 31 | token)
# + 1 so that 0 marks an empty slot; the slot is the top bits of key * _HASH_MUL (`shift` = 64 - log2 slots).


@_njit
def _ht_find(ht, key, shift):
    mask = ht.shape[0] - 1
    i = ((key * _HASH_MUL) >> shift) & mask
    while True:
        k = ht[i, 0]
        if k == key:
            return ht[i, 1]
        if k == 0:
            return -1
        i = (i + 1) & mask


@_njit
def _child(nodes, ht, parent, token, shift):
    """The child of `parent` for `token`, or -1. The most recently touched child, the usual answer when an
    insertion re-walks the paths of the previous step, and a leaf's empty list are settled without reading
    the table (whose slots are scattered over memory)."""
    head = nodes[parent, KHEAD]
    if head < 0:
        return -1
    if nodes[head, TOK] == token:
        return head
    return _ht_find(ht, (np.int64(parent) << 31 | token) + 1, shift)


@_njit
def _ht_put(ht, key, val, shift):
    mask = ht.shape[0] - 1
    i = ((key * _HASH_MUL) >> shift) & mask
    while ht[i, 0] != 0:
        i = (i + 1) & mask
    ht[i, 0] = key
    ht[i, 1] = val


@_njit
def _ht_delete(ht, key, shift):
    """Backward-shift deletion (no tombstones)."""
    mask = ht.shape[0] - 1
    i = ((key * _HASH_MUL) >> shift) & mask
    while ht[i, 0] != key:
        i = (i + 1) & mask
    j = i
    while True:
        j = (j + 1) & mask
        kj = ht[j, 0]
        if kj == 0:
            break
        ideal = ((kj * _HASH_MUL) >> shift) & mask
        # leave entry j where it is if its ideal slot lies cyclically in (i, j]
        if i <= j:
            stays = i < ideal <= j
        else:
            stays = ideal > i or ideal <= j
        if stays:
            continue
        ht[i, 0] = kj
        ht[i, 1] = ht[j, 1]
        i = j
    ht[i, 0] = 0


def new_table(slots: int) -> np.ndarray:
    """An empty table, allocated by numpy rather than inside compiled code: numpy asks the kernel for huge pages
    for large arrays, and without them the random slot reads of a table of millions of nodes miss the TLB."""
    return np.zeros((slots, 2), np.int64)


@_njit
def _ht_grown(ht, shift):
    """The table at twice the size (its shift is one less)."""
    slots = ht.shape[0] * 2
    with numba.objmode(out="int64[:, :]"):
        out = new_table(slots)
    for i in range(ht.shape[0]):
        if ht[i, 0] != 0:
            _ht_put(out, ht[i, 0], ht[i, 1], shift - 1)
    return out


# ---------------------------------------------------------------------------- libstdc++'s binary heap
# std::priority_queue's push and pop (bits/stl_heap.h __push_heap, __pop_heap -> __adjust_heap), on heap[0:n]
# holding item indices ordered by key[item], largest in front: the same tie order as SGLang's buildFrequency.


@_njit
def _sift_up(heap, hole, key, item):
    """__push_heap(first, hole, 0, item): move `item` up from `hole` to where its key belongs."""
    v = key[item]
    while hole > 0:
        up = (hole - 1) // 2
        if not key[heap[up]] < v:
            break
        heap[hole] = heap[up]
        hole = up
    heap[hole] = item


@_njit
def _heap_push(heap, n, key, item):
    """push_back(item) + std::push_heap on heap[0:n]."""
    _sift_up(heap, n, key, item)


@_njit
def _heap_pop(heap, n, key):
    """front() + std::pop_heap + pop_back on heap[0:n] (n >= 1): returns the front item."""
    top = heap[0]
    if n > 1:
        value = heap[n - 1]
        length = n - 1
        hole = 0
        second = 0
        while second < (length - 1) // 2:
            second = 2 * (second + 1)
            if key[heap[second]] < key[heap[second - 1]]:
                second -= 1
            heap[hole] = heap[second]
            hole = second
        if (length & 1) == 0 and second == (length - 2) // 2:
            second = 2 * (second + 1)
            heap[hole] = heap[second - 1]
            hole = second - 1
        _sift_up(heap, hole, key, value)
    return top


@_njit
def _tree_child(t_par, t_tok, size, parent, token):
    """The draft-tree node under `parent` with `token` among nodes 1 .. size - 1, or -1 (a tree has at most
    num_draft_tokens nodes: a scan beats a map)."""
    for x in range(1, size):
        if t_par[x] == parent and t_tok[x] == token:
            return x
    return -1


# ---------------------------------------------------------------------------- the replay


@_njit
def _replay(nodes, toks, starts, prompt_len, n_draft, min_bfs, max_bfs, depth_max, prob, capacity, version,
            min_w, max_w, scale, top_depth, concurrency):
    max_nodes = nodes.shape[0]
    n_req = prompt_len.shape[0]
    budget = n_draft - 1
    lag = version == 2

    # ---- nodes (index 0 is the root): one 64-byte row each, so that touching a node reads one cache line
    ngen = np.zeros(max_nodes, np.int32)  # bumped at eviction
    free_ids = np.empty(max_nodes, np.int32)
    n_free_ids = 0
    n_alloc = 1
    nodes[0, TOK] = -1
    nodes[0, PAR] = -1
    nodes[0, FREQ] = 0
    nodes[0, KHEAD] = -1
    lru_head = -1
    lru_tail = -1
    free = capacity - 1
    ht = np.zeros((1 << 12, 2), np.int64)
    ht_shift = 64 - 12
    ht_count = 0

    # ---- results
    hist = np.zeros(n_draft, np.int64)
    req_steps = np.zeros(n_req, np.int64)
    req_acc = np.zeros(n_req, np.int64)
    req_hist = np.zeros((n_req, n_draft), np.int64)
    batch_steps = 0

    # ---- per-request state
    req_end = np.zeros(n_req, np.int64)
    req_match_end = np.zeros(n_req, np.int64)
    # 0.5.23 MatchState: epoch, processed, anchors (node, generation) per depth
    m_epoch = np.zeros(n_req, np.int64)
    m_processed = np.zeros(n_req, np.int64)
    m_count = np.zeros(n_req, np.int64)
    m_node = np.full((n_req if lag else 1, depth_max), -1, np.int32)
    m_gen = np.zeros((n_req if lag else 1, depth_max), np.int32)
    nxt_node = np.full(depth_max, -1, np.int32)
    nxt_gen = np.zeros(depth_max, np.int32)

    # ---- scratch for drafting
    anc_node = np.empty(depth_max + 1, np.int32)
    anc_depth = np.empty(depth_max + 1, np.int64)
    t_tok = np.empty(n_draft, np.int64)
    t_par = np.empty(n_draft, np.int64)
    q_cap = 4 * (n_draft + max_bfs) + 16
    q_par = np.empty(q_cap, np.int64)
    q_br = np.empty(q_cap, np.float64)
    q_node = np.empty(q_cap, np.int32)
    heap = np.empty(q_cap, np.int64)
    e_prob = np.empty(q_cap, np.float64)
    e_par = np.empty(q_cap, np.int64)
    e_node = np.empty(q_cap, np.int64)
    e_tok = np.empty(q_cap, np.int64)
    path = np.empty(depth_max, np.int32)
    sort_keys = np.empty(64, np.int64)

    running = np.empty(concurrency, np.int64)
    ks = np.empty(concurrency, np.int64)
    n_run = 0
    pending = 0

    while pending < n_req or n_run > 0:
        while n_run < concurrency and pending < n_req:
            r = pending
            pending += 1
            if starts[r + 1] - starts[r] - prompt_len[r] <= 1:  # finished at prefill: never verified
                continue
            req_end[r] = starts[r] + prompt_len[r] + 1  # absolute index into toks
            running[n_run] = r
            n_run += 1
        if n_run == 0:
            break
        batch_steps += 1

        # -------------------------------------------------------- draft + verify, against the trie as it stands
        for slot in range(n_run):
            r = running[slot]
            base = starts[r]
            end = req_end[r]
            total = starts[r + 1]
            rel_end = end - base

            # anchors: (node, depth), longest first
            n_anc = 0
            if version == 1:
                top = rel_end if rel_end < depth_max else depth_max
                for d in range(top, 0, -1):
                    cur = 0
                    for p in range(end - d, end):
                        cur = _child(nodes, ht, cur, toks[p], ht_shift)
                        if cur < 0:
                            break
                    if cur >= 0 and nodes[cur, KHEAD] >= 0:
                        anc_node[n_anc] = cur
                        anc_depth[n_anc] = d
                        n_anc += 1
            elif version == 0:
                hi = rel_end if rel_end < max_w else max_w
                for d in range(hi, min_w - 1, -1):
                    cur = 0
                    for p in range(end - d, end):
                        cur = _child(nodes, ht, cur, toks[p], ht_shift)
                        if cur < 0:
                            break
                    if cur >= 0:
                        anc_node[n_anc] = cur
                        anc_depth[n_anc] = d
                        n_anc += 1
            else:
                tail_len = rel_end if rel_end < depth_max else depth_max
                processed = m_processed[r]
                appended = rel_end - processed if rel_end >= processed else 0
                cnt = m_count[r]
                lim = processed if processed < depth_max else depth_max
                advanced = False
                if m_epoch[r] == 1 and rel_end >= processed and appended <= tail_len and cnt == lim:
                    alive = True
                    for d in range(cnt):
                        a = m_node[r, d]
                        if a >= 0 and ngen[a] != m_gen[r, d]:
                            alive = False
                            break
                    if alive:
                        for p in range(end - appended, end):
                            t = toks[p]
                            nd = cnt + 1 if cnt + 1 < depth_max else depth_max
                            c = _child(nodes, ht, 0, t, ht_shift)
                            nxt_node[0] = c
                            nxt_gen[0] = ngen[c] if c >= 0 else 0
                            for d in range(1, nd):
                                prev = m_node[r, d - 1]
                                c = -1
                                if prev >= 0:
                                    c = _child(nodes, ht, prev, t, ht_shift)
                                nxt_node[d] = c
                                nxt_gen[d] = ngen[c] if c >= 0 else 0
                            for d in range(nd):
                                m_node[r, d] = nxt_node[d]
                                m_gen[r, d] = nxt_gen[d]
                            cnt = nd
                        m_count[r] = cnt
                        m_processed[r] = rel_end
                        advanced = True
                if not advanced:  # rebuildMatchState_: every depth of the tail, leaves included
                    for d in range(1, tail_len + 1):
                        cur = 0
                        for p in range(end - d, end):
                            cur = _child(nodes, ht, cur, toks[p], ht_shift)
                            if cur < 0:
                                break
                        m_node[r, d - 1] = cur
                        m_gen[r, d - 1] = ngen[cur] if cur >= 0 else 0
                    m_count[r] = tail_len
                    m_epoch[r] = 1
                    m_processed[r] = rel_end
                for d in range(m_count[r], 0, -1):
                    a = m_node[r, d - 1]
                    if a >= 0 and ngen[a] == m_gen[r, d - 1] and nodes[a, KHEAD] >= 0:
                        anc_node[n_anc] = a
                        anc_depth[n_anc] = d
                        n_anc += 1

            # the draft tree (t_tok/t_par of nodes 1 .. cursor - 1; node 0 is the root)
            cursor = 1
            if not prob:  # Trie::buildRecency
                for ai in range(n_anc):
                    if cursor > budget:
                        break
                    qh = 0
                    qt = 1
                    q_par[0] = 0
                    q_br[0] = (top_depth - anc_depth[ai]) * scale + min_bfs
                    q_node[0] = anc_node[ai]
                    while qh < qt and cursor <= budget:
                        parent = q_par[qh]
                        cur_b = q_br[qh]
                        tnode = q_node[qh]
                        qh += 1
                        breadth = int(cur_b)  # int32_t(double): truncation toward zero
                        if breadth < 1:
                            breadth = 1
                        taken = 0
                        nb = cur_b - scale
                        c = nodes[tnode, KHEAD]
                        while c >= 0:
                            if taken >= breadth or cursor > budget:
                                break
                            tok = nodes[c, TOK]
                            pos = _tree_child(t_par, t_tok, cursor, parent, tok)
                            if pos < 0:
                                pos = cursor
                                t_tok[pos] = tok
                                t_par[pos] = parent
                                cursor += 1
                            if qt == q_par.shape[0]:
                                q_par = np.concatenate((q_par, np.empty(qt, np.int64)))
                                q_br = np.concatenate((q_br, np.empty(qt, np.float64)))
                                q_node = np.concatenate((q_node, np.empty(qt, np.int32)))
                            q_par[qt] = pos
                            q_br[qt] = nb
                            q_node[qt] = c
                            qt += 1
                            taken += 1
                            c = nodes[c, KNEXT]
            else:  # Trie::buildFrequency: one libstdc++ binary heap shared by all anchors
                # heap entries (probability, tree parent, trie node, token) live in e_*; the heap holds their
                # indices, ordered by e_prob as std::priority_queue<..., CompareByLastDouble> orders them
                hn = 0
                n_ent = 0
                for ai in range(n_anc):
                    # add(0, anchor, 1.0), then pop while there is budget; add(pos, child, prob) after each pop
                    a_par = 0
                    a_node = anc_node[ai]
                    a_prob = 1.0
                    while True:
                        # -- add: the node's first max_bfs children by (freq desc, token asc)
                        m = 0
                        c = nodes[a_node, KHEAD]
                        while c >= 0:
                            m += 1
                            c = nodes[c, KNEXT]
                        if m > sort_keys.shape[0]:
                            sort_keys = np.empty(2 * m, np.int64)
                        c = nodes[a_node, KHEAD]
                        i = 0
                        while c >= 0:
                            sort_keys[i] = ((np.int64(1) << 31) - nodes[c, FREQ]) * (np.int64(1) << 31) + nodes[c, TOK]
                            i += 1
                            c = nodes[c, KNEXT]
                        keys_sorted = np.sort(sort_keys[:m])
                        kk = m if m < max_bfs else max_bfs
                        total_f = 0.0
                        for i in range(kk):
                            total_f += float((np.int64(1) << 31) - (keys_sorted[i] >> 31))
                        if total_f <= 0:
                            total_f = 1.0
                        if n_ent + kk > heap.shape[0]:
                            grow = heap.shape[0] + kk
                            heap = np.concatenate((heap, np.empty(grow, np.int64)))
                            e_prob = np.concatenate((e_prob, np.empty(grow, np.float64)))
                            e_par = np.concatenate((e_par, np.empty(grow, np.int64)))
                            e_node = np.concatenate((e_node, np.empty(grow, np.int64)))
                            e_tok = np.concatenate((e_tok, np.empty(grow, np.int64)))
                        for i in range(kk):
                            tok = keys_sorted[i] & ((np.int64(1) << 31) - 1)
                            freq = (np.int64(1) << 31) - (keys_sorted[i] >> 31)
                            e_prob[n_ent] = float(freq) / total_f * a_prob
                            e_par[n_ent] = a_par
                            e_node[n_ent] = _child(nodes, ht, a_node, tok, ht_shift)
                            e_tok[n_ent] = tok
                            _heap_push(heap, hn, e_prob, n_ent)
                            hn += 1
                            n_ent += 1
                        if hn == 0 or cursor > budget:
                            break
                        top = _heap_pop(heap, hn, e_prob)
                        hn -= 1
                        pos = _tree_child(t_par, t_tok, cursor, e_par[top], e_tok[top])
                        if pos < 0:
                            pos = cursor
                            t_tok[pos] = e_tok[top]
                            t_par[pos] = e_par[top]
                            cursor += 1
                        a_par = pos
                        a_node = e_node[top]
                        a_prob = e_prob[top]

            # greedy verification against what the target produced next (VerifyTreeGreedy)
            node = 0
            k = 0
            limit = total - end
            if limit > n_draft - 1:
                limit = n_draft - 1
            while k < limit:
                nxt = _tree_child(t_par, t_tok, cursor, node, toks[end + k])
                if nxt < 0:
                    break
                node = nxt
                k += 1
            if k == 0 and limit > 0 and cursor < n_draft and toks[end] == 0:
                k = 1  # result.cpp pads with token 0 under the root: a valid one-token draft
            ks[slot] = k

        for slot in range(n_run):
            r = running[slot]
            end = req_end[r]
            produced = ks[slot] + 1
            if produced > starts[r + 1] - end:
                produced = starts[r + 1] - end
            k = produced - 1
            req_match_end[r] = end
            req_end[r] = end + produced
            req_steps[r] += 1
            req_acc[r] += k
            req_hist[r, k] += 1
            hist[k] += 1

        # -------------------------------------------------------- insertion (Trie::insert), batch order
        for slot in range(n_run):
            r = running[slot]
            end = req_match_end[r] if lag else req_end[r]
            w0 = end - depth_max
            if w0 < starts[r]:
                w0 = starts[r]
            n = end - w0
            n_starts = n
            if version == 0:
                n_starts = n - min_w if n > min_w else 0
            for i in range(n_starts):
                plen = n - i
                if plen > depth_max:
                    plen = depth_max
                if plen > free:  # Trie::squeeze: release the least recently used nodes (always leaves)
                    for _ in range(plen - free):
                        victim = lru_tail
                        lru_tail = nodes[victim, LPREV]
                        if lru_tail >= 0:
                            nodes[lru_tail, LNEXT] = -1
                        else:
                            lru_head = -1
                        par = nodes[victim, PAR]
                        # unlink from the parent's children
                        if nodes[victim, KPREV] >= 0:
                            nodes[nodes[victim, KPREV], KNEXT] = nodes[victim, KNEXT]
                        else:
                            nodes[par, KHEAD] = nodes[victim, KNEXT]
                        if nodes[victim, KNEXT] >= 0:
                            nodes[nodes[victim, KNEXT], KPREV] = nodes[victim, KPREV]
                        _ht_delete(ht, (np.int64(par) << 31 | nodes[victim, TOK]) + 1, ht_shift)
                        ht_count -= 1
                        ngen[victim] += 1
                        free_ids[n_free_ids] = victim
                        n_free_ids += 1
                        free += 1
                cur = 0
                for j in range(plen):
                    t = toks[w0 + i + j]
                    key = (np.int64(cur) << 31 | t) + 1
                    child = _child(nodes, ht, cur, t, ht_shift)
                    if child < 0:
                        if n_free_ids > 0:
                            n_free_ids -= 1
                            child = free_ids[n_free_ids]
                        else:
                            child = n_alloc
                            n_alloc += 1
                        nodes[child, TOK] = t
                        nodes[child, PAR] = cur
                        nodes[child, FREQ] = 1
                        nodes[child, KHEAD] = -1
                        # lru.emplace_front: the newest child
                        nodes[child, KPREV] = -1
                        nodes[child, KNEXT] = nodes[cur, KHEAD]
                        if nodes[cur, KHEAD] >= 0:
                            nodes[nodes[cur, KHEAD], KPREV] = child
                        nodes[cur, KHEAD] = child
                        nodes[child, LPREV] = -1  # linked into the global LRU below
                        nodes[child, LNEXT] = -1
                        if 2 * (ht_count + 1) > ht.shape[0]:
                            ht = _ht_grown(ht, ht_shift)
                            ht_shift -= 1
                        _ht_put(ht, key, child, ht_shift)
                        ht_count += 1
                        free -= 1
                        fresh = True
                    else:
                        # lru.splice(begin): the most recently touched child
                        if nodes[cur, KHEAD] != child:
                            nodes[nodes[child, KPREV], KNEXT] = nodes[child, KNEXT]
                            if nodes[child, KNEXT] >= 0:
                                nodes[nodes[child, KNEXT], KPREV] = nodes[child, KPREV]
                            nodes[child, KPREV] = -1
                            nodes[child, KNEXT] = nodes[cur, KHEAD]
                            nodes[nodes[cur, KHEAD], KPREV] = child
                            nodes[cur, KHEAD] = child
                        nodes[child, FREQ] += 1
                        fresh = False
                    path[j] = child if not fresh else -child - 1
                    cur = child
                # global_lru_.splice(begin) for the path in reverse: the shallowest ends up most recent
                for j in range(plen - 1, -1, -1):
                    x = path[j]
                    if x < 0:
                        x = -x - 1
                    elif x == lru_head:
                        continue
                    else:  # unlink from where it is
                        if nodes[x, LPREV] >= 0:
                            nodes[nodes[x, LPREV], LNEXT] = nodes[x, LNEXT]
                        if nodes[x, LNEXT] >= 0:
                            nodes[nodes[x, LNEXT], LPREV] = nodes[x, LPREV]
                        else:
                            lru_tail = nodes[x, LPREV]
                    nodes[x, LPREV] = -1
                    nodes[x, LNEXT] = lru_head
                    if lru_head >= 0:
                        nodes[lru_head, LPREV] = x
                    lru_head = x
                    if lru_tail < 0:
                        lru_tail = x

        # -------------------------------------------------------- finished requests leave the batch
        kept = 0
        for slot in range(n_run):
            r = running[slot]
            if req_end[r] < starts[r + 1]:
                running[kept] = r
                kept += 1
        n_run = kept

    return hist, req_steps, req_acc, req_hist, batch_steps, capacity - 1 - free


def replay_arrays(sequences, config, concurrency):
    """Run the compiled replay over checked sequences (simspec.ngram.replayer.Sequence with int lists).

    Returns (histogram, per-request verify steps, per-request accepted drafts, per-request histograms,
    batch steps, live trie nodes)."""
    lengths = np.fromiter((len(s.prompt_ids) + len(s.output_ids) for s in sequences), np.int64, len(sequences))
    starts = np.zeros(len(sequences) + 1, np.int64)
    np.cumsum(lengths, out=starts[1:])
    toks = np.empty(int(starts[-1]), np.int64)
    for i, s in enumerate(sequences):
        a = int(starts[i])
        p = len(s.prompt_ids)
        toks[a:a + p] = s.prompt_ids
        toks[a + p:int(starts[i + 1])] = s.output_ids
    prompt_len = np.fromiter((len(s.prompt_ids) for s in sequences), np.int64, len(sequences))
    from simspec.ngram.draft import bfs_breadth_params

    scale, top_depth = bfs_breadth_params(config)
    d = config.max_trie_depth
    # live nodes are distinct n-grams of at most max_trie_depth tokens of the text: at most len(text) * D
    max_nodes = int(min(config.capacity, int(starts[-1]) * d + 1)) + 1
    if max_nodes >= 2**31:  # node ids are int32, and PROB's sort key holds a touch count below 2**31
        from simspec.errors import InputError

        raise InputError(f"the trie could reach {max_nodes:,} nodes: the compiled engine holds fewer than 2**31; "
                         f"lower capacity or replay a smaller corpus (or engine literal)", key="capacity")
    # rows aligned to 64 bytes (numpy aligns less); untouched pages of a large buffer cost no memory
    buf = np.empty(max_nodes * 8 + 8, np.int64)
    skip = (-buf.ctypes.data % 64) // 8
    nodes = buf[skip:skip + max_nodes * 8].reshape(max_nodes, 8)
    return _replay(nodes, toks, starts, prompt_len, config.num_draft_tokens, config.min_bfs_breadth,
                   config.max_bfs_breadth, d, config.effective_match_type == "PROB", config.capacity,
                   _VERSION_CODE[config.sglang_version], config.min_match_window_size,
                   config.max_match_window_size, float(scale), int(top_depth), concurrency)
