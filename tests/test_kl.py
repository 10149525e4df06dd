"""KLScorer against a float64 one-request-at-a-time reference; the logits budget (long windows in pieces over the
KV caches, in every attention family); the shared-tokenizer check; models that share a tokenizer but not a logits
width; the out-of-memory fallback."""

from __future__ import annotations

import copy
import json

import numpy as np
import pyarrow as pa
import pytest
import torch
import tiny_families as fam
from conftest import GPT2_TOKENIZER, STORIES
from reference import float64_copy
from reference_corpus import reference_kl
from transformers import AutoModelForCausalLM, AutoTokenizer

from raylm.corpus.doc_scoring import DocKL
from raylm.corpus.run import CorpusConfig, check_same_tokenizer, resolve_lengths
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec
from raylm.scoring.kl import LOGITS_SHARE, KLScorer, KLScores

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


def assert_reference(scores: KLScores, p, q, contexts: list[list[int]], continuations: list[list[int]]) -> None:
    p64, q64 = float64_copy(p), float64_copy(q)
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        kl, nll_p, nll_q, disagree = reference_kl(p64, q64, context, continuation, MAX_LENGTH)
        assert scores.kl[i] == pytest.approx(kl, rel=1e-4, abs=1e-7)
        assert scores.nll_p[i] == pytest.approx(nll_p, rel=1e-6)
        assert scores.nll_q[i] == pytest.approx(nll_q, rel=1e-6)
        assert scores.disagree[i] == disagree


def test_kl_matches_float64_reference_across_batches(models):
    p, q = models
    contexts, continuations = requests(10)
    # A small token budget splits the requests over several padded batches.
    scores = KLScorer(p, q, MAX_LENGTH, token_budget=300).score(contexts, continuations)
    assert_reference(scores, p, q, contexts, continuations)
    assert np.all(scores.kl > 0) and scores.disagree.sum() > 0


POSITIONS = 16  # what the small logits budget holds


def small_budget(model) -> int:
    """A logits budget of POSITIONS predicted positions for a float32 model."""
    return POSITIONS * model.config.vocab_size * 4 * LOGITS_SHARE


def with_long_rows(contexts: list[list[int]], continuations: list[list[int]]):
    """Besides short requests, a rolling window's row (one token of context, 120 predicted) and a strided one (a
    context of 60, 68 predicted): several times what the small budget holds."""
    rng = np.random.default_rng(5)
    return ([*contexts, [1], rng.integers(3, 512, 60).tolist()],
            [*continuations, rng.integers(3, 512, 120).tolist(), rng.integers(3, 512, 68).tolist()])


def test_a_window_longer_than_the_logits_budget_runs_in_pieces_equal_to_one_pass(models):
    """No LM head ever computes more positions than the budget holds; KL, NLLs and disagreements are those of the
    unbudgeted pass and of the float64 reference."""
    p, q = models
    contexts, continuations = with_long_rows(*requests(3))
    seen: list[int] = []
    hooks = [m.get_output_embeddings().register_forward_hook(lambda _m, _a, out: seen.append(out.shape[1]))
             for m in (p, q)]
    try:
        small = KLScorer(p, q, MAX_LENGTH, logits_budget=small_budget(p))
        got = small.score(contexts, continuations)
    finally:
        for hook in hooks:
            hook.remove()
    assert small.max_predicted == POSITIONS and max(seen) <= POSITIONS
    assert len(seen) >= 2 * (120 + 68) // POSITIONS  # the long rows really ran in pieces, in both models
    whole = KLScorer(p, q, MAX_LENGTH).score(contexts, continuations)
    np.testing.assert_allclose(got.kl, whole.kl, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got.nll_p, whole.nll_p, rtol=1e-6)
    np.testing.assert_allclose(got.nll_q, whole.nll_q, rtol=1e-6)
    assert np.array_equal(got.disagree, whole.disagree)
    long_rows = slice(-2, None)  # the short ones ran whole: the test above holds them to the reference
    pieces = KLScores(*(values[long_rows] for values in (got.kl, got.nll_p, got.nll_q, got.disagree)))
    assert_reference(pieces, p, q, contexts[long_rows], continuations[long_rows])


@pytest.mark.parametrize("family", ["mistral", "gemma2", "bloom"])
def test_pieces_over_the_caches_equal_one_pass_in_every_kind_of_attention(family):
    """Sliding windows (Mistral; Gemma-2 mixing window and full layers, with softcapping in its head) and ALiBi
    (BLOOM), besides the rotary Llama above: each piece continues from the cache exactly as the whole row would
    have run."""
    torch.manual_seed(0)
    p = AutoModelForCausalLM.from_config(fam.FAMILIES[family]()).eval()
    torch.manual_seed(1)
    q = AutoModelForCausalLM.from_config(fam.FAMILIES[family]()).eval()
    contexts, continuations = with_long_rows(*requests(2))
    got = KLScorer(p, q, fam.CONTEXT, logits_budget=small_budget(p)).score(contexts, continuations)
    whole = KLScorer(p, q, fam.CONTEXT).score(contexts, continuations)
    np.testing.assert_allclose(got.kl, whole.kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.nll_p, whole.nll_p, rtol=1e-5)
    np.testing.assert_allclose(got.nll_q, whole.nll_q, rtol=1e-5)


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


