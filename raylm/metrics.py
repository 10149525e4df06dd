"""Merged sums -> the metrics lm-evaluation-harness reports, under its names."""

from __future__ import annotations

import math


def _mean_and_stderr(hits: int, n: int) -> tuple[float, float]:
    """Mean of 0/1 outcomes and its standard error: sample standard deviation / sqrt(n), as lm-eval computes it."""
    p = hits / n
    return p, math.sqrt(p * (1 - p) / (n - 1)) if n > 1 else float("nan")


def choice_metrics(sums: dict[str, float], names: tuple[str, ...]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, key in (("acc", "correct"), ("acc_norm", "correct_norm")):
        if name in names:
            mean, stderr = _mean_and_stderr(int(sums[key]), int(sums["docs"]))
            out[f"{name},none"] = mean
            out[f"{name}_stderr,none"] = stderr
    return out


def rolling_metrics(sums: dict[str, float]) -> dict[str, float]:
    """Perplexities weight by the whole corpus (sum of NLL over sum of units), not by averaging per document."""
    nll = sums["nll"]
    return {
        "word_perplexity,none": math.exp(nll / sums["words"]),
        "byte_perplexity,none": math.exp(nll / sums["bytes"]),
        "bits_per_byte,none": nll / sums["bytes"] / math.log(2),
        "token_perplexity,none": math.exp(nll / sums["tokens"]),
    }
