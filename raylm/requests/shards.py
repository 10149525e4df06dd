"""Requests table -> shards: Arrow slices cut on document boundaries, the unit of work an actor scores."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

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
    """Slices of about max_requests rows that never split a document (a longer document gets a shard alone).

    Whole documents per shard are what lets an actor turn its shard into prediction counts by itself.
    """
    if max_requests < 1:
        raise ValueError("max_requests must be at least 1")
    doc_id = table["doc_id"].to_numpy()
    starts = np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]]) if len(doc_id) else np.array([], dtype=int)
    slices, begin = [], 0
    for start in starts[1:]:
        if start - begin >= max_requests:
            slices.append(table.slice(begin, start - begin))
            begin = start
    if len(doc_id) > begin:
        slices.append(table.slice(begin))
    return slices


def make_shards(tables: dict[str, tuple[str, pa.Table]], max_requests: int) -> list[Shard]:
    """Shards of every task, numbered globally in a stable order (task order, then document order)."""
    shards: list[Shard] = []
    for task, (kind, table) in tables.items():
        for piece in cut(table, max_requests):
            shards.append(Shard(task, kind, len(shards), piece))
    return shards
