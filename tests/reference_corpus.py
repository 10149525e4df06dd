"""Slow, obviously-correct references for corpus scoring: one window at a time, float64 models."""

from __future__ import annotations

import torch
import torch.nn.functional as F


@torch.inference_mode()
def reference_strided_nll(model64: torch.nn.Module, tokens: list[int], prefix_token: int, max_length: int,
                          stride: int) -> tuple[float, int]:
    """The HF strided-perplexity recipe: each window's already-scored tokens are labelled -100, the loss summed.

    Windows are max_length model inputs over [prefix] + tokens; the first scores everything it covers, each later
    one the `stride` tokens after the previous window. Returns (NLL, tokens scored).
    """
    sequence = [prefix_token, *tokens]
    nll, scored, prev_end = 0.0, 0, 1
    while prev_end < len(sequence):
        end = min(len(sequence), max_length + 1 if prev_end == 1 else prev_end + stride)
        window = torch.tensor(sequence[max(0, end - max_length - 1):end])
        labels = window.clone()
        labels[: len(window) - (end - prev_end)] = -100
        logits = model64(input_ids=window[None, :-1]).logits[0].double()
        nll += float(F.cross_entropy(logits, labels[1:], ignore_index=-100, reduction="sum"))
        scored += int((labels[1:] != -100).sum())
        prev_end = end
    return nll, scored


@torch.inference_mode()
def reference_kl(p64: torch.nn.Module, q64: torch.nn.Module, context: list[int], continuation: list[int],
                 max_length: int) -> tuple[float, float, float, int]:
    """(sum KL(P||Q), NLL under P, NLL under Q, argmax disagreements) over the continuation's positions."""
    whole = (context + continuation)[-(max_length + 1):]
    ids = torch.tensor([whole[:-1]])
    logp = torch.log_softmax(p64(input_ids=ids).logits[0].double(), -1)[-len(continuation):]
    logq = torch.log_softmax(q64(input_ids=ids).logits[0].double(), -1)[-len(continuation):]
    target = torch.tensor(continuation)[:, None]
    kl = float((logp.exp() * (logp - logq)).sum())
    return (kl, -float(logp.gather(-1, target).sum()), -float(logq.gather(-1, target).sum()),
            int((logp.argmax(-1) != logq.argmax(-1)).sum()))
