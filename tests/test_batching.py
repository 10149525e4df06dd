"""Token-budget batching, on random lengths: every item once, within budget, longest first, member caps kept."""

from __future__ import annotations

import random

import pytest

import torch

from raylm.scoring.batching import GROW_AFTER, TokenBudget, budget_batches, halving_on_oom


@pytest.mark.parametrize("seed", range(20))
def test_batches_cover_every_item_once_within_the_budget_longest_first(seed):
    rng = random.Random(seed)
    widths = [rng.randint(1, 300) for _ in range(rng.randint(1, 200))]
    members = [rng.randint(1, 4) for _ in widths]
    budget, cap = rng.choice([64, 256, 1024]), rng.choice([None, 1, 3, 8])
    batches = list(budget_batches(range(len(widths)), widths.__getitem__, budget, members.__getitem__, cap))
    assert sorted(i for b in batches for i in b) == list(range(len(widths)))
    order = [widths[i] for b in batches for i in b]
    assert order == sorted(order, reverse=True)
    for batch in batches:
        if len(batch) > 1:
            assert len(batch) * max(widths[i] for i in batch) <= budget
            if cap is not None:
                assert sum(members[i] for i in batch) <= cap
    for batch, after in zip(batches, batches[1:]):  # a batch closes only when the next row would not fit
        grown = batch + after[:1]
        over_budget = len(grown) * max(widths[i] for i in grown) > budget
        over_cap = cap is not None and sum(members[i] for i in grown) > cap
        assert over_budget or over_cap


def test_a_row_wider_than_the_budget_gets_a_batch_of_its_own():
    assert list(budget_batches([5, 500, 7], lambda w: w, 100)) == [[500], [7, 5]]


def test_an_item_no_batch_holds_is_an_error_not_an_endless_retry():
    """A planner that leaves an item out (a request with nothing to predict once did) must not loop for ever."""
    scored = []

    def batches(pending, budget):
        yield [p for p in pending if p != 2], [p for p in pending if p != 2], False

    with pytest.raises(RuntimeError, match=r"^1 items were in no batch \(first: 2\)$"):
        halving_on_oom([0, 1, 2], batches, scored.append, TokenBudget(64))
    assert scored == [[0, 1]]


def test_a_halved_budget_doubles_back_after_a_run_of_batches_that_fit_and_never_past_its_start():
    """Out of memory on the first two batches only (another process held memory for a while): the budget halves
    twice, then grows back one doubling per GROW_AFTER batches that fit, up to where it started and no further,
    and carries over to the next call. Every item is scored exactly once."""
    failures = [2]
    seen: list[tuple[int, int]] = []  # (budget, item) for each item scored

    def batches(pending, tokens):
        for item in pending:
            yield (tokens, item), [item], False

    def score(batch):
        if failures[0]:
            failures[0] -= 1
            raise torch.OutOfMemoryError("fake: out of memory")
        seen.append(batch)

    budget = TokenBudget(64)
    halving_on_oom(list(range(4 * GROW_AFTER)), batches, score, budget)
    assert sorted(item for _, item in seen) == list(range(4 * GROW_AFTER))
    used = [tokens for tokens, _ in seen]
    assert used == [16] * GROW_AFTER + [32] * GROW_AFTER + [64] * 2 * GROW_AFTER
    assert (budget.tokens, budget.ceiling) == (64, 64)
    failures[0] = 1
    halving_on_oom(list(range(GROW_AFTER + 1)), batches, score, budget)  # the next call starts from what is left
    assert budget.tokens == 64 and [t for t, _ in seen[4 * GROW_AFTER:]] == [32] * GROW_AFTER + [64]


def test_a_budget_that_grows_back_into_out_of_memory_waits_twice_as_long_to_grow_again():
    limit = 32  # the memory really holds 32 tokens: growing back to 64 fails each time

    def batches(pending, tokens):
        for item in pending:
            yield tokens, [item], False

    def score(tokens):
        if tokens > limit:
            raise torch.OutOfMemoryError("fake: out of memory")

    budget = TokenBudget(64)
    halving_on_oom(list(range(6 * GROW_AFTER)), batches, score, budget)
    assert budget.tokens == 32 and budget.grow_after == 4 * GROW_AFTER  # grew back twice, each time into an error
