"""A finished sweep's points -> PNG plots: headline metrics per model, and acc_norm's score distributions."""

from __future__ import annotations

import io
import math

import numpy as np

from raylm.results.distributions import choice_scores, draw_choice_scores, score_bins
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location
from raylm.sweep.config import Sweep
from raylm.sweep.summary import Row, headline_metrics

METRICS_PNG = "metrics.png"


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_metrics(sweep: Sweep, rows: list[Row], path: Location) -> None:
    """One panel per task metric; in each, a group of bars per point, one bar per model, stderr as error bars."""
    plt = _pyplot()
    metrics = headline_metrics(rows)
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


def plot_norm_scores(task: str, rows: list[Row], path: Location) -> None:
    """Per model and point, how the correct choice's score is distributed against the others'
    (raylm.results.distributions: loglikelihood per character, what acc_norm ranks by, for a native task)."""
    plt = _pyplot()
    scores = [choice_scores(row.directory / "samples" / f"{task}.parquet") for row in rows]
    bins = score_bins(scores)
    cols = min(4, len(rows))
    nrows = math.ceil(len(rows) / cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows), squeeze=False, sharex=True)
    for ax, row, row_scores in zip(axes.flat, rows, scores):
        draw_choice_scores(ax, row_scores, bins)
        ax.set_title(f"{row.model}\n{row.point}", fontsize=8)
    for ax in list(axes.flat)[len(rows):]:
        ax.axis("off")
    axes[0][0].legend(fontsize=7)
    fig.supxlabel(scores[0].score)
    fig.suptitle(task)
    fig.tight_layout()
    _save(fig, plt, path)


def _save(fig, plt, path: Location) -> None:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
