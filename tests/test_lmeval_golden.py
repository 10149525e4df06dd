"""lm-eval-backed tasks against lm-evaluation-harness 0.4.13's own outputs for stories260K (tests/golden).

Scored by raylm's real pipeline (lm-eval builds the requests, raylm's Encoder tokenises, raylm's Scorer scores,
lm-eval computes the metrics): prompts character for character, per-request loglikelihoods within the golden
README's tolerance, identical per-document results (every metric lm-eval logs per document), every metric and
stderr of tasks and groups to 1e-6 relative of lm-eval's. Zero-shot: all of ARC-Easy and PIQA's first 300 rows
(the golden runs themselves), the first 25 documents of each MMLU subject (groups included) and 100 of BoolQ;
few-shot: MMLU 5-shot (first_n from dev, each subject's description) and ARC-Easy 3-shot (the default sampler
drawing from the evaluated split, excluding the evaluated document) on their first documents; rolling: lm-eval's
wikitext task (reference_tasks) on 4 pages. On a subset, lm-eval's numbers are those its metric code gives for
its own scores of the same documents (`--limit N` builds the first N documents' requests exactly as a full run).

The metrics path alone (lm-eval's own scores in, lm-eval's own numbers out, bit for bit) is checked on every
golden run in full, BoolQ's 3,270 documents included.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np
import pytest
from conftest import STORIES
from fixture_data import FEW_SHOT, ORIGINAL, ZERO_SHOT, read_golden

from raylm.cluster.actors import score_shard
from raylm.config import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.lmeval import request_tables
from raylm.requests.shards import LMEVAL_KIND
from raylm.results.lmeval import results, task_scores
from raylm.scoring.scorer import Scorer
from raylm.tasks.lmeval.build import load_and_build
from raylm.tasks.lmeval.names import select

SEEDS = (DEFAULT_RANDOM_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED)
BOOTSTRAP_ITERS = 1000  # what the golden runs used (tests/golden/make_stories260K.py)
METRIC_REL = 1e-6


@dataclass(frozen=True)
class Run:
    golden: str
    names: tuple[str, ...]
    num_fewshot: int | None
    limit: int | None  # what this test scores
    golden_limit: int | None = None  # what the golden run scored
    tasks_dir: str = "local_tasks"  # the --include-path fixture holding the names


SCORED = {
    "arc_easy": Run(ZERO_SHOT, ("arc_easy_local",), None, None),
    "piqa": Run(ZERO_SHOT, ("piqa_local",), None, 300, 300),
    "mmlu": Run(ZERO_SHOT, ("mmlu_local",), None, 25),
    "boolq": Run(ZERO_SHOT, ("boolq_local",), None, 100),
    "mmlu-5shot": Run(FEW_SHOT, ("mmlu_local",), 5, 20),
    "arc_easy-3shot": Run(FEW_SHOT, ("arc_easy_local",), 3, 60),
    "wikitext": Run(ORIGINAL, ("wikitext_local",), 0, 4, tasks_dir="reference_tasks"),
}
GOLDEN_RUNS = {
    "arc_easy+boolq+mmlu": Run(ZERO_SHOT, ("arc_easy_local", "boolq_local", "mmlu_local"), None, None),
    "piqa": Run(ZERO_SHOT, ("piqa_local",), None, 300, 300),
    "mmlu-5shot": Run(FEW_SHOT, ("mmlu_local",), 5, None),
    "arc_easy-3shot": Run(FEW_SHOT, ("arc_easy_local",), 3, None),
    "wikitext": Run(ORIGINAL, ("wikitext_local",), 0, None, tasks_dir="reference_tasks"),
}


@pytest.fixture(scope="module")
def goldens():
    return {name: read_golden(name) for name in (ORIGINAL, ZERO_SHOT, FEW_SHOT)}


@pytest.fixture(scope="module")
def stories():
    spec = ModelSpec(str(STORIES), dtype="float32")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    return encoder, Scorer(model, encoder.max_length)


def build(run: Run, request: pytest.FixtureRequest, limit: int | None):
    tasks_dir = request.getfixturevalue(run.tasks_dir)
    return load_and_build(select(run.names, tasks_dir), SEEDS, run.num_fewshot, limit)


def golden_scores(golden: dict, built) -> dict:
    """lm-eval's own score of every request: (loglikelihood, is_greedy), or a rolling document's total."""
    out = {}
    for task in built.tasks["tasks"]:
        rolling = built.output_type(task) == "loglikelihood_rolling"
        for s in golden["samples"][task]:
            for idx, (ll, greedy) in enumerate(zip(s["loglikelihood"], s["is_greedy"])):
                out[(task, s["doc_id"], idx)] = ll if rolling else (ll, greedy)
    return out


def as_json(out: dict) -> dict:
    return json.loads(json.dumps(out, default=str))


def assert_metrics_close(ours: dict, golden: dict, names) -> None:
    for name in names:
        for key, expected in golden[name].items():
            if not isinstance(expected, float):  # names, counts, and "N/A" where lm-eval has no stderr
                assert ours[name][key] == expected, (name, key)
            else:
                assert ours[name][key] == pytest.approx(expected, rel=METRIC_REL, abs=0), (name, key)


def per_document(out: dict, task: str) -> list[tuple]:
    """What lm-eval logs per document, its per-document metrics included (acc, acc_norm: the predictions)."""
    return [(s["doc_id"], s["target"], tuple(s["metrics"]), tuple(s[m] for m in s["metrics"]))
            for s in out["samples"][task]]


@pytest.fixture(scope="module", params=sorted(SCORED))
def scored_run(request, stories, goldens):
    """One run scored by raylm: built, tokenised, scored in-process by the real Scorer, turned into lm-eval's
    results by lm-eval; and the same requests given lm-eval's own scores."""
    run = SCORED[request.param]
    encoder, scorer = stories
    built = build(run, request, run.limit)
    tables = request_tables(built, encoder)
    scores = {}
    for name, table in tables.items():
        scores.update(task_scores(name, built.output_type(name), table,
                                  score_shard(scorer, LMEVAL_KIND, table).table))
    golden = goldens[run.golden]
    requests = {name: built.requests(name) for name in built.tasks["tasks"]}
    ours = as_json(results(built, scores, BOOTSTRAP_ITERS))
    theirs = as_json(results(built, golden_scores(golden, built), BOOTSTRAP_ITERS))
    return run, golden, requests, scores, ours, theirs


