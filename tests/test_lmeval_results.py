"""lm-eval's results from raylm: the glue around lm-eval's metric code against lm-eval's own simple_evaluate for
the same scores (output types, metrics and few-shot rules no golden covers), native tasks in lm-eval's shape
(its rules for stderr entries, its section order), and the printed table: lm-eval's make_table, or raylm's plain
table where lm-eval is not installed."""

from __future__ import annotations

import json
import math
import multiprocessing
import sys
from pathlib import Path

import lm_eval
import numpy as np
import pyarrow as pa
import pytest
from conftest import STORIES, tasks_only
from lm_eval.api.model import LM
from lm_eval.utils import handle_non_serializable, make_table

from raylm.config import EvalConfig
from raylm.models.spec import ModelSpec
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.lmeval import results
from raylm.results.native import task_entry
from raylm.results.report import format_table, results_dict
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import select

def forbidden_pool(*args, **kwargs):
    raise AssertionError("lm-eval forked a multiprocessing pool from a process with Ray's and torch's threads")


EXTRA = {"shards": 2, "requests_scored": 8, "shards_retried": 0, "shards_resumed": 0}


def hellaswag(docs: int = 10) -> TaskResult:
    return TaskResult("hellaswag", "multiple_choice", {"acc,none": 0.5, "acc_stderr,none": 0.16,
                                                       "acc_norm,none": 0.4, "acc_norm_stderr,none": 0.15},
                      {"docs": docs, "correct": 5, "correct_norm": 4}, 1000, pa.table({}))


def wikitext() -> TaskResult:
    return TaskResult("wikitext", "rolling", {"word_perplexity,none": 900.0, "byte_perplexity,none": 15.0,
                                              "bits_per_byte,none": 3.9, "token_perplexity,none": 120.0},
                      {"docs": 2, "nll": 10.0, "tokens": 4, "words": 3, "bytes": 20}, 62, pa.table({}))


def result(*tasks: TaskResult, bootstrap_iters: int = 100000) -> EvalResult:
    cfg = EvalConfig(ModelSpec(str(STORIES)), tuple(t.name for t in tasks), bootstrap_iters=bootstrap_iters)
    return EvalResult(cfg, {t.name: t for t in tasks}, 1.5, dict(EXTRA))


def test_native_entries_follow_lm_evals_stderr_rules():
    assert task_entry(hellaswag(), 100000) == {"name": "hellaswag", "alias": "hellaswag", "sample_len": 10,
                                               "acc,none": 0.5, "acc_stderr,none": 0.16, "acc_norm,none": 0.4,
                                               "acc_norm_stderr,none": 0.15}
    # lm-eval: no stderr with bootstrap_iters 0, nor for a single document, nor for a weighted perplexity
    assert task_entry(hellaswag(), 0)["acc_stderr,none"] == "N/A"
    assert task_entry(hellaswag(docs=1), 100000)["acc_norm_stderr,none"] == "N/A"
    assert task_entry(wikitext(), 100000) == {"name": "wikitext", "alias": "wikitext", "sample_len": 2,
                                              "word_perplexity,none": 900.0, "word_perplexity_stderr,none": "N/A",
                                              "byte_perplexity,none": 15.0, "byte_perplexity_stderr,none": "N/A",
                                              "bits_per_byte,none": 3.9, "bits_per_byte_stderr,none": "N/A"}


def test_native_results_are_in_lm_evals_shape_with_raylms_extras_beside():
    out = results_dict(result(wikitext(), hellaswag()))
    assert list(out["results"]) == ["wikitext", "hellaswag"]  # as asked for
    assert list(out["versions"]) == ["hellaswag", "wikitext"]  # sorted, as lm-eval writes it
    assert out["n-shot"] == {"hellaswag": 0, "wikitext": 0} and out["group_subtasks"] == {}
    assert out["n-samples"]["hellaswag"] == {"original": 1000, "effective": 10}
    assert out["configs"]["hellaswag"]["metadata"] == {"version": 1.0, "implementation": "raylm native"}
    assert out["token_perplexity"] == {"wikitext": math.exp(10.0 / 4)} and out["sums"]["hellaswag"]["docs"] == 10
    assert "None" not in str(out["config"]["model_args"].values())


