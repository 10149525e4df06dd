"""A task's requests in token order, and where shards are best cut, so requests sharing a prefix meet on one actor.

Few-shot MMLU gives every question of a subject the same head: an actor that scores a shard as a token tree
(raylm.scoring.tree) runs a shared prefix once per shard, so the fewer shards a prefix is spread over, the fewer
times it runs. Documents are sorted by their first request's tokens, which is the order of a walk over the trie of
their inputs, so documents sharing a prefix are adjacent; each document keeps its requests together and in order,
since an actor reduces whole documents (raylm.requests.shards). A shard is then cut where adjacent documents share
the least, among the document boundaries near the size asked for.

Results are keyed by (doc_id, req_idx[, window]), never by position: the driver puts them back in the table's own
order by that key (`restore`), so neither ordering nor cut points change a number.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from raylm.errors import RaylmError

# A cut may move this fraction of the shard size either way to land on a boundary where less is shared.
CUT_SLACK = 1 / 4
# What names a request's row: the window only in lm-eval's likelihood tables, the repeat only in its generation tables.
KEY_COLUMNS = ("doc_id", "req_idx", "window", "repeat")


def document_runs(table: pa.Table) -> np.ndarray:
    """Row index where each run of one document's requests starts (a table keeps a document's requests together)."""
    doc_id = table["doc_id"].to_numpy()
    return np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]]) if len(doc_id) else np.array([], dtype=int)


def token_order(table: pa.Table) -> np.ndarray:
    """The row permutation that lays the table out document by document in token order (a trie walk)."""
    starts = document_runs(table)
    if len(starts) == 0:
        return np.array([], dtype=np.int64)
    ends = np.r_[starts[1:], table.num_rows]
    keys = [first_tokens(table, int(s)) for s in starts]
    runs = sorted(range(len(starts)), key=keys.__getitem__)  # stable: equal documents keep table order
    return np.concatenate([np.arange(starts[r], ends[r]) for r in runs]).astype(np.int64)


def first_tokens(table: pa.Table, row: int) -> list[int]:
    """The tokens a row's model input starts with: context and continuation, or a generation's prompt alone."""
    tokens = table["context"][row].as_py()
    return tokens + table["continuation"][row].as_py() if "continuation" in table.column_names else tokens


def common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def cut_points(table: pa.Table, max_requests: int) -> list[int]:
    """Row indices where shards of an ordered table start: every shard holds whole documents, about
    max_requests rows (a longer document gets a shard alone), cut within CUT_SLACK of that size at the boundary
    whose two documents share the shortest token prefix (the nearest such one on a tie)."""
    if max_requests < 1:
        raise ValueError("max_requests must be at least 1")
    starts = document_runs(table)
    if len(starts) == 0:
        return []
    slack = int(max_requests * CUT_SLACK)
    cuts, begin, k = [0], 0, 1
    seen: dict[int, list[int]] = {}

    def tokens(row: int) -> list[int]:
        if row not in seen:
            seen[row] = first_tokens(table, row)
        return seen[row]

    while k < len(starts):
        # The first boundary at least max_requests - slack past the shard's start, and the candidates after it.
        while k < len(starts) and starts[k] - begin < max_requests - slack:
            k += 1
        if k == len(starts):
            break
        window, j = [k], k + 1
        while j < len(starts) and starts[j] - begin <= max_requests + slack:
            window.append(j)
            j += 1
        target = begin + max_requests
        best = min(window, key=lambda j: (common_prefix_length(tokens(int(starts[j - 1])), tokens(int(starts[j]))),
                                          abs(int(starts[j]) - target)))
        begin = int(starts[best])
        cuts.append(begin)
        k = best + 1
    return cuts


def restore(scored: pa.Table, requests: pa.Table, task: str) -> pa.Table:
    """`task`'s scored rows put back in its request table's own order, each matched to its request by key: rows
    come back shard by shard in whatever order they were cut and scored, so their position proves nothing. Refuses
    rows whose keys are not exactly the table's, each once."""
    names = [name for name in KEY_COLUMNS if name in requests.column_names]

    def keys(table: pa.Table) -> list[tuple[int, ...]]:
        return list(zip(*(table[name].to_pylist() for name in names)))

    where: dict[tuple[int, ...], int] = {}
    for row, key in enumerate(keys(scored)):
        if where.setdefault(key, row) != row:
            raise RaylmError(f"{task}: two results for the request with ({', '.join(names)}) = {key}")
    wanted = keys(requests)
    missing = [key for key in wanted if key not in where]
    if missing or len(wanted) != scored.num_rows:
        raise RaylmError(f"{task}: {scored.num_rows} results for {len(wanted)} requests (first without a result: "
                         f"{missing[0] if missing else None}; keyed by {', '.join(names)})")
    return scored.take(pa.array([where[key] for key in wanted], pa.int64()))
