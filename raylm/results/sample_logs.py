"""lm-eval's own per-sample logs, `samples_<task>_<date>.jsonl`, beside raylm's Parquet samples.

lm-eval users' scripts, Zeno uploads and hub pushes read these files, so they are written by lm-eval's own code:
EvaluationTracker.save_results_samples turns each logged sample into its line (arguments as gen_args_i/arg_j,
responses through sanitize_list, the target as text, json.dumps with handle_non_serializable), and raylm moves the
file it wrote into the output atomically. The samples are the ones lm-eval's evaluate() logs
(raylm.results.lmeval), so every field, hash and per-document metric is lm-eval's.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Any

from raylm.errors import RaylmError
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location
from raylm.storage.ownership import own_companions

# samples_<task>_<local ISO time, ':' as '-'>.jsonl, as sample_log_name writes it with date_id
_NAME = re.compile(r"samples_(?P<task>.+)_\d{4}-\d{2}-\d{2}T\d{2}-\d{2}-\d{2}(\.\d+)?\.jsonl")


def date_id() -> str:
    """The timestamp lm-eval puts in its file names (EvaluationTracker.date_id): local ISO time, ':' -> '-'."""
    return datetime.now().isoformat().replace(":", "-")


def sample_log_name(task: str, date: str) -> str:
    return f"samples_{task}_{date}.jsonl"


def sample_log_parquet(name: str) -> str | None:
    """The Parquet samples of the task a sample log named `name` logs (raylm writes both for a task it logged
    samples of, and only the Parquet file can carry raylm's mark), or None for another name."""
    match = _NAME.fullmatch(name)
    return f"{match['task']}.parquet" if match else None


own_companions(sample_log_parquet)  # --overwrite removes the previous run's logs (raylm.storage.ownership)


def sample_log(task: str, samples: list[dict[str, Any]]) -> bytes:
    """The jsonl text lm-eval 0.4.13 writes for one task's logged samples (it rewrites the samples in place, so it
    is handed a copy)."""
    from lm_eval.loggers import EvaluationTracker

    with tempfile.TemporaryDirectory(prefix="raylm-samples-") as tmp:
        # An output path ending in .json makes lm-eval write beside it, without its model-name folder.
        tracker = EvaluationTracker(output_path=str(Path(tmp) / "results.json"))
        tracker.date_id = "raylm"
        tracker.save_results_samples(task, copy.deepcopy(samples))
        return (Path(tmp) / sample_log_name(task, tracker.date_id)).read_bytes()


def write_sample_logs(folder: Location, samples: dict[str, list[dict[str, Any]]], date: str) -> list[Location]:
    """Each task's log in `folder`, one date for the run, as lm-eval names a run's files."""
    paths = []
    for task, logged in samples.items():
        path = folder / sample_log_name(task, date)
        write_atomic(path, sample_log(task, logged))
        paths.append(path)
    return paths


def read_sample_log(where: Location) -> list[dict[str, Any]]:
    """A samples_<task>_<date>.jsonl, a record per line."""
    out = []
    for number, line in enumerate(where.read_text().splitlines(), 1):
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise RaylmError(f"{where}: line {number} is not JSON ({e.msg})") from None
    return out
