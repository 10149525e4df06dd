"""Comparing finished runs document by document: which outputs are runs, their per-document scores, the pairing
rules, and comparison.json / comparison.csv / the printed table. The statistics are raylm.results.paired's.

A run is a `raylm eval --output` directory (results.json and its --log-samples Parquet), a point of a sweep
directory (every <model>/<point>/results.json, in summary.csv's order), or an lm-eval --output_path directory
(its newest results_<date>.json and that run's samples_<task>_<date>.jsonl). The first run is the baseline;
every other run is compared with it.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from raylm.errors import RaylmError
from raylm.results.paired import Difference, paired_difference
from raylm.storage.atomic import write_atomic

COMPARISON_JSON, COMPARISON_CSV = "comparison.json", "comparison.csv"
# Per-document values of lm-eval's perplexity metrics are (loglikelihood, words or bytes) pairs that its
# aggregation pools over the corpus; per document, loglikelihood / units is the quantity that pairs.
PER_UNIT = {"word_perplexity": "loglikelihood_per_word", "byte_perplexity": "loglikelihood_per_byte"}
# lm-eval's `perplexity` (loglikelihood output type) logs each document's loglikelihood and aggregates exp(-mean).
RENAMED = {"perplexity": "loglikelihood"}


@dataclass(frozen=True)
class Run:
    label: str
    results: dict[str, Any]  # results.json, lm-eval's shape
    samples: dict[str, Path]  # task -> its per-document file (Parquet or lm-eval's jsonl)


@dataclass
class DocScores:
    """One task's per-document values, rows in doc_id order."""

    doc_ids: np.ndarray
    values: dict[str, np.ndarray]  # metric (`acc`, or `acc,<filter>` under another filter) -> per-document values
    hashes: list[str] | None = None  # lm-eval's doc_hash per document, where the run logged it
    not_paired: list[str] = field(default_factory=list)  # metrics with no per-document mean to pair


def find_runs(path: Path) -> list[Run]:
    """The runs an argument names: an eval output, a sweep's points, or lm-eval's output directory."""
    if (path / "results.json").is_file():
        return [_raylm_run(str(path), path)]
    lmeval = sorted({p.parent for p in [*path.glob("results_*.json"), *path.glob("*/results_*.json")]})
    if lmeval:
        return [_lmeval_run(d) for d in lmeval]
    points = _sweep_points(path)
    if points:
        return [_raylm_run(f"{path}/{model}/{point}", path / model / point) for model, point in points]
    raise RaylmError(f"{path}: no results.json, lm-eval results_<date>.json or sweep points under it")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise RaylmError(f"{path}: not readable as JSON ({e})") from e


def _raylm_run(label: str, directory: Path) -> Run:
    results = _read_json(directory / "results.json")
    samples = {}
    for task in _tasks(results):
        for name in (f"{task}_docs.parquet", f"{task}.parquet"):
            if (directory / "samples" / name).is_file():
                samples[task] = directory / "samples" / name
                break
    return Run(label, results, samples)


def _lmeval_run(directory: Path) -> Run:
    """lm-eval's newest run in the directory: its results file and the samples files of the same date."""
    newest = max(directory.glob("results_*.json"), key=lambda p: p.name)
    date = newest.stem.removeprefix("results_")
    results = _read_json(newest)
    samples = {task: directory / f"samples_{task}_{date}.jsonl" for task in _tasks(results)
               if (directory / f"samples_{task}_{date}.jsonl").is_file()}
    return Run(str(directory), results, samples)


def _sweep_points(path: Path) -> list[tuple[str, str]]:
    """A sweep's (model, point) folders in its summary.csv's order, else by name."""
    found = sorted((p.parent.parent.name, p.parent.name) for p in path.glob("*/*/results.json"))
    summary = path / "summary.csv"
    if not summary.is_file():
        return found
    with summary.open(encoding="utf-8", newline="") as f:
        order = [(row[0], row[1]) for row in list(csv.reader(f))[1:] if len(row) >= 2]
    return [p for p in order if p in found] + [p for p in found if p not in order]


