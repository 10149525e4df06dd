"""A task's per-document values from the files runs keep them in: raylm's Parquet (a native task's documents or
a rolling task's windows, lm-eval's logged samples as raylm keeps them) and lm-eval's samples_<task>_<date>.jsonl;
and a corpus run's per-document rows (samples/ppl.parquet).

Each value is the document's own value of a metric, under the name the metric is reported by; what pairs with
what, and whether the metric's reported number is the mean of these values, is raylm.compare.pairing's to decide.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from raylm.results.corpus_labels import NLL_COLUMNS, domain_samples_column
from raylm.errors import RaylmError
from raylm.results.sample_logs import read_sample_log
from raylm.storage.location import Location

# Per-document values of lm-eval's perplexity metrics are (loglikelihood, words or bytes) pairs that its
# aggregation pools over the corpus; per document, loglikelihood / units is the quantity that pairs.
PER_UNIT = {"word_perplexity": "loglikelihood_per_word", "byte_perplexity": "loglikelihood_per_byte"}
# lm-eval's `perplexity` (loglikelihood output type) logs each document's loglikelihood and aggregates exp(-mean).
RENAMED = {"perplexity": "loglikelihood"}
NATIVE_CHOICE_METRICS = ("acc", "acc_norm")


@dataclass
class DocScores:
    """One task's per-document values, rows in doc_id order."""

    doc_ids: np.ndarray
    values: dict[str, np.ndarray]  # metric (`acc`, or `acc,<filter>` under another filter) -> per-document values
    hashes: list[str] | None = None  # each document's doc_hash (lm-eval's), where the run logged it
    not_paired: list[str] = field(default_factory=list)  # metrics with no per-document value to pair
    row_hashes: list[str] | None = None  # each document's row_hash (raylm's native tasks': raylm.tasks.base)


def doc_scores(where: Location) -> DocScores:
    """A task's per-document values from raylm's Parquet (per document, or a rolling task's per request) or
    lm-eval's jsonl."""
    if where.suffix == ".jsonl":
        return _from_logged(where, read_sample_log(where))
    with where.open_input() as f:
        table = pq.read_table(f)
    names = table.column_names
    if "metrics" in names:  # lm-eval's logged samples, as raylm keeps them (raylm.results.lmeval_samples)
        return _from_logged(where, table.to_pylist())
    ids, index = np.unique(table["doc_id"].to_numpy(), return_inverse=True)
    hashes, row_hashes = (_native_hashes(where, table, column, ids, index) if column in names else None
                          for column in ("doc_hash", "row_hash"))
    if "words" in names:  # a native rolling task's scored windows: the first holds its document's words and bytes
        total = {c: np.bincount(index, weights=table[c].to_numpy().astype(np.float64))
                 for c in ("loglikelihood", "words", "bytes")}
        return DocScores(ids, {PER_UNIT[f"{unit[:-1]}_perplexity"]: _per_unit(total["loglikelihood"], total[unit])
                               for unit in ("words", "bytes")}, hashes,
                         not_paired=["bits_per_byte", "byte_perplexity", "word_perplexity"], row_hashes=row_hashes)
    if len(ids) != table.num_rows:
        raise RaylmError(f"{where}: a doc_id on several rows (not a per-document file)")
    order = np.argsort(table["doc_id"].to_numpy(), kind="stable")
    return DocScores(ids, {m: table[m].to_numpy().astype(np.float64)[order] for m in NATIVE_CHOICE_METRICS
                           if m in names}, hashes, row_hashes=row_hashes)


@dataclass
class CorpusRows:
    """A corpus run's documents in the order it read them: what tells them apart (file, bytes, characters), each
    one's NLL in nats, and its domain (None without --domain-column)."""

    path: np.ndarray
    bytes: np.ndarray
    chars: np.ndarray
    nll: np.ndarray
    domains: np.ndarray | None