def test_the_table_is_lm_evals_make_table_and_raylms_own_without_lm_eval(monkeypatch):
    run = result(hellaswag(), wikitext())
    shown = results_dict(run)
    assert format_table(run).startswith(make_table(shown))
    assert format_table(run).endswith("8 requests scored in 2 shards, 0 retried, 0 resumed from checkpoint, "
                                      "wall time 1.5 s")
    monkeypatch.setitem(sys.modules, "lm_eval.utils", None)
    plain = format_table(run).splitlines()
    assert plain[0].split() == ["task", "metric", "value", "stderr", "n"]
    assert plain[1].split() == ["hellaswag", "acc", "0.5000", "0.1600", "10"]



class ReplayLM(LM):
    """An lm-eval model that answers from a table of scores, checking each request's strings are the ones raylm
    built: lm-eval's own simple_evaluate around the same scores is the reference for raylm's glue."""

    def __init__(self, scores: dict, arguments: dict):
        super().__init__()
        self.scores, self.arguments = scores, arguments

    def _answer(self, requests):
        for req in requests:
            assert req.args == self.arguments[(req.task_name, req.doc_id, req.idx)]
        return [self.scores[(req.task_name, req.doc_id, req.idx)] for req in requests]

    def loglikelihood(self, requests):
        return self._answer(requests)

    def loglikelihood_rolling(self, requests):
        return self._answer(requests)

    def generate_until(self, requests):
        raise NotImplementedError


@pytest.fixture(scope="module")
def variants(local_tasks, tmp_path_factory):
    """arc_easy_local variants for what no golden covers: acc_mutual_info (unconditional requests), output_type
    loglikelihood with a bootstrapped perplexity stderr, a few-shot default and a pinned 0."""
    out = tmp_path_factory.mktemp("variants")
    base = local_tasks / "arc_easy_local.yaml"
    (out / "arc_mi.yaml").write_text(
        f"task: arc_mi\ninclude: {base}\ntag: null\nmetric_list:\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n"
        "  - {metric: acc_mutual_info, aggregation: mean, higher_is_better: true}\n")
    (out / "arc_ll.yaml").write_text(
        f"task: arc_ll\ninclude: {base}\ntag: null\noutput_type: loglikelihood\ndoc_to_choice: null\n"
        "doc_to_target: \"{{' ' + choices.text[choices.label.index(answerKey)]}}\"\nmetric_list:\n"
        "  - {metric: perplexity, aggregation: perplexity, higher_is_better: false}\n"
        "  - {metric: acc, aggregation: mean, higher_is_better: true}\n")
    (out / "arc_two_shot.yaml").write_text(f"task: arc_two_shot\ninclude: {base}\ntag: null\nnum_fewshot: 2\n")
    (out / "arc_pinned.yaml").write_text(f"task: arc_pinned\ninclude: {base}\ntag: null\nnum_fewshot: 0\n")
    return out


@pytest.mark.parametrize("num_fewshot,bootstrap_iters,predict_only", [(None, 200, False), (3, 0, False),
                                                                    (None, 200, True)])
def test_raylms_glue_gives_lm_evals_own_results_for_the_same_scores(variants, num_fewshot, bootstrap_iters,
                                                                    predict_only, monkeypatch):
    """predict_only: lm-eval's --predict_only, its metrics replaced by "bypass" before the requests are built."""
    # lm-eval's bootstrap (arc_ll's perplexity stderr, on both sides below) must not fork a pool from this process,
    # which holds Ray's and torch's threads: importing raylm's lm-eval layer turns the pool off (raylm.tasks.lmeval).
    monkeypatch.setattr(multiprocessing, "Pool", forbidden_pool)
    names = ["arc_mi", "arc_ll", "arc_two_shot", "arc_pinned"]
    seeds = (0, 1234, 1234, 1234)
    built = load_and_build(select(names, variants), seeds, num_fewshot, 12, predict_only=predict_only)
    rng = np.random.default_rng(0)
    scores, arguments = {}, {}
    for task in built.tasks["tasks"]:
        for r in built.requests(task):
            scores[(task, r.doc_id, r.idx)] = (float(-rng.gamma(2.0, 10.0)), bool(rng.random() < 0.2))
            arguments[(task, r.doc_id, r.idx)] = r.arguments
    unconditional = [a for (t, d, _), a in arguments.items() if t == "arc_mi" and d == 0 and a[0] == ""]
    # one ("", " choice") request per choice, after the conditional ones, for acc_mutual_info alone
    assert len(unconditional) == (0 if predict_only else 4)
    ours = results(built, scores, bootstrap_iters)
    theirs = lm_eval.simple_evaluate(model=ReplayLM(scores, arguments), tasks=names,
                                     task_manager=tasks_only(variants), num_fewshot=num_fewshot,
                                     limit=12, bootstrap_iters=bootstrap_iters, random_seed=seeds[0],
                                     numpy_random_seed=seeds[1], torch_random_seed=seeds[2],
                                     fewshot_random_seed=seeds[3], predict_only=predict_only)
    for key in ("results", "group_subtasks", "configs", "versions", "n-shot", "higher_is_better", "n-samples",
                "samples"):
        assert json.dumps(ours[key], default=handle_non_serializable) == \
            json.dumps(theirs[key], default=handle_non_serializable), key
    assert theirs["n-shot"]["arc_pinned"] == 0 and theirs["n-shot"]["arc_two_shot"] == (num_fewshot or 2)
    if predict_only:
        # lm-eval 0.4.13 reports no metric at all for "bypass"; the samples hold every response
        assert all(set(metrics) == {"name", "alias", "sample_len"} for metrics in ours["results"].values())
        assert all(len(samples) == 12 and samples[0]["resps"] for samples in ours["samples"].values())
        return
    stderr = ours["results"]["arc_ll"]["perplexity_stderr,none"]
    assert stderr == "N/A" if bootstrap_iters == 0 else isinstance(stderr, float)


