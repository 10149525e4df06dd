"""Rows -> documents -> requests, against the exact (context, continuation) pairs lm-eval built, and bad rows."""

from __future__ import annotations

import json
import random

import pytest
from conftest import DATA, STORIES
from fixture_data import ORIGINAL, read_golden

from raylm.errors import InputError
from raylm.models.loading import load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.windows import strided_windows
from raylm.tasks import get_task, hellaswag, wikitext


@pytest.fixture(scope="module")
def golden():
    return read_golden(ORIGINAL)["samples"]


@pytest.mark.parametrize("task", ["hellaswag", "winogrande"])
def test_choice_arguments_equal_lm_eval(golden, task):
    docs = get_task(task).load_docs(DATA)
    samples = golden[f"{task}_local"]
    assert len(docs) == len(samples)
    for doc, sample in zip(docs, samples):
        assert [list(p) for p in zip(doc.contexts, doc.continuations)] == sample["arguments"]
    gold = [d.gold for d in docs]
    if task == "hellaswag":
        assert gold == [s["target"] for s in samples]


def test_wikitext_pages_equal_lm_eval(golden):
    docs = wikitext.load_docs(DATA)
    assert [d.text for d in docs] == [s["target"] for s in golden["wikitext_local"]]


def test_encoding_moves_trailing_space_and_splits_joint_encoding():
    encoder = Encoder(load_tokenizer(ModelSpec(str(STORIES))), 512)
    (context, continuation), = encoder.encode_pairs([("Once upon a time ", "there was")])
    whole = encoder.encode_many(["Once upon a time there was"])[0]
    assert context == encoder.encode_many(["Once upon a time"])[0]
    assert context + continuation == whole
    assert context[0] == 1  # the Llama tokenizer's own BOS, kept as lm-eval 0.4.13 keeps it


@pytest.mark.parametrize("model", ["stories", "tiny_gpt2"])
def test_encode_many_equals_lm_evals_tok_encode_with_and_without_the_prefix_text(model, request):
    """Both branches of Encoder.encode_many in one batch, against lm-eval's own HFLM.tok_encode: text that starts
    with the prefix token's text is encoded without special tokens (else a Llama tokenizer would put a second BOS
    in front), other text with the tokenizer's defaults."""
    from lm_eval.models.huggingface import HFLM

    path = STORIES if model == "stories" else request.getfixturevalue(model)
    lm = HFLM(pretrained=str(path), device="cpu", dtype="float32", batch_size=1)
    encoder = Encoder(lm.tokenizer, 128)
    prefix = lm.tokenizer.decode(encoder.prefix_token)
    texts = ["Once upon a time", prefix + "Once upon a time", " a leading space", prefix + prefix + "twice",
             prefix + " spaced", "x" + prefix]
    assert sum(t.startswith(prefix) for t in texts) == 3
    assert encoder.encode_many(texts) == [lm.tok_encode(t) for t in texts]
    if model == "stories":  # the branch matters: the tokenizer's default would add its BOS before the text's own
        assert lm.tokenizer(prefix + "Once upon a time")["input_ids"][:2] == [encoder.prefix_token] * 2
        assert encoder.encode_many([prefix + "Once upon a time"])[0][:2] != [encoder.prefix_token] * 2


def test_empty_context_is_conditioned_on_prefix_token():
    encoder = Encoder(load_tokenizer(ModelSpec(str(STORIES))), 512)
    (context, continuation), = encoder.encode_pairs([("", "Once upon a time")])
    assert context == [encoder.prefix_token] and continuation[0] != encoder.prefix_token


@pytest.mark.parametrize("max_length", [1, 2, 7, 16])
def test_rolling_windows_score_every_token_once_within_max_length(max_length):
    rnd = random.Random(max_length)
    for n in [1, max_length - 1, max_length, max_length + 1, 3 * max_length + 2, rnd.randint(1, 100)]:
        if n < 1:
            continue
        tokens = list(range(100, 100 + n))
        windows = strided_windows(tokens, 0, max_length, max_length)
        assert [t for _, cont in windows for t in cont] == tokens
        for context, continuation in windows:
            assert len(context) + len(continuation) - 1 <= max_length
            assert context
        # Every window but the first conditions on the tokens right before it.
        for (context, continuation), (_, previous) in zip(windows[1:], windows):
            assert context[-1] == previous[-1]


def write_rows(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in rows))


GOOD_HS = {"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": 1}
GOOD_WG = {"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "1"}


@pytest.mark.parametrize("task,rows,row,field", [
    ("hellaswag", [GOOD_HS, {k: v for k, v in GOOD_HS.items() if k != "endings"}], 2, "endings"),
    ("hellaswag", [GOOD_HS, {**GOOD_HS, "label": 7}], 2, "label"),
    ("hellaswag", [{**GOOD_HS, "label": "x"}], 1, "label"),
    ("hellaswag", [{**GOOD_HS, "endings": []}], 1, "endings"),
    ("hellaswag", [{**GOOD_HS, "endings": ["a", ""]}], 1, "endings"),
    ("hellaswag", [GOOD_HS, "{not json\n"], 2, None),
    ("winogrande", [GOOD_WG, {**GOOD_WG, "sentence": "no blank"}], 2, "sentence"),
    ("winogrande", [{**GOOD_WG, "answer": "3"}], 1, "answer"),
])
def test_bad_rows_name_file_row_and_field(tmp_path, task, rows, row, field):
    name = {"hellaswag": "hellaswag/validation.jsonl", "winogrande": "winogrande/dev.jsonl"}[task]
    write_rows(tmp_path / name, rows)
    with pytest.raises(InputError) as err:
        get_task(task).load_docs(tmp_path)
    message = str(err.value)
    assert name in message and f"row {row}" in message
    if field:
        assert f"'{field}'" in message
    assert "\n" not in message


def test_missing_and_empty_files(tmp_path):
    with pytest.raises(InputError, match="hellaswag/validation.jsonl: data file not found"):
        hellaswag.load_docs(tmp_path)
    write_rows(tmp_path / "hellaswag" / "validation.jsonl", ["\n"])
    with pytest.raises(InputError, match="data file is empty"):
        hellaswag.load_docs(tmp_path)


def test_non_utf8_text_names_the_line(tmp_path):
    (tmp_path / "wikitext-2").mkdir()
    (tmp_path / "wikitext-2" / "test.txt").write_bytes(b" = A = \n fine \n bad \xff\xfe \n")
    with pytest.raises(InputError, match=r"test.txt: row 3: not valid UTF-8"):
        wikitext.load_docs(tmp_path)


def test_a_task_with_no_documents_is_one_line_not_a_division_by_zero(monkeypatch):
    """A hub split can be empty (local files are refused earlier, as empty data files); metrics would divide by 0."""
    from dataclasses import replace

    import raylm.tasks
    from raylm.errors import RaylmError
    from raylm.tasks.native import load_task_docs

    monkeypatch.setitem(raylm.tasks.TASKS, "hellaswag", replace(hellaswag.TASK, load_docs=lambda data_dir: []))
    with pytest.raises(RaylmError, match=r"^hellaswag: no documents to evaluate \(the hub gave none\)$"):
        load_task_docs(("hellaswag",), None)
