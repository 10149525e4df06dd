"""A finished scan -> DIR/contamination.json, the printed table of dirty fractions, and DIR/contamination.png.

Groups are summed over every task under them: a group's fraction dirty is its dirty documents over its
documents, whatever its subtasks' sizes (lm-eval's size-weighted mean of the subtasks' fractions).
"""

from __future__ import annotations

import io
import json
import os
import platform
from importlib import metadata
from typing import Any

import raylm
from raylm.contamination.scan import MATCHES, ScanConfig, ScanResult, run_scan
from raylm.results.contamination import CONTAMINATION_JSON, query_digest
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location, redact
from raylm.storage.lock import output_lock
from raylm.storage.ownership import check_results_owner

CHART = "contamination.png"


def run_contamination(cfg: ScanConfig, out_dir: str | os.PathLike[str] | Location) -> dict[str, Any]:
    """`raylm contamination`: scan, then write the report and chart; DIR's lock is held throughout, taken before any
    work (raylm.storage.lock), so two scans into one directory cannot interleave."""
    cfg.validate()
    out_dir = location(out_dir)
    with output_lock(out_dir):
        check_output(out_dir)
        return write_report(run_scan(cfg, out_dir), out_dir)


def check_output(out_dir: Location) -> None:
    check_results_owner(out_dir, "contamination", CONTAMINATION_JSON, (MATCHES,))


def _fraction(part: int, whole: int) -> float:
    return part / whole if whole else 0.0


def document_entries(result: ScanResult) -> dict[str, list[dict[str, Any]]]:
    """Per task, per document: its words, distinct n-grams, those found in the corpus, and the fraction of its
    words they cover."""
    n = result.index.n
    queries = {(t.name, doc_id): q for t in result.tasks.tasks.values() for doc_id, q in t.queries}
    out: dict[str, list[dict[str, Any]]] = {name: [] for name in result.tasks.tasks}
    for d, doc in enumerate(result.index.documents):
        grams = {" ".join(doc.words[k:k + n]) for k in range(len(doc.words) - n + 1)}
        starts = result.found.get(d, set())
        covered = set()
        for k in starts:
            covered.update(range(k, k + n))
        out[doc.task].append({
            "doc_id": doc.doc_id,
            "words": len(doc.words),
            "ngrams": len(grams),
            "matched_ngrams": len({" ".join(doc.words[k:k + n]) for k in starts}),
            "contaminated_fraction": _fraction(len(covered), len(doc.words)),
            "query_sha256": query_digest(queries[(doc.task, doc.doc_id)]),
        })
    return out


def summary(docs: list[dict[str, Any]], n: int) -> dict[str, Any]:
    dirty = sum(d["matched_ngrams"] > 0 for d in docs)
    return {"documents": len(docs), "dirty": dirty, "fraction_dirty": _fraction(dirty, len(docs)),
            "too_short": sum(d["words"] < n for d in docs)}


def contamination_dict(result: ScanResult) -> dict[str, Any]:
    cfg = result.config
    n = result.index.n
    per_doc = document_entries(result)
    tasks = {name: {**summary(per_doc[name], n), "original": t.original, "query": t.rule, "docs": per_doc[name]}
             for name, t in result.tasks.tasks.items()}
    groups = {}
    for name, members in result.tasks.groups.items():
        docs = [d for task in members for d in per_doc.get(task, [])]
        groups[name] = {**summary(docs, n), "tasks": members}
    versions = {"raylm": raylm.__version__, "ray": metadata.version("ray"), "python": platform.python_version()}
    return {
        "ngram": n,
        "tasks": tasks,
        **({"groups": groups, "group_subtasks": result.tasks.group_subtasks} if groups else {}),
        "corpus": {"files": result.files, "rows": result.corpus_rows, "bytes": result.corpus_bytes,
                   "task_ngrams": result.index.ngram_count, "match_rows": result.match_rows,
                   "hash_collisions": result.collisions},
        "config": {"command": "contamination", "tasks": list(cfg.tasks), "corpus": [redact(c) for c in cfg.corpus],
                   "format": cfg.fmt, "text_column": cfg.text_column, "ngram": n,
                   "data_dir": str(cfg.data_dir) if cfg.data_dir else None,
                   "include_path": str(cfg.include_path) if cfg.include_path else None, "limit": cfg.limit,
                   "limit_docs": cfg.limit_docs, "actors": result.actors, "docs_per_batch": cfg.docs_per_batch,
                   "wall_time_s": result.wall_s, "stream_time_s": result.stream_s, "versions": versions},
    }


def write_report(result: ScanResult, out_dir: Location) -> dict[str, Any]:
    report = contamination_dict(result)
    write_atomic(out_dir / CONTAMINATION_JSON, json.dumps(report, indent=2).encode())
    plot_dirty(report, out_dir / CHART)
    return report


def rows(report: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """(label, summary) for every task, then every group with the tasks under it indented (lm-eval's layout)."""
    out = [(name, t) for name, t in report["tasks"].items()]
    for name, g in report.get("groups", {}).items():
        out.append((name, g))
        out.extend((f" - {child}", report["tasks"][child]) for child in report.get("group_subtasks", {}).get(name, [])
                   if child in report["tasks"])
    return out


def format_table(report: dict[str, Any]) -> str:
    n = report["ngram"]
    entries = rows(report)
    w = max([len("task"), *(len(label) for label, _ in entries)])
    lines = [f"| {'task':<{w}} | {'documents':>9} | {'dirty':>7} | {'fraction dirty':>14} | {f'< {n} words':>11} |",
             f"|{'-' * (w + 2)}|{'-' * 10}:|{'-' * 8}:|{'-' * 15}:|{'-' * 12}:|"]
    for label, s in entries:
        lines.append(f"| {label:<{w}} | {s['documents']:>9} | {s['dirty']:>7} | {s['fraction_dirty']:>14.4f} | "
                     f"{s['too_short']:>11} |")
    corpus = report["corpus"]
    lines.append(f"{n}-grams; corpus: {corpus['rows']} rows, {corpus['bytes'] / 2**20:.1f} MiB in {corpus['files']} "
                 f"file(s); {corpus['match_rows']} match rows in {MATCHES}")
    return "\n".join(lines)


def plot_dirty(report: dict[str, Any], path: Location) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    entries = [(name, t["fraction_dirty"]) for name, t in report["tasks"].items()]
    entries += [(f"{name} (group)", g["fraction_dirty"]) for name, g in report.get("groups", {}).items()]
    fig, ax = plt.subplots(figsize=(7.0, 1.0 + 0.3 * len(entries)))
    y = range(len(entries))
    ax.barh(list(y), [100 * f for _, f in entries], color=["#c44e52" if f else "#8c8c8c" for _, f in entries])
    ax.set_yticks(list(y), [name for name, _ in entries], fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(f"dirty documents (%): any {report['ngram']}-gram found in the corpus", fontsize=8)
    ax.set_xlim(0, max(1.0, max((100 * f for _, f in entries), default=0) * 1.15))
    for i, (_, f) in enumerate(entries):
        ax.text(100 * f, i, f" {100 * f:.1f}%", va="center", fontsize=7)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    plt.close(fig)
    write_atomic(path, buf.getvalue())
