"""A document's tokens -> (context, continuation) requests that score every token exactly once.

With stride = max_length these are lm-eval's disjoint rolling windows (the WikiText task's), so corpus
perplexity and the WikiText task agree. A smaller stride gives the overlapping sliding window of the HF strided
perplexity recipe: each window after the first scores only its `stride` new tokens, and the first of them still
sees max_length - stride earlier tokens, so fewer tokens are predicted from a nearly empty context.
"""

from __future__ import annotations


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
