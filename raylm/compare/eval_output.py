"""A `raylm eval --output` directory as a run: results.json, and per task its samples/<task>_docs.parquet (one
row per document) or samples/<task>.parquet (a rolling task's windows)."""

from __future__ import annotations

from typing import Any

from raylm.compare.run import Run, read_results, scored_tasks
from raylm.storage.location import Location


def is_eval_output(where: Location) -> bool:
    return (where / "results.json").is_file()


def eval_run(where: Location, results: dict[str, Any]) -> Run:
    """The run whose results.json (read) is `results`."""
    present = {f.name: f for f in (where / "samples").iterdir()}
    samples = {}
    for task in scored_tasks(results):
        for name in (f"{task}_docs.parquet", f"{task}.parquet"):
            if name in present:
                samples[task] = present[name]
                break
    return Run(str(where), results, samples)


def find(where: Location) -> list[Run]:
    return [eval_run(where, read_results(where / "results.json"))] if is_eval_output(where) else []
