"""Which runs an argument names: the first kind of output that finds any (a run kind is one reader module with a
`find(Location) -> list[Run]`)."""

from __future__ import annotations

import os

from raylm.compare import corpus_output, eval_output, lmeval_output, sweep_output
from raylm.compare.run import Run
from raylm.errors import RaylmError
from raylm.storage.location import Location, location

KINDS = (corpus_output, eval_output, lmeval_output, sweep_output)  # a corpus run's results.json before an eval's


def find_runs(where: str | os.PathLike[str] | Location) -> list[Run]:
    """The runs at a local path or storage URI: a corpus run's or an eval's output, lm-eval's output directory, or a
    sweep's points."""
    place = location(where)
    for kind in KINDS:
        runs = kind.find(place)
        if runs:
            return runs
    raise RaylmError(f"{place}: no results.json, lm-eval results_<date>.json or sweep points under it")
