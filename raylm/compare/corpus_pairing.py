"""A corpus run against another on the same documents: bits per byte, the corpus's (`ppl`), each domain's
(`ppl/<domain>`) and their macro average (`ppl macro`), each b - a with its paired standard error
(raylm.compare.statistics.pooled_bits_difference).

Two corpus runs pair document by document, in the order they read them, when they hold the same documents: as
many, each with the same file, bytes and characters (the text itself is not kept). Bits per byte, the NLL over
the bytes, compares models whatever their tokenizers; the per-token figures would not (other tokens). The numbers
compared are the runs' own: the per-document NLLs must give what each results.json reports, or the figure is
refused. A `raylm kl` run holds no one model's NLL: it is shown, not compared.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from raylm.compare.corpus_output import domain_task, macro_task
from raylm.compare.pairing import agrees, reported_value, task_entry
from raylm.compare.run import Run
from raylm.compare.scores import CorpusRows
from raylm.compare.statistics import (
    Difference,
    macro_difference,
    pooled_bits_difference,
)
from raylm.results.corpus_labels import NLL_COLUMNS
from raylm.errors import RaylmError

FIGURE = "bits_per_byte"
IDENTITY = ("path", "bytes", "chars")  # what tells a corpus run's documents apart, in its samples

Rows = Callable[[Run], CorpusRows]


def refuse_other_documents(a: Run, b: Run, ra: CorpusRows, rb: CorpusRows) -> None:
    if len(ra.path) != len(rb.path):
        raise RaylmError(f"{a.corpus}: {a.label} and {b.label} are not on the same documents ({len(ra.path)} and "
                         f"{len(rb.path)}: another --data or --limit-docs)")
    same = {field: np.asarray(getattr(ra, field) == getattr(rb, field)) for field in IDENTITY}
    differ = np.flatnonzero(~np.logical_and.reduce(list(same.values())))
    if len(differ):
        i = int(differ[0])
        field = next(f for f, ok in same.items() if not ok[i])
        x, y = (getattr(rows, field)[i:i + 1].tolist()[0] for rows in (ra, rb))
        raise RaylmError(f"{a.corpus}: {a.label} and {b.label} hold other documents: document {i}'s {field} is "
                         f"{x!r} and {y!r} (other data, or another order)")


def _checked(name: str, a: Run, b: Run, difference: Difference | str) -> Difference | str:
    """The difference where a and b are what the runs report for the figure; else (or already) why not."""
    if isinstance(difference, str):
        return difference
    for run, computed in ((a, difference.a), (b, difference.b)):
        value = reported_value(run, name, FIGURE)
        if value is None or not agrees(value, computed):
            return (f"{run.label} reports {'none' if value is None else format(value, '.6g')}, its documents give "
                    f"{computed:.6g}: its samples are not its results'")
    return difference


def _pooled(ra: CorpusRows, rb: CorpusRows, keep: np.ndarray) -> Difference | str:
    if not ra.bytes[keep].sum():
        return "its documents hold no bytes"
    return pooled_bits_difference(ra.nll[keep], rb.nll[keep], ra.bytes[keep])


def _differences(label: str, ra: CorpusRows, rb: CorpusRows) -> dict[str, Difference | str]:
    """Each task's difference, or why there is none: the corpus, its domains (where both runs group the documents
    alike) and their macro average."""
    out = {label: _pooled(ra, rb, np.ones(len(ra.path), bool))}
    if ra.domains is None or rb.domains is None:
        return out
    if not np.array_equal(ra.domains, rb.domains):
        return {**out, macro_task(label): "the runs group the documents into other domains (another --domain-column)"}
    domains = sorted(set(ra.domains.tolist()))
    out.update({domain_task(label, d): _pooled(ra, rb, ra.domains == d) for d in domains})
    parts = [out[domain_task(label, d)] for d in domains]
    refused = next((domain_task(label, d) for d, part in zip(domains, parts) if isinstance(part, str)), None)
    out[macro_task(label)] = f"its domain {refused}'s is refused" if refused else macro_difference(parts)
    return out


def pair_corpus(a: Run, b: Run, rows_of: Rows) -> dict[str, Any]:
    """compare_pair's pair for two corpus runs of one label: {"a", "b", "tasks", "refused", "only_in_a",
    "only_in_b"}; a domain in one run only (one run without --domain-column) is listed, not compared."""
    label = a.corpus
    names_a, names_b = list(a.results["results"]), list(b.results["results"])
    pair = {"a": a.label, "b": b.label, "tasks": {}, "refused": {},
            "only_in_a": [n for n in names_a if n not in names_b],
            "only_in_b": [n for n in names_b if n not in names_a]}
    if label not in NLL_COLUMNS:
        pair["refused"][label] = {"kl_mean": "raylm kl's figures are not compared (raylm ppl's bits per byte are)"}
        return pair
    missing = [run.label for run in (a, b) if label not in run.samples]
    if missing:
        raise RaylmError(f"{label}: no samples/{label}.parquet (a row per document) in {' and '.join(missing)}")
    ra, rb = rows_of(a), rows_of(b)
    refuse_other_documents(a, b, ra, rb)
    for name, difference in _differences(label, ra, rb).items():
        checked = _checked(name, a, b, difference)
        if isinstance(checked, str):
            pair["refused"][name] = {FIGURE: checked}
        else:
            pair["tasks"][name] = task_entry({FIGURE: checked}, [])
    return pair