SAMPLE = {"doc_id": 0, "doc": {"q": "?"}, "target": 1, "arguments": [("Q:", " a"), ("Q:", " b")],
          "resps": [[(-1.5, False)], [(-0.5, True)]], "filtered_resps": [(-1.5, False), (-0.5, True)],
          "filter": "none", "metrics": ["acc"], "doc_hash": "d", "prompt_hash": "p", "target_hash": "t", "acc": 1.0}


@pytest.mark.parametrize("output_path,model_args", [
    ("out", {"pretrained": "EleutherAI/pythia-160m"}),
    ("out/", {"pretrained": "huggyllama/llama-7b", "peft": "tloen/alpaca-lora-7b"}),  # lm-eval names the adapter
    ("runs/pythia.json", {"pretrained": "EleutherAI/pythia-160m", "dtype": "float32"}),
])
def test_output_path_files_are_named_and_filled_as_lm_evals_tracker_does(output_path, model_args, tmp_path,
                                                                          monkeypatch):
    """--output_path through raylm's writer and through lm-eval's EvaluationTracker as its CLI drives it, in two
    folders: the same file names (dates aside) and, but for the evaluation time, the same results file."""
    import copy
    import re

    from lm_eval.loggers import EvaluationTracker

    from raylm.results.lmeval_output import Layout, write_lmeval_output

    run = results_dict(result(hellaswag()))
    samples = {"hellaswag": [dict(SAMPLE)]}
    files = {}
    for side in ("ours", "theirs"):
        (tmp_path / side).mkdir()
        monkeypatch.chdir(tmp_path / side)
        if side == "ours":
            layout = Layout.of(output_path, model_args)
            path = write_lmeval_output(layout, run, copy.deepcopy(samples), model_args, 2.5)
            assert str(path).startswith(layout.folder) and layout.work_dir.startswith(layout.folder)
        else:
            tracker = EvaluationTracker(output_path=output_path)
            tracker.general_config_tracker.log_experiment_args("hf", model_args, None, None, False)
            tracker.save_results_aggregated(results=copy.deepcopy(run), samples=copy.deepcopy(samples))
            tracker.save_results_samples("hellaswag", copy.deepcopy(samples["hellaswag"]))
        found = sorted(str(p.relative_to(tmp_path / side)) for p in (tmp_path / side).rglob("*") if p.is_file())
        files[side] = {re.sub(r"\d{4}-\d\d-\d\dT\d\d-\d\d-\d\d\.\d+", "<date>", f): f for f in found}
    assert list(files["ours"]) == list(files["theirs"]) and len(files["ours"]) == 2, files
    results_name = next(n for n in files["ours"] if not Path(n).name.startswith("samples_"))
    ours, theirs = (json.loads((tmp_path / side / files[side][results_name]).read_text()) for side in files)
    assert ours.pop("total_evaluation_time_seconds") == "2.5"
    theirs.pop("total_evaluation_time_seconds")
    assert ours == theirs and ours["task_hashes"]["hellaswag"] and ours["model_source"] == "hf"
    samples_name = next(n for n in files["ours"] if Path(n).name.startswith("samples_"))
    assert [(tmp_path / side / files[side][samples_name]).read_text() for side in files] == \
        [(tmp_path / "theirs" / files["theirs"][samples_name]).read_text()] * 2
