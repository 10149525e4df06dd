"""Membership scores of one text from its per-token log-probabilities: weak, model-side evidence of training on it.

- Min-K% Prob (Shi et al., 2023, "Detecting Pretraining Data from Large Language Models"): the mean of the lowest
  k % of the text's token log-probabilities. A text seen in training has few very unlikely tokens, so its score
  is higher (closer to 0). k % of n tokens is int(n * k / 100) tokens, as the authors' code counts them, but at
  least one (their code gives nan for texts shorter than 100 / k tokens). Their code reports the negated mean; this
  is the mean itself, so higher means more member-like.
- zlib ratio (Carlini et al., 2021, "Extracting Training Data from Large Language Models"): the text's log
  perplexity (mean NLL per token, nats) over its zlib-compressed size in bytes, as in the Min-K% authors' code
  (`np.log(ppl) / len(zlib.compress(text))`). Low perplexity for text that does not compress well is suspicious, so
  lower means more member-like.

Neither is proof: both rank texts, and thresholds depend on the model, the text's length and its domain (common
or formulaic text scores like a member without being one). Overlap with the corpus is evidence; these are hints.
"""

from __future__ import annotations

import math
import zlib

import numpy as np

DEFAULT_K = 20.0


def min_k_prob(token_logprobs: np.ndarray, k: float = DEFAULT_K) -> float:
    """Mean of the lowest k % of the token log-probs (float64); nan for a text with no tokens."""
    lp = np.asarray(token_logprobs, dtype=np.float64)
    if not len(lp):
        return math.nan
    count = max(1, int(len(lp) * (k / 100)))
    return float(np.mean(np.sort(lp)[:count]))


def zlib_ratio(token_logprobs: np.ndarray, text: str) -> float:
    """Mean NLL per token (nats) over the zlib-compressed UTF-8 size of the text (bytes); nan without tokens."""
    lp = np.asarray(token_logprobs, dtype=np.float64)
    if not len(lp):
        return math.nan
    return float(-lp.mean()) / len(zlib.compress(text.encode("utf-8")))


def check_k(k: float) -> None:
    if not 0 < k <= 100:
        raise ValueError(f"--k must be a percentage in (0, 100], got {k}")
