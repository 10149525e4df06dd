"""Strided windows: lm-eval's rolling windows at stride = max length, every token scored exactly once."""

from __future__ import annotations

import random

import pytest
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from raylm.requests.windows import strided_windows

PREFIX = 999


@pytest.mark.parametrize("max_length", [1, 2, 7, 16])
def test_stride_equal_to_max_length_is_lm_eval_rolling(max_length):
    rng = random.Random(max_length)
    for n in range(0, 60):
        tokens = [rng.randrange(500) for _ in range(n)]
        # lm-eval's loglikelihood_rolling: context_len=1, each window made disjoint from its continuation.
        lm_eval = [make_disjoint_window(w) for w in get_rolling_token_windows(tokens, PREFIX, max_length, 1)]
        assert strided_windows(tokens, PREFIX, max_length, max_length) == [(list(c), list(k)) for c, k in lm_eval]


@pytest.mark.parametrize("max_length,stride", [(1, 1), (8, 1), (8, 3), (8, 7), (16, 5)])
def test_every_token_scored_once_with_full_context_windows(max_length, stride):
    rng = random.Random(stride)
    for n in range(0, 50):
        tokens = [rng.randrange(500) for _ in range(n)]
        windows = strided_windows(tokens, PREFIX, max_length, stride)
        assert [t for _, continuation in windows for t in continuation] == tokens
        sequence = [PREFIX, *tokens]
        scored = 0
        for i, (context, continuation) in enumerate(windows):
            assert 0 < len(continuation) <= (max_length if i == 0 else stride)
            # The context is exactly the text before the continuation, as much of it as fits max_length inputs.
            assert context == sequence[max(0, scored + len(continuation) - max_length):scored + 1]
            if i > 0:
                assert len(context) + len(continuation) == max_length + 1
            scored += len(continuation)


@pytest.mark.parametrize("stride", [0, 9])
def test_stride_outside_one_to_max_length_is_refused(stride):
    with pytest.raises(ValueError, match="stride"):
        strided_windows([1, 2, 3], PREFIX, 8, stride)
