"""A document's tokens -> (context, continuation) requests that score every token exactly once.

With stride = max_length these are lm-eval's disjoint rolling windows (the WikiText task's), so corpus
perplexity and the WikiText task agree. A smaller stride gives the overlapping sliding window of the HF strided
perplexity recipe: each window after the first scores only its `stride` new tokens, and the first of them still
sees max_length - stride earlier tokens, so fewer tokens are predicted from a nearly empty context.
"""

from __future__ import annotations


def split_conditioning(ids: list[int], prefix_token: int) -> tuple[int, list[int]]:
    """A whole document's encoding -> (the token its first scored token is conditioned on, the tokens to score).

    This is how the HF strided-perplexity recipe treats a text: the model sees the tokenizer's own encoding, and
    a BOS the tokenizer put first only conditions, it is neither predicted nor counted. A tokenizer that adds no
    BOS gets the prefix token (BOS, else EOS) in front, as lm-eval's rolling windows do, so that the first text
    token is scored too instead of being dropped as the recipe drops it.
    """
    if ids and ids[0] == prefix_token:
        return ids[0], ids[1:]
    return prefix_token, ids


def strided_windows(tokens: list[int], prefix_token: int, max_length: int, stride: int
                    ) -> list[tuple[list[int], list[int]]]:
    """Windows of at most max_length model inputs; the first scores up to max_length tokens, each later one
    `stride` new tokens conditioned on as much earlier text (prefix token first) as still fits."""
    if not 1 <= stride <= max_length:
        raise ValueError(f"stride must be between 1 and max_length ({max_length}), got {stride}")
    sequence = [prefix_token, *tokens]  # tokens[i] is sequence[i + 1], predicted from sequence[:i + 1]
    windows: list[tuple[list[int], list[int]]] = []
    scored = 0
    while scored < len(tokens):
        end = min(len(tokens), scored + (max_length if scored == 0 else stride))
        start = max(0, end - max_length)
        windows.append((sequence[start:scored + 1], tokens[scored:end]))
        scored = end
    return windows
