"""The logits budget: a row whose predicting positions would not fit runs in pieces over the KV cache, equal to
one pass and to the float64 reference; a request that cannot be cut is one line naming its document."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
import torch
from reference import float64_copy, reference_score
from transformers import AutoModelForCausalLM

from raylm.cluster.actors import score_shard
from raylm.errors import RaylmError
from raylm.requests.table import SCHEMA
from raylm.scoring.attention import attention_plan
from raylm.scoring.scorer import LOGITS_BUDGET_BYTES, LOGITS_BUDGET_ENV, RequestDoesNotFit, Scorer

POSITIONS = 16  # what the small budget holds


@pytest.fixture(scope="module")
def model(tiny_llama):
    return AutoModelForCausalLM.from_pretrained(tiny_llama, dtype=torch.float32).eval()


def budget(model) -> int:
    return POSITIONS * model.config.vocab_size * 4


def rolling_row(seed: int, n: int = 120) -> tuple[list[int], list[int]]:
    """One token of context and every other position predicting, as a rolling window's row."""
    tokens = np.random.default_rng(seed).integers(3, 500, n).tolist()
    return tokens[:1], tokens[1:]


def test_a_long_row_runs_in_pieces_within_the_budget_and_equals_one_pass(model):
    contexts, continuations = zip(*(rolling_row(s) for s in range(3)))
    widest: list[int] = []
    hook = model.get_output_embeddings().register_forward_pre_hook(lambda _m, args: widest.append(args[0].shape[1]))
    try:
        small = Scorer(model, 127, logits_budget=budget(model))
        pieces, pieces_greedy = small.score(contexts, continuations)
    finally:
        hook.remove()
    whole, whole_greedy = Scorer(model, 127).score(contexts, continuations)
    assert small.max_predicted == POSITIONS and max(widest) <= POSITIONS and len(widest) >= 3 * 119 / POSITIONS
    np.testing.assert_allclose(pieces, whole, rtol=1e-6)
    assert np.array_equal(pieces_greedy, whole_greedy)
    model64 = float64_copy(model)
    reference = [reference_score(model64, list(c), list(k), 127)[0] for c, k in zip(contexts, continuations)]
    np.testing.assert_allclose(pieces, reference, rtol=1e-5)


def test_a_row_over_the_logits_budget_is_cut_even_where_requests_share_no_rows(model):
    """share_prefixes=False (raylm membership's scoring) still cuts a row into pieces over the KV cache where the
    model's plan takes masks: sharing no row with another request is not the same as having no cache."""
    context, continuation = rolling_row(0)
    pieces = Scorer(model, 127, share_prefixes=False, logits_budget=budget(model)).score([context], [continuation])
    whole = Scorer(model, 127).score([context], [continuation])
    np.testing.assert_allclose(pieces[0], whole[0], rtol=1e-6)
    assert np.array_equal(pieces[1], whole[1])


def test_a_request_an_unpacked_model_cannot_cut_is_one_line_naming_its_document(model):
    context, continuation = rolling_row(0)
    unpacked = attention_plan(model).unpacked("unpacked (test)")  # no mask may carry a cached piece on
    scorer = Scorer(model, 127, plan=unpacked, logits_budget=budget(model))
    with pytest.raises(RequestDoesNotFit, match=r"^119 predicted tokens need more logits memory than the budget "
                                                r"holds \(16 positions\) .* pass a smaller --max-length$"):
        scorer.score([context], [continuation])
    shard = pa.table({"doc_id": [7], "req_idx": [0], "context": [context], "continuation": [continuation],
                      "gold": [0], "norm_len": [0], "words": [0], "bytes": [0]}, schema=SCHEMA)
    with pytest.raises(RaylmError, match=r"^document 7 \(request 0, 1 \+ 119 tokens\): 119 predicted tokens"):
        score_shard(scorer, "rolling", shard)


def test_the_logits_budget_is_the_setting_where_one_is_given_and_the_device_s_default_otherwise(model, monkeypatch):
    """RAYLM_LOGITS_BUDGET_GIB replaces the default budget: the positions one pass predicts are the GiB given over
    one position's float32 logits (the model is float32, so no second copy)."""
    per_position = model.config.vocab_size * 4
    monkeypatch.delenv(LOGITS_BUDGET_ENV, raising=False)
    assert Scorer(model, 127).max_predicted == LOGITS_BUDGET_BYTES["cpu"] // per_position
    monkeypatch.setenv(LOGITS_BUDGET_ENV, "0.5")
    assert Scorer(model, 127).max_predicted == 2**29 // per_position


@pytest.mark.parametrize("value", ["0", "-1", "eight", "inf"])
def test_a_logits_budget_that_is_no_positive_number_of_gib_is_one_line_naming_the_setting(model, monkeypatch, value):
    monkeypatch.setenv(LOGITS_BUDGET_ENV, value)
    with pytest.raises(RaylmError, match=f"{LOGITS_BUDGET_ENV}='{value}': the logits budget must be a number"):
        Scorer(model, 127)
