"""A `raylm sweep` output as runs: every <model>/<point> output, in its summary.csv's order: an eval's, or a
corpus point's (`corpus-<name>`, a `raylm ppl` output, told by its results.json's config.command)."""

from __future__ import annotations

import csv
import io

from raylm.compare.corpus_output import corpus_run, is_corpus
from raylm.compare.eval_output import eval_run, is_eval_output
from raylm.compare.run import Run, read_results
from raylm.storage.location import Location


def _points(where: Location) -> list[tuple[str, str]]:
    """The sweep's (model, point) folders in its summary.csv's order, else by name."""
    found = sorted((model.name, point.name) for model in where.iterdir() if model.is_dir()
                   for point in model.iterdir() if is_eval_output(point))
    summary = where / "summary.csv"
    if not summary.is_file():
        return found
    order = [(row[0], row[1]) for row in list(csv.reader(io.StringIO(summary.read_text())))[1:] if len(row) >= 2]
    return [p for p in order if p in found] + [p for p in found if p not in order]


def _point_run(where: Location) -> Run:
    results = read_results(where / "results.json")
    return corpus_run(where, results) if is_corpus(results) else eval_run(where, results)


def find(where: Location) -> list[Run]:
    return [_point_run(where / model / point) for model, point in _points(where)]
