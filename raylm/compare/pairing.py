"""What pairs with what, and which number each task and group reports.

Two runs' tasks pair document by document when they hold the same documents (doc_id, and each hash both runs logged:
lm-eval's doc_hash of the doc its task processed, which raylm logs for its native tasks too, and raylm's row_hash of
a native task's source row) with few-shot examples drawn by the same seed. A metric pairs when the number its run
reports is the mean of its documents' values (checked against results.json: tinyBenchmarks' IRT scores, a median,
are not); loglikelihood per word or byte stands in for the perplexities, which are pooled over the corpus. A group
reports a mean of its subtasks' numbers (lm-eval's aggregate_subtask_metrics), weighted by their sizes or not
(weight_by_size); which one is read off the runs' own results.json, and the group's difference is the same
combination of its subtasks' paired differences, its clustered standard error likewise weighted.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from raylm.compare.run import Run
from raylm.compare.scores import PER_UNIT, RENAMED, DocScores
from raylm.compare.statistics import Difference, paired_difference
from raylm.errors import RaylmError

DERIVED = set(PER_UNIT.values()) | set(RENAMED.values())  # stand-ins, not the reported number: nothing to check
REL_TOL = 1e-9  # a mean summed in another order still agrees with results.json's to this

Scores = Callable[[Run, str], DocScores]


def refuse_unpaired(task: str, a: Run, b: Run, sa: DocScores, sb: DocScores) -> None:
    if not np.array_equal(sa.doc_ids, sb.doc_ids):
        common = len(np.intersect1d(sa.doc_ids, sb.doc_ids))
        raise RaylmError(f"{task}: {a.label} and {b.label} are not on the same documents ({len(sa.doc_ids)} and "
                         f"{len(sb.doc_ids)}, {common} in common: another --limit or --samples)")
    for column, xs, ys in (("doc_hash", sa.hashes, sb.hashes), ("row_hash", sa.row_hashes, sb.row_hashes)):
        if xs is not None and ys is not None and xs != ys:
            doc = sa.doc_ids[next(i for i, (x, y) in enumerate(zip(xs, ys)) if x != y)]
            raise RaylmError(f"{task}: {a.label} and {b.label} hold other documents under doc_id {doc} ({column} "
                             "differs: other data)")
    shots = [run.results.get("n-shot", {}).get(task, 0) for run in (a, b)]
    seeds = [run.results.get("config", {}).get("fewshot_seed") for run in (a, b)]
    if all(shots) and seeds[0] != seeds[1]:
        raise RaylmError(f"{task}: {a.label} and {b.label} drew their few-shot examples with other seeds "
                         f"({seeds[0]} and {seeds[1]})")


def _key(metric: str) -> str:
    """results.json's key of a per-document metric name: `acc` -> `acc,none`, `acc,<filter>` as it is."""
    return metric if "," in metric else f"{metric},none"


def reported_value(run: Run, name: str, metric: str) -> float | None:
    """A task's or group's reported number for a metric, None where it reports none."""
    for section in ("groups", "results"):
        value = run.results.get(section, {}).get(name, {}).get(_key(metric))
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def agrees(x: float, y: float) -> bool:
    return math.isclose(x, y, rel_tol=REL_TOL, abs_tol=1e-12)


def _difference(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None,
                weights: np.ndarray | None = None) -> Difference | None:
    """Over the documents with a value in both runs (a page with no words has no loglikelihood per word, and
    adds nothing to the corpus perplexity either); None if there are none."""
    keep = np.isfinite(a) & np.isfinite(b)
    if not keep.any():
        return None
    if weights is not None:
        weights = weights[keep] / weights[keep].sum()
    return paired_difference(a[keep], b[keep], clusters[keep] if clusters is not None else None, weights)


def pair_task(task: str, a: Run, b: Run, sa: DocScores, sb: DocScores
              ) -> tuple[dict[str, Difference], dict[str, str]]:
    """The task's paired metrics, and the metrics refused with the reason."""
    differences, refused = {}, {}
    for metric in (m for m in sa.values if m in sb.values):
        if metric not in DERIVED:
            reported = [reported_value(run, task, metric) for run in (a, b)]
            if None in reported:
                continue  # not a metric the task reports (WinoGrande's acc_norm, which lm-eval's winogrande lacks)
            means = [float(np.mean(s.values[metric])) for s in (sa, sb)]
            wrong = [(run, r, m) for run, r, m in zip((a, b), reported, means) if not agrees(r, m)]
            if wrong:
                run, r, m = wrong[0]
                refused[metric] = (f"{run.label} reports {r:.6g}, its documents' mean is {m:.6g}: the metric's "
                                   "aggregation is not a mean, so no paired difference describes it")
                continue
        if (difference := _difference(sa.values[metric], sb.values[metric])) is not None:
            differences[metric] = difference
    return differences, refused


def leaves(group: str, subtasks: dict[str, list[str]]) -> list[str]:
    return [leaf for child in subtasks[group]
            for leaf in (leaves(child, subtasks) if child in subtasks else [child])]


