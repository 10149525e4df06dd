"""Slow, obviously-correct references for corpus scoring: one window at a time, float64 models."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def reference_sequence(tokenizer, text: str) -> list[int]:
    """What the HF recipe feeds the model for one text: `tokenizer(text)`, whose added BOS only conditions. A
    tokenizer that adds nothing in front gets BOS (else EOS) prepended, so that every text token is predicted.

    Found by comparing the encodings with and without special tokens, not by looking for a BOS id, so it does not
    share raylm's rule."""
    with_special = list(tokenizer(text)["input_ids"])
    plain = list(tokenizer(text, add_special_tokens=False)["input_ids"])
    if len(with_special) == len(plain) + 1 and with_special[1:] == plain:
        return with_special
    assert with_special == plain, "a tokenizer that adds tokens after the text is not covered here"
    start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
    return [start, *plain]


@torch.inference_mode()
def reference_strided_nll(model64: torch.nn.Module, tokenizer, text: str, max_length: int,
                          stride: int) -> tuple[float, int]:
    """The HF strided-perplexity recipe on one text: each window's already-scored tokens are labelled -100, the
    loss summed.

    Windows are max_length model inputs over reference_sequence(text); the first scores everything it covers,
    each later one the `stride` tokens after the previous window. Returns (NLL, tokens scored).
    """
    sequence = reference_sequence(tokenizer, text)
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
