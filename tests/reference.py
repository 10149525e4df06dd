"""The slow, obviously-correct scorer every fast path is checked against: one request at a time, float64."""

from __future__ import annotations

import copy

import torch


def float64_copy(model: torch.nn.Module) -> torch.nn.Module:
    return copy.deepcopy(model).double().eval()


@torch.inference_mode()
def reference_score(model64: torch.nn.Module, context: list[int], continuation: list[int], max_length: int
                    ) -> tuple[float, bool]:
    """Sum of log p(continuation token | everything before it), context left-truncated to fit max_length."""
    whole = (context + continuation)[-(max_length + 1):]
    logits = model64(input_ids=torch.tensor([whole[:-1]])).logits[0].double()
    logprobs = torch.log_softmax(logits, dim=-1)
    total, greedy = 0.0, True
    first = len(whole) - 1 - len(continuation)
    for offset, token in enumerate(continuation):
        row = logprobs[first + offset]
        total += float(row[token])
        greedy &= int(row.argmax()) == token
    return total, greedy
