"""Every run against the first: each run's samples read once, however many pairs it is in."""

from __future__ import annotations

from typing import Any

from raylm.compare.pairing import compare_pair
from raylm.compare.run import Run
from raylm.compare.scores import DocScores, doc_scores
from raylm.errors import RaylmError


def compare_runs(runs: list[Run]) -> dict[str, Any]:
    """{"baseline": label, "comparisons": [pair, ...]} (raylm.compare.pairing.compare_pair's pairs)."""
    if len(runs) < 2:
        raise RaylmError(f"compare needs two runs or more; {', '.join(r.label for r in runs) or 'none'} given")
    read: dict[tuple[int, str], DocScores] = {}

    def scores_of(run: Run, task: str) -> DocScores:
        key = (id(run), task)
        if key not in read:
            read[key] = doc_scores(run.samples[task])
        return read[key]

    return {"baseline": runs[0].label, "comparisons": [compare_pair(runs[0], run, scores_of) for run in runs[1:]]}
