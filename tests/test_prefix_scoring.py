"""Shared-prefix packing against separate scoring and the float64 reference; what reaches the model and its head;
and the token budget's halving on out-of-memory."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import STORIES
from reference import float64_copy, reference_score
from test_scoring import real_requests
from transformers import AutoModelForCausalLM

from raylm.scoring.attention import attention_plan
from raylm.scoring.scorer import CacheIgnored, RequestDoesNotFit, Scorer
from raylm.scoring.tree import build_trie, plan_requests, plan_tree, worth_sharing


def grouped_requests(vocab: int, max_length: int, n_docs: int, seed: int):
    """Documents with 1-4 requests each: one context and several endings (some starting with the same tokens,
    some contexts long enough to be left-truncated), or WinoGrande-like contexts that differ after a shared start."""
    rnd = random.Random(seed)
    contexts, continuations, doc_ids = [], [], []
    for doc in range(n_docs):
        context = [rnd.randrange(vocab) for _ in range(rnd.randint(1, max_length + 10))]
        opener = [rnd.randrange(vocab) for _ in range(rnd.randint(0, 2))]
        for _ in range(rnd.randint(1, 4)):
            if rnd.random() < 0.3:
                mine = context[:rnd.randint(1, len(context))] + [rnd.randrange(vocab)]
                ending = [rnd.randrange(vocab) for _ in range(rnd.randint(1, 6))]
            else:
                mine = context
                ending = opener + [rnd.randrange(vocab) for _ in range(rnd.randint(1, 10))]
            contexts.append(mine)
            continuations.append(ending)
            doc_ids.append(doc)
    return contexts, continuations, doc_ids


def test_a_tree_row_lays_out_each_distinct_prefix_once_at_its_true_position():
    inputs = [[5, 6, 7, 8], [5, 6, 7, 9, 10], [5, 6]]
    free, cached = plan_tree([0, 1, 2], inputs, n_targets=[2, 3, 1], row_tokens=100)
    assert cached == [] and len(free) == 1
    row = free[0]
    assert row.tokens == [5, 6, 7, 8, 9, 10]
    assert row.positions == [0, 1, 2, 3, 3, 4]
    assert row.spans == [6, 5, 4, 1, 2, 1]  # columns j..j+span-1 are column j's descendants-or-self
    # Input index t predicts token t+1: request 2's only target is predicted from shared column 1, request 0's
    # first target and request 1's first from column 2 (both continue after 5 6 7).
    assert sorted(row.predicts) == [(1, 2, 0), (2, 0, 0), (2, 1, 0), (3, 0, 1), (4, 1, 1), (5, 1, 2)]


def test_a_subtree_too_big_for_a_row_runs_its_path_once_into_the_cache_and_rows_continue_from_it():
    head = list(range(10, 50))  # a 40-token few-shot head
    inputs = [head + [60 + q, 70 + c] for q in range(3) for c in range(2)]
    free, steps = plan_tree(range(6), inputs, [1] * 6, row_tokens=8)
    assert free == []
    assert [(s.cached, s.keep, len(s.rows[0].tokens)) for s in steps] == [(0, True, 8)] * 1 + [
        (8 * i, True, 8) for i in range(1, 5)] + [(40, False, 6), (40, False, 3)]
    assert steps[-1].rows[0].positions == [40, 41, 41] and steps[-1].rows[0].spans == [3, 1, 1]


def test_a_short_shared_path_is_copied_into_each_row_instead_of_cached():
    inputs = [[1, 5, 6, 7], [1, 8, 9, 10]]  # two documents that share only BOS
    free, steps = plan_tree([0, 1], inputs, [2, 2], row_tokens=6)
    assert steps == [] and [row.tokens for row in free] == [[1, 5, 6, 7], [1, 8, 9, 10]]
    assert sorted(free[0].predicts + free[1].predicts) == [(2, 0, 0), (2, 1, 0), (3, 0, 1), (3, 1, 1)]


def unshared_inputs(seed: int, vocab: int = 5000) -> list[list[int]]:
    """Inputs that share only BOS and a few tokens more, some wider than a row, some requests sharing nothing."""
    rnd = random.Random(seed)
    heads = [[1, rnd.randrange(2, 6)] for _ in range(3)]
    return [rnd.choice(heads)[:rnd.randint(0, 2)] + [rnd.randrange(6, vocab) for _ in range(rnd.randint(20, 90))]
            for _ in range(40)]


def layout(free, steps) -> tuple[list, list]:
    """A plan's forward passes, and which input column predicts each (request, target) token."""
    rows = [(r.tokens, r.positions, r.spans) for r in free] + [
        (s.cached, s.keep, [(r.tokens, r.positions, r.spans) for r in s.rows]) for s in steps]
    predicted = sorted((row.positions[col], request, t) for row in free + [r for s in steps for r in s.rows]
                       for col, request, t in row.predicts)
    return rows, predicted


