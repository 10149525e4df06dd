"""The slow, obviously-correct PLL every masked-LM fast path is checked against: one masked copy at a time, the
whole model over the whole row (no head cut, no padding, no batching), a full softmax; run it on float64 models.

It shares nothing with raylm.scoring.mlm but the request's fields; the masked set is written out from the
definition: the token itself, and for word-l2r every later continuation token of the same word.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

import torch

UNSCORED = -1


@torch.inference_mode()
def reference_pll(model64: torch.nn.Module, context: Sequence[int], continuation: Sequence[int],
                  following: Sequence[int], word_ids: Sequence[int], mask_token_id: int, variant: str
                  ) -> tuple[float, bool]:
    tokens = [*context, *continuation, *following]
    start = len(context)
    total, greedy = 0.0, True
    for k, word in enumerate(word_ids):
        if word == UNSCORED:
            continue
        ids = list(tokens)
        ids[start + k] = mask_token_id
        if variant == "word-l2r":
            for j in range(k + 1, len(word_ids)):
                if word_ids[j] == word:
                    ids[start + j] = mask_token_id
        logprob, argmax = _masked_prediction(model64, tuple(ids), start + k, continuation[k])
        total += logprob
        greedy = greedy and argmax == continuation[k]
    return total, greedy


@lru_cache(maxsize=65536)
def _masked_prediction(model64: torch.nn.Module, ids: tuple[int, ...], position: int, token: int
                       ) -> tuple[float, int]:
    """log P(token) and the argmax at `position`, from the whole model's full softmax over the whole row; cached,
    since a one-piece word's copy is the same row for both variants."""
    logprobs = torch.log_softmax(model64(input_ids=torch.tensor([ids])).logits[0].double(), dim=-1)[position]
    return float(logprobs[token]), int(logprobs.argmax())
