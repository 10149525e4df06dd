"""Requests table -> shards: Arrow slices in token order cut on document boundaries, the unit of work an actor
scores."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

from raylm.requests.order import cut_points, token_order

DEFAULT_SHARD_REQUESTS = 512
# The kind of an lm-eval task's shards: its rows are lm-eval requests (or rolling windows of one), whose metrics
# lm-eval computes from the scores on the driver; a shard reduces only to NLL and token sums.
LMEVAL_KIND = "lmeval"


@dataclass(frozen=True)
class Shard:
    task: str
    kind: str
    index: int
    table: pa.Table


def cut(table: pa.Table, max_requests: int) -> list[pa.Table]:
    """Slices of about max_requests rows, in token order, that never split a document (a longer document gets a
    shard alone) and end where adjacent documents share the least (raylm.requests.order).

    Whole documents per shard are what lets an actor turn its shard into prediction counts by itself; documents
    sharing a prefix in one shard are what lets it run that prefix once.
    """
    ordered = table.take(pa.array(token_order(table)))
    cuts = cut_points(ordered, max_requests)
    return [ordered.slice(a, b - a) for a, b in zip(cuts, [*cuts[1:], ordered.num_rows])]


def make_shards(tables: dict[str, tuple[str, pa.Table]], max_requests: int) -> list[Shard]:
    """Shards of every task, numbered globally in a stable order (task order, then token order). A task's results,
    concatenated in shard order, go back to its table's order through raylm.requests.order.restore."""
    shards: list[Shard] = []
    for task, (kind, table) in tables.items():
        for piece in cut(table, max_requests):
            shards.append(Shard(task, kind, len(shards), piece))
    return shards
