"""Finished runs -> one self-contained HTML page (`raylm report`): each run's results table in lm-eval's columns,
its multiple-choice tasks' score distributions (correct vs other choices) and its config, and for two runs or more
the paired comparison of raylm.compare, as tables and charts. A corpus run (`raylm ppl`) is shown as its reader
(raylm.compare.corpus_output) makes it: the corpus, each domain and their macro average as tasks, its figures
(bits per byte, ...) as their metrics, and its pairs' bits per byte differences as tasks' are.

The page loads nothing: CSS is inline and the charts are matplotlib's SVG, inline, their text kept as text. Every
string taken from a results file is escaped (html.escape here, matplotlib's XML writer in the charts).
"""

from __future__ import annotations

import html
import io
import json
import math
from dataclasses import dataclass
from typing import Any

from raylm.compare.comparison import compare_runs
from raylm.compare.output import notes
from raylm.compare.run import Run
from raylm.compare.statistics import Z95, shown_stderr
from raylm.errors import RaylmError
from raylm.results.distributions import ChoiceScores, choice_scores, draw_choice_scores, holds_choice_scores, score_bins
from raylm.storage.location import Location, redact

# The config keys shown up front, in this order, where a run has them (raylm's and lm-eval's results files
# differ); the whole config is on the page too, folded.
CONFIG_KEYS = ("command", "model", "model_commit", "model_b", "peft", "peft_commit", "dtype", "scored_with",
               "quantization", "tasks", "data", "domain_column", "max_length", "stride", "limit", "limit_docs",
               "num_fewshot", "batch_size", "random_seed", "numpy_seed", "torch_seed", "fewshot_seed", "actors",
               "shards", "shards_retried", "shards_resumed", "docs_resumed", "wall_time_s", "versions")
RESULT_COLUMNS = ("Tasks", "Version", "Filter", "n-shot", "Metric", "", "Value", "", "Stderr")  # lm-eval's
COMPARISON_COLUMNS = ("task", "metric", "n", "a", "b", "b − a", "se", "unpaired se", "95% low", "95% high", "p")
HIGHER_IS_BETTER = {True: "↑", False: "↓"}  # lm-eval's table's arrows
# matplotlib's SVG with its text as text, and ids that do not change from one drawing to the next
SVG_RC = {"svg.fonttype": "none", "svg.hashsalt": "raylm", "text.parse_math": False, "font.size": 9}

