"""A finished run as compare and the report read it: its results.json, read once, and where its per-document
samples are."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from raylm.errors import RaylmError
from raylm.storage.location import Location


@dataclass(frozen=True)
class Run:
    label: str  # the run as the user named it (a path or URI)
    results: dict[str, Any]  # results.json, lm-eval's shape (a corpus run's figures as tasks: corpus_output)
    samples: dict[str, Location]  # task (a corpus run: its label) -> its per-document file (Parquet or lm-eval's jsonl)
    # A corpus run's label (`ppl`, `pseudo_ppl`, `kl`: raylm.compare.corpus_output), its documents paired by
    # position; None for an evaluation's tasks, paired by doc_id
    corpus: str | None = None


def read_results(where: Location) -> dict[str, Any]:
    try:
        return json.loads(where.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RaylmError(f"{where}: not readable as JSON ({e})") from e


def scored_tasks(results: dict[str, Any]) -> list[str]:
    """The scored tasks of a results.json: its configs (lm-eval writes one per task, none per group)."""
    return list(results.get("configs") or results.get("results", {}))
