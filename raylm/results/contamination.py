"""contamination.json, the file `raylm contamination` writes and `raylm eval --decontaminate DIR` reads.

Per task (and group): documents scanned, dirty documents (lm-eval's rule: any one of its n-grams occurs in the
corpus) and the fraction dirty; per document its n-gram count, how many of them the corpus holds, the fraction
of its words those cover (Llama 2's contaminated-token measure, on words), and a fingerprint of its query, by
which an evaluation proves it scores the documents that were scanned.

The clean-subset metrics are lm-eval's (evaluator.py before 0.4.0; 0.4.0 and 0.4.1 kept only
`decontaminate_suffix = "_decontaminate"`, their computing code commented out, and 0.4.2 removed both): every
metric again under `<metric>_decontaminate`, aggregated by the metric's own aggregation over the clean documents
alone, with its stderr under `<metric>_decontaminate_stderr`.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError

CONTAMINATION_JSON = "contamination.json"
SUFFIX = "_decontaminate"  # lm-eval's decontaminate_suffix


def query_digest(query: str) -> str:
    return hashlib.sha256(query.encode("utf-8")).hexdigest()[:16]


def decontaminated_key(key: str) -> str:
    """`acc,none` -> `acc_decontaminate,none`; `acc_stderr,none` -> `acc_decontaminate_stderr,none`."""
    metric, comma, filter_key = key.partition(",")
    if metric.endswith("_stderr"):
        return f"{metric[:-len('_stderr')]}{SUFFIX}_stderr{comma}{filter_key}"
    return f"{metric}{SUFFIX}{comma}{filter_key}"


def scan_path(path: Path) -> Path:
    """--decontaminate takes the scan's output directory or its contamination.json."""
    return path / CONTAMINATION_JSON if path.is_dir() else path


def scan_digest(path: Path | None) -> str | None:
    """The sha256 of a scan's contamination.json (None without one): results.json records it, so a sweep can tell
    a point's `_decontaminate` metrics from another scan's."""
    return None if path is None else hashlib.sha256(scan_path(path).read_bytes()).hexdigest()


def read_scan(path: Path) -> dict[str, Any]:
    """A contamination.json raylm wrote, or a one-line error naming the file."""
    file = scan_path(path)
    try:
        data = json.loads(file.read_text())
    except FileNotFoundError:
        raise RaylmError(f"--decontaminate: '{file}' does not exist (run `raylm contamination` first)") from None
    except (OSError, ValueError) as e:
        raise RaylmError(f"--decontaminate: '{file}' is not a contamination.json ({e})") from e
    config = data.get("config") if isinstance(data, dict) else None
    if not isinstance(config, dict) or config.get("command") != "contamination" or not isinstance(
            data.get("tasks"), dict):
        raise RaylmError(f"--decontaminate: '{file}' was not written by `raylm contamination`")
    return data


class CleanSets:
    """The documents of each task that the scan found clean, checked against the documents an evaluation scores."""

    def __init__(self, scan: dict[str, Any], source: Path):
        self.scan = scan
        self.source = scan_path(source)

    def require_tasks(self, names: list[str]) -> None:
        missing = [n for n in names if n not in self.scan["tasks"]]
        if missing:
            raise RaylmError(f"--decontaminate: {', '.join(missing)} not scanned in '{self.source}' (it holds "
                             f"{', '.join(self.scan['tasks']) or 'no tasks'})")

    def clean(self, task: str, queries: list[tuple[int, str]]) -> set[int]:
        """The clean doc_ids among the documents evaluated (doc_id, query); each must have been scanned with the
        same query text, else the scan says nothing about it."""
        self.require_tasks([task])
        docs = {d["doc_id"]: d for d in self.scan["tasks"][task]["docs"]}
        out = set()
        for doc_id, query in queries:
            scanned = docs.get(doc_id)
            if scanned is None:
                raise RaylmError(f"--decontaminate: {task} doc {doc_id} is evaluated but was not scanned in "
                                 f"'{self.source}' (scan with the same or no --limit)")
            if scanned["query_sha256"] != query_digest(query):
                raise RaylmError(f"--decontaminate: {task} doc {doc_id}'s text differs from the one scanned in "
                                 f"'{self.source}' (another --data-dir, dataset version or task definition?)")
            if scanned["matched_ngrams"] == 0:
                out.add(doc_id)
        return out

    def summary(self, clean: dict[str, set[int]], evaluated: dict[str, int]) -> dict[str, Any]:
        """results.json's `decontamination` entry: where the overlaps came from, and per task the documents
        evaluated, dirty and clean (the count every `_decontaminate` metric is computed on)."""
        return {
            "source": str(self.source),
            "scan_sha256": scan_digest(self.source),
            "ngram": self.scan.get("ngram"),
            "corpus": self.scan.get("config", {}).get("corpus"),
            "tasks": {name: {"documents": evaluated[name], "dirty": evaluated[name] - len(ids), "clean": len(ids)}
                      for name, ids in clean.items()},
        }
