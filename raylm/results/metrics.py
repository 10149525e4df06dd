"""Merged sums -> metrics: lm-evaluation-harness's (under its names) for tasks, and the corpus commands'."""

from __future__ import annotations

import math
from typing import Any

NATS_PER_BIT = math.log(2)


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


def perplexities(nll: float, counts: dict[str, float]) -> dict[str, float]:
    """Per-unit perplexities of a total NLL (nats), weighted by the whole corpus (total NLL over total units, not
    a mean of per-document values); nan where there are no units to divide by."""
    out = {f"{unit}_perplexity": math.exp(_ratio(nll, counts[f"{unit}s"])) for unit in ("token", "word", "byte")}
    out["bits_per_byte"] = bits_per_unit(nll, counts["bytes"])
    if "chars" in counts:
        out["bits_per_char"] = bits_per_unit(nll, counts["chars"])
    return out


def bits_per_unit(nll: float, units: float) -> float:
    """A total NLL (nats) over its units, in bits: bits per byte or per char pooled over a corpus; nan without
    units. raylm compare computes a run's bits per byte again from its per-document NLLs with this, so that it is
    the run's own number to the bit."""
    return _ratio(nll, units) / NATS_PER_BIT


def figures(metrics: dict[str, Any]) -> dict[str, float]:
    """The figures among a corpus run's metrics (ppl_metrics, pseudo_ppl_metrics, kl_metrics): what they compute
    from the sums (floats: perplexities, bits per byte and per char, KL per token, disagreement rate), not the sums
    (floats named `*_sum*`) and counts (ints) they carry beside them. Told by name and type alone, so that a
    results.json read back (raylm compare) gives the figures the run averaged over its domains."""
    return {key: value for key, value in metrics.items() if isinstance(value, float) and "_sum" not in key}


def rolling_metrics(sums: dict[str, float]) -> dict[str, float]:
    """lm-eval's perplexity metrics (plus token perplexity) under its `,none` filter suffix."""
    values = perplexities(sums["nll"], sums)
    return {f"{key},none": values[key] for key in ("word_perplexity", "byte_perplexity", "bits_per_byte",
                                                   "token_perplexity")}


def token_perplexity(sums: dict[str, float]) -> float:
    """exp(NLL per scored token) of a task's summed rows: raylm's extra for rolling tasks."""
    return math.exp(_ratio(sums["nll"], sums["tokens"]))


def ppl_metrics(sums: dict[str, float]) -> dict[str, float]:
    return {**sums, **perplexities(sums["nll_sum"], sums)}


def pseudo_ppl_metrics(sums: dict[str, float]) -> dict[str, float]:
    """A masked LM's corpus numbers: the PLL sum (nats, <= 0) and the same per-unit quantities as ppl_metrics
    computed from -PLL, each named as a pseudo-perplexity (bits per byte and per char stay in bits of -PLL).
    They rank masked LMs against each other; they are not comparable with a causal LM's perplexity."""
    values = perplexities(-sums["pll_sum"], sums)
    return {**sums, **{key.replace("_perplexity", "_pseudo_perplexity"): value for key, value in values.items()}}


def kl_metrics(sums: dict[str, float]) -> dict[str, float]:
    return {
        **sums,
        "kl_mean": _ratio(sums["kl_sum"], sums["tokens"]),
        "argmax_disagree": _ratio(sums["argmax_disagree"], sums["tokens"]),
        "argmax_disagree_count": sums["argmax_disagree"],
        "token_perplexity_p": math.exp(_ratio(sums["nll_sum_p"], sums["tokens"])),
        "token_perplexity_q": math.exp(_ratio(sums["nll_sum_q"], sums["tokens"])),
    }


def _ratio(total: float, count: float) -> float:
    return total / count if count else float("nan")
