"""Masked-LM requests: the joint encoding split as lm-eval splits it, word ids, unscored specials, truncation,
corpus windows that score each token once, and the model's real maximum length (RoBERTa's 514 for 512)."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import DATA
from transformers import AutoConfig, AutoModelForMaskedLM, AutoTokenizer

from raylm.models.context import masked_max_length
from raylm.requests.masked import UNSCORED, MaskedEncoder


@pytest.fixture(scope="module", params=["tiny_bert", "tiny_roberta"])
def encoder(request) -> MaskedEncoder:
    path = request.getfixturevalue(request.param)
    tokenizer = AutoTokenizer.from_pretrained(path)
    return MaskedEncoder(tokenizer, masked_max_length(AutoConfig.from_pretrained(path), tokenizer))


def pairs(tokenizer) -> list[tuple[str, str]]:
    """Ordinary text, a trailing context space, no context, and the tokenizer's separator written in the text."""
    sep = tokenizer.sep_token
    return [("The nurse said", " she was unbelievably tired."), ("A man sits on a roof. He ", "starts pulling."),
            ("", "Whole text, no context."), (f"Mixed {sep} in", f" the {sep} continuation")]


def test_continuation_is_the_tail_of_one_joint_encoding(encoder):
    tok = encoder.tokenizer
    requests = encoder.encode_pairs(pairs(tok))
    for (context, continuation), request in zip(pairs(tok), requests):
        stripped = context.rstrip()
        whole = tok(stripped + context[len(stripped):] + continuation)
        assert list(request.context + request.continuation + request.following) == whole["input_ids"]
        assert list(request.context) == list(encoder.opening) + tok(stripped, add_special_tokens=False)["input_ids"]
        assert request.following == encoder.closing
        words = whole.word_ids()[len(request.context):len(request.context) + len(request.continuation)]
        special = {tok.cls_token_id, tok.sep_token_id, tok.pad_token_id}
        assert list(request.word_ids) == [UNSCORED if t in special else w
                                          for t, w in zip(request.continuation, words)]
    assert requests[3].word_ids.count(UNSCORED) == 1 and UNSCORED not in requests[0].word_ids


def test_trailing_context_space_moves_into_the_continuation(encoder):
    moved, plain = encoder.encode_pairs([("A man sits on a roof. He ", "starts"), ("A man sits on a roof. He",
                                                                                 " starts")])
    assert moved == plain


def test_long_context_is_cut_from_the_left_after_the_opening_tokens(encoder):
    long_context = " ".join(["word"] * (encoder.max_length * 2))
    (request,) = encoder.encode_pairs([(long_context, " and the end.")])
    assert request.length == encoder.max_length and request.dropped > 0
    assert request.context[:encoder.n_opening] == encoder.opening
    (whole,) = encoder.encode_pairs([("word word", " and the end.")])
    assert request.continuation == whole.continuation
    assert [w - request.word_ids[0] for w in request.word_ids] == [w - whole.word_ids[0] for w in whole.word_ids]


def wikitext_text(n_lines: int) -> str:
    lines = [line for line in (DATA / "wikitext-2" / "test.txt").read_text(encoding="utf-8").splitlines()
             if line.strip()]
    return " ".join(lines[:n_lines])


@pytest.mark.parametrize("max_length,stride", [(None, None), (24, None), (24, 5), (24, 1)])
def test_document_windows_score_every_token_exactly_once(encoder, max_length, stride):
    if max_length is not None:
        encoder = MaskedEncoder(encoder.tokenizer, max_length)
    texts = [wikitext_text(12), "Short.", "", wikitext_text(1)]
    encoded = encoder.tokenizer(texts, add_special_tokens=False)
    for i, windows in enumerate(encoder.document_windows(texts, stride)):
        body, word_ids = encoded["input_ids"][i], encoded.word_ids(i)
        assert [t for w in windows for t in w.continuation] == body
        for w in windows:
            assert w.length <= encoder.max_length
            assert w.context[:encoder.n_opening] == encoder.opening and w.following[-encoder.n_closing:] == \
                encoder.closing
            assert len(w.continuation) <= (stride or encoder.room) or len(set(w.word_ids)) == 1
            # Windows read both ways: context on the left and on the right, from the document itself.
            inner = list(w.context[encoder.n_opening:]) + list(w.continuation) + \
                list(w.following[:len(w.following) - encoder.n_closing])
            assert any(body[j:j + len(inner)] == inner for j in range(len(body) - len(inner) + 1))
        ends = [sum(len(w.continuation) for w in windows[:k + 1]) for k in range(len(windows) - 1)]
        assert all(word_ids[e] != word_ids[e - 1] for e in ends), "a span ends inside a word"
        if stride is None and 0 < len(body) <= encoder.room:
            assert len(windows) == 1 and windows[0].context == encoder.opening
    with pytest.raises(ValueError, match="stride"):
        encoder.document_windows(texts, encoder.room + 1)


def test_roberta_max_length_is_its_positions_less_the_padding_offset(tiny_roberta):
    """RoBERTa numbers positions from pad_token_id + 1: 98 position embeddings take 96 tokens, and 97 index past
    the table. With no tokenizer limit to go by, the config's count must be corrected."""
    config, tokenizer = AutoConfig.from_pretrained(tiny_roberta), AutoTokenizer.from_pretrained(tiny_roberta)
    assert config.max_position_embeddings == 98 and tokenizer.model_max_length == 96
    tokenizer.model_max_length = int(1e30)
    assert masked_max_length(config, tokenizer) == 96
    tokenizer.model_max_length = 50
    assert masked_max_length(config, tokenizer) == 50
    model = AutoModelForMaskedLM.from_pretrained(tiny_roberta)
    model(input_ids=torch.full((1, 96), 10))
    with pytest.raises((IndexError, RuntimeError), match="out of"):
        model(input_ids=torch.full((1, 97), 10))


def test_encoder_refuses_a_tokenizer_without_a_mask_token(tiny_gpt2):
    with pytest.raises(ValueError, match="no mask token"):
        MaskedEncoder(AutoTokenizer.from_pretrained(tiny_gpt2), 128)


def test_random_texts_keep_their_tokens(encoder):
    """Whatever the text, context + continuation + following is the text's own encoding, scored tokens only
    where the continuation is."""
    rng = random.Random(5)
    words = wikitext_text(3).split()
    texts = [(" ".join(rng.choices(words, k=rng.randint(0, 12))), " " + " ".join(rng.choices(words, k=6)))
             for _ in range(30)]
    for (context, continuation), request in zip(texts, encoder.encode_pairs(texts)):
        assert list(request.context + request.continuation + request.following) == \
            encoder.tokenizer(context + continuation)["input_ids"]
        assert len(request.word_ids) == len(request.continuation) > 0
