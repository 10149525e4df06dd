"""The batched scorer against the one-request-at-a-time float64 reference, and its independence of batching."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
import torch
from conftest import DATA
from reference import float64_copy, reference_score
from task_requests import build_task_requests
from transformers import AutoModelForCausalLM

from raylm.config import EvalConfig
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.scoring.scorer import Scorer


def random_requests(vocab: int, max_length: int, n: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Random lengths, including contexts long enough to be left-truncated."""
    rnd = random.Random(seed)
    contexts = [[rnd.randrange(vocab) for _ in range(rnd.randint(1, max_length + 20))] for _ in range(n)]
    continuations = [[rnd.randrange(vocab) for _ in range(rnd.randint(1, 12))] for _ in range(n)]
    return contexts, continuations


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
@pytest.mark.parametrize("batch_size", [None, 1, 5])
def test_matches_float64_reference_on_random_inputs(request, fixture, batch_size):
    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(fixture))
    max_length = resolve_max_length(model.config, None)
    contexts, continuations = random_requests(model.config.vocab_size, max_length, 40, seed=len(fixture))
    loglik, greedy = Scorer(model, max_length, batch_size, token_budget=700).score(contexts, continuations)
    model64 = float64_copy(model)
    for i, (c, k) in enumerate(zip(contexts, continuations)):
        ref, ref_greedy = reference_score(model64, c, k, max_length)
        assert loglik[i] == pytest.approx(ref, rel=1e-6, abs=1e-5)
        assert greedy[i] == ref_greedy


def test_greedy_flag_is_true_when_continuation_is_argmax(tiny_llama):
    """Random tokens are almost never greedy, so build a continuation from the model's own argmax."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    context = [1, 5, 9, 22]
    continuation = []
    model64 = float64_copy(model)
    for _ in range(4):
        logits = model64(input_ids=__import__("torch").tensor([context + continuation])).logits[0, -1]
        continuation.append(int(logits.argmax()))
    _, greedy = Scorer(model, 128).score([context], [continuation])
    assert greedy[0]


def real_requests(model_dir, tasks=("hellaswag", "winogrande", "wikitext"), limit=12):
    spec = ModelSpec(str(model_dir))
    tokenizer = load_tokenizer(spec)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(spec, tasks, DATA, limit=limit), encoder)
    return model, encoder, tables


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_matches_float64_reference_on_real_rows(request, fixture):
    """Two WikiText pages already make 52 (GPT-2) and 129 (Llama) 128-token rolling windows; each costs the
    float64 reference a full-vocabulary head per position (50k-way for GPT-2), so the rolling task gets fewer
    documents."""
    model, encoder, tables = real_requests(request.getfixturevalue(fixture), ("hellaswag", "winogrande"), limit=6)
    tables.update(real_requests(request.getfixturevalue(fixture), ("wikitext",), limit=2)[2])
    model64 = float64_copy(model)
    for name, (_, table) in tables.items():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        scorer = Scorer(model, encoder.max_length)
        loglik, greedy = scorer.score(contexts, continuations)
        # A document's endings share its context; WikiText's rolling windows share only the prefix token: no trie.
        assert (scorer.requests_in_tries == 0) == (name == "wikitext")
        for i, (c, k) in enumerate(zip(contexts, continuations)):
            ref, ref_greedy = reference_score(model64, c, k, encoder.max_length)
            assert loglik[i] == pytest.approx(ref, rel=1e-6, abs=1e-5)
            assert greedy[i] == ref_greedy


@pytest.mark.parametrize("fixture,task", [("tiny_gpt2", "hellaswag"), ("tiny_llama", "wikitext")])
def test_batch_size_does_not_change_results(request, fixture, task):
    """float32 kernels round differently for different batch shapes; what must not change is any prediction,
    and the summed NLL only within float32 noise that averages out over requests. (WikiText runs on the
    512-token vocabulary: rolling windows score every position, and GPT-2's 50k-way softmax there is slow; five
    pages are already ~390 windows, each run alone at batch size 1.)"""
    model, encoder, tables = real_requests(request.getfixturevalue(fixture), tasks=(task,),
                                           limit=20 if task == "hellaswag" else 5)
    for _, table in tables.values():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        runs = [Scorer(model, encoder.max_length, bs, token_budget=budget).score(contexts, continuations)
                for bs, budget in ((1, None), (3, None), (None, 300), (None, 4096))]
        base_ll, base_greedy = runs[0]
        for loglik, greedy in runs[1:]:
            np.testing.assert_allclose(loglik, base_ll, rtol=1e-6, atol=1e-4)
            assert (greedy == base_greedy).all()
            assert math.fsum(loglik) == pytest.approx(math.fsum(base_ll), rel=1e-8)


def test_log_normaliser_and_argmax_equal_torch_logsumexp_and_first_argmax():
    from raylm.scoring.scorer import _log_normaliser_and_argmax

    generator = torch.Generator().manual_seed(3)
    logits = torch.randn(64, 1000, generator=generator) * 8
    logits[5, [7, 900]] = 100.0  # a tie: argmax and max both return the first maximal index
    expected_lse, expected_argmax = torch.logsumexp(logits, -1), logits.argmax(-1)
    lse, argmax = _log_normaliser_and_argmax(logits.clone())
    torch.testing.assert_close(lse, expected_lse, rtol=1e-6, atol=1e-6)
    assert torch.equal(argmax, expected_argmax) and argmax[5] == 7


def test_cpu_token_budget_follows_the_mlp_width():
    from transformers import GPT2Config, LlamaConfig

    from raylm.scoring.scorer import CPU_TOKEN_BUDGET_MAX, CPU_TOKEN_BUDGET_MIN, cpu_token_budget

    assert cpu_token_budget(GPT2Config()) == 1024  # GPT-2-small: MLP 3072 wide
    assert cpu_token_budget(LlamaConfig(hidden_size=64, intermediate_size=172)) == CPU_TOKEN_BUDGET_MAX
    assert cpu_token_budget(LlamaConfig(intermediate_size=28672)) == CPU_TOKEN_BUDGET_MIN
