"""The PLL scorer against the one-copy-at-a-time float64 reference: random inputs, real rows, every MLM family's
head, both variants, token budgets and batch caps, out-of-memory halving."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from conftest import DATA
from reference_masked import reference_pll
from task_requests import build_task_requests
from transformers import (
    AlbertConfig,
    AlbertForMaskedLM,
    AutoModelForMaskedLM,
    AutoTokenizer,
    DebertaV2Config,
    DebertaV2ForMaskedLM,
    DistilBertConfig,
    DistilBertForMaskedLM,
    ElectraConfig,
    ElectraForMaskedLM,
    ModernBertConfig,
    ModernBertForMaskedLM,
    XLMRobertaConfig,
    XLMRobertaForMaskedLM,
)

import raylm.requests.masked
from raylm.config import EvalConfig
from raylm.models.context import masked_max_length
from raylm.models.spec import PLL_VARIANTS, ModelSpec
from raylm.requests.masked import UNSCORED, MaskedEncoder
from raylm.scoring.mlm import MaskedScorer

TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-5}


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Models this small run fastest on one thread, and the machine's cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module", params=["tiny_bert", "tiny_roberta"])
def masked(request):
    """(float32 model, float64 copy, tokenizer) of each tiny masked LM."""
    path = request.getfixturevalue(request.param)
    model = AutoModelForMaskedLM.from_pretrained(path).eval()
    return model, AutoModelForMaskedLM.from_pretrained(path).double().eval(), AutoTokenizer.from_pretrained(path)


def random_requests(tokenizer, n: int, seed: int) -> list[tuple[list[int], list[int], list[int], list[int]]]:
    """Random ids in random word groups; every fourth request has a SEP inside its continuation (visible, never
    scored) and every fifth an empty context (only CLS)."""
    rng = random.Random(seed)
    specials = set(tokenizer.all_special_ids)
    ordinary = [i for i in range(len(tokenizer)) if i not in specials]
    out = []
    for i in range(n):
        context = [tokenizer.cls_token_id] + ([] if i % 5 == 4 else rng.choices(ordinary, k=rng.randint(1, 30)))
        continuation = rng.choices(ordinary, k=rng.randint(1, 10))
        words, word = [], 0
        for _ in continuation:
            word += rng.random() < 0.5
            words.append(word)
        if i % 4 == 3:
            k = rng.randrange(len(continuation))
            continuation[k], words[k] = tokenizer.sep_token_id, UNSCORED
        out.append((context, continuation, [tokenizer.sep_token_id], words))
    return out


def check_against_reference(model, model64, tokenizer, requests, small_budget: int):
    """Both variants, float64 at a budget small enough to split a request's copies over batches, float32 at a
    large one that packs many requests per batch, and float32 with a cap on rows per batch."""
    columns = list(zip(*requests))
    for variant in PLL_VARIANTS:
        expected = [reference_pll(model64, *r, tokenizer.mask_token_id, variant) for r in requests]
        ref_ll = np.array([ll for ll, _ in expected])
        ref_greedy = np.array([g for _, g in expected])
        for m, batch_size, budget in ((model64, None, small_budget), (model, None, 8192), (model, 3, 8192)):
            scorer = MaskedScorer(m, tokenizer.mask_token_id, tokenizer.pad_token_id, variant, batch_size, budget)
            loglik, greedy = scorer.score(*columns)
            np.testing.assert_allclose(loglik, ref_ll, rtol=TOLERANCE[m.dtype], atol=0)
            assert (greedy == ref_greedy).all()


def test_matches_float64_reference_on_random_inputs(masked):
    model, model64, tokenizer = masked
    check_against_reference(model, model64, tokenizer, random_requests(tokenizer, 16, seed=len(tokenizer)), 40)


def test_matches_float64_reference_on_real_rows(masked):
    """HellaSwag, WinoGrande and (the first windows of) WikiText requests as the driver builds them."""
    model, model64, tokenizer = masked
    encoder = MaskedEncoder(tokenizer, masked_max_length(model.config, tokenizer))
    tables, _ = build_task_requests(EvalConfig(ModelSpec(tokenizer.name_or_path), ("hellaswag", "winogrande",
                                                                                   "wikitext"), DATA, limit=2),
                                    encoder)
    requests = []
    for name, (_, table) in tables.items():
        rows = list(zip(*(table[c].to_pylist() for c in ("context", "continuation", "following", "word_ids"))))
        requests += rows[:1] if name == "wikitext" else rows
    assert any(len(set(w)) < len(w) for _, _, _, w in requests), "no multi-token word: word-l2r untested"
    check_against_reference(model, model64, tokenizer, requests, 300)


def family_models():
    small = dict(vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32)
    ids = dict(pad_token_id=0, bos_token_id=2, eos_token_id=3, cls_token_id=2, sep_token_id=3)
    return {
        "xlm-roberta": lambda: XLMRobertaForMaskedLM(XLMRobertaConfig(**small, pad_token_id=1)),
        "distilbert": lambda: DistilBertForMaskedLM(DistilBertConfig(vocab_size=97, dim=16, n_layers=2, n_heads=2,
                                                                     hidden_dim=32)),
        "electra-generator": lambda: ElectraForMaskedLM(ElectraConfig(**small, embedding_size=8)),
        "deberta-v2": lambda: DebertaV2ForMaskedLM(DebertaV2Config(**small, legacy=False)),
        "deberta-v2-legacy": lambda: DebertaV2ForMaskedLM(DebertaV2Config(**small)),
        "modernbert": lambda: ModernBertForMaskedLM(ModernBertConfig(**small, **ids)),
        "albert": lambda: AlbertForMaskedLM(AlbertConfig(**small, embedding_size=8)),
    }


@pytest.mark.parametrize("family", list(family_models()))
def test_head_cut_is_exact_for_every_family(family):
    """Each family's head has its own shape; the cut at the encoder output must leave its numbers unchanged."""
    torch.manual_seed(0)
    model64 = family_models()[family]().double().eval()
    rng = random.Random(family)
    requests = []
    for _ in range(5):
        continuation = [rng.randrange(10, 97) for _ in range(rng.randint(1, 5))]
        requests.append(([2] + [rng.randrange(10, 97) for _ in range(rng.randint(0, 8))], continuation, [3],
                         sorted(rng.randrange(3) for _ in continuation)))
    for variant in PLL_VARIANTS:
        loglik, greedy = MaskedScorer(model64, 4, 0, variant, token_budget=30).score(*zip(*requests))
        expected = [reference_pll(model64, *r, 4, variant) for r in requests]
        np.testing.assert_allclose(loglik, [e for e, _ in expected], rtol=1e-9, atol=0)
        assert list(greedy) == [g for _, g in expected]