@pytest.fixture(scope="module")
def padded_twin(tiny_llama, tmp_path_factory):
    """tiny_llama with its embedding and LM head padded from 512 to 576 rows, as Pythia's larger sizes pad theirs:
    the same model on every tokenizer id, 64 more ids no text is encoded to."""
    model = AutoModelForCausalLM.from_pretrained(tiny_llama)
    model.resize_token_embeddings(576, mean_resizing=False)
    path = tmp_path_factory.mktemp("padded-twin")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path


def test_models_of_different_logits_widths_compare_over_the_shared_ids(tiny_llama, padded_twin):
    """Over the tokenizer's 512 ids, renormalised there, the padded twin is the same distribution: KL 0, the same
    NLLs. Over all ids the comparison is refused rather than broadcast."""
    p = AutoModelForCausalLM.from_pretrained(tiny_llama).eval()
    q = AutoModelForCausalLM.from_pretrained(padded_twin).eval()
    contexts, continuations = requests(6)
    scores = KLScorer(p, q, MAX_LENGTH, width=512).score(contexts, continuations)
    np.testing.assert_allclose(scores.kl, 0, atol=1e-5)
    np.testing.assert_allclose(scores.nll_q, scores.nll_p, rtol=1e-6)
    assert np.all(scores.disagree == 0)
    with pytest.raises(RaylmError, match="logits are 512 and 576 ids wide"):
        KLScorer(p, q, MAX_LENGTH).score(contexts, continuations)


def no_weights_copy(source, tmp_path, vocab_size: int):
    """A model directory with `source`'s config at another logits width and tokenizer, and weights that cannot
    load: anything that reads them fails."""
    path = tmp_path / f"vocab-{vocab_size}"
    path.mkdir()
    config = json.loads((source / "config.json").read_text())
    (path / "config.json").write_text(json.dumps({**config, "vocab_size": vocab_size}))
    (path / "model.safetensors").write_bytes(b"not weights")
    AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path


def test_kl_width_is_decided_from_the_configs_before_any_weights_load(tiny_llama, tmp_path):
    spec_p = ModelSpec(str(tiny_llama))
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("Once upon a time there was a cat.\n")
    wider = CorpusConfig(spec_p, str(corpus), model_b=ModelSpec(str(no_weights_copy(tiny_llama, tmp_path, 576))))
    assert resolve_lengths(wider)[3] == 512
    same = CorpusConfig(spec_p, str(corpus), model_b=spec_p)
    assert resolve_lengths(same)[3] is None
    narrower = CorpusConfig(spec_p, str(corpus), model_b=ModelSpec(str(no_weights_copy(tiny_llama, tmp_path, 500))))
    with pytest.raises(RaylmError, match=r"vocab-500' scores 500 ids, fewer than the 512 of the tokenizer both "
                                         r"models share \('.*tiny-llama.*' scores 512\)"):
        resolve_lengths(narrower)


def test_the_corpus_kl_actor_compares_padded_twins_over_the_tokenizer_ids(tiny_llama, padded_twin):
    """DocKL, the code `raylm kl` actors run, in-process: the width the driver decided reaches the scorer."""
    texts = ["Once upon a time there was a little cat. " * 8, "The sun was hot and the dog was happy."]
    spec_p, spec_q = ModelSpec(str(tiny_llama), "float32", "cpu"), ModelSpec(str(padded_twin), "float32", "cpu")
    out = DocKL(spec_p, spec_q, MAX_LENGTH, MAX_LENGTH, 0, 512)(pa.table({"text": texts, "path": ["mem"] * 2}))
    np.testing.assert_allclose(out["kl"].to_numpy(), 0, atol=1e-5)
    assert out["nll_q"].to_pylist() == pytest.approx(out["nll_p"].to_pylist(), rel=1e-6)


class OutOfMemoryAbove(torch.nn.Module):
    """Raises CUDA's out-of-memory error for any batch of more than `limit` tokens, like a small GPU would."""

    def __init__(self, model, limit: int):
        super().__init__()
        self.model, self.limit = model, limit

    def get_input_embeddings(self):
        return self.model.get_input_embeddings()

    def get_output_embeddings(self):
        return self.model.get_output_embeddings()

    def forward(self, input_ids, **kwargs):
        if input_ids.numel() > self.limit:
            raise torch.cuda.OutOfMemoryError("fake: out of memory")
        return self.model(input_ids=input_ids, **kwargs)


def test_out_of_memory_halves_the_kl_budget_and_loses_nothing(models):
    p, q = models
    contexts, continuations = requests(10)
    expected = KLScorer(p, q, MAX_LENGTH, token_budget=2048).score(contexts, continuations)
    scorer = KLScorer(OutOfMemoryAbove(p, 400), q, MAX_LENGTH, token_budget=2048)
    got = scorer.score(contexts, continuations)
    assert scorer.token_budget == 256
    np.testing.assert_allclose(got.kl, expected.kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.nll_p, expected.nll_p, rtol=1e-6)
    with pytest.raises(torch.cuda.OutOfMemoryError):
        KLScorer(OutOfMemoryAbove(p, 10), q, MAX_LENGTH).score([[1] * 20], [[5, 6]])
