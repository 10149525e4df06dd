"""An lm-eval `--output_path` directory as runs: in it or in each of its model folders, the newest
results_<date>.json and that run's samples_<task>_<date>.jsonl."""

from __future__ import annotations

from raylm.compare.run import Run, read_results, scored_tasks
from raylm.results.sample_logs import sample_log_name
from raylm.storage.location import Location


def _results_files(directory: Location) -> list[Location]:
    return [f for f in directory.iterdir() if f.name.startswith("results_") and f.name.endswith(".json")]


def _newest_run(directory: Location, files: list[Location]) -> Run:
    newest = max(files, key=lambda f: f.name)
    date = newest.name.removeprefix("results_").removesuffix(".json")
    results = read_results(newest)
    present = {f.name for f in files} | {f.name for f in directory.iterdir()}
    samples = {task: directory / sample_log_name(task, date) for task in scored_tasks(results)
               if sample_log_name(task, date) in present}
    return Run(str(directory), results, samples)


def find(where: Location) -> list[Run]:
    directories = [where, *(d for d in where.iterdir() if d.is_dir())]
    found = [(d, files) for d in directories if (files := _results_files(d))]
    return [_newest_run(d, files) for d, files in sorted(found, key=lambda x: x[0].path)]
