"""lm-eval's own sample logs: with --log-samples, raylm writes samples/samples_<task>_<date>.jsonl line for line as
lm-eval 0.4.13's --log_samples writes them for the same model answers (lm-eval's simple_evaluate around the same
scores, saved by its EvaluationTracker as its CLI does), named so lm-eval's own file-name helpers read them.
Native tasks' lines are held against lm-eval's own hellaswag, winogrande and wikitext run by lm-eval on the same
model and rows (tests/golden/make_native_samples.py)."""

from __future__ import annotations

import json
from pathlib import Path

import lm_eval
import pandas as pd
import pyarrow as pa
import pytest
from conftest import DATA, STORIES
from lm_eval.loggers import EvaluationTracker
from lm_eval.utils import get_file_datetime, get_file_task_name
from test_compare import SEEDS, lmeval_task_result, random_scores
from test_lmeval_results import ReplayLM

from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.evaluate import log_native_samples, run_prompt, run_task_docs
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.native import encode_task_requests
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.lmeval import results
from raylm.results.native_logs import native_samples
from raylm.results.report import write_samples
from raylm.scoring.scorer import Scorer
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.counterparts import build_counterparts
from raylm.tasks.lmeval.names import select
from raylm.tasks.prompt import PromptFormat

TASKS = ("arc_easy_local",)
LIMIT = 5
NATIVE = ("hellaswag", "winogrande", "wikitext")
NATIVE_GOLDEN = Path(__file__).parent / "golden" / "lmeval-0.4.13_native_samples"
# What holds a loglikelihood, which lm-eval and raylm sum in different orders (tests/golden/README.md's tolerance)
LOGLIKELIHOODS = ("resps", "filtered_resps", "word_perplexity", "byte_perplexity", "bits_per_byte")


@pytest.fixture(scope="module")
def logs(local_tasks, tmp_path_factory):
    """raylm's and lm-eval's jsonl for the same scores: {task: (our lines, their lines)}, and raylm's files."""
    selection = select(list(TASKS), local_tasks)
    built = load_and_build(selection, SEEDS, None, LIMIT)
    scores = random_scores(built, 4)
    ours = tmp_path_factory.mktemp("ours")
    cfg = EvalConfig(ModelSpec(str(STORIES)), TASKS, bootstrap_iters=0, log_samples=True)
    write_samples(ours, EvalResult(cfg, {name: lmeval_task_result(built, name, scores) for name in TASKS},
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


@pytest.fixture(scope="module")
def stories():
    spec = ModelSpec(str(STORIES), dtype="float32")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    return spec, Encoder(tokenizer, resolve_max_length(model.config, tokenizer)), model


def native_results(cfg: EvalConfig, encoder: Encoder, scores) -> tuple[dict, PromptFormat, dict[str, TaskResult]]:
    """The run's native documents, prompt format and TaskResults, each scored row's loglikelihood from `scores`
    (task, scored table) -> column."""
    docs = run_task_docs(cfg)
    prompt = run_prompt(cfg, encoder.tokenizer)
    out = {}
    for name, (kind, table) in encode_task_requests(docs, encoder, prompt).items():
        scored = scores(kind, table)
        out[name] = TaskResult(name, kind, {}, {"docs": len(docs[name][0])}, docs[name][1], scored)
    return docs, prompt, out


@pytest.fixture(scope="module")
def native_logs(stories, tmp_path_factory):
    """raylm's jsonl for the native tasks on the first rows, scored by stories260K in-process, through evaluate's
    own step and the writer: {task: lines}."""
    spec, encoder, model = stories
    scorer = Scorer(model, encoder.max_length)
    cfg = EvalConfig(spec, NATIVE, DATA, limit=3, log_samples=True)
    docs, prompt, tasks = native_results(cfg, encoder, lambda kind, table: score_shard(scorer, kind, table).table)
    log_native_samples(cfg, docs, prompt, tasks)
    out = tmp_path_factory.mktemp("native")
    write_samples(out, EvalResult(cfg, tasks, 1.0, {}))
    return {get_file_task_name(path.name): path.read_text(encoding="utf-8").splitlines()
            for path in (out / "samples").glob("samples_*.jsonl")}


def _close(ours, theirs) -> bool:
    """Loglikelihoods (numbers, or numbers as lm-eval's sanitize_list writes them) to the golden tolerance, all
    else exactly."""
    if isinstance(ours, list):
        return isinstance(theirs, list) and len(ours) == len(theirs) and all(map(_close, ours, theirs))
    try:
        a, b = float(ours), float(theirs)
    except ValueError:
        return ours == theirs
    return type(ours) is type(theirs) and a == pytest.approx(b, rel=2e-6, abs=2e-4)


@pytest.mark.parametrize("task", NATIVE)
def test_native_jsonl_lines_are_lm_evals_own(native_logs, task):
    ours = [json.loads(line) for line in native_logs[task]]
    theirs = [json.loads(line) for line in (NATIVE_GOLDEN / f"samples_{task}.jsonl").read_text().splitlines()]
    assert [list(line) for line in ours] == [list(line) for line in theirs]
    for mine, golden in zip(ours, theirs):
        for key, value in mine.items():
            if key in LOGLIKELIHOODS:
                assert _close(value, golden[key]), (task, mine["doc_id"], key)
            else:
                assert value == golden[key], (task, mine["doc_id"], key)


def test_native_fewshot_and_chosen_documents_are_lm_evals(stories):
    """5-shot WinoGrande on --samples documents: lm-eval's own winogrande, built on the same rows, renders the
    same prompts and logs each document under its own index."""
    spec, encoder, _ = stories
    cfg = EvalConfig(spec, ("winogrande",), DATA, num_fewshot=5, fewshot_seed=7, samples={"winogrande": [9, 2, 40]})
    docs, prompt, tasks = native_results(cfg, encoder, lambda kind, table: table.append_column(
        "loglikelihood", pa.array([-float(i) for i in range(table.num_rows)])).append_column(
        "is_greedy", pa.array([False] * table.num_rows)))
    log_native_samples(cfg, docs, prompt, tasks)
    logged = tasks["winogrande"].samples
    assert [s["doc_id"] for s in logged] == [2, 9, 40]
    assert [s["resps"] for s in logged] == [[[(-0.0, False)], [(-1.0, False)]], [[(-2.0, False)], [(-3.0, False)]],
                                            [[(-4.0, False)], [(-5.0, False)]]]
    assert all(s["arguments"][0][0].count("\n\n") == 5 for s in logged)


def test_native_requests_other_than_lm_evals_are_refused(stories):
    """raylm's scores logged beside prompts lm-eval would not have built would be a false log: refused in one
    line naming the task, document and request."""
    spec, encoder, _ = stories
    cfg = EvalConfig(spec, ("winogrande",), DATA, limit=2)
    docs, _, tasks = native_results(cfg, encoder, lambda kind, table: table)
    built = build_counterparts(["winogrande"], DATA, num_fewshot=None, fewshot_seed=None, limit=2)
    with pytest.raises(RaylmError, match=r"^winogrande: doc 0 request 0: lm-eval's own winogrande builds"):
        native_samples(built, {"winogrande": docs["winogrande"][0]}, {"winogrande": tasks["winogrande"].scored},
                       PromptFormat(system_instruction="Answer."))
