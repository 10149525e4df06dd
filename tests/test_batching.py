"""Token-budget batching, on random lengths: every item once, within budget, longest first, member caps kept."""

from __future__ import annotations

import random

import pytest

from raylm.scoring.batching import budget_batches


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
