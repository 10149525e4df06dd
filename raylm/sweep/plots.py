"""A finished sweep's points -> PNG plots: headline metrics per model, acc_norm's score distributions, and bits per
byte per model over each corpus and its domains."""

from __future__ import annotations

import io
import math

import numpy as np

from raylm.results.distributions import choice_scores, draw_choice_scores, score_bins
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location
from raylm.sweep.config import Sweep
from raylm.sweep.summary import MACRO, WHOLE, CorpusRow, Row, headline_metrics

METRICS_PNG, CORPORA_PNG = "metrics.png", "corpora.png"
LABELLED_DOMAINS = 12  # more domains than this are drawn unlabelled (Paloma has 585)


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


def plot_corpora(sweep: Sweep, rows: list[CorpusRow], path: Location) -> None:
    """One panel per corpus: bits per byte across the models in the sweep file's order (checkpoints of a training
    run, typically), the whole corpus in bold, the macro average dashed, each domain a thin line."""
    plt = _pyplot()
    corpora = [c.name for c in sweep.corpora]
    models = [m.name for m in sweep.models]
    fig, axes = plt.subplots(1, len(corpora), figsize=(5.5 * len(corpora), 3.8), squeeze=False)
    for ax, corpus in zip(axes.flat, corpora):
        lines: dict[str, dict[str, float]] = {}
        for row in rows:
            if row.corpus == corpus:
                lines.setdefault(row.domain, {})[row.model] = row.figures["bits_per_byte"]
        domains = [d for d in lines if d not in (WHOLE, MACRO)]
        for domain in domains:
            ax.plot(models, [lines[domain].get(m, np.nan) for m in models], linewidth=0.8, alpha=0.6,
                    label=domain if len(domains) <= LABELLED_DOMAINS else None)
        if MACRO in lines:
            ax.plot(models, [lines[MACRO][m] for m in models], "k--", linewidth=1.5, label="macro average")
        ax.plot(models, [lines[WHOLE][m] for m in models], "k-o", linewidth=2.2, label="all documents")
        ax.set_title(corpus)
        ax.set_ylabel("bits per byte")
        ax.tick_params(axis="x", rotation=20, labelsize=8)
        ax.legend(fontsize=7)
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