def test_prompts_are_lm_evals_character_for_character(scored_run):
    run, golden, requests, _, _, _ = scored_run
    for task, mine in requests.items():
        expected = {s["doc_id"]: s["arguments"] for s in golden["samples"][task]}
        built: dict[int, list] = {}
        for r in mine:
            built.setdefault(r.doc_id, []).append(list(r.arguments))
        if run.limit is not None:
            expected = {d: a for d, a in expected.items() if d < run.limit}
        assert built == expected, task


def test_every_loglikelihood_within_the_golden_tolerance(scored_run):
    _, golden, requests, scores, _, _ = scored_run
    for task, mine in requests.items():
        expected = {(task, s["doc_id"], i): (ll, g) for s in golden["samples"][task]
                    for i, (ll, g) in enumerate(zip(s["loglikelihood"], s["is_greedy"]))}
        keys = [(task, r.doc_id, r.idx) for r in mine]
        rolling = mine[0].request_type == "loglikelihood_rolling"
        ours = np.array([scores[k] if rolling else scores[k][0] for k in keys])
        theirs = np.array([expected[k][0] for k in keys])
        if rolling:  # a page's total over many windows: the golden README's perplexity tolerance
            np.testing.assert_allclose(ours, theirs, rtol=1e-6, err_msg=task)
        else:
            np.testing.assert_allclose(ours, theirs, rtol=2e-6, atol=1e-4, err_msg=task)
            assert [scores[k][1] for k in keys] == [expected[k][1] for k in keys], task


def test_per_document_results_are_identical(scored_run):
    run, _, requests, _, ours, theirs = scored_run
    for task in requests:
        mine, lm_evals = per_document(ours, task), per_document(theirs, task)
        if run.names == ("wikitext_local",):  # per-document perplexity terms: (loglikelihood, count) pairs
            assert [d[:3] for d in mine] == [d[:3] for d in lm_evals]
            assert np.allclose([v[0] for d in mine for v in d[3]], [v[0] for d in lm_evals for v in d[3]], rtol=1e-6)
        else:
            assert mine == lm_evals, task


def test_every_metric_and_stderr_of_tasks_and_groups_is_lm_evals(scored_run):
    run, golden, _, _, ours, theirs = scored_run
    assert set(ours["results"]) == set(theirs["results"]) and set(ours.get("groups", {})) == set(
        theirs.get("groups", {}))
    assert_metrics_close(ours["results"], theirs["results"], theirs["results"])
    assert_metrics_close(ours.get("groups", {}), theirs.get("groups", {}), theirs.get("groups", {}))
    for section in ("group_subtasks", "n-shot", "versions", "n-samples", "higher_is_better"):
        assert ours[section] == theirs[section], section
    if run.limit == run.golden_limit:  # the golden run itself: lm-eval's numbers as its file records them
        assert_metrics_close(ours["results"], golden["results"], ours["results"])


@pytest.mark.parametrize("label", sorted(GOLDEN_RUNS))
def test_lm_evals_scores_give_back_lm_evals_numbers_exactly(label, request, goldens):
    """The metrics path without the model: lm-eval's own per-request scores through raylm's glue and lm-eval's
    metric code reproduce every golden number and table exactly."""
    run = GOLDEN_RUNS[label]
    golden = goldens[run.golden]
    built = build(run, request, run.golden_limit)
    out = as_json(results(built, golden_scores(golden, built), BOOTSTRAP_ITERS))
    for key in ("results", "groups", "group_subtasks", "n-shot", "versions", "n-samples", "higher_is_better"):
        expected = {k: v for k, v in golden.get(key, {}).items() if k in out["results"]}
        assert {k: v for k, v in out.get(key, {}).items() if k in expected} == expected, key
    assert set(out["results"]) <= set(golden["results"])
    for task in built.tasks["tasks"]:
        gold = {s["doc_id"]: s for s in golden["samples"][task]}
        assert [(s["doc_id"], s["target"]) for s in out["samples"][task]] == \
            [(d, gold[d]["target"]) for d in sorted(gold)]
