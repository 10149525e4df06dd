"""Token-budget batching: longest first, each batch as wide as its first (longest) member allows.

Rows of a batch are right-padded to its widest row, so a batch costs its row count times that width. Sorting by
length keeps the padding small, and going longest first makes the first batch the biggest, so an out-of-memory
error shows at once and every later batch is narrower. On out of memory the budget halves, and it grows back
once batches fit again (TokenBudget).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")
B = TypeVar("B")

log = logging.getLogger(__name__)

GROW_AFTER = 16  # batches in a row that fit before a halved token budget doubles again


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


@dataclass
class TokenBudget:
    """A scorer's token budget, kept across its calls: halved whenever a batch runs out of GPU memory, and doubled
    again once `grow_after` batches in a row have fitted, never past `ceiling` (where it started). One unusually
    wide batch, or memory another process held for a moment, must not slow the rest of a long run; a budget that
    grows back into an out-of-memory error waits twice as long before it grows again."""

    tokens: int
    ceiling: int = 0  # 0: the starting `tokens`
    fitted: int = 0  # batches in a row that fitted since the budget last changed
    grow_after: int = GROW_AFTER

    def __post_init__(self) -> None:
        self.ceiling = self.ceiling or self.tokens


def halving_on_oom(pending: list[T], batches: Callable[[list[T], int], Iterator[tuple[B, list[T], bool]]],
                   score: Callable[[B], None], budget: TokenBudget) -> None:
    """Score every pending item within `budget`, halving it whenever a batch runs out of GPU memory and growing it
    back after a run of batches that fit (TokenBudget), cutting what is left again at each change.

    `batches(pending, tokens)` yields (batch, the items it holds, whether no smaller batch of them exists); a batch
    that is already the smallest and still does not fit re-raises, since no budget would help.
    """
    import torch

    grown = False  # whether the budget doubled in this call: an out-of-memory error after it doubles the wait
    while pending:
        done: set[T] = set()
        smallest, grow = True, False
        try:
            for batch, members, smallest in batches(pending, budget.tokens):
                score(batch)
                done.update(members)
                budget.fitted += 1
                if budget.fitted >= budget.grow_after and budget.tokens < budget.ceiling:
                    grow = True
                    break
        except torch.cuda.OutOfMemoryError:
            if smallest or budget.tokens == 1:
                raise
            if grown:
                budget.grow_after *= 2
            budget.tokens, budget.fitted = budget.tokens // 2, 0
            log.warning("out of GPU memory; halving the token budget to %d", budget.tokens)
            torch.cuda.empty_cache()
        else:
            if grow:
                budget.tokens, budget.fitted, grown = min(budget.ceiling, 2 * budget.tokens), 0, True
                log.info("%d batches in a row fitted; growing the token budget back to %d", budget.grow_after,
                         budget.tokens)
            else:
                # Every batch ran: an item none of them held would be retried for ever.
                missed = [item for item in pending if item not in done]
                if missed:
                    raise RuntimeError(f"{len(missed)} items were in no batch (first: {missed[0]!r})")
        pending = [item for item in pending if item not in done]
