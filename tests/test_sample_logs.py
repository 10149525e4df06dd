"""lm-eval's own sample logs: with --log-samples, raylm writes samples/samples_<task>_<date>.jsonl line for line as
lm-eval 0.4.13's --log_samples writes them for the same model answers (lm-eval's simple_evaluate around the same
scores, saved by its EvaluationTracker as its CLI does), named so lm-eval's own file-name helpers read them."""

from __future__ import annotations

import json

import lm_eval
import pandas as pd
import pytest
from conftest import STORIES
from lm_eval.loggers import EvaluationTracker
from lm_eval.utils import get_file_datetime, get_file_task_name
from test_compare import SEEDS, lmeval_task_result, random_scores
from test_lmeval_results import ReplayLM

from raylm.config import EvalConfig
from raylm.models.spec import ModelSpec
from raylm.results.lmeval import results
from raylm.results.report import EvalResult, write_samples
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import select

TASKS = ("arc_easy_local",)
LIMIT = 5


@pytest.fixture(scope="module")
def logs(local_tasks, tmp_path_factory):
    """raylm's and lm-eval's jsonl for the same scores: {task: (our lines, their lines)}, and raylm's files."""
    selection = select(list(TASKS), local_tasks)
    built = load_and_build(selection, SEEDS, None, LIMIT)
    scores = random_scores(built, 4)
    ours = tmp_path_factory.mktemp("ours")
    cfg = EvalConfig(ModelSpec(str(STORIES)), TASKS, bootstrap_iters=0, log_samples=True)
    write_samples(ours, EvalResult(cfg, {name: lmeval_task_result(built, name, scores, LIMIT) for name in TASKS},
                                   1.0, {}, lmeval=results(built, scores, bootstrap_iters=0)))
    arguments = {(t, r.doc_id, r.idx): r.arguments for t in built.tasks["tasks"] for r in built.requests(t)}
    theirs = lm_eval.simple_evaluate(model=ReplayLM(scores, arguments), tasks=list(TASKS), limit=LIMIT,
                                     task_manager=selection.manager, log_samples=True,  # the names resolved once
                                     bootstrap_iters=0, random_seed=SEEDS[0], numpy_random_seed=SEEDS[1],
                                     torch_random_seed=SEEDS[2], fewshot_random_seed=SEEDS[3])
    tracker = EvaluationTracker(output_path=str(tmp_path_factory.mktemp("theirs")))
    tracker.general_config_tracker.model_name_sanitized = "stories260K"
    tracker.date_id = "2026-12-03T10-00-00.000001"
    files = {path.name: path for path in (ours / "samples").glob("samples_*.jsonl")}
    out = {}
    for task in TASKS:
        tracker.save_results_samples(task, theirs["samples"][task])  # as lm-eval's CLI saves them
        their_file = tracker.output_path + f"/stories260K/samples_{task}_{tracker.date_id}.jsonl"
        [name] = [n for n in files if get_file_task_name(n) == task]
        out[task] = (files[name].read_text(encoding="utf-8").splitlines(),
                     open(their_file, encoding="utf-8").read().splitlines())
    return out, files


@pytest.mark.parametrize("task", TASKS)
def test_jsonl_lines_are_lm_evals_own(logs, task):
    ours, theirs = logs[0][task]
    assert len(ours) == LIMIT and ours == theirs
    first = json.loads(ours[0])
    assert list(first)[:11] == ["doc_id", "doc", "target", "arguments", "resps", "filtered_resps", "filter",
                                "metrics", "doc_hash", "prompt_hash", "target_hash"]
    assert all(metric in first for metric in first["metrics"])


def test_jsonl_names_and_readers(logs):
    _, files = logs
    assert sorted(get_file_task_name(n) for n in files) == sorted(TASKS)
    assert len({get_file_datetime(n) for n in files}) == 1  # one date for the run, as lm-eval names a run's files
    for path in files.values():
        frame = pd.read_json(path, lines=True)
        assert len(frame) == LIMIT and set(frame["filter"]) == {"none"}
        assert [json.loads(line)["doc_id"] for line in path.read_text(encoding="utf-8").splitlines()] == \
            list(range(LIMIT))
