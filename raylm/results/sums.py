"""Scored requests -> sums, and sums -> merged sums, for tasks (per shard) and corpora (per batch of documents).

Everything the metrics need is a plain sum: counts add exactly, NLL and KL add in float64 with `math.fsum`.
Merging sums therefore gives the same metrics as reducing every result at once, however the work was cut into
shards or batches (up to one float64 rounding per part).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from raylm.requests.shards import LMEVAL_KIND
from raylm.results.predictions import choice_predictions

CORPUS_COUNTS = ("tokens", "words", "bytes", "chars")
_KL_COLUMNS = {"kl_sum": "kl", "nll_sum_p": "nll_p", "nll_sum_q": "nll_q"}


def shard_sums(kind: str, scored: pa.Table) -> dict[str, float]:
    """A shard's prediction counts (multiple choice), NLL and unit counts (rolling text), or NLL and counts of an
    lm-eval task's rows (whose metrics lm-eval computes from the scores themselves)."""
    if kind == LMEVAL_KIND:
        return {"docs": len(np.unique(scored["doc_id"].to_numpy())),
                "requests": int((scored["window"].to_numpy() == 0).sum()),
                "nll": -math.fsum(scored["loglikelihood"].to_numpy()),
                "tokens": int(scored["continuation_tokens"].to_numpy().sum())}
    if kind == "multiple_choice":
        p = choice_predictions(scored)
        return {"docs": len(p.doc_id), "correct": int((p.pred == p.gold).sum()),
                "correct_norm": int((p.pred_norm == p.gold).sum())}
    loglik = scored["loglikelihood"].to_numpy()
    tokens = int(scored["continuation_tokens"].to_numpy().sum())
    return {"docs": len(np.unique(scored["doc_id"].to_numpy())), "nll": -math.fsum(loglik), "tokens": tokens,
            "words": int(scored["words"].to_numpy().sum()), "bytes": int(scored["bytes"].to_numpy().sum())}


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