def _tasks(results: dict[str, Any]) -> list[str]:
    """The scored tasks of a results.json: its configs (lm-eval writes one per task, none per group)."""
    return list(results.get("configs") or results.get("results", {}))


def _number(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, (int, float)) else None


def doc_scores(path: Path, reported: Iterable[str] = ("acc", "acc_norm")) -> DocScores:
    """A task's per-document values from raylm's Parquet (per document, or a rolling task's per request) or
    lm-eval's jsonl; `reported`: the metrics results.json reports for a native multiple-choice task (its
    Parquet holds acc_norm for WinoGrande too, which lm-eval's winogrande does not report)."""
    if path.suffix == ".jsonl":
        return _from_logged(path, read_samples_jsonl(path))
    table = pq.read_table(path)
    names = table.column_names
    if "metrics" in names:  # lm-eval's logged samples, as raylm keeps them (raylm.results.lmeval_samples)
        return _from_logged(path, table.to_pylist())
    if "words" in names:  # a native rolling task's scored windows: the first holds its document's words and bytes
        ids, index = np.unique(table["doc_id"].to_numpy(), return_inverse=True)
        total = {c: np.bincount(index, weights=table[c].to_numpy().astype(np.float64))
                 for c in ("loglikelihood", "words", "bytes")}
        return DocScores(ids, {PER_UNIT[f"{unit[:-1]}_perplexity"]: _per_unit(total["loglikelihood"], total[unit])
                               for unit in ("words", "bytes")},
                         not_paired=["bits_per_byte", "byte_perplexity", "word_perplexity"])
    order = np.argsort(table["doc_id"].to_numpy(), kind="stable")
    metrics = [m for m in ("acc", "acc_norm") if m in names and m in reported]
    return DocScores(table["doc_id"].to_numpy()[order],
                     {m: table[m].to_numpy().astype(np.float64)[order] for m in metrics})


def read_samples_jsonl(path: Path) -> list[dict[str, Any]]:
    """lm-eval's samples_<task>_<date>.jsonl, a record per line."""
    out = []
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise RaylmError(f"{path}: line {number} is not JSON ({e.msg})") from None
    return out


def _from_logged(path: Path, samples: list[dict[str, Any]]) -> DocScores:
    """Per-document values from lm-eval's logged samples: one record per document and filter, each metric's
    value under its name (a number, or a tuple its aggregation pools)."""
    by_filter: dict[str, dict[int, dict[str, Any]]] = {}
    for sample in samples:
        try:
            by_filter.setdefault(sample["filter"], {})[int(sample["doc_id"])] = sample
        except (KeyError, TypeError, ValueError) as e:
            raise RaylmError(f"{path}: a sample without a filter or integer doc_id ({e})") from None
    if not by_filter:
        raise RaylmError(f"{path}: no samples")
    first = next(iter(by_filter.values()))
    doc_ids = np.array(sorted(first), np.int64)
    values: dict[str, np.ndarray] = {}
    not_paired: list[str] = []
    for filter_key, docs in by_filter.items():
        if sorted(docs) != doc_ids.tolist():
            raise RaylmError(f"{path}: filter {filter_key} has other documents than {next(iter(by_filter))}")
        rows = [docs[d] for d in doc_ids.tolist()]
        if not isinstance(rows[0].get("metrics"), list):
            raise RaylmError(f"{path}: doc {doc_ids[0]} has no list of `metrics` (not lm-eval's logged samples)")
        for metric in rows[0]["metrics"]:
            name = metric if filter_key == "none" else f"{metric},{filter_key}"
            paired = _per_document(metric, [row.get(metric) for row in rows])
            if paired is None:
                not_paired.append(name)
            else:
                new_name, column = paired
                values[new_name if filter_key == "none" else f"{new_name},{filter_key}"] = column
    hashes = [str(docs_row.get("doc_hash")) for docs_row in (first[d] for d in doc_ids.tolist())]
    return DocScores(doc_ids, values, hashes if all(h != "None" for h in hashes) else None, not_paired)


