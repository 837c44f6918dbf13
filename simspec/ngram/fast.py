"""The fast engine: the same trie as simspec.ngram.literal (SGLang 0.5.10, match_type BFS), with the work a
replay does not need left out. It gives exactly the literal engine's answers (tests check both against an
independent transcription of SGLang's source); `unsupported` says where it does not apply.

Why the literal engine is slow: after every verify each request re-inserts all suffixes of its last
max_trie_depth (D) tokens (trie.cpp Trie::insert), D (D + 1) / 2 node touches, nearly all of which it made one
step earlier; and in ordinary text most of those paths are new, one new node per token and depth.

What this engine keeps instead, per request, is one *row* per window position p: the trie path of
tokens[p : end]. A row holds its explicit nodes (depth 1..k) and, once its path leaves what the trie held, a
*chain*: the rest of the path left implicit (tokens read from the request, length following the window end).
A chain is made explicit node by node only when another path walks into it. Rows whose path is all explicit
("walking" rows) are the only ones an insertion visits; a row with its own chain grows for free.

- Sibling order (each node's `lru` list, which BFS reads most recently touched child first). A re-touch of an
  edge the same request touched on its previous step changes no order, unless another request touched a child
  of that parent in between: within one request the re-touches come in the same order as one step earlier,
  and before the parent's new edges. So only edges into newly inserted tokens move a child to the front, plus,
  at concurrency > 1, the re-touches below parents another request touched since (per node: the request that
  last touched one of its children).
- The global LRU (Trie::squeeze evicts its back). Every node in a running request's window is touched every
  step, so with a capacity above what the running windows can touch in two steps (`min_capacity`), squeeze
  only ever evicts nodes that no window holds. Rows *pin* their explicit nodes; a row that leaves its window
  (or whose request finished) keeps its last touch as LRU keys: (insertion call, path index in that call,
  D - depth), the order global_lru_ ends up in (paths are walked in order, each path's nodes spliced to the
  front deepest first). A released row is one heap entry, a block of consecutive keys (its chain, then its
  explicit nodes deepest first); a node is evicted from the block holding its largest key once no row pins it.
- Insertion: when no squeeze can happen during an insertion (free room above the new pairs plus one path),
  only walking rows are visited and the node count grows by the closed-form number of new (row, depth)
  pairs; otherwise rows are visited in SGLang's order with a squeeze before each path.
- Anchors (Trie::match, every suffix depth): right after the request's own insertion the node of its suffix of
  length d is the end of row `end - d`, so only walking rows can be anchors.
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

from simspec.ngram.config import NgramConfig
from simspec.ngram.draft import Tree, bfs_breadth_params

ROOT = 0
_LIST_MAX = 8  # children kept in a list up to this many, then in a dict


def min_capacity(config: NgramConfig, concurrency: int) -> int:
    """Smallest capacity for which squeeze provably never reaches a node a running window holds: at a squeeze
    at least capacity - max_trie_depth nodes are live, and two steps of `concurrency` insertions touch at most
    concurrency * D * (D + 1) of them."""
    d = config.max_trie_depth
    return concurrency * d * (d + 1) + 2 * d + 2


def unsupported(config: NgramConfig, concurrency: int) -> str | None:
    """Why the fast engine cannot replay this configuration exactly, or None."""
    if config.sglang_version != "0.5.10":
        return f"it follows SGLang 0.5.10's drafter, not {config.sglang_version}'s"
    if config.effective_match_type != "BFS":
        return "match_type PROB needs every node's touch count: use the literal engine"
    need = min_capacity(config, concurrency)
    if config.capacity < need:
        return (f"capacity {config.capacity} is below {need}, where eviction can reach nodes the running "
                f"requests' windows hold")
    return None


_INF = 1 << 62


class Chain:
    """The implicit tail of a row's path: depths top..bottom of seq[p : p + depth], hanging below node `head`.

    While its row holds it (`req` set) the bottom follows the row: the row's request's insertion end - p
    (`req.e`, or `req.e_old` for a row the current insertion has not reached yet); `bottom` is frozen when the
    row lets go."""

    __slots__ = ("seq", "p", "top", "bottom", "req", "row", "head", "base", "dead")

    def __init__(self, seq: list[int], p: int, top: int, req: Any, row: Row, head: int) -> None:
        self.seq = seq
        self.p = p
        self.top = top
        self.bottom = 0
        self.req = req
        self.row: Row | None = row
        self.head = head
        self.base = 0  # LRU key of depth D along the releasing row's last touch (key(depth) = base + D - depth)
        self.dead = False


def _bottom(ch: Chain) -> int:
    r = ch.req
    if r is None:
        return ch.bottom
    return (r.e if ch.p < r.split else r.e_old) - ch.p


class Row:
    """The path of tokens[p : window end] of one request: explicit nodes (depth 1..k), then maybe a chain."""

    __slots__ = ("p", "nodes", "chain", "base")

    def __init__(self, p: int) -> None:
        self.p = p
        self.nodes: list[int] = []
        self.chain: Chain | None = None
        self.base = 0  # set at release: LRU key of depth D along the row's last touch


def _row_p(row: Row) -> int:
    return row.p


class FastTrie:
    name = "fast"

    def __init__(self, config: NgramConfig, concurrency: int = 1) -> None:
        reason = unsupported(config, concurrency)
        if reason is not None:
            raise ValueError(reason)
        self.config = config
        self.D = config.max_trie_depth
        self.capacity = config.capacity
        self.shared = concurrency > 1
        self.scale, self.top_depth = bfs_breadth_params(config)
        # node arrays; node 0 is the root
        self.tok: list[int] = [-1]
        self.par: list[int] = [-1]
        self.kids: list[Any] = [None]
        self.chain: list[Chain | None] = [None]
        self.pins: list[int] = [1]
        self.lastkey: list[int] = [-1]
        self.tch: list[int] = [-1]
        self.free_ids: list[int] = []
        self.alive = 0  # live nodes besides the root
        # released rows (next LRU key in the row, push counter, row), or single nodes (key, counter, node id)
        self.heap: list[tuple[int, int, Any]] = []
        self.pushes = 0
        self.calls = 0

    # ------------------------------------------------------------------ requests

    def begin(self, req: Any) -> None:
        req.rows = deque()
        req.walking = []  # rows without a chain of their own, by p
        req.killed = []  # rows whose empty chain another path ended (they walk again)
        req.s = 0
        req.e = -1  # no insertion yet
        req.e_old = -1
        req.split = _INF
        req.last_call = 0

    def finish(self, req: Any) -> None:
        rows = req.rows
        while rows:
            self._release(rows.popleft(), req.last_call, req.s, req.e)
        req.walking = []
        req.killed = []

    # ------------------------------------------------------------------ nodes

    def _new(self, t: int, parent: int) -> int:
        if self.free_ids:
            n = self.free_ids.pop()
            self.tok[n] = t
            self.par[n] = parent
            self.kids[n] = None
            self.chain[n] = None
            self.pins[n] = 0
            self.lastkey[n] = -1
            self.tch[n] = -1
        else:
            n = len(self.tok)
            self.tok.append(t)
            self.par.append(parent)
            self.kids.append(None)
            self.chain.append(None)
            self.pins.append(0)
            self.lastkey.append(-1)
            self.tch.append(-1)
        return n

    def _add_kid(self, parent: int, c: int) -> None:
        """A new child is the most recently touched one (lru.emplace_front)."""
        k = self.kids[parent]
        if k is None:
            self.kids[parent] = c
        elif type(k) is int:
            self.kids[parent] = [k, c]
        elif type(k) is list:
            if len(k) < _LIST_MAX:
                k.append(c)
            else:
                tok = self.tok
                d = {tok[x]: x for x in k}
                d[tok[c]] = c
                self.kids[parent] = d
        else:
            k[self.tok[c]] = c

    def _touch(self, parent: int, c: int) -> None:
        """lru.splice to the front: c becomes the most recently touched child."""
        k = self.kids[parent]
        if type(k) is list:
            if k[-1] != c:
                k.remove(c)
                k.append(c)
        elif type(k) is dict:
            t = self.tok[c]
            if next(reversed(k)) != t:
                del k[t]
                k[t] = c

    def _kill_empty(self, n: int) -> None:
        """n heads an empty chain (its row ends at n) and is about to get a child: that row walks again."""
        ch = self.chain[n]
        self.chain[n] = None
        ch.dead = True
        row = ch.row
        ch.row = None
        if ch.req is not None:
            row.chain = None
            ch.req.killed.append(row)
            ch.req = None

    # ------------------------------------------------------------------ insertion

    def insert(self, req: Any, tokens: list[int], end: int) -> None:
        D = self.D
        s = end - D if end > D else 0
        e0 = req.e
        rows = req.rows
        self.calls += 1
        if rows and rows[0].p < s:
            last_call, s0 = req.last_call, req.s
            while rows and rows[0].p < s:
                self._release(rows.popleft(), last_call, s0, e0)
        walking = self._walking(req, s)
        if self.shared and rows:
            self._retouch_dirty(rows, req.rid)
        for p in range(rows[-1].p + 1 if rows else s, end):
            row = Row(p)
            rows.append(row)
            walking.append(row)
        w = end - s
        w0 = e0 - s if e0 > s else 0
        growth = (w * (w + 1) - w0 * (w0 + 1)) // 2  # new (row, depth) pairs: every path grows to `end`
        req.e_old = e0
        req.e = end
        req.s = s
        req.last_call = self.calls
        if self.capacity - 1 - (self.alive + growth) >= D:
            # no squeeze can happen during this insertion: paths may be walked in any order
            req.split = _INF
            self.alive += growth
            self._walk(walking, req, tokens, end, True)
        else:
            # Trie::insert path by path, squeezing before each as SGLang does
            free_base = self.capacity - 1
            a = end - e0
            req.split = s
            for row in rows:
                p = row.p
                plen = end - p
                if plen > free_base - self.alive:
                    self._squeeze(plen - (free_base - self.alive))
                req.split = p + 1
                if row.chain is not None:
                    self.alive += a
                elif len(row.nodes) < plen:
                    self._walk((row,), req, tokens, end, False)
            req.split = _INF
        req.walking = [row for row in walking if row.chain is None]

    def _walking(self, req: Any, s: int) -> list[Row]:
        walking = req.walking
        if req.killed:
            walking = sorted(walking + [r for r in req.killed if r.chain is None], key=_row_p)
            req.killed = []
        if walking and walking[0].p < s:
            walking = [r for r in walking if r.p >= s]
        req.walking = walking
        return walking

    def _walk(self, rows: Any, req: Any, tokens: list[int], end: int, counted: bool) -> None:
        """Extend paths to `end` (Trie::insert's inner loop). `counted`: the new (row, depth) pairs are already
        in self.alive (subtract the nodes found); otherwise add the ones created. Written out for speed: node
        creation, making a chain's top node explicit, and lru.splice (a touched child moves to the front)."""
        chain = self.chain
        kids = self.kids
        tok = self.tok
        par = self.par
        pins = self.pins
        lastkey = self.lastkey
        tch = self.tch
        free_ids = self.free_ids
        shared = self.shared
        D = self.D
        rid = req.rid
        found = 0  # nodes walked into (counted) or created (not counted)
        for row in rows:
            nodes = row.nodes
            p = row.p
            d0 = len(nodes)
            if p + d0 >= end:
                continue
            n = nodes[-1] if d0 else ROOT
            created = 0
            for t in tokens[p + d0:end]:
                k = kids[n]
                if k is None:
                    # a node heading a chain has no explicit children
                    cn = chain[n]
                    if cn is not None:
                        r = cn.req
                        top = cn.top
                        if top <= (cn.bottom if r is None else (r.e if cn.p < r.split else r.e_old) - cn.p):
                            # another path reaches this chain: its top node becomes explicit, below n, and joins
                            # the chain's row (pinned if the row still holds the chain, else under its release
                            # key)
                            ct = cn.seq[cn.p + top - 1]
                            if free_ids:
                                c = free_ids.pop()
                                tok[c] = ct
                                par[c] = n
                                kids[c] = None
                                tch[c] = -1
                            else:
                                c = len(tok)
                                tok.append(ct)
                                par.append(n)
                                kids.append(None)
                                chain.append(None)
                                pins.append(0)
                                lastkey.append(-1)
                                tch.append(-1)
                            kids[n] = c
                            chain[n] = None
                            cn.top = top + 1
                            cn.head = c
                            chain[c] = cn
                            cn.row.nodes.append(c)
                            if r is not None:
                                pins[c] = 1
                                lastkey[c] = -1
                            else:
                                pins[c] = 0
                                lastkey[c] = cn.base + D - top
                                if top >= cn.bottom:
                                    cn.dead = True
                                    chain[c] = None
                            if ct == t:
                                if shared:
                                    tch[n] = rid
                                pins[c] += 1
                                nodes.append(c)
                                n = c
                                continue
                            k = c
                        else:
                            self._kill_empty(n)
                c = -1
                if k is not None:
                    if type(k) is int:
                        if tok[k] == t:
                            c = k
                    elif type(k) is list:
                        for x in k:
                            if tok[x] == t:
                                c = x
                                if k[-1] != x:  # _touch: most recently touched last
                                    k.remove(x)
                                    k.append(x)
                                break
                    else:
                        c = k.get(t, -1)
                        if c >= 0 and next(reversed(k)) != t:
                            del k[t]
                            k[t] = c
                if c < 0:
                    # the path leaves the trie here: one explicit node, the rest of the row implicit
                    c = self._new(t, n)
                    if k is None:
                        kids[n] = c
                    else:
                        self._add_kid(n, c)
                    if shared:
                        tch[n] = rid
                    pins[c] = 1
                    nodes.append(c)
                    d = len(nodes)
                    created = 1
                    if not counted:
                        self.alive += 1 + end - p - d
                    ch = Chain(tokens, p, d + 1, req, row, c)
                    chain[c] = ch
                    row.chain = ch
                    break
                if shared:
                    tch[n] = rid
                pins[c] += 1
                nodes.append(c)
                n = c
            found += len(nodes) - d0 - created
        if counted:
            self.alive -= found

    def _retouch_dirty(self, rows: deque, rid: int) -> None:
        """Concurrency > 1: re-touch, in SGLang's order, the old edges below parents another request touched."""
        tch = self.tch
        dirty = []
        for row in rows:
            nodes = row.nodes
            for j in range(len(nodes) - 1):
                x = nodes[j]
                if tch[x] != rid:
                    dirty.append((x, nodes[j + 1]))
        for x, c in dirty:
            self._touch(x, c)
        for x, _ in dirty:
            tch[x] = rid

    def _release(self, row: Row, call: int, s: int, e: int) -> None:
        """A row leaves its request's window (or the request finished): its nodes keep their last touch,
        key (call, path index p - s, D - depth). The row becomes one heap entry, a block of consecutive keys
        base + D - depth (its chain's nodes, then its explicit nodes deepest first); a node is evicted from the
        block that holds its largest key, once no row holds it."""
        D = self.D
        base = (call * (D + 1) + (row.p - s)) * (D + 1)
        pins = self.pins
        lastkey = self.lastkey
        key = base + D
        if not self.shared:
            # one request at a time: calls and window positions only grow, so every earlier key (a release or a
            # chain node made explicit under one) is below this row's keys
            for n in row.nodes:
                key -= 1
                lastkey[n] = key
                pins[n] -= 1
        else:
            self._release_shared(row.nodes, key, pins, lastkey)
            key -= len(row.nodes)
        first = key  # the deepest explicit node's key
        ch = row.chain
        if ch is not None:
            bottom = e - ch.p
            ch.bottom = bottom
            ch.req = None
            if ch.top <= bottom:
                ch.base = base
                first = base + D - bottom
            else:
                ch.dead = True
                self.chain[ch.head] = None
                row.chain = None
                ch.row = None
        row.base = base
        self.pushes += 1
        heapq.heappush(self.heap, (first, self.pushes, row))

    def _release_shared(self, nodes: list[int], key: int, pins: list[int], lastkey: list[int]) -> None:
        """_release's node loop at concurrency > 1, where an earlier release may hold a larger key."""
        for n in nodes:
            key -= 1
            if key > lastkey[n]:
                lastkey[n] = key
            elif pins[n] == 1:
                # a row released earlier holds this node's largest key and its block may have been passed
                # while this row still held the node: give it an entry of its own
                self.pushes += 1
                heapq.heappush(self.heap, (lastkey[n], self.pushes, n))
            pins[n] -= 1

    def _squeeze(self, count: int) -> None:
        """Trie::squeeze: evict `count` least recently used nodes (all released: see the module docstring)."""
        heap = self.heap
        D = self.D
        pins = self.pins
        lastkey = self.lastkey
        while count > 0:
            key, _, row = heap[0]
            if type(row) is int:
                heapq.heappop(heap)
                if pins[row] == 0 and lastkey[row] == key:
                    self._evict(row)
                    count -= 1
                continue
            base = row.base
            depth = base + D - key
            ch = row.chain
            if ch is not None and (ch.dead or ch.top > ch.bottom):
                ch.row = None
                ch = row.chain = None
            if ch is not None and ch.top <= depth <= ch.bottom:
                # the chain's nodes, deepest first (keys are consecutive)
                take = min(count, ch.bottom - ch.top + 1)
                ch.bottom -= take
                self.alive -= take
                count -= take
                depth = ch.bottom
                if ch.top > ch.bottom:
                    ch.dead = True
                    self.chain[ch.head] = None
                    row.chain = None
                    ch.row = None
                    depth = ch.top - 1
            nodes = row.nodes
            while count > 0 and depth > 0:
                n = nodes[depth - 1]
                if pins[n] == 0 and lastkey[n] == base + D - depth:
                    self._evict(n)
                    count -= 1
                depth -= 1
            if depth > 0:
                self.pushes += 1
                heapq.heapreplace(heap, (base + D - depth, self.pushes, row))
            else:
                heapq.heappop(heap)

    def _evict(self, n: int) -> None:
        if self.kids[n] is not None or self.chain[n] is not None:
            raise RuntimeError("n-gram trie: least recently used node still has children")
        parent = self.par[n]
        k = self.kids[parent]
        if type(k) is int:
            self.kids[parent] = None
        elif type(k) is list:
            k.remove(n)
            if len(k) == 1:
                self.kids[parent] = k[0]
        else:
            del k[self.tok[n]]
            if not k:
                self.kids[parent] = None
        self.lastkey[n] = -1
        self.alive -= 1
        self.free_ids.append(n)

    # ------------------------------------------------------------------ drafting

    def _lookup(self, h: Any, t: int) -> Any:
        """Read-only step from handle h (a node id or (chain, depth)) along token t; None if absent."""
        if type(h) is int:
            ch = self.chain[h]
            if ch is not None:
                if ch.top <= _bottom(ch) and ch.seq[ch.p + ch.top - 1] == t:
                    return (ch, ch.top)
                return None
            k = self.kids[h]
            if k is None:
                return None
            if type(k) is int:
                return k if self.tok[k] == t else None
            if type(k) is list:
                for c in k:
                    if self.tok[c] == t:
                        return c
                return None
            return k.get(t)
        ch, d = h
        if d < _bottom(ch) and ch.seq[ch.p + d] == t:
            return (ch, d + 1)
        return None

    def _has_children(self, h: Any) -> bool:
        if type(h) is int:
            ch = self.chain[h]
            if ch is not None:
                return ch.top <= _bottom(ch)
            return self.kids[h] is not None
        ch, d = h
        return d < _bottom(ch)

    def anchors(self, req: Any, tokens: list[int], end: int) -> list[tuple[Any, int]]:
        """Trie::match: the suffix nodes with children, longest first, as (handle, depth)."""
        out: list[tuple[Any, int]] = []
        if req.e == end:
            # right after this request's own insertion the suffix of length d is the end of row end - d; rows
            # ending in their own chain have no children there
            chain = self.chain
            kids = self.kids
            for row in self._walking(req, req.s):
                n = row.nodes[-1]
                ch = chain[n]
                if ch is not None:
                    if ch.top <= _bottom(ch):
                        out.append((n, end - row.p))
                elif kids[n] is not None:
                    out.append((n, end - row.p))
            return out
        D = self.D
        for d in range(end if end < D else D, 0, -1):
            h: Any = ROOT
            for t in tokens[end - d:end]:
                h = self._lookup(h, t)
                if h is None:
                    break
            if h is not None and self._has_children(h):
                out.append((h, d))
        return out

    def draft(self, req: Any, tokens: list[int], end: int) -> Tree:
        """Trie::buildRecency over this engine's nodes and chains (the steps of draft.build_bfs, with the
        single-child case, by far the commonest, written out)."""
        anchors = self.anchors(req, tokens, end)
        tree: Tree = [{}]
        if not anchors:
            return tree
        cfg = self.config
        budget = cfg.draft_budget
        scale = self.scale
        top_depth = self.top_depth
        min_bfs = cfg.min_bfs_breadth
        chain = self.chain
        kids = self.kids
        tok = self.tok
        cursor = 1
        for h0, depth in anchors:
            if cursor > budget:
                break
            queue = [(0, (top_depth - depth) * scale + min_bfs, h0)]
            qi = 0
            while qi < len(queue) and cursor <= budget:
                parent, cur, h = queue[qi]
                qi += 1
                while True:
                    nb = cur - scale
                    # the node's children, most recently touched first (drafting runs outside insert(): an
                    # owned chain's bottom is its request's end - p)
                    if type(h) is int:
                        ch = chain[h]
                        if ch is None:
                            k = kids[h]
                            if k is None:
                                break
                            if type(k) is not int:
                                breadth = int(cur)
                                if breadth < 1:
                                    breadth = 1
                                nxt = tree[parent]
                                taken = 0
                                for c in (reversed(k) if type(k) is list else reversed(k.values())):
                                    if taken >= breadth or cursor > budget:
                                        break
                                    t = tok[c]
                                    pos = nxt.get(t)
                                    if pos is None:
                                        pos = cursor
                                        nxt[t] = pos
                                        tree.append({})
                                        cursor += 1
                                    queue.append((pos, nb, c))
                                    taken += 1
                                break
                            t = tok[k]
                            c = k
                        else:
                            top = ch.top
                            r = ch.req
                            if top > (ch.bottom if r is None else r.e - ch.p):
                                break
                            t = ch.seq[ch.p + top - 1]
                            c = (ch, top)
                    else:
                        ch, d = h
                        r = ch.req
                        if d >= (ch.bottom if r is None else r.e - ch.p):
                            break
                        t = ch.seq[ch.p + d]
                        c = (ch, d + 1)
                    # a single child (breadth >= 1 always takes it)
                    nxt = tree[parent]
                    pos = nxt.get(t)
                    if pos is None:
                        pos = cursor
                        nxt[t] = pos
                        tree.append({})
                        cursor += 1
                    if qi == len(queue) and cursor <= budget:
                        # nothing else is queued: this child is the next one popped, so go down directly
                        parent, cur, h = pos, nb, c
                        continue
                    queue.append((pos, nb, c))
                    break
        return tree

    def accept(self, req: Any, tokens: list[int], end: int, total: int) -> int:
        """draft() then draft.accepted_drafts(tree, tokens, end, total, num_draft_tokens), fused: the same tree
        (same merges, same budget cut) kept as one dict {(tree parent << 31) | token: tree node}, which is all
        greedy verification reads (token ids are below 2**31)."""
        n_draft = self.config.num_draft_tokens
        limit = n_draft - 1
        if total - end < limit:
            limit = total - end
        anchors = self.anchors(req, tokens, end)
        if not anchors:
            # an empty tree: padding only
            return 1 if limit > 0 and tokens[end] == 0 else 0
        budget = n_draft - 1
        scale = self.scale
        top_depth = self.top_depth
        min_bfs = self.config.min_bfs_breadth
        chain = self.chain
        kids = self.kids
        tok = self.tok
        T: dict[int, int] = {}
        get = T.get
        cursor = 1
        for h0, depth in anchors:
            if cursor > budget:
                break
            queue = [(0, (top_depth - depth) * scale + min_bfs, h0)]
            qi = 0
            qn = 1  # len(queue)
            while qi < qn and cursor <= budget:
                parent, cur, h = queue[qi]
                qi += 1
                while True:
                    if type(h) is int:
                        ch = chain[h]
                        if ch is None:
                            k = kids[h]
                            if k is None:
                                break
                            nb = cur - scale
                            if type(k) is not int:
                                breadth = int(cur)
                                if breadth < 1:
                                    breadth = 1
                                pk = parent << 31
                                taken = 0
                                for c in (reversed(k) if type(k) is list else reversed(k.values())):
                                    if taken >= breadth or cursor > budget:
                                        break
                                    key = pk | tok[c]
                                    pos = get(key)
                                    if pos is None:
                                        pos = cursor
                                        T[key] = pos
                                        cursor += 1
                                    queue.append((pos, nb, c))
                                    qn += 1
                                    taken += 1
                                break
                            t = tok[k]
                            c = k
                        else:
                            d = ch.top - 1
                            r = ch.req
                            bottom = ch.bottom if r is None else r.e - ch.p
                            if d >= bottom:
                                break
                            if qi == qn and parent == cursor - 1:
                                # nothing else queued and the tree node is the newest (no children yet): the
                                # chain's tokens become a line of new tree nodes until the budget or the chain
                                # ends (below a chain every node has one child, so the breadth no longer matters)
                                count = bottom - d
                                if count > budget - cursor + 1:
                                    count = budget - cursor + 1
                                b = ch.p + d
                                for t in ch.seq[b:b + count]:
                                    T[(parent << 31) | t] = cursor
                                    parent = cursor
                                    cursor += 1
                                break
                            nb = cur - scale
                            t = ch.seq[ch.p + d]
                            c = (ch, d + 1)
                    else:
                        ch, d = h
                        r = ch.req
                        bottom = ch.bottom if r is None else r.e - ch.p
                        if d >= bottom:
                            break
                        if qi == qn and parent == cursor - 1:
                            count = bottom - d
                            if count > budget - cursor + 1:
                                count = budget - cursor + 1
                            b = ch.p + d
                            for t in ch.seq[b:b + count]:
                                T[(parent << 31) | t] = cursor
                                parent = cursor
                                cursor += 1
                            break
                        nb = cur - scale
                        t = ch.seq[ch.p + d]
                        c = (ch, d + 1)
                    key = (parent << 31) | t
                    pos = get(key)
                    if pos is None:
                        pos = cursor
                        T[key] = pos
                        cursor += 1
                    if qi == qn and cursor <= budget:
                        parent, cur, h = pos, nb, c
                        continue
                    queue.append((pos, nb, c))
                    qn += 1
                    break
        k = 0
        pos = 0
        while k < limit:
            pos = get((pos << 31) | tokens[end + k])
            if pos is None:
                break
            k += 1
        if k == 0 and limit > 0 and cursor < n_draft and tokens[end] == 0:
            k = 1
        return k

    def node_count(self) -> int:
        return self.alive