def corpus_rows(where: Location, label: str, domain_column: str | None) -> CorpusRows:
    """The rows of a `raylm ppl` samples file (label `ppl`, or a masked LM's `pseudo_ppl`), grouped by the run's
    --domain-column: the file's `domain` column, or its `path` for `path`."""
    loss, sign = NLL_COLUMNS[label]
    domain = domain_samples_column(domain_column)
    wanted = list(dict.fromkeys(["path", "bytes", "chars", loss, *([domain] if domain else [])]))
    with where.open_input() as f:
        parquet = pq.ParquetFile(f)
        missing = [c for c in wanted if c not in parquet.schema_arrow.names]
        if missing:
            raise RaylmError(f"{where}: no column {', '.join(missing)} (not the samples of a raylm {label} run)")
        table = parquet.read(columns=wanted)
    column = {c: table[c].to_numpy() for c in wanted}
    return CorpusRows(column["path"], column["bytes"].astype(np.int64), column["chars"].astype(np.int64),
                      sign * column[loss].astype(np.float64), None if domain is None else column[domain])


def _native_hashes(where: Location, table: Any, column: str, ids: np.ndarray, index: np.ndarray) -> list[str]:
    """Each document's hash in `column` (the same on every row of one document)."""
    hashes = [""] * len(ids)
    for k, value in zip(index.tolist(), table[column].to_pylist()):
        if hashes[k] and hashes[k] != value:
            raise RaylmError(f"{where}: doc {ids[k]} has two {column} values")
        hashes[k] = value
    return hashes


def _from_logged(where: Location, samples: list[dict[str, Any]]) -> DocScores:
    """Per-document values from lm-eval's logged samples: one record per document and filter, each metric's
    value under its name (a number, or a tuple its aggregation pools)."""
    by_filter: dict[str, dict[int, dict[str, Any]]] = {}
    for sample in samples:
        try:
            by_filter.setdefault(sample["filter"], {})[int(sample["doc_id"])] = sample
        except (KeyError, TypeError, ValueError) as e:
            raise RaylmError(f"{where}: a sample without a filter or integer doc_id ({e})") from None
    if not by_filter:
        raise RaylmError(f"{where}: no samples")
    first = next(iter(by_filter.values()))
    doc_ids = np.array(sorted(first), np.int64)
    values: dict[str, np.ndarray] = {}
    not_paired: list[str] = []
    for filter_key, docs in by_filter.items():
        if sorted(docs) != doc_ids.tolist():
            raise RaylmError(f"{where}: filter {filter_key} has other documents than {next(iter(by_filter))}")
        rows = [docs[d] for d in doc_ids.tolist()]
        if not isinstance(rows[0].get("metrics"), list):
            raise RaylmError(f"{where}: doc {doc_ids[0]} has no list of `metrics` (not lm-eval's logged samples)")
        for metric in rows[0]["metrics"]:
            name = metric if filter_key == "none" else f"{metric},{filter_key}"
            paired = _per_document(metric, [row.get(metric) for row in rows])
            if paired is None:
                not_paired.append(name)
            else:
                new_name, column = paired
                values[new_name if filter_key == "none" else f"{new_name},{filter_key}"] = column
    hashes = [str(row.get("doc_hash")) for row in (first[d] for d in doc_ids.tolist())]
    return DocScores(doc_ids, values, hashes if all(h != "None" for h in hashes) else None, not_paired)


def _per_document(metric: str, values: list[Any]) -> tuple[str, np.ndarray] | None:
    """The value that pairs for one metric, under the name it is reported by, or None where a document's value
    is not a number (bleu's, f1's and mcc's (gold, prediction) pairs are only scored over the whole corpus)."""
    if metric in PER_UNIT:
        pairs = [_unit_pair(v) for v in values]
        if all(p is not None for p in pairs):
            logliks, units = np.array(pairs, np.float64).reshape(-1, 2).T
            return PER_UNIT[metric], _per_unit(logliks, units)
        return None
    numbers = [_number(v) for v in values]
    if metric == "bits_per_byte" or any(n is None for n in numbers):
        return None  # bits_per_byte's pairs are byte_perplexity's: loglikelihood_per_byte pairs them
    return RENAMED.get(metric, metric), np.array(numbers, np.float64)


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def _per_unit(loglikelihood: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Loglikelihood per word or byte; nan for a document with none (an empty page)."""
    return np.divide(loglikelihood, units, out=np.full(len(units), math.nan), where=units > 0)


def _unit_pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, str):  # raylm's Parquet keeps lm-eval's tuples as JSON text when Arrow cannot type them
        value = json.loads(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(v) is not None for v in value):
        return float(value[0]), float(value[1])
    return None
