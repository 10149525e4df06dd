"""A multiple-choice task's samples -> the scores of each document's correct choice and of its other choices, and
their histograms: the further apart a model holds the two, the better it separates right from wrong. The sweep's
PNGs and the report page both draw them from here.

raylm's native tasks log each choice's character length, so their score is what acc_norm ranks by (loglikelihood
per character); lm-eval's logged samples hold each choice's loglikelihood but not the length acc_norm divides by,
so theirs is what acc ranks by (the summed loglikelihood). The chart's axis says which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from raylm.errors import RaylmError
from raylm.results.lmeval_samples import docs_table
from raylm.results.sample_logs import read_sample_log
from raylm.scoring.predictions import norm_scores
from raylm.storage.location import Location, location

HIST_BINS = 40
PER_CHARACTER = "loglikelihood / choice length in characters"
SUMMED = "loglikelihood of the choice"
NATIVE_COLUMNS = ("req_idx", "gold", "loglikelihood", "norm_len")  # a native task's per-request samples
LOGGED_COLUMNS = ("doc_id", "target", "loglikelihoods", "filter")  # lm-eval's logged samples, as raylm keeps them


@dataclass(frozen=True)
class ChoiceScores:
    correct: np.ndarray  # one per document
    other: np.ndarray  # every other choice of every document
    score: str  # what the numbers are: PER_CHARACTER or SUMMED


def holds_choice_scores(path: str | os.PathLike[str] | Location) -> bool:
    """Whether choice_scores can read the file: lm-eval's jsonl, or Parquet with a native task's per-request
    columns or lm-eval's per-document ones (a native task's per-document file has neither)."""
    where = location(path)
    if where.suffix == ".jsonl":
        return True
    with where.open_input() as f:
        names = set(pq.read_schema(f).names)
    return set(NATIVE_COLUMNS) <= names or set(LOGGED_COLUMNS) <= names


def choice_scores(path: str | os.PathLike[str] | Location) -> ChoiceScores:
    """The correct and other choices' scores of a task's samples: a native task's samples/<task>.parquet, raylm's
    samples/<task>_docs.parquet of an lm-eval task, or lm-eval's samples_<task>_<date>.jsonl."""
    where = location(path)
    if where.suffix == ".jsonl":
        return _logged(where, docs_table(read_sample_log(where)))
    with where.open_input() as f:
        table = pq.read_table(f)
    if set(NATIVE_COLUMNS) <= set(table.column_names):
        score = norm_scores(table)
        gold = table["req_idx"].to_numpy() == table["gold"].to_numpy()
        shown = np.isfinite(score)  # an empty choice has no score per character (norm_scores) and no place on an axis
        return ChoiceScores(score[gold & shown], score[~gold & shown], PER_CHARACTER)
    if set(LOGGED_COLUMNS) <= set(table.column_names):
        return _logged(where, table)
    raise RaylmError(f"{where}: no per-choice loglikelihoods (neither {', '.join(NATIVE_COLUMNS)} nor "
                     f"{', '.join(LOGGED_COLUMNS)})")


def _logged(where: Location, table: pa.Table) -> ChoiceScores:
    """lm-eval's documents under their first filter (every filter logs the same choices), the target being the
    correct choice's index."""
    if table.num_rows == 0:
        raise RaylmError(f"{where}: no samples")
    table = table.filter(pc.equal(table["filter"], table["filter"][0]))
    correct, other = [], []
    for doc_id, target, logliks in zip(*(table[c].to_pylist() for c in ("doc_id", "target", "loglikelihoods"))):
        try:
            gold = int(target)
        except (TypeError, ValueError):
            gold = -1
        if not 0 <= gold < len(logliks):
            raise RaylmError(f"{where}: doc {doc_id}: target {target!r} is not the index of one of its "
                             f"{len(logliks)} choices")
        correct.append(logliks[gold])
        other += logliks[:gold] + logliks[gold + 1:]
    return ChoiceScores(np.array(correct, np.float64), np.array(other, np.float64), SUMMED)


def score_bins(scores: list[ChoiceScores]) -> np.ndarray:
    """HIST_BINS bins over every score given, so histograms drawn side by side share their x axis."""
    every = np.concatenate([np.concatenate([s.correct, s.other]) for s in scores])
    low, high = every.min(), every.max()
    return np.linspace(low, high if high > low else low + 1.0, HIST_BINS + 1)  # one score alone still has a bin


def draw_choice_scores(ax, scores: ChoiceScores, bins: np.ndarray) -> None:
    """The two histograms on one axis, as densities: a document has one correct choice and several others."""
    ax.hist(scores.other, bins=bins, density=True, alpha=0.6, label="other choices")
    ax.hist(scores.correct, bins=bins, density=True, alpha=0.6, label="correct choice")
