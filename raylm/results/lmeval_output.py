"""lm-eval's --output_path layout, for scripts and tools that glob lm-eval's files.

lm-eval 0.4.13's EvaluationTracker writes `DIR/<sanitized model name>/results_<date>.json` and, with --log_samples,
`samples_<task>_<date>.jsonl` beside it; an output path ending in `.json` becomes `<stem>_<date>.json`, its samples
in the same folder. The results file is written by the tracker's own save_results_aggregated (its task hashes, its
general config: model_source, model_name, prompt settings and hashes, evaluation time) into a scratch folder and
moved into place atomically, the samples by raylm.results.sample_logs, which does the same with
save_results_samples. raylm's own working folders (results.json, the checkpoint a rerun resumes from, the Parquet
samples) sit in the same folder under `.raylm`, or `.<stem>.raylm` for a `.json` path, one per command line
(raylm.cli.run_dirs), so that the same command line resumes a stopped run and a line with other tasks or settings
runs beside it; each finished run adds files with a new date, as lm-eval's do.
"""

from __future__ import annotations

import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from raylm.errors import RaylmError
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, is_uri, location, split_query

WORK_DIR = ".raylm"


def model_name(model_args: dict[str, Any]) -> str:
    """The model's name as lm-eval's tracker takes it from --model_args (peft before pretrained), sanitized for a
    folder name by lm-eval's own sanitize_model_name."""
    from lm_eval.loggers.evaluation_tracker import GeneralConfigTracker
    from lm_eval.utils import sanitize_model_name

    return sanitize_model_name(GeneralConfigTracker._get_model_name(model_args))


def _join(base: str, *names: str) -> str:
    """A local path or URI with names appended, its query (`?endpoint=...`) kept last."""
    path, query = split_query(base) if is_uri(base) else (base, "")
    return posixpath.join(path, *names) + (f"?{query}" if query else "")


@dataclass(frozen=True)
class Layout:
    """Where one --output_path puts a model's files."""

    folder: str  # results and samples files
    stem: str | None  # a `.json` output path's stem: results are `<stem>_<date>.json`, else `results_<date>.json`

    @classmethod
    def of(cls, output_path: str, model_args: dict[str, Any]) -> Layout:
        base = split_query(output_path)[0] if is_uri(output_path) else output_path
        if PurePosixPath(base).suffix == ".json":  # EvaluationTracker's test, on the path as given
            parent = posixpath.dirname(base.rstrip("/")) or "."
            query = output_path[len(base):]
            return cls(parent + query, PurePosixPath(base).stem)
        return cls(_join(output_path, model_name(model_args)), None)

    @property
    def work_dir(self) -> str:
        """The folder raylm's own output folders sit in, one per command line (raylm.cli.run_dirs)."""
        return _join(self.folder, WORK_DIR if self.stem is None else f".{self.stem}.raylm")

    def results_file(self, date: str) -> Location:
        return location(self.folder) / (f"results_{date}.json" if self.stem is None else f"{self.stem}_{date}.json")


def lmeval_results_file(results: dict[str, Any], samples: dict[str, list[dict[str, Any]]] | None,
                        model_args: dict[str, Any], wall_s: float) -> tuple[str, bytes]:
    """(date, text) of the results file lm-eval's EvaluationTracker writes for these results: its task hashes
    (with samples), its general config for an hf model of these model_args, the run's wall time as its evaluation
    time. `results` already holds the prompt settings the tracker logs, under the same keys."""
    from lm_eval.loggers import EvaluationTracker

    with tempfile.TemporaryDirectory(prefix="raylm-results-") as tmp:
        tracker = EvaluationTracker(output_path=str(Path(tmp) / "results.json"))
        general = tracker.general_config_tracker
        general.log_experiment_args(model_source="hf", model_args=model_args,
                                    system_instruction=results.get("system_instruction"),
                                    chat_template=results.get("chat_template"),
                                    fewshot_as_multiturn=results.get("fewshot_as_multiturn"))
        # The tracker times from its own creation to its save; the run took wall_s.
        general.log_end_time = lambda: setattr(general, "total_evaluation_time_seconds", str(wall_s))
        tracker.save_results_aggregated(results=dict(results), samples=samples)  # it adds its keys to the dict
        written = sorted(Path(tmp).glob("results_*.json"))
        if not written:  # the tracker logs a failed write as a warning and carries on; raylm stops
            raise RaylmError("lm-eval's EvaluationTracker did not write the results file (see the warning above)")
        return tracker.date_id, written[0].read_bytes()


def write_lmeval_output(layout: Layout, results: dict[str, Any], samples: dict[str, list[dict[str, Any]]] | None,
                        model_args: dict[str, Any], wall_s: float) -> Location:
    """The results file, and each task's samples file with --log_samples, under one date; the results file's
    Location."""
    from raylm.results.sample_logs import write_sample_logs

    date, text = lmeval_results_file(results, samples, model_args, wall_s)
    if samples:
        write_sample_logs(location(layout.folder), samples, date)
    path = layout.results_file(date)
    write_atomic(path, text)
    return path