def test_requests_planned_without_a_trie_get_the_forward_passes_the_trie_gives():
    """On inputs that share prefixes of every length around the thresholds, with or without a trie the forward
    passes are the trie's own and every target is predicted once, from its own position; both ways are taken.
    (Without a trie, a target predicted from a copied shared prefix is taken from its own request's row, where the
    trie takes it from the first row that holds that prefix: the same position, the same tokens before it.)"""
    tries = []
    for seed in range(150):
        rnd = random.Random(seed)
        inputs = [[1] + [rnd.randrange(2, 5000) for _ in range(rnd.choice([20, 90, 300]))] for _ in range(8)]
        for _ in range(rnd.randint(0, 2)):  # a pair sharing 2-60 tokens, or one input inside another
            a, b = rnd.sample(range(len(inputs)), 2)
            shared = inputs[a][:rnd.randint(2, 60)]
            inputs[b] = shared if rnd.random() < 0.2 else shared + inputs[b][len(shared):]
        n_targets = [rnd.randint(0, len(x) // 2) for x in inputs]
        row_tokens = rnd.choice([16, 64, 4096])
        free, steps, trie = plan_requests(range(8), inputs, n_targets, row_tokens)
        assert layout(free, steps) == layout(*plan_tree(range(8), inputs, n_targets, row_tokens)), seed
        tries.append(trie)
    assert set(tries) == {True, False}


def test_a_prefix_worth_sharing_is_one_input_inside_another_or_long_enough_to_cache_or_for_a_tree_row():
    assert worth_sharing([1, 2, 3], [1, 2, 3, 4], row_tokens=100)
    assert not worth_sharing([1, 2] + [5] * 18, [1, 2] + [3] * 18, row_tokens=100)  # 2 of 20: too little
    assert worth_sharing([1, 2] + [0] * 10, [1, 2] + [9] * 10, row_tokens=100)  # 2 of 12 shared: a tree row
    assert not worth_sharing([1, 2] + [0] * 30, [1, 2] + [9] * 30, row_tokens=100)
    assert worth_sharing(list(range(40)) + [0] * 900, list(range(40)) + [9] * 900, row_tokens=100)  # cached


def test_trie_nodes_are_in_preorder_with_subtree_sizes():
    trie = build_trie([0, 1, 2, 3], [[3, 1], [1, 2, 3], [1, 2], [1, 4]], [1, 1, 1, 1])
    assert trie.tokens == [1, 2, 3, 4, 3, 1] and trie.depth == [0, 1, 2, 1, 0, 1]
    assert trie.size == [4, 2, 1, 1, 2, 1] and trie.requests == [3, 2, 1, 1, 1, 1]


@pytest.mark.parametrize("fixture", ["tiny_gpt2", "tiny_llama"])
def test_shared_prefix_matches_separate_scoring_and_reference_on_random_inputs(request, fixture):
    model = AutoModelForCausalLM.from_pretrained(request.getfixturevalue(fixture))
    max_length = model.config.max_position_embeddings if fixture == "tiny_llama" else model.config.n_positions
    contexts, continuations, _ = grouped_requests(model.config.vocab_size, max_length, 14, seed=3)
    scorer = Scorer(model, max_length, token_budget=900)
    shared = scorer.score(contexts, continuations)
    assert scorer.requests_in_tries > 0  # the documents' requests share their contexts: they go through a trie
    alone = Scorer(model, max_length, share_prefixes=False).score(contexts, continuations)
    np.testing.assert_allclose(shared[0], alone[0], rtol=0, atol=1e-5)
    assert (shared[1] == alone[1]).all()
    model64 = float64_copy(model)
    for i, (c, k) in enumerate(zip(contexts, continuations)):
        ref, ref_greedy = reference_score(model64, c, k, max_length)
        assert shared[0][i] == pytest.approx(ref, rel=1e-6, abs=1e-5)
        assert shared[1][i] == ref_greedy


def test_requests_that_share_nothing_score_as_the_reference_without_a_trie(tiny_llama):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    inputs = unshared_inputs(0, model.config.vocab_size)[:12]
    contexts, continuations = [x[:-4] for x in inputs], [x[-4:] for x in inputs]
    scorer = Scorer(model, 128, token_budget=64)
    loglik, greedy = scorer.score(contexts, continuations)
    assert scorer.requests_in_tries == 0 and scorer.packed_rows > 0  # the 90-token inputs ran over the cache
    model64 = float64_copy(model)
    for i, (c, k) in enumerate(zip(contexts, continuations)):
        ref, ref_greedy = reference_score(model64, c, k, 128)
        assert loglik[i] == pytest.approx(ref, rel=1e-6, abs=1e-5)
        assert greedy[i] == ref_greedy


@pytest.mark.parametrize("model_dir", ["tiny_gpt2", "tiny_llama", "stories"])
def test_shared_prefix_matches_reference_on_real_rows(request, model_dir):
    path = STORIES if model_dir == "stories" else request.getfixturevalue(model_dir)
    model, encoder, tables = real_requests(path, tasks=("hellaswag", "winogrande"), limit=5)
    model64 = float64_copy(model)
    for _, table in tables.values():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        loglik, greedy = Scorer(model, encoder.max_length).score(contexts, continuations)
        for i, (c, k) in enumerate(zip(contexts, continuations)):
            ref, ref_greedy = reference_score(model64, c, k, encoder.max_length)
            assert loglik[i] == pytest.approx(ref, rel=1e-6, abs=1e-5)
            assert greedy[i] == ref_greedy


class Counting(torch.nn.Module):
    """Counts the tokens a forward pass sees and the hidden states the LM head sees."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config
        self.tokens = self.head_rows = 0
        model.get_output_embeddings().register_forward_hook(self._count_head)

    def _count_head(self, _module, args, _out):
        self.head_rows += args[0].shape[0] * args[0].shape[1]

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, **kwargs):
        self.tokens += int(input_ids.numel())
        return self.model(input_ids=input_ids, **kwargs)


def test_hellaswag_prefix_runs_once_and_head_sees_only_continuation_positions(tiny_llama):
    """Each distinct prefix of a document's inputs is fed once; the head sees each predicting position once."""
    model, encoder, tables = real_requests(tiny_llama, tasks=("hellaswag",), limit=8)
    table = tables["hellaswag"][1]
    rows = list(zip(table["context"].to_pylist(), table["continuation"].to_pylist(), table["doc_id"].to_pylist()))
    truncated = {d for c, k, d in rows if len(c) + len(k) > encoder.max_length + 1}
    contexts, continuations, doc_ids = zip(*[(c, k, d) for c, k, d in rows if d not in truncated])
    assert len(set(doc_ids)) >= 4
    tokens = head_rows = 0
    for doc in sorted(set(doc_ids)):
        mine = [(c, k) for c, k, d in zip(contexts, continuations, doc_ids) if d == doc]
        inputs = [(c + k)[:-1] for c, k in mine]
        tokens += len({tuple(x[:t + 1]) for x in inputs for t in range(len(x))})
        head_rows += len({tuple(x[:t + 1]) for x, (_, k) in zip(inputs, mine) for t in range(len(x) - len(k), len(x))})
    counting = Counting(model)
    # The wrapper is no class the rule knows (so it would be scored unpacked): give it the wrapped model's plan.
    scorer = Scorer(counting, encoder.max_length, plan=attention_plan(model))
    for doc in sorted(set(doc_ids)):  # one document per call: one row, so no padding is counted
        mine = [i for i, d in enumerate(doc_ids) if d == doc]
        scorer.score([contexts[i] for i in mine], [continuations[i] for i in mine])
    assert counting.tokens == tokens
    assert counting.head_rows == head_rows < sum(len(k) for k in continuations) + 1
    assert tokens < sum(len(c) + len(k) - 1 for c, k in zip(contexts, continuations))


class OutOfMemoryAbove(torch.nn.Module):
    """Raises CUDA's out-of-memory error for any batch of more than `limit` tokens, like a small GPU would; with
    `times`, only on the first `times` such batches, like memory another process held for a while."""

    def __init__(self, model, limit: int, times: int | None = None):
        super().__init__()
        self.model, self.limit, self.times = model, limit, times
        self.widths: list[int] = []  # tokens of every batch that ran

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, **kwargs):
        if input_ids.numel() > self.limit and self.times != 0:
            self.times = None if self.times is None else self.times - 1
            raise torch.OutOfMemoryError("fake: out of memory")
        self.widths.append(input_ids.numel())
        return self.model(input_ids=input_ids, **kwargs)


def test_out_of_memory_halves_the_budget_and_loses_nothing(tiny_llama):
    model, encoder, tables = real_requests(tiny_llama, tasks=("hellaswag", "wikitext"), limit=6)
    for _, table in tables.values():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        expected = Scorer(model, encoder.max_length, token_budget=4096).score(contexts, continuations)
        small = OutOfMemoryAbove(model, 600)
        scorer = Scorer(small, encoder.max_length, token_budget=4096, plan=attention_plan(model))
        got = scorer.score(contexts, continuations)
        # Halved to 512, the largest budget that always fits; it may have grown back one doubling since.
        assert max(small.widths) <= 600 and scorer.token_budget in (512, 1024)
        np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-5)
        assert (got[1] == expected[1]).all()


