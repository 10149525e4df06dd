"""KLScorer against a float64 one-request-at-a-time reference, and the shared-tokenizer check."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from conftest import GPT2_TOKENIZER, STORIES
from reference import float64_copy
from reference_corpus import reference_kl
from transformers import AutoModelForCausalLM, AutoTokenizer

from raylm.corpus.run import check_same_tokenizer
from raylm.errors import RaylmError
from raylm.scoring.kl import KLScorer

MAX_LENGTH = 128


@pytest.fixture(scope="module")
def models(tiny_llama):
    """P is tiny_llama; Q is P with perturbed weights, so the two distributions differ but stay related."""
    p = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    q = copy.deepcopy(p)
    torch.manual_seed(3)
    with torch.no_grad():
        for w in q.parameters():
            w.add_(0.05 * torch.randn_like(w))
    return p, q


def requests(n: int) -> tuple[list[list[int]], list[list[int]]]:
    rng = np.random.default_rng(0)
    contexts = [rng.integers(3, 512, rng.integers(1, 150)).tolist() for _ in range(n)]
    continuations = [rng.integers(3, 512, rng.integers(1, 40)).tolist() for _ in range(n)]
    return contexts, continuations


def test_kl_of_a_model_with_itself_is_zero(models):
    p, _ = models
    contexts, continuations = requests(6)
    scores = KLScorer(p, p, MAX_LENGTH).score(contexts, continuations)
    assert np.all(scores.kl == 0) and np.all(scores.disagree == 0)
    assert np.array_equal(scores.nll_p, scores.nll_q)


def test_kl_matches_float64_reference_across_batches(models):
    p, q = models
    contexts, continuations = requests(10)
    # A small token budget splits the requests over several padded batches.
    scores = KLScorer(p, q, MAX_LENGTH, token_budget=300).score(contexts, continuations)
    p64, q64 = float64_copy(p), float64_copy(q)
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        kl, nll_p, nll_q, disagree = reference_kl(p64, q64, context, continuation, MAX_LENGTH)
        assert scores.kl[i] == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert scores.nll_p[i] == pytest.approx(nll_p, rel=1e-6)
        assert scores.nll_q[i] == pytest.approx(nll_q, rel=1e-6)
        assert scores.disagree[i] == disagree
    assert np.all(scores.kl > 0) and scores.disagree.sum() > 0


def test_near_zero_mass_under_q_gives_large_finite_kl(models):
    p, q = models
    sharp = copy.deepcopy(q)
    with torch.no_grad():
        sharp.lm_head.weight.mul_(1e4)  # Q puts ~all mass on one token: log q of the rest is about -1e4 or less
    contexts, continuations = requests(3)
    scores = KLScorer(p, sharp, MAX_LENGTH).score(contexts, continuations)
    assert np.all(np.isfinite(scores.kl)) and np.all(np.isfinite(scores.nll_q))
    assert scores.kl.min() > 100


def test_tokenizers_must_match():
    stories, gpt2 = AutoTokenizer.from_pretrained(STORIES), AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    check_same_tokenizer(stories, AutoTokenizer.from_pretrained(STORIES), "a", "b")
    with pytest.raises(RaylmError, match="different vocabularies"):
        check_same_tokenizer(stories, gpt2, "a", "b")
    without_bos = AutoTokenizer.from_pretrained(STORIES, add_bos_token=False)
    with pytest.raises(RaylmError, match="encode the same text differently"):
        check_same_tokenizer(stories, without_bos, "a", "b")