def _per_document(metric: str, values: list[Any]) -> tuple[str, np.ndarray] | None:
    """The value that pairs for one metric, under the name it is reported by, or None where a document's value
    is not one (bleu's, f1's and mcc's (gold, prediction) pairs are only scored over the whole corpus)."""
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


def _per_unit(loglikelihood: np.ndarray, units: np.ndarray) -> np.ndarray:
    """Loglikelihood per word or byte; nan for a document with none (an empty page)."""
    return np.divide(loglikelihood, units, out=np.full(len(units), math.nan), where=units > 0)


def _unit_pair(value: Any) -> tuple[float, float] | None:
    if isinstance(value, str):  # raylm's Parquet keeps lm-eval's tuples as JSON text when Arrow cannot type them
        value = json.loads(value)
    if isinstance(value, (list, tuple)) and len(value) == 2 and all(_number(v) is not None for v in value):
        return float(value[0]), float(value[1])
    return None


def _reported(run: Run, task: str) -> set[str]:
    return {key.split(",")[0] for key in run.results.get("results", {}).get(task, {})}


def _refuse_unpaired(task: str, a: Run, b: Run, sa: DocScores, sb: DocScores) -> None:
    if not np.array_equal(sa.doc_ids, sb.doc_ids):
        common = len(np.intersect1d(sa.doc_ids, sb.doc_ids))
        raise RaylmError(f"{task}: {a.label} and {b.label} are not on the same documents ({len(sa.doc_ids)} and "
                         f"{len(sb.doc_ids)}, {common} in common: another --limit or --samples)")
    if sa.hashes is not None and sb.hashes is not None and sa.hashes != sb.hashes:
        doc = sa.doc_ids[next(i for i, (x, y) in enumerate(zip(sa.hashes, sb.hashes)) if x != y)]
        raise RaylmError(f"{task}: {a.label} and {b.label} hold other documents under doc_id {doc} (doc_hash "
                         "differs: other data)")
    shots = [run.results.get("n-shot", {}).get(task, 0) for run in (a, b)]
    seeds = [run.results.get("config", {}).get("fewshot_seed") for run in (a, b)]
    if all(shots) and seeds[0] != seeds[1]:
        raise RaylmError(f"{task}: {a.label} and {b.label} drew their few-shot examples with other seeds "
                         f"({seeds[0]} and {seeds[1]})")


def _difference(a: np.ndarray, b: np.ndarray, clusters: np.ndarray | None = None) -> Difference | None:
    """Over the documents with a value in both runs (a page with no words has no loglikelihood per word, and
    adds nothing to the corpus perplexity either); None if there are none."""
    keep = np.isfinite(a) & np.isfinite(b)
    if not keep.any():
        return None
    return paired_difference(a[keep], b[keep], clusters[keep] if clusters is not None else None)


def _leaves(group: str, subtasks: dict[str, list[str]]) -> list[str]:
    return [leaf for child in subtasks[group]
            for leaf in (_leaves(child, subtasks) if child in subtasks else [child])]


def _entry(differences: dict[str, Difference], not_paired: Iterable[str]) -> dict[str, Any]:
    """A task's or group's comparison: its first metric's numbers at the top (the primary one, as lm-eval lists
    them), every paired metric under `metrics`, and what could not be paired."""
    metric, primary = next(iter(differences.items()))
    return {"metric": metric, **primary.as_dict(), "metrics": {m: d.as_dict() for m, d in differences.items()},
            "not_paired": sorted(set(not_paired))}


