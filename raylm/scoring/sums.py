"""A scored shard -> its sums: what the metrics need from it. The actor that scored a shard computes them (as does
the checkpoint, for a shard it reloads), so they live below cluster/, beside the scorer.

Everything the metrics need is a plain sum: counts add exactly, NLL adds in float64 with `math.fsum`. Merging sums
(raylm.results.sums) therefore gives the same metrics however the work was cut into shards (up to one float64
rounding per shard).
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from raylm.requests.shards import LMEVAL_KIND
from raylm.scoring.predictions import choice_predictions


def shard_sums(kind: str, scored: pa.Table) -> dict[str, float]:
    """A shard's prediction counts (multiple choice), NLL and unit counts (rolling text), NLL and counts of an
    lm-eval task's rows (whose metrics lm-eval computes from the scores themselves), or an lm-eval generation
    shard's documents and generated tokens."""
    if kind == LMEVAL_KIND and "generation" in scored.column_names:
        return {"docs": len(np.unique(scored["doc_id"].to_numpy())),
                "generated_tokens": int(scored["generated_tokens"].to_numpy().sum())}
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
