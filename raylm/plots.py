"""A finished sweep's points -> summary.csv, summary.md and PNG plots, read back from each point's files.

Everything here reads what the points wrote (results.json, samples/*.parquet), never in-memory results, so a
resumed sweep reports its old points exactly like its new ones.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from raylm.report import write_atomic
from raylm.sweep_config import Sweep
from raylm.tasks import get_task

SUMMARY_METRICS = ("acc", "acc_norm", "word_perplexity", "bits_per_byte")
SETTING_COLUMNS = ("dtype", "quantization", "num_fewshot", "limit", "batch_size")
HIST_BINS = 40
SUMMARY_CSV, SUMMARY_MD, METRICS_PNG = "summary.csv", "summary.md", "metrics.png"


@dataclass(frozen=True)
class Row:
    model: str
    point: str
    directory: Path
    results: dict[str, Any]

    def metric(self, task: str, metric: str) -> tuple[float | None, float | None]:
        values = self.results["results"].get(task, {})
        return values.get(f"{metric},none"), values.get(f"{metric}_stderr,none")


def collect(sweep: Sweep, out: Path) -> list[Row]:
    rows = []
    for model in sweep.models:
        for point in sweep.points:
            directory = out / model.name / point.name
            rows.append(Row(model.name, point.name, directory, json.loads((directory / "results.json").read_text())))
    return rows


def write_reports(sweep: Sweep, out: Path) -> list[Path]:
    rows = collect(sweep, out)
    paths = [out / SUMMARY_CSV, out / SUMMARY_MD, out / METRICS_PNG]
    write_atomic(paths[0], summary_csv(sweep, rows).encode())
    write_atomic(paths[1], summary_markdown(sweep, rows).encode())
    plot_metrics(sweep, rows, paths[2])
    for task in sweep.tasks:
        if get_task(task).kind == "multiple_choice":
            paths.append(out / f"{task}_norm_scores.png")
            plot_norm_scores(task, rows, paths[-1])
    return paths


def _all_metrics(sweep: Sweep, rows: list[Row]) -> list[tuple[str, str]]:
    """(task, metric) pairs in the order results.json lists them, stderr keys folded into their metric."""
    seen: dict[tuple[str, str], None] = {}
    for task in sweep.tasks:
        for row in rows:
            for key in row.results["results"].get(task, {}):
                if key.endswith(",none") and "_stderr" not in key:
                    seen[(task, key.split(",")[0])] = None
    return list(seen)


def summary_csv(sweep: Sweep, rows: list[Row]) -> str:
    metrics = _all_metrics(sweep, rows)
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "point", *SETTING_COLUMNS, *(f"{t} {m}{s}" for t, m in metrics for s in ("", " stderr"))])
    for row in rows:
        config = row.results["config"]
        cells: list[Any] = [row.model, row.point, *(config.get(c) for c in SETTING_COLUMNS)]
        for task, metric in metrics:
            cells.extend("" if v is None else repr(v) for v in row.metric(task, metric))
        writer.writerow(cells)
    return buf.getvalue()


def summary_markdown(sweep: Sweep, rows: list[Row]) -> str:
    """Rows are models (× points), columns the headline metric of each task with its standard error."""
    metrics = [(t, m) for t, m in _all_metrics(sweep, rows) if m in SUMMARY_METRICS]
    header = ["model", "point", *(f"{t} {m}" for t, m in metrics)]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row.model, row.point]
        for task, metric in metrics:
            value, stderr = row.metric(task, metric)
            cells.append("" if value is None else f"{value:.4f}" + ("" if stderr is None or math.isnan(stderr)
                                                                   else f" ± {stderr:.4f}"))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(sweep: Sweep, rows: list[Row], path: Path) -> None:
    """One panel per task metric; in each, a group of bars per point, one bar per model, stderr as error bars."""
    plt = _pyplot()
    metrics = [(t, m) for t, m in _all_metrics(sweep, rows) if m in SUMMARY_METRICS]
    models = [m.name for m in sweep.models]
    points = [p.name for p in sweep.points]
    cols = min(3, len(metrics))
    fig, axes = plt.subplots(math.ceil(len(metrics) / cols), cols, figsize=(4.5 * cols, 3.6 * math.ceil(
        len(metrics) / cols)), squeeze=False)
    width = 0.8 / len(models)
    by_key = {(r.model, r.point): r for r in rows}
    for ax in list(axes.flat)[len(metrics):]:
        ax.axis("off")
    for ax, (task, metric) in zip(axes.flat, metrics):
        for i, model in enumerate(models):
            values = [by_key[(model, p)].metric(task, metric) for p in points]
            heights = [v if v is not None else np.nan for v, _ in values]
            errors = [e if e is not None else 0.0 for _, e in values]
            ax.bar(np.arange(len(points)) + (i - (len(models) - 1) / 2) * width, heights, width, yerr=errors,
                   capsize=2, label=model)
        ax.set_title(f"{task} {metric}")
        ax.set_xticks(np.arange(len(points)), points, rotation=20, ha="right", fontsize=8)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    _save(fig, plt, path)


def plot_norm_scores(task: str, rows: list[Row], path: Path) -> None:
    """Per model and point, how loglikelihood per character (what acc_norm ranks by) is distributed for the
    correct choice versus the others: the further apart, the better the model separates them."""
    plt = _pyplot()
    scores = [_norm_scores(row.directory / "samples" / f"{task}.parquet") for row in rows]
    every = np.concatenate([np.concatenate(s) for s in scores])
    bins = np.linspace(every.min(), every.max(), HIST_BINS + 1)
    cols = min(4, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False, sharex=True)
    for ax, row, (correct, incorrect) in zip(axes.flat, rows, scores):
        ax.hist(incorrect, bins=bins, density=True, alpha=0.6, label="incorrect choices")
        ax.hist(correct, bins=bins, density=True, alpha=0.6, label="correct choice")
        ax.set_title(f"{row.model}\n{row.point}", fontsize=8)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.supxlabel("loglikelihood / choice length in characters")
    fig.suptitle(task)
    fig.tight_layout()
    _save(fig, plt, path)


def _norm_scores(samples: Path) -> tuple[np.ndarray, np.ndarray]:
    table = pq.read_table(samples, columns=["req_idx", "gold", "loglikelihood", "norm_len"])
    score = table["loglikelihood"].to_numpy() / table["norm_len"].to_numpy().astype(np.float64)
    gold = table["req_idx"].to_numpy() == table["gold"].to_numpy()
    return score[gold], score[~gold]


def _save(fig, plt, path: Path) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
