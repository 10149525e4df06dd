"""Shards in token order: documents sharing a prefix are adjacent, whole, cut where neighbours share least, and
results go back to the table's own order."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from raylm.errors import RaylmError
from raylm.requests.order import cut_points, restore, token_order
from raylm.requests.shards import make_shards


def subjects_table(seed: int) -> pa.Table:
    """Documents of two interleaved 'subjects' (each its own few-shot head), 1-4 requests each."""
    rnd = random.Random(seed)
    cols: dict[str, list] = {"doc_id": [], "req_idx": [], "context": [], "continuation": []}
    for doc in range(40):
        head = [1, 2, 3, 4, 5, 6] if doc % 2 else [1, 9, 9, 9, 9, 9]
        context = head + [rnd.randrange(20) for _ in range(3)]
        for req in range(rnd.randint(1, 4)):
            for name, value in (("doc_id", doc), ("req_idx", req), ("context", context), ("continuation", [req])):
                cols[name].append(value)
    return pa.table(cols)


@pytest.mark.parametrize("size", [1, 3, 8, 30, 500])
def test_shards_hold_whole_documents_in_token_order_and_restore_the_table(size):
    table = subjects_table(seed=size)
    shards = make_shards({"t": ("multiple_choice", table)}, size)
    docs = [s.table["doc_id"].to_pylist() for s in shards]
    seen = [d for shard in docs for d in dict.fromkeys(shard)]
    assert len(seen) == len(set(seen)) == 40  # no document split across shards
    rows = [r for s in shards for r in s.table["context"].to_pylist()]
    assert rows == sorted(rows)  # token order: each subject's documents adjacent
    assert restore(pa.concat_tables(s.table for s in shards), table, "t").equals(table)


def test_results_go_back_by_key_whatever_order_they_arrive_in_and_a_mismatch_is_refused():
    """Shards may come back in any order (a resumed run reads some from its checkpoint); rows are matched to
    their requests by (doc_id, req_idx), and results that are not exactly the requests, once each, are refused."""
    table = subjects_table(seed=3)
    shards = make_shards({"t": ("multiple_choice", table)}, 8)
    scored = pa.concat_tables(s.table for s in reversed(shards))
    assert restore(scored, table, "t").equals(table)
    with pytest.raises(RaylmError, match=r"^t: two results for the request with \(doc_id, req_idx\) = \(\d+, \d+\)$"):
        restore(pa.concat_tables([scored, scored.slice(0, 1)]), table, "t")
    with pytest.raises(RaylmError, match=r"^t: \d+ results for \d+ requests \(first without a result: \(\d+, \d+\); "
                                         r"keyed by doc_id, req_idx\)$"):
        restore(scored.slice(1), table, "t")


def test_a_cut_moves_to_the_boundary_between_subjects_when_one_is_near():
    table = subjects_table(seed=0).take(pa.array(token_order(subjects_table(seed=0))))
    first_subject = sum(1 for c in table["context"].to_pylist() if c[1] == 2)
    size = first_subject + 3  # the boundary is within a quarter of the size
    cuts = cut_points(table, size)
    assert cuts[1] == first_subject
