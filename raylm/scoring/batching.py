"""Token-budget batching: longest first, each batch as wide as its first (longest) member allows.

Rows of a batch are right-padded to its widest row, so a batch costs its row count times that width. Sorting by
length keeps the padding small, and going longest first makes the first batch the biggest, so an out-of-memory
error shows at once and every later batch is narrower.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")


def budget_batches(items: Sequence[T], width: Callable[[T], int], token_budget: int,
                   members: Callable[[T], int] = lambda _: 1, max_members: int | None = None) -> Iterator[list[T]]:
    """Batches whose row count times widest row stays within token_budget (a single row may exceed it), and whose
    summed `members` (requests packed into a row) stay within max_members when given."""
    batch: list[T] = []
    widest = count = 0
    for item in sorted(items, key=lambda i: -width(i)):
        widest = max(widest, width(item))
        full = max_members is not None and count + members(item) > max_members
        if batch and (full or (len(batch) + 1) * widest > token_budget):
            yield batch
            batch, widest, count = [], width(item), 0
        batch.append(item)
        count += members(item)
    if batch:
        yield batch
