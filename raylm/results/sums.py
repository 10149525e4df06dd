"""Sums -> merged sums: a task's per-shard sums (raylm.scoring.sums) and a corpus's per-batch sums, merged into what
the metrics are computed from.

Everything the metrics need is a plain sum: counts add exactly, NLL and KL add in float64 with `math.fsum`.
Merging sums therefore gives the same metrics as reducing every result at once, however the work was cut into
shards or batches (up to one float64 rounding per part).
"""

from __future__ import annotations

import math

import pyarrow as pa

CORPUS_COUNTS = ("tokens", "words", "bytes", "chars")
_KL_COLUMNS = {"kl_sum": "kl", "nll_sum_p": "nll_p", "nll_sum_q": "nll_q"}


def corpus_batch_sums(rows: pa.Table) -> dict[str, float]:
    """Sums of one batch of per-document rows of `raylm ppl` (column nll; pll for a masked LM) or `raylm kl`
    (kl, nll_p, nll_q)."""
    sums: dict[str, float] = {"docs": rows.num_rows}
    for key in CORPUS_COUNTS:
        sums[key] = int(sum(rows[key].to_pylist()))
    if "nll" in rows.column_names:
        sums["nll_sum"] = math.fsum(rows["nll"].to_pylist())
    elif "pll" in rows.column_names:
        sums["pll_sum"] = math.fsum(rows["pll"].to_pylist())
    else:
        for key, column in _KL_COLUMNS.items():
            sums[key] = math.fsum(rows[column].to_pylist())
        sums["argmax_disagree"] = int(sum(rows["argmax_disagree"].to_pylist()))
    return sums


def merge(parts: list[dict[str, float]]) -> dict[str, float]:
    """Key by key: floats with math.fsum (exactly rounded, so the order of parts does not matter), counts exactly."""
    if not parts:
        return {}
    return {key: math.fsum(p[key] for p in parts) if isinstance(parts[0][key], float) else sum(p[key] for p in parts)
            for key in parts[0]}
