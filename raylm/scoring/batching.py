"""Token-budget batching: longest first, each batch as wide as its first (longest) member allows.

Rows of a batch are right-padded to its widest row, so a batch costs its row count times that width. Sorting by
length keeps the padding small, and going longest first makes the first batch the biggest, so an out-of-memory
error shows at once and every later batch is narrower.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

T = TypeVar("T")
B = TypeVar("B")

log = logging.getLogger(__name__)


def budget_batches(items: Sequence[T], width: Callable[[T], int], token_budget: int,
                   members: Callable[[T], int] = lambda _: 1, max_members: int | None = None,
                   weight: Callable[[T], int] = lambda _: 0, max_weight: int | None = None) -> Iterator[list[T]]:
    """Batches whose row count times widest row stays within token_budget (a single row may exceed it), and whose
    summed `members` (requests packed into a row) stay within max_members and summed `weight` (positions whose
    logits the batch computes) within max_weight, when given."""
    batch: list[T] = []
    widest = count = weighed = 0
    for item in sorted(items, key=lambda i: -width(i)):
        widest = max(widest, width(item))
        full = (max_members is not None and count + members(item) > max_members) or (
            max_weight is not None and weighed + weight(item) > max_weight)
        if batch and (full or (len(batch) + 1) * widest > token_budget):
            yield batch
            batch, widest, count, weighed = [], width(item), 0, 0
        batch.append(item)
        count += members(item)
        weighed += weight(item)
    if batch:
        yield batch


def halving_on_oom(pending: list[T], batches: Callable[[list[T], int], Iterator[tuple[B, list[T], bool]]],
                   score: Callable[[B], None], token_budget: int) -> int:
    """Score every pending item, halving the token budget whenever a batch runs out of GPU memory and cutting what
    is left again; returns the budget that worked, for the next call to start from.

    `batches(pending, budget)` yields (batch, the items it holds, whether no smaller batch of them exists); a batch
    that is already the smallest and still does not fit re-raises, since no budget would help.
    """
    import torch

    while pending:
        done: set[T] = set()
        smallest = True
        try:
            for batch, members, smallest in batches(pending, token_budget):
                score(batch)
                done.update(members)
        except torch.cuda.OutOfMemoryError:
            if smallest:
                raise
            token_budget //= 2
            log.warning("out of GPU memory; halving the token budget to %d", token_budget)
            torch.cuda.empty_cache()
        else:
            # Every batch ran: an item none of them held would be retried for ever.
            missed = [item for item in pending if item not in done]
            if missed:
                raise RuntimeError(f"{len(missed)} items were in no batch (first: {missed[0]!r})")
        pending = [item for item in pending if item not in done]
    return token_budget
