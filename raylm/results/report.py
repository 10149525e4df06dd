"""Final results -> results.json (lm-eval's shape), per-request samples as Parquet, and a printed table."""

from __future__ import annotations

import json
import logging
import platform
from collections.abc import Iterable
from importlib import metadata
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

import raylm
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.results.atomic import write_atomic
from raylm.results.ownership import tagged
from raylm.results.predictions import choice_predictions
from raylm.scoring.models import ModelSpec


log = logging.getLogger(__name__)

VERSIONED = ("ray", "torch", "transformers")  # installed distributions whose versions decide a run's numbers


@dataclass
class TaskResult:
    name: str
    kind: str
    metrics: dict[str, float]
    sums: dict[str, float]
    n_docs_original: int
    scored: pa.Table


@dataclass
class EvalResult:
    """A finished `raylm eval` run, as the driver hands it to the report."""

    config: EvalConfig
    tasks: dict[str, TaskResult]
    wall_s: float
    extra: dict[str, object] = field(default_factory=dict)


def run_config(model: ModelSpec, wall_s: float, **fields: object) -> dict[str, Any]:
    """The `config` every raylm results.json carries: the model, what the run was asked, its wall time, and the
    versions of what computed it."""
    versions = {"raylm": raylm.__version__, **{name: metadata.version(name) for name in VERSIONED},
                "python": platform.python_version()}
    return {"model": model.path, "model_args": model.as_dict(), **fields, "wall_time_s": wall_s,
            "versions": versions}


def results_dict(result: EvalResult) -> dict[str, Any]:
    cfg = result.config
    return {
        "results": {name: {"alias": name, **t.metrics} for name, t in result.tasks.items()},
        "n-samples": {name: {"original": t.n_docs_original, "effective": int(t.sums["docs"])}
                      for name, t in result.tasks.items()},
        "sums": {name: t.sums for name, t in result.tasks.items()},
        "config": run_config(
            cfg.model, result.wall_s, dtype=cfg.model.dtype, quantization=cfg.model.quantization,
            num_gpus=cfg.num_gpus, num_cpus=cfg.num_cpus, tasks=list(cfg.tasks), limit=cfg.limit,
            num_fewshot=cfg.num_fewshot, seed=cfg.seed, batch_size=cfg.batch_size or "auto", actors=cfg.actors,
            data_dir=str(cfg.data_dir or "hub"), **result.extra),
    }


def prefix_sharing(verdicts: Iterable[str | None]) -> str | list[str] | None:
    """config.prefix_sharing from the actors' verdicts on sharing prefixes between requests
    (raylm.scoring.attention), each logged once: one string, or a list where actors disagreed (each start-up
    checks its own first shard or batch); None if no actor said (every shard resumed from an older checkpoint)."""
    distinct = sorted({v for v in verdicts if v is not None})
    for verdict in distinct:
        fell_back = verdict.startswith("unpacked (start-up check")
        log.log(logging.WARNING if fell_back else logging.INFO, "prefix sharing: %s", verdict)
    return distinct[0] if len(distinct) == 1 else distinct or None


def run_summary(extra: dict[str, object], wall_s: float) -> str:
    """The final line: what was scored here, what had to be retried, and what came from a checkpoint."""
    return (f"{extra['requests_scored']} requests scored in {extra['shards']} shards, "
            f"{extra['shards_retried']} retried, {extra['shards_resumed']} resumed from checkpoint, "
            f"wall time {wall_s:.1f} s")


def prepare_output(out_dir: Path) -> None:
    """Fail before any scoring if results could not be written, rather than after an hour of work."""
    if out_dir.exists() and not out_dir.is_dir():
        raise RaylmError(f"output path '{out_dir}' exists and is not a directory")
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=out_dir):
            pass
    except OSError as e:
        raise RaylmError(f"output directory '{out_dir}' is not writable: {e.strerror}") from e


def write_samples(out_dir: Path, result: EvalResult) -> None:
    """samples/<task>.parquet per request; samples/<task>_docs.parquet per document for multiple choice."""
    for name, task in result.tasks.items():
        path = out_dir / "samples" / f"{name}.parquet"
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(tagged(task.scored), path)
        if task.kind == "multiple_choice":
            p = choice_predictions(task.scored)
            docs = pa.table({"doc_id": p.doc_id, "gold": p.gold, "pred": p.pred, "pred_norm": p.pred_norm,
                             "acc": (p.pred == p.gold).astype("int8"), "acc_norm": (p.pred_norm == p.gold).astype("int8")})
            pq.write_table(tagged(docs), out_dir / "samples" / f"{name}_docs.parquet")


def write_results(out_dir: Path, result: EvalResult) -> Path:
    path = out_dir / "results.json"
    write_atomic(path, json.dumps(results_dict(result), indent=2, default=str).encode())
    return path


def format_table(result: EvalResult) -> str:
    lines = [f"{'task':<12} {'metric':<18} {'value':>14} {'stderr':>10}  n"]
    for name, task in result.tasks.items():
        for key, value in task.metrics.items():
            if "_stderr" in key:
                continue
            metric = key.split(",")[0]
            stderr = task.metrics.get(f"{metric}_stderr,none")
            stderr_text = f"{stderr:10.4f}" if stderr is not None else f"{'':>10}"
            lines.append(f"{name:<12} {metric:<18} {value:14.4f} {stderr_text}  {int(task.sums['docs'])}")
    lines.append(run_summary(result.extra, result.wall_s))
    return "\n".join(lines)