def compare_pair(a: Run, b: Run) -> dict[str, Any]:
    """{"a", "b", "tasks": {task or group: entry}, "only_in_a", "only_in_b"}: every task both runs logged per
    document, and every group all of whose subtasks are among them, clustered by subtask."""
    shared = [t for t in a.samples if t in b.samples]
    if not shared:
        raise RaylmError(f"{a.label} and {b.label} have no task with per-document samples in common "
                         "(run raylm eval with --log-samples)")
    scores = {}
    for task in shared:
        sa, sb = (doc_scores(run.samples[task], _reported(run, task)) for run in (a, b))
        _refuse_unpaired(task, a, b, sa, sb)
        scores[task] = (sa, sb)
    tasks: dict[str, Any] = {}
    for task, (sa, sb) in scores.items():
        metrics = [m for m in sa.values if m in sb.values]
        differences = {m: d for m in metrics if (d := _difference(sa.values[m], sb.values[m])) is not None}
        if differences:
            tasks[task] = _entry(differences, sa.not_paired + sb.not_paired)
    subtasks = a.results.get("group_subtasks") or {}
    for group in subtasks:
        if subtasks[group] != (b.results.get("group_subtasks") or {}).get(group):
            continue
        leaves = _leaves(group, subtasks)
        if not leaves or any(leaf not in tasks for leaf in leaves):
            continue
        metrics = [m for m in tasks[leaves[0]]["metrics"] if all(m in tasks[leaf]["metrics"] for leaf in leaves)]
        differences = {}
        for metric in metrics:
            va = np.concatenate([scores[leaf][0].values[metric] for leaf in leaves])
            vb = np.concatenate([scores[leaf][1].values[metric] for leaf in leaves])
            clusters = np.concatenate([np.full(len(scores[leaf][0].doc_ids), i) for i, leaf in enumerate(leaves)])
            if (difference := _difference(va, vb, clusters)) is not None:
                differences[metric] = difference
        if differences:
            tasks[group] = _entry(differences, (m for leaf in leaves for m in tasks[leaf]["not_paired"]))
    order = [name for name in a.results.get("results", {}) if name in tasks]
    return {"a": a.label, "b": b.label, "tasks": {name: tasks[name] for name in order + sorted(set(tasks) - set(order))},
            "only_in_a": sorted(set(a.samples) - set(b.samples)), "only_in_b": sorted(set(b.samples) - set(a.samples))}


def compare_runs(paths: list[Path]) -> dict[str, Any]:
    """Every run the paths name, each against the first: {"baseline": label, "comparisons": [pair, ...]}."""
    runs = [run for path in paths for run in find_runs(path)]
    if len(runs) < 2:
        raise RaylmError(f"compare needs two runs or more; {', '.join(map(str, paths))} hold {len(runs)}")
    return {"baseline": runs[0].label, "comparisons": [compare_pair(runs[0], run) for run in runs[1:]]}


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
                clustered = d.get("diff_stderr_clustered")
                se = clustered if clustered is not None else d["diff_stderr"]
                interval = f"[{_num(d['ci95_low'], '+.4f')}, {_num(d['ci95_high'], '+.4f')}]"
                lines.append(f"{task:<36} {metric:<24} {d['n']:>6} {_num(d['a'], '9.4f')} {_num(d['b'], '9.4f')} "
                             f"{_num(d['diff'], '+9.4f')} {_num(se, '8.4f')} {_num(d['unpaired_stderr'], '8.4f')} "
                             f"{interval:>21} {_num(d['p_value'], '8.3g')}")
        not_paired = sorted({f"{t}: {m}" for t, e in pair["tasks"].items() for m in e["not_paired"]})
        if not_paired:
            lines.append("not paired (no per-document mean): " + ", ".join(not_paired))
        for side in ("a", "b"):
            if pair[f"only_in_{side}"]:
                lines.append(f"only in {side} (not compared): {', '.join(pair[f'only_in_{side}'])}")
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def _num(value: float | None, spec: str) -> str:
    """A number as the table shows it; None (nan in the statistics: one document) as n/a."""
    return format(value, spec) if value is not None else format("n/a", f">{spec.strip('+').split('.')[0]}")


def write_comparison(out_dir: Path, comparison: dict[str, Any]) -> Path:
    write_atomic(out_dir / COMPARISON_CSV, comparison_csv(comparison).encode())
    path = out_dir / COMPARISON_JSON
    write_atomic(path, (json.dumps(comparison, indent=2, allow_nan=False) + "\n").encode())
    return path