@pytest.mark.parametrize("share_prefixes", [True, False])
def test_out_of_memory_on_a_single_row_scores_it_in_pieces_over_the_kv_cache(tiny_llama, share_prefixes):
    """A row too big for the GPU alone is cut into pieces that run over the KV cache of the ones before, whether
    or not requests share rows, and scores as it does whole."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    rnd = random.Random(0)
    contexts = [[rnd.randrange(3, 512) for _ in range(n)] for n in (60, 9)]
    continuations = [[rnd.randrange(3, 512) for _ in range(n)] for n in (30, 3)]
    expected = Scorer(model, 128, token_budget=4096).score(contexts, continuations)
    small = OutOfMemoryAbove(model, 24)
    scorer = Scorer(small, 128, token_budget=4096, share_prefixes=share_prefixes, plan=attention_plan(model))
    got = scorer.score(contexts, continuations)
    assert max(small.widths) <= 24 < len(contexts[0]) + len(continuations[0]) - 1
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-5)
    assert (got[1] == expected[1]).all()


def test_out_of_memory_where_no_smaller_forward_pass_exists_is_raised(tiny_llama):
    """One token that does not fit, or a whole row of a model scored unpacked (no mask may carry a cached piece
    into the next), cannot be helped by any budget."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    with pytest.raises(torch.OutOfMemoryError):
        Scorer(OutOfMemoryAbove(model, 0), 128, token_budget=4096, plan=attention_plan(model)).score([[1] * 20],
                                                                                                      [[5, 6]])
    unpacked = attention_plan(model).unpacked("unpacked (test)")
    with pytest.raises(torch.OutOfMemoryError):
        Scorer(OutOfMemoryAbove(model, 10), 128, token_budget=4096, plan=unpacked).score([[1] * 20], [[5, 6]])


