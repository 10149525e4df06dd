"""Per-request loglikelihoods of multiple-choice documents -> each document's predicted choice.

A shard holds whole documents, so it can decide its documents' predictions on its own. lm-eval ranks choices by
summed loglikelihood (acc) and by loglikelihood per character of the choice (acc_norm); ties go to the first
choice, as numpy's argmax (and so lm-eval) breaks them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa


@dataclass(frozen=True)
class Predictions:
    doc_id: np.ndarray
    gold: np.ndarray
    pred: np.ndarray
    pred_norm: np.ndarray


def norm_scores(scored: pa.Table) -> np.ndarray:
    """What acc_norm ranks by: each request's loglikelihood divided by its choice's character length.

    A choice that is empty after preprocessing (a HellaSwag ending that was only '[title]') has length 0, and
    lm-eval divides by it all the same (`lls / completion_len`): -inf, which never wins acc_norm, or nan for a
    loglikelihood of exactly 0, which np.argmax picks first. Dividing the same way keeps acc_norm lm-eval's.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        return scored["loglikelihood"].to_numpy() / scored["norm_len"].to_numpy().astype(np.float64)


def choice_predictions(scored: pa.Table) -> Predictions:
    doc_id = scored["doc_id"].to_numpy()
    loglik = scored["loglikelihood"].to_numpy()
    norm = norm_scores(scored)
    gold = scored["gold"].to_numpy()
    starts = np.flatnonzero(np.r_[True, doc_id[1:] != doc_id[:-1]])
    ends = np.r_[starts[1:], len(doc_id)]
    pred = np.array([np.argmax(loglik[s:e]) for s, e in zip(starts, ends)], dtype=np.int64)
    pred_norm = np.array([np.argmax(norm[s:e]) for s, e in zip(starts, ends)], dtype=np.int64)
    return Predictions(doc_id[starts], gold[starts], pred, pred_norm)
