"""Per-request results -> per-shard sums -> merged sums.

Shards hold whole documents, so a shard can decide its documents' predictions on its own, and everything the
metrics need is a plain sum: counts add exactly, NLL adds in float64 with `math.fsum`. Merging shard sums
therefore gives the same metrics as reducing all per-request results at once, however the work was cut.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

CHOICE_KEYS = ("docs", "correct", "correct_norm")
ROLLING_KEYS = ("docs", "nll", "tokens", "words", "bytes")


@dataclass
class ScoredShard:
    """What an actor sends back for one shard: its scored requests, their sums, and who scored them."""

    table: pa.Table
    sums: dict[str, float]
    pid: int


@dataclass(frozen=True)
class Predictions:
    doc_id: np.ndarray
    gold: np.ndarray
    pred: np.ndarray
    pred_norm: np.ndarray


def choice_predictions(scored: pa.Table) -> Predictions:
    """argmax of loglikelihood (acc) and of loglikelihood per character of the choice (acc_norm), per doc.

    Ties go to the first choice, as numpy's argmax (and so lm-eval) breaks them.
    """
    doc_id = scored["doc_id"].to_numpy()
    loglik = scored["loglikelihood"].to_numpy()
    norm = loglik / scored["norm_len"].to_numpy().astype(np.float64)
    gold = scored["gold"].to_numpy()
    starts = np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]])
    ends = np.r_[starts[1:], len(doc_id)]
    pred = np.array([np.argmax(loglik[s:e]) for s, e in zip(starts, ends)], dtype=np.int64)
    pred_norm = np.array([np.argmax(norm[s:e]) for s, e in zip(starts, ends)], dtype=np.int64)
    return Predictions(doc_id[starts], gold[starts], pred, pred_norm)


def shard_sums(kind: str, scored: pa.Table) -> dict[str, float]:
    if kind == "multiple_choice":
        p = choice_predictions(scored)
        return {"docs": len(p.doc_id), "correct": int((p.pred == p.gold).sum()),
                "correct_norm": int((p.pred_norm == p.gold).sum())}
    loglik = scored["loglikelihood"].to_numpy()
    tokens = int(scored["continuation_tokens"].to_numpy().sum())
    return {"docs": len(np.unique(scored["doc_id"].to_numpy())), "nll": -math.fsum(loglik), "tokens": tokens,
            "words": int(scored["words"].to_numpy().sum()), "bytes": int(scored["bytes"].to_numpy().sum())}


def merge(kind: str, parts: list[dict[str, float]]) -> dict[str, float]:
    keys = CHOICE_KEYS if kind == "multiple_choice" else ROLLING_KEYS
    return {k: math.fsum(p[k] for p in parts) if k == "nll" else sum(int(p[k]) for p in parts) for k in keys}
