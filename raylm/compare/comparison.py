"""Every run against the first of its kind: each run's samples read once, however many pairs it is in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from raylm.compare.corpus_pairing import pair_corpus
from raylm.compare.pairing import compare_pair
from raylm.compare.run import Run
from raylm.compare.scores import CorpusRows, DocScores, corpus_rows, doc_scores
from raylm.errors import RaylmError

T = TypeVar("T")


def compare_runs(runs: list[Run]) -> dict[str, Any]:
    """{"baseline": label, "comparisons": [pair, ...]} (raylm.compare.pairing.compare_pair's pairs). An evaluation
    is compared with the first evaluation, a corpus run with the first corpus run of its label (`ppl`) over the same
    data (its config's `data`): a sweep's points pair with their own kind, each corpus's with that corpus's."""
    if len(runs) < 2:
        raise RaylmError(f"compare needs two runs or more; {', '.join(r.label for r in runs) or 'none'} given")
    read: dict[tuple[int, str], Any] = {}

    def once(run: Run, name: str, reader: Callable[[], T]) -> T:
        key = (id(run), name)
        if key not in read:
            read[key] = reader()
        return read[key]

    def scores_of(run: Run, task: str) -> DocScores:
        return once(run, task, lambda: doc_scores(run.samples[task]))

    def rows_of(run: Run) -> CorpusRows:
        domain_column = run.results.get("config", {}).get("domain_column")
        return once(run, run.corpus, lambda: corpus_rows(run.samples[run.corpus], run.corpus, domain_column))

    firsts: dict[tuple[str | None, str | None], Run] = {}
    comparisons = []
    for run in runs:
        first = firsts.setdefault((run.corpus, run.results["config"].get("data") if run.corpus else None), run)
        if first is not run:
            comparisons.append(pair_corpus(first, run, rows_of) if run.corpus else compare_pair(first, run, scores_of))
    if not comparisons:
        raise RaylmError(f"{', '.join(r.label for r in runs)}: no two runs of one kind to compare (evaluations, or "
                         "corpus runs of one label over the same data: ppl, pseudo_ppl, kl)")
    return {"baseline": runs[0].label, "comparisons": comparisons}
