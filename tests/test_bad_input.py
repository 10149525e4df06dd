"""Every kind of bad input, through `raylm eval` in-process: one line naming what is wrong, exit 2, no results."""

from __future__ import annotations

import json
import logging
import shutil

import pytest
from conftest import GPT2_TOKENIZER

from raylm.cli import main
from raylm.cluster.checkpoint import CHECKPOINT_DIR, MANIFEST
from raylm.storage.lock import LOCK_FILE

HS = {"activity_label": "A", "ctx_a": "b", "ctx_b": "c", "endings": ["x", "y"], "label": 1}
WG = {"sentence": "a _ b", "option1": "x", "option2": "y", "answer": "1"}
HS_FILE, WG_FILE, WT_FILE = "hellaswag/validation.jsonl", "winogrande/dev.jsonl", "wikitext-2/test.txt"
OTHER_RUN_MANIFEST = f"out/{CHECKPOINT_DIR}/{MANIFEST}"
OTHER_RUN = {"limit": 9, "code": {"raylm": "0.1.0"}}  # a raylm manifest (it names raylm's version) of another run

# Data errors stop a run before Ray is touched; model, tokenizer and checkpoint errors surface once the driver has
# tokenised, by which time evaluate() has connected to Ray (it starts actors while tokenising). In-process, that
# must be the test session's small Ray, not one the product would start.
pytestmark = pytest.mark.usefixtures("ray_session")


