"""A probe file's log-ratios as a PNG: per fill combination (per template when nothing is filled), the mean over
templates of each target's log-ratio against the first target, the spread over templates as error bars."""

from __future__ import annotations

import io

import numpy as np

from raylm.probe.sentences import ProbeSentence
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location


def plot_log_ratios(sentences: list[ProbeSentence], ratios: list[list[float]], targets: list[str],
                    templates: list[str], names: list[str], path: Location, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups: dict[str, list[int]] = {}
    for i, s in enumerate(sentences):
        label = ", ".join(v for _, v in s.fills) if names else f"template {s.template + 1}"
        groups.setdefault(label, []).append(i)
    values = np.asarray(ratios, dtype=np.float64).reshape(len(sentences), len(targets) - 1)
    means = np.array([values[rows].mean(axis=0) for rows in groups.values()])
    spread = np.array([values[rows].std(axis=0) for rows in groups.values()])
    width = 0.8 / (len(targets) - 1)
    x = np.arange(len(groups))
    fig, ax = plt.subplots(figsize=(min(9.0, 2.5 + 0.6 * len(groups) * (len(targets) - 1)), 3.2))
    for j, target in enumerate(targets[1:]):
        ax.bar(x + (j - (len(targets) - 2) / 2) * width, means[:, j], width, yerr=spread[:, j], capsize=2,
               label=f"{target} vs {targets[0]}")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x, list(groups), rotation=20 if len(groups) > 4 else 0, ha="right" if len(groups) > 4 else "center",
                  fontsize=8)
    ax.set_ylabel(f"log P(target) - log P({targets[0]})", fontsize=8)
    per = f"mean and sd over {len(templates)} templates" if names and len(templates) > 1 else "per sentence"
    ax.set_title(f"{title} ({per})", fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