def test_a_budget_halved_by_a_passing_out_of_memory_error_grows_back_to_where_it_started(tiny_llama):
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    rnd = random.Random(1)
    contexts = [[rnd.randrange(3, 512) for _ in range(rnd.randint(5, 40))] for _ in range(60)]
    continuations = [[rnd.randrange(3, 512) for _ in range(rnd.randint(1, 4))] for _ in contexts]
    expected = Scorer(model, 128, token_budget=64, share_prefixes=False).score(contexts, continuations)
    scorer = Scorer(OutOfMemoryAbove(model, 0, times=1), 128, token_budget=64, share_prefixes=False,
                    plan=attention_plan(model))
    got = scorer.score(contexts, continuations)
    assert scorer.token_budget == 64  # halved to 32 by the first batch, doubled back after GROW_AFTER that fitted
    np.testing.assert_allclose(got[0], expected[0], rtol=0, atol=1e-5)
    assert (got[1] == expected[1]).all()


def test_a_continuation_with_no_input_position_to_predict_it_from_is_refused(tiny_llama):
    """Longer than the model's context, or after no context token: its first token would be read from a negative
    index, another request's or padding's position."""
    scorer = Scorer(AutoModelForCausalLM.from_pretrained(tiny_llama), 8)
    for contexts, continuations in (([[1, 2], [3, 4]], [[5], [6] * 9]), ([[1, 2], []], [[5], [6, 7]])):
        with pytest.raises(RequestDoesNotFit, match=r"^a continuation of \d tokens after \d context tokens cannot "
                                                    r"be scored: it must follow at least one context token and be "
                                                    r"at most the model's 8 tokens long$") as raised:
            scorer.score(contexts, continuations)
        assert raised.value.request == 1