def _group_weights(group: str, metric: str, a: Run, b: Run, parts: list[Difference]) -> list[float] | str:
    """Each subtask's weight in the group's number (its size, or 1: lm-eval's weight_by_size), the one that
    gives both runs' reported values; or why none does."""
    sizes = [float(d.n) for d in parts]
    candidates = {"size": sizes, "equal": [1.0] * len(parts)}
    fits = {}
    for name, weights in candidates.items():
        combined = [np.dot(weights, [getattr(d, side) for d in parts]) / sum(weights) for side in ("a", "b")]
        reported = [reported_value(run, group, metric) for run in (a, b)]
        if all(r is not None and agrees(r, c) for r, c in zip(reported, combined)):
            fits[name] = weights
    if len(fits) == 2 and len(set(sizes)) > 1:
        return "its subtasks' numbers are the same weighed by size or not: the weights cannot be told apart"
    if not fits:
        return ("its reported number is not a mean of its subtasks' numbers, weighted by size or not: no paired "
                "difference describes it")
    return next(iter(fits.values()))


def pair_group(group: str, a: Run, b: Run, subtasks: dict[str, list[str]],
               tasks: dict[str, dict[str, Difference]], scores: dict[str, tuple[DocScores, DocScores]],
               refused_in: dict[str, dict[str, str]]) -> tuple[dict[str, Difference], dict[str, str]]:
    """A group's paired metrics over its subtasks' documents, clustered by subtask and weighted as the group
    weighs its subtasks; and the metrics refused with the reason (a subtask's refusal refuses the group's)."""
    names = leaves(group, subtasks)
    differences: dict[str, Difference] = {}
    refused = {metric: f"its subtask {leaf}'s is refused" for leaf in names for metric in refused_in[leaf]
               if reported_value(a, group, metric) is not None}
    for metric in (m for m in tasks[names[0]] if all(m in tasks[leaf] for leaf in names)):
        if metric not in DERIVED and reported_value(a, group, metric) is None:
            continue
        weights = (_group_weights(group, metric, a, b, [tasks[leaf][metric] for leaf in names])
                   if metric not in DERIVED else None)
        if isinstance(weights, str):
            refused[metric] = weights
            continue
        va = np.concatenate([scores[leaf][0].values[metric] for leaf in names])
        vb = np.concatenate([scores[leaf][1].values[metric] for leaf in names])
        clusters = np.concatenate([np.full(len(scores[leaf][0].doc_ids), i) for i, leaf in enumerate(names)])
        per_doc = None if weights is None else np.concatenate(
            [np.full(len(scores[leaf][0].doc_ids), weights[i] / sum(weights) / tasks[leaf][metric].n)
             for i, leaf in enumerate(names)])
        if per_doc is not None and np.allclose(per_doc, per_doc[0], rtol=REL_TOL, atol=0):
            per_doc = None  # weighted by size: the plain mean over the group's documents
        if (difference := _difference(va, vb, clusters, per_doc)) is not None:
            differences[metric] = difference
    return differences, refused


def task_entry(differences: dict[str, Difference], not_paired: Iterable[str]) -> dict[str, Any]:
    """A task's or group's comparison: its first metric's numbers at the top (the primary one, as lm-eval lists
    them), every paired metric under `metrics`, and what could not be paired."""
    metric, primary = next(iter(differences.items()))
    return {"metric": metric, **primary.as_dict(), "metrics": {m: d.as_dict() for m, d in differences.items()},
            "not_paired": sorted(set(not_paired))}


def compare_pair(a: Run, b: Run, scores_of: Scores) -> dict[str, Any]:
    """{"a", "b", "tasks": {task or group: entry}, "refused": {task or group: {metric: why}}, "only_in_a",
    "only_in_b"}: every task both runs logged per document, and every group all of whose subtasks are among
    them, clustered by subtask. `scores_of` reads a run's task (compare_runs reads each file once)."""
    shared = [t for t in a.samples if t in b.samples]
    if not shared:
        raise RaylmError(f"{a.label} and {b.label} have no task with per-document samples in common "
                         "(run raylm eval with --log-samples)")
    scores = {}
    for task in shared:
        sa, sb = scores_of(a, task), scores_of(b, task)
        refuse_unpaired(task, a, b, sa, sb)
        scores[task] = (sa, sb)
    paired: dict[str, dict[str, Difference]] = {}
    refused: dict[str, dict[str, str]] = {}
    not_paired: dict[str, list[str]] = {}
    for task, (sa, sb) in scores.items():
        paired[task], refused[task] = pair_task(task, a, b, sa, sb)
        not_paired[task] = sa.not_paired + sb.not_paired
    subtasks = a.results.get("group_subtasks") or {}
    for group in subtasks:
        names = leaves(group, subtasks)
        if (subtasks[group] != (b.results.get("group_subtasks") or {}).get(group) or not names
                or any(leaf not in paired for leaf in names)):
            continue
        paired[group], refused[group] = pair_group(group, a, b, subtasks, paired, scores, refused)
        not_paired[group] = [m for leaf in names for m in not_paired[leaf]]
    tasks = {name: task_entry(d, not_paired[name]) for name, d in paired.items() if d}
    order = [name for name in a.results.get("results", {}) if name in tasks]
    return {"a": a.label, "b": b.label, "tasks": {name: tasks[name] for name in order + sorted(set(tasks) - set(order))},
            "refused": {name: why for name, why in refused.items() if why},
            "only_in_a": sorted(set(a.samples) - set(b.samples)), "only_in_b": sorted(set(b.samples) - set(a.samples))}