def write(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text("".join(r if isinstance(r, str) else json.dumps(r) + "\n" for r in content))
    return path


@pytest.fixture(scope="module")
def no_weights_model(tiny_llama, tmp_path_factory):
    path = tmp_path_factory.mktemp("no-weights")
    shutil.copy(tiny_llama / "config.json", path)
    return path


@pytest.fixture(scope="module")
def no_bos_eos_model(tiny_llama, tmp_path_factory):
    from transformers import AutoTokenizer

    path = tmp_path_factory.mktemp("no-bos-eos") / "model"
    shutil.copytree(tiny_llama, path)
    tokenizer = AutoTokenizer.from_pretrained(GPT2_TOKENIZER)
    tokenizer.bos_token = tokenizer.eos_token = None
    tokenizer.save_pretrained(path)
    return path


# case -> (task, files to write {relative path: rows or bytes}, extra CLI args, expected text in the error)
CASES = {
    "unknown task": ("hellaswag,nope", {HS_FILE: [HS]}, [], "unknown task 'nope'"),
    "missing data file": ("hellaswag", {}, [], f"{HS_FILE}: data file not found"),
    "empty data file": ("hellaswag", {HS_FILE: ["\n"]}, [], f"{HS_FILE}: data file is empty"),
    "malformed JSON line": ("hellaswag", {HS_FILE: [HS, "{oops\n"]}, [], f"{HS_FILE}: row 2: malformed JSON"),
    "row missing a field": ("hellaswag", {HS_FILE: [{k: v for k, v in HS.items() if k != "ctx_b"}]}, [],
                            f"{HS_FILE}: row 1: field 'ctx_b': missing field"),
    "label out of range": ("hellaswag", {HS_FILE: [HS, {**HS, "label": 2}]}, [],
                           f"{HS_FILE}: row 2: field 'label': label 2 is out of range for 2 endings"),
    "label not an integer": ("hellaswag", {HS_FILE: [{**HS, "label": 1.5}]}, [],
                             f"{HS_FILE}: row 1: field 'label': expected int or str, got float"),
    "label text not an integer": ("hellaswag", {HS_FILE: [{**HS, "label": "one"}]}, [],
                                  f"{HS_FILE}: row 1: field 'label': label must be an integer"),
    "empty ending list": ("hellaswag", {HS_FILE: [{**HS, "endings": []}]}, [],
                          f"{HS_FILE}: row 1: field 'endings': empty list of endings"),
    "empty ending": ("hellaswag", {HS_FILE: [{**HS, "endings": ["x", " "]}]}, [],
                     f"{HS_FILE}: row 1: field 'endings': every ending must be a non-empty string"),
    "winogrande sentence without blank": ("winogrande", {WG_FILE: [WG, {**WG, "sentence": "no blank"}]}, [],
                                          f"{WG_FILE}: row 2: field 'sentence': sentence has no blank"),
    "non-UTF-8 text": ("wikitext", {WT_FILE: b" = A = \n fine \n bad \xff \n"}, [],
                       f"{WT_FILE}: row 3: not valid UTF-8"),
    "limit 0": ("hellaswag", {HS_FILE: [HS]}, ["--limit", "0"], "--limit must be a number of documents"),
    "negative limit": ("hellaswag", {HS_FILE: [HS]}, ["--limit", "-2"], "--limit must be a number of documents"),
    "limit not whole": ("hellaswag", {HS_FILE: [HS]}, ["--limit", "2.5"], "or a fraction of them below 1"),
    "negative num-fewshot": ("hellaswag", {HS_FILE: [HS]}, ["--num-fewshot", "-1"], "--num-fewshot must be 0 or more"),
    "num-fewshot larger than pool": ("winogrande", {WG_FILE: [WG], "winogrande/train_xs.jsonl": [WG, WG]},
                                     ["--num-fewshot", "3"],
                                     "--num-fewshot 3 needs a few-shot pool of at least 4 examples"),
    "actors 0": ("hellaswag", {HS_FILE: [HS]}, ["--actors", "0"], "--actors must be at least 1"),
    "model dir missing": ("hellaswag", {HS_FILE: [HS]}, ["--model", "{tmp}/no-such-model"],
                          "no-such-model' does not exist"),
    "model dir without weights": ("hellaswag", {HS_FILE: [HS]}, ["--model", "{no_weights}"], "has no weights"),
    "pickle weights without --allow-pickle": ("hellaswag", {HS_FILE: [HS]}, ["--model", "{pickle}"],
                                              "has only pickle weights (pytorch_model*.bin)"),
    "tokenizer without BOS or EOS": ("hellaswag", {HS_FILE: [HS]}, ["--model", "{no_bos}"],
                                     "has neither a BOS nor an EOS token"),
    "output dir is a file": ("hellaswag", {HS_FILE: [HS], "out": b"a file"}, [],
                             "/out' exists and is not a directory"),
    "unwritable output dir": ("hellaswag", {HS_FILE: [HS], "blocker": b"a file"}, ["--output", "{tmp}/blocker/out"],
                              "/blocker/out' is not writable: Not a directory"),
    "output dir from a different run": ("hellaswag", {HS_FILE: [HS], OTHER_RUN_MANIFEST: [OTHER_RUN]}, [],
                                        "holds results of a different run (differs in:"),
}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_is_one_line_exit_2_and_no_results(case, tmp_path, capsys, tiny_llama, no_weights_model,
                                                     no_bos_eos_model, pickle_only_model):
    task, files, extra, expected = CASES[case]
    data = tmp_path / "data"
    for relative, content in files.items():
        write((tmp_path if relative.startswith(("out", "blocker")) else data) / relative, content)
    places = {"tmp": tmp_path, "no_weights": no_weights_model, "pickle": pickle_only_model, "no_bos": no_bos_eos_model}
    extra = [a.format(**places) for a in extra]
    out = tmp_path / "out"
    argv = ["eval", "--model", str(tiny_llama), "--tasks", task, "--data-dir", str(data), "--output", str(out),
            "--no-progress", *extra]
    capsys.readouterr()
    assert main(argv) == 2
    errors = capsys.readouterr().err.strip().splitlines()
    assert len(errors) == 1 and errors[0].startswith("raylm: error: ") and expected in errors[0], errors
    assert not (out / "results.json").exists()


@pytest.mark.parametrize("value", ["garbage", "0", "-3", "1.5"])
def test_batch_size_garbage_is_a_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["eval", "--demo", "--batch-size", value])
    assert exit_.value.code == 2
    assert f"argument --batch-size: must be 'auto' or a positive integer, got '{value}'" in capsys.readouterr().err


def test_overlong_context_is_left_truncated_with_a_warning_and_only_output_is_written(
        ray_session, tiny_llama, tmp_path, monkeypatch, caplog):
    long_row = {**HS, "ctx_a": " ".join(["word"] * 400)}
    data = tmp_path / "data"
    write(data / HS_FILE, [long_row, HS])
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    caplog.set_level(logging.WARNING)
    out = tmp_path / "out"
    assert main(["eval", "--model", str(tiny_llama), "--tasks", "hellaswag", "--data-dir", str(data), "--output",
                 str(out), "--no-progress"]) == 0
    assert "2 requests exceed the model's max length 128; their contexts are left-truncated" in caplog.text
    assert json.loads((out / "results.json").read_text())["n-samples"]["hellaswag"]["effective"] == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cwd", "data", "out"]
    assert list(cwd.iterdir()) == [] and sorted(p.name for p in out.iterdir()) == [LOCK_FILE, CHECKPOINT_DIR,
                                                                                   "results.json"]