def fewshot_requests(vocab: int, seed: int):
    """A few-shot shape three levels deep: two 'subjects' (each a 60-token head), questions below each head, and
    1-4 choices per question (some starting alike), as MMLU 5-shot's requests are."""
    rnd = random.Random(seed)
    contexts, continuations = [], []
    for _ in range(2):
        head = [rnd.randrange(vocab) for _ in range(60)]
        for _ in range(5):
            question = head + [rnd.randrange(vocab) for _ in range(rnd.randint(1, 12))]
            first = rnd.randrange(vocab)
            for _ in range(rnd.randint(1, 4)):
                contexts.append(question)
                continuations.append([first] + [rnd.randrange(vocab) for _ in range(rnd.randint(0, 3))])
    return contexts, continuations


@pytest.mark.parametrize("budget", [900, 48, 16])
def test_tree_over_a_cached_head_matches_reference_with_token_logprobs(tiny_llama, budget):
    """Rows over a cached head (budget 48: the head is cached, questions are rows over it; 16: the head in pieces
    and questions cached too) give every request's loglikelihood and per-token log-probs as scoring alone does."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    max_length = model.config.max_position_embeddings
    contexts, continuations = fewshot_requests(model.config.vocab_size, seed=budget)
    scorer = Scorer(model, max_length, token_budget=budget)
    loglik, greedy, per_token = scorer.score(contexts, continuations, token_logprobs=True)
    alone = Scorer(model, max_length, share_prefixes=False).score(contexts, continuations, token_logprobs=True)
    held = sum(len(c) + len(k) - 1 for c, k in zip(contexts, continuations))
    assert scorer.computed_tokens < held / 3
    for mine, theirs in zip(per_token, alone[2]):
        np.testing.assert_allclose(mine, theirs, rtol=0, atol=1e-5)
    assert (greedy == alone[1]).all()
    model64 = float64_copy(model)
    for i, (c, k) in enumerate(zip(contexts, continuations)):
        assert loglik[i] == pytest.approx(reference_score(model64, c, k, max_length)[0], rel=1e-6, abs=1e-5)


class TakesItsCacheUnderAnotherName(torch.nn.Module):
    """A model as a transformers release before raylm's floor forwards it: the KV cache under another argument
    name, so the `cache=` raylm passes lands in **kwargs, unread."""

    def __init__(self, model):
        super().__init__()
        self.model, self.config = model, model.config

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, cache=None, **kwargs):
        return self.model(input_ids=input_ids, **kwargs)


def test_a_model_that_does_not_extend_the_cache_it_is_given_is_refused(tiny_llama):
    """Rows over a cached few-shot head would otherwise run without their prefix; the pass that ignored the cache
    fails in one line instead."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    contexts, continuations = fewshot_requests(model.config.vocab_size, seed=48)
    max_length = model.config.max_position_embeddings
    Scorer(model, max_length, token_budget=48).score(contexts, continuations)
    with pytest.raises(CacheIgnored, match="did not extend the KV cache it was given"):
        Scorer(TakesItsCacheUnderAnotherName(model), max_length, token_budget=48,
               plan=attention_plan(model)).score(contexts, continuations)
