"""A finished sweep's points -> summary.csv and summary.md, read back from each point's results.json.

Task points are a row each, a column per task metric; corpus points (raylm ppl's results) are a row per model,
corpus and domain (the whole corpus, Paloma's macro average over the domains, then each domain), with columns of
their own: a corpus of 585 domains would be thousands of columns the other way.

The summaries and plots read what the points wrote, never in-memory results, so a resumed sweep reports its old
points exactly like its new ones.
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from raylm.storage.location import Location
from raylm.sweep.config import Sweep

SUMMARY_METRICS = ("acc", "acc_norm", "word_perplexity", "bits_per_byte", "exact_match")
SETTING_COLUMNS = ("dtype", "quantization", "num_fewshot", "limit", "batch_size")
SUMMARY_CSV, SUMMARY_MD = "summary.csv", "summary.md"
WHOLE, MACRO = "", "(macro)"  # the domain column of a corpus's pooled figures and of its macro average
CORPUS_COUNTS = ("tokens", "docs")


@dataclass(frozen=True)
class Row:
    model: str
    point: str
    directory: Location
    results: dict[str, Any]

    def metric(self, task: str, metric: str) -> tuple[float | None, float | None]:
        """The metric and its stderr, None where there is no number (lm-eval writes "N/A" for a missing stderr).
        `metric` is a name, or `name,filter` for a metric under a filter other than lm-eval's "none" (a generation
        task's `exact_match,strict-match`)."""
        name, _, filter_key = metric.partition(",")
        filter_key = filter_key or "none"
        values = self.results["results"].get(task, {})
        return tuple(v if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                     for v in (values.get(f"{name},{filter_key}"), values.get(f"{name}_stderr,{filter_key}")))

    def reported(self) -> list[str]:
        """Tasks and groups in results.json order, less the subtasks a group reports for them (an MMLU run's
        headline is mmlu, not its 57 subjects)."""
        inside = {child for children in self.results.get("group_subtasks", {}).values() for child in children}
        return [name for name in self.results["results"] if name not in inside]


def collect(sweep: Sweep, out: Location) -> list[Row]:
    rows = []
    for model in sweep.models:
        for point in sweep.points:
            directory = out / model.name / point.name
            rows.append(Row(model.name, point.name, directory, json.loads((directory / "results.json").read_bytes())))
    return rows


@dataclass(frozen=True)
class CorpusRow:
    model: str
    point: str
    corpus: str
    domain: str  # WHOLE, MACRO, or a domain's name
    figures: dict[str, Any]  # what results.json reports for it (raylm.corpus.run.domain_metrics)
    config: dict[str, Any]

    def figure_names(self) -> list[str]:
        """Bits per byte, then the perplexities (a masked LM's pseudo-perplexities), then the counts."""
        names = [k for k in ("bits_per_byte", *self.figures) if k == "bits_per_byte" or k.endswith("perplexity")]
        return [k for k in dict.fromkeys(names) if k in self.figures] + [k for k in CORPUS_COUNTS if k in self.figures]


def collect_corpora(sweep: Sweep, out: Location) -> list[CorpusRow]:
    rows = []
    for model in sweep.models:
        for corpus in sweep.corpora:
            results = json.loads((out / model.name / corpus.point / "results.json").read_bytes())
            (figures,) = results["results"].values()
            # raylm ppl keeps the model's settings (dtype, quantization) under model_args, as lm-eval does
            config = {**results["config"].get("model_args", {}), **results["config"]}
            parts = [(WHOLE, figures), *([(MACRO, figures["macro"])] if "macro" in figures else []),
                     *figures.get("domains", {}).items()]
            rows += [CorpusRow(model.name, corpus.point, corpus.name, domain, values, config)
                     for domain, values in parts]
    return rows


def corpus_figures(rows: list[CorpusRow]) -> list[str]:
    return list(dict.fromkeys(name for row in rows for name in row.figure_names()))


def all_metrics(rows: list[Row]) -> list[tuple[str, str]]:
    """(task, metric) pairs in the order results.json lists them, stderr keys folded into their metric, a metric
    under a filter other than "none" named `name,filter` (Row.metric); a group's subtasks are left to the
    group."""
    seen: dict[tuple[str, str], None] = {}
    for row in rows:
        for task in row.reported():
            for key in row.results["results"][task]:
                name, comma, filter_key = key.partition(",")
                if comma and "_stderr" not in name:
                    seen[(task, name if filter_key == "none" else key)] = None
    return list(seen)


def summary_csv(rows: list[Row], corpus_rows: list[CorpusRow] = ()) -> str:
    metrics = all_metrics(rows)
    figures = corpus_figures(corpus_rows)
    corpus_columns = ["corpus", "domain", *figures] if corpus_rows else []
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(["model", "point", *SETTING_COLUMNS, *(f"{t} {m}{s}" for t, m in metrics for s in ("", " stderr")),
                     *corpus_columns])
    for row in rows:
        config = row.results["config"]
        cells: list[Any] = [row.model, row.point, *(config.get(c) for c in SETTING_COLUMNS)]
        for task, metric in metrics:
            cells.extend("" if v is None else repr(v) for v in row.metric(task, metric))
        writer.writerow(cells + [""] * len(corpus_columns))
    for c in corpus_rows:
        values = ("" if c.figures.get(f) is None else repr(c.figures[f]) for f in figures)
        writer.writerow([c.model, c.point, *(c.config.get(k) for k in SETTING_COLUMNS), *[""] * (2 * len(metrics)),
                         c.corpus, c.domain, *values])
    return buf.getvalue()


def headline_metrics(rows: list[Row]) -> list[tuple[str, str]]:
    return [(t, m) for t, m in all_metrics(rows) if m.split(",")[0] in SUMMARY_METRICS]


def summary_markdown(rows: list[Row], corpus_rows: list[CorpusRow] = ()) -> str:
    """The tasks' table, then the corpora's (each under a heading when there are both)."""
    tables = ([_tasks_markdown(rows)] if rows else []) + ([_corpora_markdown(corpus_rows)] if corpus_rows else [])
    if len(tables) == 1:
        return tables[0]
    return f"## Tasks\n\n{tables[0]}\n## Corpora\n\n{tables[1]}"


def _corpora_markdown(rows: list[CorpusRow]) -> str:
    """A row per model, corpus and domain: the corpus's pooled figures first, its macro average, then each
    domain's; columns bits per byte, the perplexities and the counts."""
    figures = corpus_figures(rows)
    header = ["model", "corpus", "domain", *figures]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        domain = {WHOLE: "all", MACRO: "macro average"}.get(row.domain, row.domain)
        cells = [_figure(row.figures.get(f)) for f in figures]
        lines.append("| " + " | ".join([row.model, row.corpus, domain, *cells]) + " |")
    return "\n".join(lines) + "\n"


def _figure(value: Any) -> str:
    if value is None:
        return ""
    return str(int(value)) if isinstance(value, int) or float(value).is_integer() else f"{value:.4f}"


def _tasks_markdown(rows: list[Row]) -> str:
    """Rows are models (× points), columns the headline metric of each task with its standard error."""
    metrics = headline_metrics(rows)
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
