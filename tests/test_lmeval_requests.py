"""lm-eval's (context, continuation) requests as raylm tokenises them: lm-eval's own empty-context rule, exactly,
and the one-line refusals and warnings its request tables give per task."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
from conftest import GPT2_TOKENIZER, STORIES
from transformers import AutoTokenizer

from raylm.errors import RaylmError
from raylm.models.loading import load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.lmeval import request_tables
from raylm.requests.table import build_requests
from raylm.tasks import ChoiceDoc, Task
from raylm.tasks.lmeval.build import Request

# "" alone takes lm-eval's empty-context path; whitespace-only contexts go through _encode_pair.
PAIRS = [("", " Once"), ("  ", "Once upon"), ("\n", " upon a time"), (" \t ", "x"), ("Once upon", " a time"),
         ("Once upon ", "a time")]


@pytest.mark.parametrize("model", ["stories", "tiny_gpt2"])
def test_contexts_empty_or_of_whitespace_are_encoded_as_lm_evals_loglikelihood_encodes_them(model, request):
    """What lm-eval 0.4.13's HFLM.loglikelihood hands _loglikelihood_tokens, against raylm's Encoder: a Llama
    tokenizer encodes a whitespace context to BOS, GPT-2's to nothing (a request lm-eval then fails on); only ""
    is conditioned on the prefix token."""
    from lm_eval.models.huggingface import HFLM

    path = STORIES if model == "stories" else request.getfixturevalue(model)
    lm = HFLM(pretrained=str(path), device="cpu", dtype="float32", batch_size=1)
    lm._loglikelihood_tokens = lambda requests, disable_tqdm=False: requests
    theirs = [(context, continuation) for _, context, continuation in
              lm.loglikelihood([SimpleNamespace(args=pair) for pair in PAIRS], disable_tqdm=True)]
    assert Encoder(lm.tokenizer, 128).encode_pairs(PAIRS) == theirs
    prefix = lm.prefix_token_id
    assert theirs[0][0] == [prefix]
    assert all(context == ([] if model == "tiny_gpt2" else [prefix]) for context, _ in theirs[1:4])


def fake_built(requests: dict[str, list[Request]]) -> SimpleNamespace:
    """What request_tables reads of lm-eval's built tasks: each task's config, version and output type, and its
    requests."""
    tasks = {name: SimpleNamespace(VERSION=1.0, dump_config=lambda name=name: {"task": name}) for name in requests}
    return SimpleNamespace(tasks={"tasks": tasks}, requests=requests.__getitem__,
                           output_type=lambda name: requests[name][0].request_type)


def test_a_context_encoded_to_no_token_is_refused_in_one_line_naming_the_request(tiny_gpt2):
    encoder = Encoder(load_tokenizer(ModelSpec(str(tiny_gpt2))), 128)
    built = fake_built({"blanks": [Request("blanks", 0, 0, "loglikelihood", ("Question:", " yes")),
                                   Request("blanks", 3, 1, "loglikelihood", ("  ", "yes"))]})
    with pytest.raises(RaylmError) as raised:
        request_tables(built, encoder)
    assert str(raised.value) == ("blanks: 1 context(s) of only whitespace encode to no tokens, which lm-eval cannot "
                                 "score either (HFLM asserts a non-empty context): doc 3 request 1")


def test_left_truncated_lm_eval_requests_are_counted_per_task_in_one_warning(caplog):
    """As native tasks warn, once per task (HFLM warns once per request), so a 25-shot prompt that loses its head
    to a short context says so."""
    encoder = Encoder(load_tokenizer(ModelSpec(str(STORIES))), 16)
    long = "Once upon a time there was a little girl who liked to play in the park with her dog."
    built = fake_built({
        "long_prompts": [Request("long_prompts", d, i, "loglikelihood", (long if d < 2 else "Hi", " there"))
                         for d in range(3) for i in range(2)],
        "short_prompts": [Request("short_prompts", 0, 0, "loglikelihood", ("Hi", " there"))],
        "rolling": [Request("rolling", 0, 0, "loglikelihood_rolling", (long * 3,))],
    })
    with caplog.at_level(logging.WARNING):
        tables = request_tables(built, encoder)
    assert tables["long_prompts"].num_rows == 6
    warned = [r.getMessage() for r in caplog.records if "left-truncated" in r.getMessage()]
    assert warned == ["long_prompts: 4 requests exceed the model's max length 16; their contexts are left-truncated"]


def test_native_and_lm_eval_tables_refuse_unscorable_requests_by_one_rule_in_one_line_naming_each():
    """A native task's requests go through the same rule and message as lm-eval's: every unscorable request of
    the task named in one line, not the first alone."""
    encoder = Encoder(AutoTokenizer.from_pretrained(GPT2_TOKENIZER), 8)
    pairs = [("Question:", "yes"), ("Question:", "a rather long answer of many more than eight tokens"),
             ("  ", "yes")]
    docs = [ChoiceDoc.plain(i, (q,), (a,), 0, (len(a),), str(i)) for i, (q, a) in enumerate(pairs)]
    task = Task("t", "multiple_choice", lambda _: docs)
    long = len(encoder.encode_pairs([(pairs[1][0], " " + pairs[1][1])])[0][1])
    expected = (f"t: 1 continuation(s) longer than the model's 8-token context, which lm-eval cannot score either: "
                f"doc 1 request 0 ({long} tokens); t: 1 context(s) of only whitespace encode to no tokens, which "
                "lm-eval cannot score either (HFLM asserts a non-empty context): doc 2 request 0")
    with pytest.raises(RaylmError) as native:
        build_requests(task, docs, encoder)
    built = fake_built({"t": [Request("t", i, 0, "loglikelihood", (q, " " + a)) for i, (q, a) in enumerate(pairs)]})
    with pytest.raises(RaylmError) as lmeval:
        request_tables(built, encoder)
    assert str(native.value) == str(lmeval.value) == expected


def test_repeated_texts_are_encoded_once_and_each_pair_as_it_would_be_alone():
    """A multiple-choice question's choices repeat its context: the tokenizer sees each distinct text once, and
    every pair still gets the ids (and lists of its own) that encoding it alone gives."""
    tokenizer = AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    seen: list[str] = []

    def recording(texts, **kwargs):
        seen.extend(texts)
        return tokenizer(texts, **kwargs)

    encoder = Encoder(tokenizer, 128)
    pairs = [(f"Question {q}: what?\nAnswer:", f" {choice}") for q in range(2) for choice in "ABCD"]
    alone = [encoder.encode_pairs([pair])[0] for pair in pairs]
    encoder.tokenizer = recording
    together = encoder.encode_pairs(pairs)
    assert together == alone
    assert sorted(seen) == sorted({c + k for c, k in pairs} | {c for c, _ in pairs})
    together[0][0].append(-1)
    assert together[1][0] == alone[1][0]
