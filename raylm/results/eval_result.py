"""A finished `raylm eval` run as the driver hands it to the writers (raylm.results.report) and to the native
tasks' lm-eval shape (raylm.results.native)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from raylm.config import EvalConfig


@dataclass
class TaskResult:
    name: str
    kind: str
    metrics: dict[str, float]
    sums: dict[str, float]
    n_docs_original: int
    scored: pa.Table
    decontaminated: dict[str, float] | None = None  # a native task's `_decontaminate` metrics (lm-eval's: in metrics)
    n_clean: int | None = None  # documents the `_decontaminate` metrics are computed on
    samples: list[dict[str, Any]] | None = None  # a native task's samples as lm-eval logs them (--log-samples)
    # A native task's documents by doc_id: lm-eval's doc_hash of each (from its logged samples, raylm.results.
    # native_logs), which pairs it with lm-eval's own run of the task; raylm's row_hash (raylm.tasks.base) of each
    doc_hashes: dict[int, str] | None = None
    row_hashes: dict[int, str] | None = None


@dataclass
class EvalResult:
    """A finished `raylm eval` run, as the driver hands it to the report."""

    config: EvalConfig
    tasks: dict[str, TaskResult]
    wall_s: float
    extra: dict[str, object] = field(default_factory=dict)
    lmeval: dict[str, Any] | None = None  # lm-eval's results dict for its tasks (samples when log_samples)
    decontamination: dict[str, Any] | None = None  # --decontaminate: the scan used, documents dirty and clean
