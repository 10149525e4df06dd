"""raylm against lm-evaluation-harness 0.4.13's own outputs for the stories260K model on the full fixture sets.

Tolerances follow tests/golden/README.md: lm-eval sums float32 log-probs per request, so its own values move by
up to ~1e-4 with batch size; predictions and accuracy must match exactly, perplexities to 1e-6 relative.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import DATA, STORIES
from fixture_data import ORIGINAL, read_golden
from task_requests import build_task_requests

from raylm.cluster.actors import score_shard
from raylm.config import EvalConfig
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.scoring.predictions import choice_predictions
from raylm.scoring.scorer import Scorer
from raylm.tasks import get_task

pytestmark = pytest.mark.slow  # the full fixture sets scored in float32 and float64: a minute of CPU


@pytest.fixture(scope="module")
def scored():
    spec = ModelSpec(str(STORIES), dtype="float32")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, ("hellaswag", "winogrande", "wikitext"), DATA), encoder)
    scorer = Scorer(model, encoder.max_length)
    return {name: (kind, score_shard(scorer, kind, table)) for name, (kind, table) in tables.items()}


@pytest.fixture(scope="module")
def golden():
    return read_golden(ORIGINAL)


@pytest.mark.parametrize("task", ["hellaswag", "winogrande"])
def test_multiple_choice_matches_lm_eval(scored, golden, task):
    kind, shard = scored[task]
    samples = golden["samples"][f"{task}_local"]
    ours = shard.table["loglikelihood"].to_numpy()
    ref = np.array([ll for s in samples for ll in s["loglikelihood"]])
    assert len(ours) == len(ref)
    np.testing.assert_allclose(ours, ref, rtol=2e-6, atol=1e-4)
    greedy = shard.table["is_greedy"].to_numpy(zero_copy_only=False)
    assert (greedy == np.array([g for s in samples for g in s["is_greedy"]])).all()
    pred = choice_predictions(shard.table).pred
    assert (pred == np.array([int(np.argmax(s["loglikelihood"])) for s in samples])).all()
    metrics = choice_metrics(shard.sums, get_task(task).choice_metrics)
    expected = golden["results"][f"{task}_local"]
    for key in ("acc,none", "acc_norm,none"):
        if key in expected:
            assert metrics[key] == expected[key]
            stderr = key.replace(",", "_stderr,")
            assert metrics[stderr] == pytest.approx(expected[stderr], rel=1e-9)


def test_wikitext_matches_lm_eval(scored, golden):
    _, shard = scored["wikitext"]
    samples = golden["samples"]["wikitext_local"]
    doc_id = shard.table["doc_id"].to_numpy()
    loglik = shard.table["loglikelihood"].to_numpy()
    per_doc = np.array([loglik[doc_id == d].sum() for d in range(len(samples))])
    ref = np.array([s["loglikelihood"][0] for s in samples])
    np.testing.assert_allclose(per_doc, ref, rtol=1e-6)
    metrics = rolling_metrics(shard.sums)
    for key in ("word_perplexity,none", "byte_perplexity,none", "bits_per_byte,none"):
        assert np.log(metrics[key]) == pytest.approx(np.log(golden["results"]["wikitext_local"][key]), rel=1e-6)
