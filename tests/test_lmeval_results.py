"""Native tasks in lm-eval's results shape (lm-eval's rules for stderr entries, its section order), and the printed
table: lm-eval's make_table, or raylm's plain table where lm-eval is not installed."""

from __future__ import annotations

import math
import sys

import pyarrow as pa
from lm_eval.utils import make_table

from conftest import STORIES
from raylm.config import EvalConfig
from raylm.results.native import task_entry
from raylm.results.report import EvalResult, TaskResult, format_table, results_dict
from raylm.scoring.models import ModelSpec

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

