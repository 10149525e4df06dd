"""A tokenizer that appends EOS to every encoding: lm-eval's continuation slice then drops a real token and scores
EOS instead. raylm refuses such a tokenizer in one line; splits lm-eval defines are kept."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from conftest import STORIES
from lm_eval.api.model import TemplateLM
from transformers import AutoTokenizer

from raylm.errors import RaylmError
from raylm.requests.encoding import Encoder

PAIR = ("The cat sat on the", " mat")


@pytest.fixture(scope="module")
def eos_tokenizer():
    tokenizer = AutoTokenizer.from_pretrained(STORIES, add_eos_token=True)
    assert tokenizer("a mat")["input_ids"][-1] == tokenizer.eos_token_id
    return tokenizer


def test_lm_eval_scores_eos_in_place_of_the_first_continuation_token(eos_tokenizer):
    """What raylm refuses to copy: lm-eval 0.4.13's own _encode_pair on this tokenizer."""
    lm = SimpleNamespace(backend="causal", tok_encode=lambda s: eos_tokenizer(s)["input_ids"])
    context, continuation = TemplateLM._encode_pair(lm, *PAIR)
    mat = eos_tokenizer(" mat", add_special_tokens=False)["input_ids"]
    assert context[-1] == eos_tokenizer.eos_token_id
    assert continuation == mat[1:] + [eos_tokenizer.eos_token_id]  # " mat"'s first token lost, EOS scored


def test_raylm_refuses_a_tokenizer_that_appends_eos(eos_tokenizer):
    with pytest.raises(RaylmError, match=r"appends '</s>' to every encoding.*lose its first token") as raised:
        Encoder(eos_tokenizer, 128).encode_pairs([PAIR])
    assert "\n" not in str(raised.value)


def test_a_token_merging_across_the_boundary_keeps_lm_evals_split():
    """Not every mismatch is an appended EOS: 'Hel' + 'lo' merges, and lm-eval's tail of the joint encoding stands."""
    tokenizer = AutoTokenizer.from_pretrained(STORIES)
    (context, continuation), = Encoder(tokenizer, 128).encode_pairs([("Hel", "lo")])
    whole = tokenizer("Hello")["input_ids"]
    assert whole[:len(context)] != context and continuation == whole[len(context):]
