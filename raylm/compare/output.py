"""A comparison as the printed table, comparison.csv and comparison.json."""

from __future__ import annotations

import csv
import io
import json
import os
from collections.abc import Iterable
from typing import Any

from raylm.compare.statistics import shown_stderr
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location

COMPARISON_JSON, COMPARISON_CSV = "comparison.json", "comparison.csv"
CSV_COLUMNS = ("n", "a", "b", "diff", "diff_stderr", "unpaired_stderr", "diff_stderr_clustered", "clusters",
               "ci95_low", "ci95_high", "p_value")


def _rows(comparison: dict[str, Any]) -> Iterable[tuple[str, str, str, str, dict[str, Any]]]:
    for pair in comparison["comparisons"]:
        for task, entry in pair["tasks"].items():
            for metric, numbers in entry["metrics"].items():
                yield pair["a"], pair["b"], task, metric, numbers


def comparison_csv(comparison: dict[str, Any]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["run_a", "run_b", "task", "metric", *CSV_COLUMNS])
    for a, b, task, metric, numbers in _rows(comparison):
        writer.writerow([a, b, task, metric, *("" if numbers.get(c) is None else repr(numbers[c])
                                               for c in CSV_COLUMNS)])
    return buf.getvalue()


def notes(pair: dict[str, Any]) -> list[str]:
    """What a pair did not compare, a line each: metrics with no per-document value, metrics refused (with
    why), tasks in one run only."""
    lines = []
    not_paired = sorted({f"{t}: {m}" for t, e in pair["tasks"].items() for m in e["not_paired"]})
    if not_paired:
        lines.append("not paired (no per-document mean): " + ", ".join(not_paired))
    lines += [f"refused: {task}: {metric}: {why}" for task, metrics in pair["refused"].items()
              for metric, why in metrics.items()]
    for side in ("a", "b"):
        if pair[f"only_in_{side}"]:
            lines.append(f"only in {side} (not compared): {', '.join(pair[f'only_in_{side}'])}")
    return lines


def format_comparison(comparison: dict[str, Any]) -> str:
    """One table per pair: a row per task (groups too) and metric; `se` is the paired standard error, clustered
    by subtask for a group of several, `unpaired` what the runs' own stderrs would give."""
    lines = []
    for pair in comparison["comparisons"]:
        lines.append(f"a = {pair['a']}\nb = {pair['b']}")
        lines.append(f"{'task':<36} {'metric':<24} {'n':>6} {'a':>9} {'b':>9} {'b-a':>9} {'se':>8} "
                     f"{'unpaired':>8} {'95% interval':>21} {'p':>8}")
        for task, entry in pair["tasks"].items():
            for metric, d in entry["metrics"].items():
                interval = f"[{_num(d['ci95_low'], '+.4f')}, {_num(d['ci95_high'], '+.4f')}]"
                lines.append(f"{task:<36} {metric:<24} {d['n']:>6} {_num(d['a'], '9.4f')} {_num(d['b'], '9.4f')} "
                             f"{_num(d['diff'], '+9.4f')} {_num(shown_stderr(d), '8.4f')} "
                             f"{_num(d['unpaired_stderr'], '8.4f')} {interval:>21} {_num(d['p_value'], '8.3g')}")
        lines += notes(pair)
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _num(value: float | None, spec: str) -> str:
    """A number as the table shows it; None (nan in the statistics: one document) as n/a."""
    return format(value, spec) if value is not None else format("n/a", f">{spec.strip('+').split('.')[0]}")


def write_comparison(out_dir: str | os.PathLike[str] | Location, comparison: dict[str, Any]) -> Location:
    out = location(out_dir)
    write_atomic(out / COMPARISON_CSV, comparison_csv(comparison).encode())
    path = out / COMPARISON_JSON
    write_atomic(path, (json.dumps(comparison, indent=2, allow_nan=False) + "\n").encode())
    return path
