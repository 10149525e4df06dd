"""Per-document rows -> batch sums -> merged sums -> corpus metrics, for `raylm ppl` and `raylm kl`.

Counts add exactly and NLL/KL add with math.fsum, so the merged sums depend on how the stream was cut into
batches only by one float64 rounding per batch. Perplexities weight by the whole corpus (total NLL over total units).
"""

from __future__ import annotations

import math

import pyarrow as pa

COUNT_KEYS = ("docs", "tokens", "words", "bytes", "chars")
PPL_FLOAT_KEYS = ("nll_sum",)
KL_FLOAT_KEYS = ("kl_sum", "nll_sum_p", "nll_sum_q")
_KL_COLUMNS = {"kl_sum": "kl", "nll_sum_p": "nll_p", "nll_sum_q": "nll_q"}


def batch_sums(rows: pa.Table) -> dict[str, float]:
    """Sums of one batch of per-document rows from DocPerplexity or DocKL."""
    sums: dict[str, float] = {"docs": rows.num_rows}
    for key in COUNT_KEYS[1:]:
        sums[key] = int(sum(rows[key].to_pylist()))
    if "nll" in rows.column_names:
        sums["nll_sum"] = math.fsum(rows["nll"].to_pylist())
    else:
        for key, column in _KL_COLUMNS.items():
            sums[key] = math.fsum(rows[column].to_pylist())
        sums["argmax_disagree"] = int(sum(rows["argmax_disagree"].to_pylist()))
    return sums


def merge_sums(parts: list[dict[str, float]]) -> dict[str, float]:
    if not parts:
        return {}
    return {key: math.fsum(p[key] for p in parts) if isinstance(parts[0][key], float) else sum(p[key] for p in parts)
            for key in parts[0]}


def ppl_metrics(sums: dict[str, float]) -> dict[str, float]:
    nll = sums["nll_sum"]
    return {
        **sums,
        "token_perplexity": _exp_ratio(nll, sums["tokens"]),
        "word_perplexity": _exp_ratio(nll, sums["words"]),
        "byte_perplexity": _exp_ratio(nll, sums["bytes"]),
        "bits_per_byte": _ratio(nll, sums["bytes"]) / math.log(2),
        "bits_per_char": _ratio(nll, sums["chars"]) / math.log(2),
    }


def kl_metrics(sums: dict[str, float]) -> dict[str, float]:
    return {
        **sums,
        "kl_mean": _ratio(sums["kl_sum"], sums["tokens"]),
        "argmax_disagree": _ratio(sums["argmax_disagree"], sums["tokens"]),
        "argmax_disagree_count": sums["argmax_disagree"],
        "token_perplexity_p": _exp_ratio(sums["nll_sum_p"], sums["tokens"]),
        "token_perplexity_q": _exp_ratio(sums["nll_sum_q"], sums["tokens"]),
    }


def _ratio(total: float, count: int) -> float:
    return total / count if count else float("nan")


def _exp_ratio(total: float, count: int) -> float:
    return math.exp(total / count) if count else float("nan")