def test_greedy_is_every_scored_token_the_argmax(masked):
    _, model64, tokenizer = masked
    context, following = [tokenizer.cls_token_id, 100, 200, 300], [400, tokenizer.sep_token_id]
    ids = torch.tensor([context + [tokenizer.mask_token_id] + following])
    argmax = int(model64(input_ids=ids).logits[0, len(context)].argmax())
    scorer = MaskedScorer(model64, tokenizer.mask_token_id, tokenizer.pad_token_id)
    _, greedy = scorer.score([context] * 2, [[argmax], [argmax + 1]], [following] * 2, [[0], [0]])
    assert greedy.tolist() == [True, False]


def test_nothing_to_score_is_an_empty_sum(masked):
    model, _, tokenizer = masked
    scorer = MaskedScorer(model, tokenizer.mask_token_id, tokenizer.pad_token_id)
    loglik, greedy = scorer.score([[tokenizer.cls_token_id]], [[tokenizer.sep_token_id]], [[]], [[UNSCORED]])
    assert loglik.tolist() == [0.0] and greedy.tolist() == [True]


def test_out_of_memory_halves_the_token_budget_and_scores_every_copy_once(tiny_bert, monkeypatch):
    model = AutoModelForMaskedLM.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    requests = random_requests(tokenizer, 8, seed=3)
    scorer = MaskedScorer(model, tokenizer.mask_token_id, tokenizer.pad_token_id, token_budget=4096)
    expected, expected_greedy = scorer.score(*zip(*requests))
    forward = model.forward
    rows_seen = []

    def small_gpu(*args, **kwargs):
        rows_seen.append(kwargs["input_ids"].shape[0])
        if kwargs["input_ids"].numel() > 400:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
        return forward(*args, **kwargs)

    monkeypatch.setattr(model, "forward", small_gpu)
    loglik, greedy = scorer.score(*zip(*requests))
    assert scorer.token_budget <= 400 < 4096
    np.testing.assert_allclose(loglik, expected, rtol=1e-6)
    assert (greedy == expected_greedy).all()
    monkeypatch.setattr(model, "forward", lambda *a, **k: (_ for _ in ()).throw(torch.cuda.OutOfMemoryError("x")))
    with pytest.raises(torch.cuda.OutOfMemoryError):
        MaskedScorer(model, tokenizer.mask_token_id, tokenizer.pad_token_id, token_budget=1).score(*zip(*requests))


def test_batch_size_caps_the_masked_copies_per_forward(tiny_bert, monkeypatch):
    model = AutoModelForMaskedLM.from_pretrained(tiny_bert).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_bert)
    requests = random_requests(tokenizer, 6, seed=4)
    forward, rows = model.forward, []
    monkeypatch.setattr(model, "forward", lambda *a, **k: rows.append(k["input_ids"].shape[0]) or forward(*a, **k))
    MaskedScorer(model, tokenizer.mask_token_id, tokenizer.pad_token_id, batch_size=3).score(*zip(*requests))
    assert max(rows) == 3 and sum(rows) == sum(w != UNSCORED for _, _, _, words in requests for w in words)


def test_a_shard_for_the_other_kind_of_model_is_refused(tiny_bert):
    import pyarrow as pa

    from raylm.cluster.actors import score_shard

    model = AutoModelForMaskedLM.from_pretrained(tiny_bert).eval()
    causal_table = pa.table({"doc_id": [0], "req_idx": [0], "context": [[2, 5]], "continuation": [[6]]})
    with pytest.raises(ValueError, match="a shard of requests for a causal LM reached a masked-LM scorer"):
        score_shard(MaskedScorer(model, 4, 0), "multiple_choice", causal_table)


def test_requests_and_scorer_agree_on_the_unscored_mark():
    assert raylm.requests.masked.UNSCORED == UNSCORED