CSS = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 2em auto; max-width: 1100px; color: #222; padding: 0 1em; }
h1 { font-size: 1.6em; } h2 { margin-top: 2em; border-bottom: 1px solid #ccc; } h3 { margin-top: 1.4em; }
table { border-collapse: collapse; margin: 0.6em 0; }
th, td { padding: 2px 8px; border-bottom: 1px solid #eee; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
th { background: #f4f4f4; }
tr.group td:first-child { font-weight: 600; }
td.depth1 { padding-left: 1.6em; } td.depth2 { padding-left: 2.8em; } td.depth3 { padding-left: 4em; }
.note { color: #666; } .refused { color: #a00; }
pre { background: #f7f7f7; padding: 0.8em; overflow-x: auto; font-size: 12px; }
svg { max-width: 100%; height: auto; }
.charts { display: flex; flex-wrap: wrap; gap: 0.5em; }
"""


def report_page(runs: list[Run]) -> tuple[str, str | None]:
    """The page for the runs (raylm.compare.find.find_runs), and why they were not compared (compare's one-line
    refusal: no samples in common, other documents), None if they were or there is one run."""
    comparison, refused = None, None
    if len(runs) > 1:
        try:
            comparison = compare_runs(runs)
        except RaylmError as e:
            refused = str(e)
    title = "raylm report: " + ", ".join(run.label for run in runs)
    body = [f"<h1>{_e(title)}</h1>", "<ul>"]
    body += [f'<li><a href="#run-{i}">{_e(run.label)}</a></li>' for i, run in enumerate(runs)]
    body.append("</ul>")
    if comparison is not None:
        body.append(_comparison_section(comparison))
    elif refused is not None:
        body.append(f'<h2 id="comparison">Paired comparison</h2><p class="refused">Not compared: {_e(refused)}</p>')
    chart = _metrics_chart(runs)
    if chart:
        body += ["<h2>Metrics</h2>", '<p class="note">Each run\'s value with its 95% interval (value ± 1.96 × '
                 "stderr, lm-eval's unpaired standard error).</p>", chart]
    for i, run in enumerate(runs):
        body.append(_run_section(i, run))
    page = (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f"<style>{CSS}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")
    return page, refused


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


def _cell(value: Any, spec: str = ".4f") -> str:
    if isinstance(value, float) and not isinstance(value, bool):
        return f'<td class="num">{value:{spec}}</td>'
    return f"<td>{_e('' if value is None else value)}</td>"


def _depths(results: dict[str, Any]) -> dict[str, int]:
    """How deep each task sits under its groups (group_subtasks): the table indents it so."""
    depth: dict[str, int] = {}

    def walk(name: str, level: int) -> None:
        depth[name] = max(depth.get(name, 0), level)
        for child in results.get("group_subtasks", {}).get(name, []):
            walk(child, level + 1)

    children = {c for cs in results.get("group_subtasks", {}).values() for c in cs}
    for group in results.get("group_subtasks", {}):
        if group not in children:
            walk(group, 0)
    return depth


def _result_rows(results: dict[str, Any], column: str = "results") -> list[tuple[str, int, list[Any]]]:
    """(task, depth, cells) per task and metric, in lm-eval's make_table columns (version, filter, n-shot,
    metric, arrow, value, ±, stderr), tasks in results.json's order and metrics sorted, as make_table lists them."""
    depths = _depths(results)
    rows = []
    for task, values in results.get(column, {}).items():
        better = results.get("higher_is_better", {}).get(task, {})
        for key, value in sorted(values.items()):
            metric, _, filter_key = key.partition(",")
            if not filter_key or metric.endswith("_stderr"):
                continue  # alias, name, sample_len; stderrs sit beside their metric
            stderr = values.get(_stderr_key(key))
            rows.append((task, depths.get(task, 0),
                         [str(results.get("versions", {}).get(task, "N/A")), filter_key,
                          results.get("n-shot", {}).get(task, ""), metric, HIGHER_IS_BETTER.get(better.get(metric), ""),
                          value, "±" if stderr is not None else "", stderr]))
    return rows


def _results_table(table_id: str, results: dict[str, Any], column: str) -> str:
    groups = set(results.get("group_subtasks", {}))
    head = "".join(f"<th>{_e('Groups' if column == 'groups' and c == 'Tasks' else c)}</th>" for c in RESULT_COLUMNS)
    lines = [f'<table id="{table_id}" class="results"><thead><tr>{head}</tr></thead><tbody>']
    for task, depth, cells in _result_rows(results, column):
        row_class = ' class="group"' if task in groups else ""
        lines.append(f'<tr{row_class}><td class="depth{min(depth, 3)}">{_e(task)}</td>'
                     + "".join(_cell(c) for c in cells) + "</tr>")
    lines.append("</tbody></table>")
    return "\n".join(lines)


def _run_section(i: int, run: Run) -> str:
    results = run.results
    parts = [f'<h2 id="run-{i}">{_e(run.label)}</h2>', "<h3>Results</h3>",
             _results_table(f"results-{i}", results, "results")]
    if results.get("groups"):
        parts += ["<h3>Groups</h3>", _results_table(f"groups-{i}", results, "groups")]
    parts.append(_distributions(i, run))
    config = results.get("config", {})
    shown = [(key, config[key]) for key in CONFIG_KEYS if key in config]
    shown += [(key, results[key]) for key in ("n-shot", "date", "git_hash", "total_evaluation_time_seconds")
              if results.get(key) not in (None, {})]
    # A results file written before URIs were stored redacted may hold a corpus URI's secret: the page never does.
    rows = "".join(f"<tr><th>{_e(key)}</th><td>{_e(redact(_text(value)))}</td></tr>" for key, value in shown)
    parts += ["<h3>Config</h3>", f'<table id="config-{i}" class="config">{rows}</table>',
              "<details><summary>every config key</summary><pre>"
              f"{_e(redact(json.dumps(config, indent=2, default=str)))}</pre></details>"]
    return "\n".join(parts)


def _distributions(i: int, run: Run) -> str:
    """A chart per multiple-choice task with per-choice scores in its samples (raylm.results.distributions), and
    why a task that has samples has none."""
    charts, problems = [], []
    for task, config in run.results.get("configs", {}).items():
        path = _choice_file(run, task) if config.get("output_type") == "multiple_choice" else None
        if path is None:
            continue
        try:
            charts.append(_distribution_svg(task, choice_scores(path)))
        except RaylmError as e:
            problems.append(str(e))
    if not charts and not problems:
        return ""
    parts = ["<h3>Score distributions</h3>",
             '<p class="note">Per multiple-choice task, the correct choice\'s score against the other choices\' '
             "(densities): the further apart, the better the model tells them apart. A native task's score is "
             "loglikelihood per character (what acc_norm ranks by); an lm-eval task's is the choice's summed "
             "loglikelihood (what acc ranks by: its samples do not log the length acc_norm divides by).</p>",
             f'<div class="charts" id="distributions-{i}">' + "".join(charts) + "</div>"]
    parts += [f'<p class="note">No distribution: {_e(note)}</p>' for note in problems]
    return "\n".join(parts)


def _choice_file(run: Run, task: str) -> Location | None:
    """The task's samples holding each choice's loglikelihood: lm-eval's, or a native task's per-request Parquet
    beside its per-document one."""
    path = run.samples.get(task)
    if path is None:
        return None
    for candidate in (path, path.parent / f"{task}.parquet"):
        if candidate.is_file() and holds_choice_scores(candidate):
            return candidate
    return None


def _distribution_svg(task: str, scores: ChoiceScores) -> str:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with matplotlib.rc_context(SVG_RC):
        fig, ax = plt.subplots(figsize=(4.4, 2.6), layout="constrained")
        draw_choice_scores(ax, scores, score_bins([scores]))
        ax.set_title(task, loc="left", fontsize=9)
        ax.set_title(f"{len(scores.correct)} correct, {len(scores.other)} other", loc="right", fontsize=7)
        ax.set_xlabel(scores.score, fontsize=8)
        ax.legend(fontsize=7)
        return _inline_svg(fig, plt)


def _text(value: Any) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


def _comparison_section(comparison: dict[str, Any]) -> str:
    parts = ['<h2 id="comparison">Paired comparison</h2>',
             f'<p class="note">Every run against the baseline {_e(comparison["baseline"])} (a corpus run against the '
             "first corpus run): documents paired by (task, doc_id), b − a per document; se is the paired standard "
             "error, clustered by subtask for a group of several; the interval and p-value use it. A corpus run's "
             "documents pair in order (same file, bytes and characters), and its bits per byte is pooled, the "
             "corpus's NLL over its bytes, with the ratio estimator's standard error (raylm compare, "
             "docs/compare.md).</p>"]
    for j, pair in enumerate(comparison["comparisons"]):
        parts.append(f"<h3>b = {_e(pair['b'])}<br>a = {_e(pair['a'])}</h3>")
        head = "".join(f"<th>{_e(c)}</th>" for c in COMPARISON_COLUMNS)
        lines = [f'<table id="comparison-{j}" class="comparison"><thead><tr>{head}</tr></thead><tbody>']
        for task, entry in pair["tasks"].items():
            for metric, d in entry["metrics"].items():
                numbers = (d["n"], d["a"], d["b"], d["diff"], shown_stderr(d), d["unpaired_stderr"], d["ci95_low"],
                           d["ci95_high"])
                cells = [_cell("n/a" if c is None else c) for c in numbers]
                p = _cell("n/a" if d["p_value"] is None else d["p_value"], ".3g")  # 1.77e-07, not 0.0000
                lines.append(f"<tr><td>{_e(task)}</td><td>{_e(metric)}</td>{''.join(cells)}{p}</tr>")
        lines.append("</tbody></table>")
        parts.append("\n".join(lines))
        parts += [f'<p class="note">{_e(line[0].upper() + line[1:])}</p>' for line in notes(pair)]
        by_metric: dict[str, list[tuple[str, float, float | None, float | None]]] = {}
        for task, e in pair["tasks"].items():  # a panel per primary metric: each on its own scale
            by_metric.setdefault(e["metric"], []).append((task, e["diff"], e["ci95_low"], e["ci95_high"]))
        if by_metric:
            parts.append(_svg([Panel(f"b − a in {metric}, with its 95% interval", [r[0] for r in rows],
                                     [("b − a", *map(list, zip(*[r[1:] for r in rows])))], zero_line=True)
                               for metric, rows in by_metric.items()]))
    return "\n".join(parts)


def _metrics_chart(runs: list[Run]) -> str:
    """A panel per metric (acc, acc_norm, word_perplexity, ...: each on its own scale), a row per task or group
    reporting it, a point per run with its 95% interval where the run has a numeric stderr (lm-eval gives
    perplexities none, and none with --bootstrap-iters 0)."""
    rows: dict[str, dict[str, None]] = {}  # metric key -> tasks and groups
    for run in runs:
        for column in ("results", "groups"):
            for task, values in run.results.get(column, {}).items():
                for key, value in values.items():
                    metric, _, filter_key = key.partition(",")
                    if filter_key and not metric.endswith("_stderr") and _float(value) is not None:
                        rows.setdefault(key, {})[task] = None
    panels = []
    for key, tasks in rows.items():
        series = []
        for run in runs:
            points = []
            for task in tasks:
                entry = run.results.get("results", {}).get(task) or run.results.get("groups", {}).get(task) or {}
                value, stderr = _float(entry.get(key)), _float(entry.get(_stderr_key(key)))
                interval = (value - Z95 * stderr, value + Z95 * stderr) if None not in (value, stderr) else (None,) * 2
                points.append((value, *interval))
            series.append((run.label, *map(list, zip(*points))))
        title = key.split(",")[0] + ("" if key.endswith(",none") else f" ({key.split(',', 1)[1]})")
        panels.append(Panel(f"{title}, with its 95% interval (value ± 1.96 × stderr)", list(tasks), series))
    return _svg(panels) if panels else ""


def _stderr_key(key: str) -> str:
    metric, _, filter_key = key.partition(",")
    return f"{metric}_stderr,{filter_key}"


def _float(value: Any) -> float | None:
    """A number to plot; None for lm-eval's "N/A", a missing value, or nan."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    return float(value) if ok else None


@dataclass(frozen=True)
class Panel:
    """One chart: a row per label, a point with its interval per series (a run, or a pair's difference)."""

    title: str
    labels: list[str]
    series: list[tuple[str, list[float | None], list[float | None], list[float | None]]]  # name, value, low, high
    zero_line: bool = False


def _svg(panels: list[Panel]) -> str:
    """The panels stacked in one figure, as inline SVG whose text stays text (searchable, and escaped by
    matplotlib's XML writer)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n_series = len(panels[0].series)
    heights = [0.9 + 0.22 * len(p.labels) * max(1.0, n_series / 2) for p in panels]
    with matplotlib.rc_context(SVG_RC):
        fig, axes = plt.subplots(len(panels), 1, figsize=(8, sum(heights) + 0.25 * n_series * (n_series > 1)),
                                 height_ratios=heights, layout="constrained", squeeze=False)
        step = 0.7 / n_series
        for ax, panel in zip(axes[:, 0], panels):
            for k, (name, values, lows, highs) in enumerate(panel.series):
                shown = [(row, v, lo, hi) for row, (v, lo, hi) in enumerate(zip(values, lows, highs)) if v is not None]
                if not shown:
                    continue
                y = [row + (k - (n_series - 1) / 2) * step for row, *_ in shown]
                x = [v for _, v, _, _ in shown]
                err = [[v - lo if lo is not None else 0.0 for _, v, lo, _ in shown],
                       [hi - v if hi is not None else 0.0 for _, v, _, hi in shown]]
                ax.errorbar(x, y, xerr=err, fmt="o", markersize=4, capsize=3, color=f"C{k}", label=name)
            if panel.zero_line:
                ax.axvline(0, color="#888", linewidth=0.8)
            ax.set_yticks(range(len(panel.labels)), panel.labels)
            ax.set_ylim(len(panel.labels) - 0.5, -0.5)
            ax.set_title(panel.title, loc="left", fontsize=9)
            ax.grid(axis="x", color="#ddd")
        if n_series > 1:
            legend = {name: handle for ax in axes[:, 0] for handle, name in zip(*ax.get_legend_handles_labels())}
            fig.legend(list(legend.values()), list(legend), loc="outside upper center", fontsize=8)
        return _inline_svg(fig, plt)


def _inline_svg(fig, plt) -> str:
    """The figure as an <svg> element to put in the page (no XML prolog), drawn under SVG_RC."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata=dict.fromkeys(("Creator", "Date", "Format", "Type")))  # no RDF
    plt.close(fig)
    svg = buf.getvalue()
    return svg[svg.index("<svg"):]
