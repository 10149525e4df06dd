"""A shard's requests as one token tree, and the forward passes that compute each distinct tree token once.

MMLU 5-shot gives every question of a subject the same few-shot head, and each question's choices share the
question: the requests' inputs form a trie several levels deep, with far fewer distinct nodes than tokens. The
trie is built from the inputs sorted, so node ids come out in preorder and a node's subtree is the id range
[node, node + size): a row is then a few such ranges, and its mask follows from sizes alone (raylm.scoring.packing).

The walk, per node: a child whose subtree fits one row (`row_tokens`, and the batch's request cap) becomes a row,
joined by its siblings where the rows continue a cached path; a child too big has its path run once into a KV cache
(a transformers DynamicCache, batch 1, built without a config so no layer keeps only a sliding window of it) and
the walk goes below it, the rows there attending the cached path through a mask [1, 1, q, cached + q] with
positions continuing from it. The cache holds only the path the walk is on: each step crops it to its own cached
length first, so memory for cached prefixes is bounded by the longest input. Rows over a cache run one at a time,
so the prefix is never repeated per row; rows with no cached path batch as before, and share a row only where they
share SHARE_FRACTION of their length (the old packing's rule), so unrelated texts keep plain rows and the model's
own causal kernel. A path shorter than `cache_min` is not worth a forward pass of its own (two documents that only
share BOS): it is copied into each row below it instead, as the old two-level packing did.

Many calls share nothing the walk would use (loglikelihood_rolling windows, documents that share only BOS), and
the trie is a Python loop over every token: `plan_requests` compares sorted neighbours' first few tokens and, where
no two share enough to matter, gives each request the walk's plan for a lone request without building the trie.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from raylm.requests.order import common_prefix_length
from raylm.scoring.packing import PackedRow, chain_row

CACHE_MIN_TOKENS = 32  # a shared path at least this long is cached once rather than copied into each row below it
# Requests with no cached path share a row only if at least this fraction of the longest one is shared: two texts
# that only share BOS gain nothing from a tree row, and a plain row keeps the model's own causal kernel.
SHARE_FRACTION = 1 / 8


@dataclass(frozen=True)
class Step:
    """One forward pass: `rows` over the first `cached` tokens of the walk's cache; with `keep`, its keys and
    values extend the cache (a path below which later steps run), else they are dropped after it."""

    rows: list[PackedRow]
    cached: int = 0
    keep: bool = False


@dataclass
class Trie:
    """Distinct (prefix, token) nodes of a set of inputs, in preorder; `predicts[n]` are the (request, target index)
    whose continuation token node n's output predicts, `requests[n]` how many requests end in n's subtree."""

    tokens: list[int] = field(default_factory=list)
    parent: list[int] = field(default_factory=list)
    depth: list[int] = field(default_factory=list)
    size: list[int] = field(default_factory=list)
    requests: list[int] = field(default_factory=list)
    height: list[int] = field(default_factory=list)  # the longest input through the node
    children: list[list[int]] = field(default_factory=list)
    roots: list[int] = field(default_factory=list)
    predicts: dict[int, list[tuple[int, int]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)


def build_trie(requests: Sequence[int], inputs: Sequence[Sequence[int]], n_targets: Sequence[int]) -> Trie:
    """The trie of `inputs[i]` for i in requests; request i's last n_targets[i] input positions predict."""
    trie = Trie()
    path: list[int] = []
    previous: Sequence[int] = ()
    for i in sorted(requests, key=lambda r: inputs[r]):
        tokens = inputs[i]
        shared = common_prefix_length(previous, tokens)
        del path[shared:]
        for d in range(shared, len(tokens)):
            node = len(trie.tokens)
            parent = path[-1] if path else -1
            trie.tokens.append(tokens[d])
            trie.parent.append(parent)
            trie.depth.append(d)
            trie.size.append(1)
            trie.requests.append(0)
            trie.height.append(d + 1)
            trie.children.append([])
            (trie.children[parent] if parent >= 0 else trie.roots).append(node)
            path.append(node)
        trie.requests[path[-1]] += 1
        n = len(tokens)
        for t in range(n_targets[i]):
            trie.predicts.setdefault(path[n - n_targets[i] + t], []).append((i, t))
        previous = tokens
    for node in range(len(trie) - 1, -1, -1):
        parent = trie.parent[node]
        if parent >= 0:
            trie.size[parent] += trie.size[node]
            trie.requests[parent] += trie.requests[node]
            trie.height[parent] = max(trie.height[parent], trie.height[node])
    return trie


