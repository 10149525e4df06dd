"""Token-budget batching, on random lengths: every item once, within budget, longest first, member caps kept."""

from __future__ import annotations

import random

import pytest

from raylm.scoring.batching import budget_batches, halving_on_oom


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
        halving_on_oom([0, 1, 2], batches, scored.append, 64)
    assert scored == [[0, 1]]