class _Walk:
    """The planner's state: rows with no cached path (batched later), steps over the cache in walk order."""

    def __init__(self, trie: Trie, row_tokens: int, max_requests: int | None, cache_min: int):
        self.trie, self.row_tokens, self.max_requests = trie, max(1, row_tokens), max_requests
        self.cache_min = max(1, min(cache_min, self.row_tokens))
        self.free_rows: list[PackedRow] = []
        self.steps: list[Step] = []
        self._gathered: set[int] = set()  # nodes whose predictions some row already carries

    def fits(self, node: int, extra: int) -> bool:
        return self.trie.size[node] + extra <= self.row_tokens and (
            self.max_requests is None or self.trie.requests[node] <= self.max_requests)

    def visit(self, children: list[int], cached: int, prefix: list[int]) -> None:
        """Cover `children`, whose parent's path is `cached` tokens of cache then the copied `prefix` nodes."""
        trie, group, used, count = self.trie, [], len(prefix), 0
        for child in children:
            if self.fits(child, len(prefix)) and not cached:
                if self.worth_a_row(child, prefix):
                    self.emit(0, prefix, [child])
                else:  # the requests below share too little: each gets a plain row, the short path copied
                    chain = self.unary_chain(child)
                    self.visit(trie.children[chain[-1]], 0, prefix + chain)
                continue
            if self.fits(child, len(prefix)):
                full = used + trie.size[child] > self.row_tokens or (
                    self.max_requests is not None and count + trie.requests[child] > self.max_requests)
                if group and full:
                    self.emit(cached, prefix, group)
                    group, used, count = [], len(prefix), 0
                group.append(child)
                used += trie.size[child]
                count += trie.requests[child]
                continue
            chain = [child]
            while len(trie.children[chain[-1]]) == 1 and not self.fits(trie.children[chain[-1]][0],
                                                                        len(prefix) + len(chain)):
                chain.append(trie.children[chain[-1]][0])
            path = prefix + chain
            below = trie.children[chain[-1]]
            if len(path) >= self.cache_min or not below:
                self.extend(cached, path)
                self.visit(below, cached + len(path), [])
            else:
                self.visit(below, cached, path)
        if group:
            self.emit(cached, prefix, group)

    def unary_chain(self, node: int) -> list[int]:
        """`node` and its descendants down to the first that branches or ends (inclusive)."""
        chain = [node]
        while len(self.trie.children[chain[-1]]) == 1:
            chain.append(self.trie.children[chain[-1]][0])
        return chain

    def worth_a_row(self, node: int, prefix: list[int]) -> bool:
        """Whether node's requests share enough to be one tree row with no cached path (a lone request always is)."""
        shared = len(prefix) + len(self.unary_chain(node))
        return shared >= max(1.0, SHARE_FRACTION * self.trie.height[node])

    def extend(self, cached: int, path: list[int]) -> None:
        """Run `path` into the cache after its first `cached` tokens, in pieces of at most a row."""
        for start in range(0, len(path), self.row_tokens):
            piece = path[start:start + self.row_tokens]
            row = self.row(piece, [len(piece) - j for j in range(len(piece))])
            self.steps.append(Step([row], cached + start, keep=True))

    def emit(self, cached: int, prefix: list[int], subtrees: list[int]) -> None:
        nodes = list(prefix)
        spans = []
        width = len(prefix) + sum(self.trie.size[s] for s in subtrees)
        spans.extend(width - j for j in range(len(prefix)))
        for root in subtrees:
            for node in range(root, root + self.trie.size[root]):
                nodes.append(node)
                spans.append(self.trie.size[node])
        row = self.row(nodes, spans)
        if cached:
            self.steps.append(Step([row], cached))
        else:
            self.free_rows.append(row)

    def row(self, nodes: list[int], spans: list[int]) -> PackedRow:
        trie = self.trie
        predicts = []
        for col, node in enumerate(nodes):
            if node in trie.predicts and node not in self._gathered:
                self._gathered.add(node)
                predicts.extend((col, request, t) for request, t in trie.predicts[node])
        return PackedRow([trie.tokens[n] for n in nodes], [trie.depth[n] for n in nodes], spans, predicts)


def plan_tree(requests: Sequence[int], inputs: Sequence[Sequence[int]], n_targets: Sequence[int], row_tokens: int,
              max_requests: int | None = None, cache_min: int = CACHE_MIN_TOKENS
              ) -> tuple[list[PackedRow], list[Step]]:
    """Rows with no cached path (to batch under the token budget), and the cached steps in the order they must
    run. Every distinct trie node is computed once, in exactly one of them, except short paths copied per row."""
    walk = _Walk(build_trie(requests, inputs, n_targets), row_tokens, max_requests, cache_min)
    walk.visit(walk.trie.roots, 0, [])
    return walk.free_rows, walk.steps


def worth_sharing(a: Sequence[int], b: Sequence[int], row_tokens: int, cache_min: int = CACHE_MIN_TOKENS) -> bool:
    """Whether the walk would plan inputs a and b otherwise than apart: one is a prefix of the other, or their
    shared prefix is long enough to be cached (cache_min) or to be worth a tree row (SHARE_FRACTION). Only the first
    few tokens are compared, never the whole inputs."""
    cache_min = max(1, min(cache_min, max(1, row_tokens)))
    k = min(len(a), len(b), cache_min, max(1, math.ceil(SHARE_FRACTION * max(len(a), len(b)))))
    return list(a[:k]) == list(b[:k])


def plan_requests(requests: Sequence[int], inputs: Sequence[Sequence[int]], n_targets: Sequence[int],
                  row_tokens: int, max_requests: int | None = None, cache_min: int = CACHE_MIN_TOKENS
                  ) -> tuple[list[PackedRow], list[Step], bool]:
    """plan_tree's forward passes, and whether a trie was built for them: none where no two requests share a prefix
    worth sharing. Sorted, two inputs' longest shared prefix is shared by every input between them, so neighbours
    settle it. Each request then gets the walk's plan for a tree of one request, the rows the walk gives it among
    the others: a plain row, or its path in pieces over the cache where it is wider than a row. (A target predicted
    from a short shared prefix, which the walk copies into each row, is then taken from its own request's row
    rather than the first row holding that prefix: the same position after the same tokens.)"""
    order = sorted(requests, key=lambda r: inputs[r])
    if any(worth_sharing(inputs[a], inputs[b], row_tokens, cache_min) for a, b in zip(order, order[1:])):
        return *plan_tree(order, inputs, n_targets, row_tokens, max_requests, cache_min), True
    free: list[PackedRow] = []
    steps: list[Step] = []
    for i in order:
        if len(inputs[i]) <= max(1, row_tokens):
            free.append(chain_row(inputs[i], i, n_targets[i]))
        else:
            rows, cached = plan_tree([i], inputs, n_targets, row_tokens, max_requests, cache_min)
            free += rows
            steps += cached
    return free, steps, False
