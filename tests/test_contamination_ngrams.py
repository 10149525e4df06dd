"""The n-gram maths of `raylm contamination`, without Ray: lm-eval's normalisation and n-grams exactly (its
Janitor and word_ngrams are the reference), the vectorised candidate search against a plain set lookup, and
each document's query as lm-eval's own task code gives it."""

from __future__ import annotations

import contextlib
import io
import json
import random
import string

import pytest

from conftest import DATA
from raylm.contamination.ngrams import NgramIndex, TaskDocument, ngrams, normalize, word_starts, words
from raylm.tasks.queries import native_queries

with contextlib.redirect_stdout(io.StringIO()):  # it prints that its C++ module is missing, with a traceback
    from lm_eval.decontamination.janitor import Janitor, word_ngrams

ODD = ["", "   ", "a", "Don't STOP -- believing!!", "x\u00a0y\u2028z\u3000w\x1cv\x85u", "tab\there\nnew\r\nline",
       "Ünïcödé ÉCOLE straße İstanbul ΣΟΦΙΑ", "(parenthesised) [bracketed] {braced} \"quoted\" 'single'",
       "... --- !!! ,,, ;;; :: ??", "a-b a_b a.b a/b a\\b a@b", "emoji 🙂 and em—dash and “smart” quotes"]


def real_texts() -> list[str]:
    lines = [line for line in (DATA / "wikitext-2" / "valid.txt").read_text().splitlines() if line.strip()][:200]
    winogrande = native_queries("winogrande", DATA)[:200]
    hellaswag = native_queries("hellaswag", DATA)[:200]
    return lines + winogrande + hellaswag


def random_texts(count: int = 300) -> list[str]:
    rng = random.Random(0)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " \t\n" + "éÄß—“”\u00a0\u3000\x1c"
    return ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 120))) for _ in range(count)]


@pytest.mark.parametrize("n", [1, 3, 13])
def test_normalisation_and_ngrams_are_lm_evals_janitor(n):
    janitor = Janitor(ngram_n=n)
    for text in ODD + real_texts() + random_texts():
        assert normalize(text) == janitor.normalize_string(text), text
        assert ngrams(words(text), n) == list(word_ngrams(janitor.normalize_string(text), n)), text


def test_each_word_starts_where_the_text_has_it():
    for text in ODD + random_texts() + real_texts()[:50]:
        starts = word_starts(text)
        assert len(starts) == len(words(text))
        for start, word in zip(starts, words(text)):
            raw = text[start:].split(maxsplit=1)[0]
            assert normalize(raw) == word, (text, start)


SPACES = [" ", "  ", "\n", "\t", " \x1c ", "\x85", "\u00a0", "\u2003", "\u2028", "\u3000", " -- "]


def test_candidates_are_exactly_the_windows_a_set_lookup_finds():
    """The hashed, vectorised search over a batch against the plain way: every corpus n-gram looked up in the set
    of task n-grams (a few task words shared by chance make many windows candidates without any match)."""
    rng = random.Random(1)
    vocab = [f"w{i}" for i in range(40)]
    task_texts = [" ".join(rng.choices(vocab, k=rng.randint(5, 40))) for _ in range(30)]
    docs = [TaskDocument("t", i, words(t)) for i, t in enumerate(task_texts)]
    index = NgramIndex(docs, 4)
    task_grams = {g for d in docs for g in ngrams(d.words, 4)}
    corpus = []
    for _ in range(60):
        parts = [" ".join(rng.choices(vocab + ["other", "Words,"], k=rng.randint(0, 30)))]
        if rng.random() < 0.5:
            source = rng.choice(task_texts).split()
            k = rng.randint(0, max(0, len(source) - 4))
            parts.append(rng.choice(SPACES).join(source[k:k + rng.randint(3, 8)]).upper())
        corpus.append(rng.choice(SPACES).join(parts))
    found = [(c.doc, c.word, c.ngram) for c in index.filter.candidates(corpus) if index.owners(c.ngram)]
    expected = [(d, k, g) for d, text in enumerate(corpus) for k, g in enumerate(ngrams(words(text), 4))
                if g in task_grams]
    assert found == expected and expected
    for c in index.filter.candidates(corpus):
        assert normalize(corpus[c.doc][c.offset:]).split()[:4] == c.ngram.split()
    owners = index.owners(expected[0][2])
    assert owners and all(" ".join(docs[d].words[k:k + 4]) == expected[0][2] for d, k in owners)
    assert index.owners("w1 w2 nosuchword w3") == [] and index.owners("w1 w2") == []


def _include(tmp_path, name: str, installed: str, dataset: str, split: str, extra: str = "") -> None:
    import lm_eval

    base = __import__("pathlib").Path(lm_eval.__file__).parent / "tasks" / installed
    (tmp_path / f"{name}.yaml").write_text(
        f"task: {name}\ninclude: {base}\ntag: null\ndataset_path: json\ndataset_name: null\n"
        f"dataset_kwargs:\n  data_files:\n    {split}: {dataset}\n{extra}")


def test_native_queries_are_those_of_the_lm_eval_task_each_reproduces(tmp_path):
    """winogrande (`doc_to_decontamination_query: sentence`), hellaswag (no query: doc_to_text), wikitext
    (`{{page}}`: lm-eval's own method cannot render it, since it parses the text as a Python literal) through
    lm-eval's installed YAMLs on the same data."""
    from lm_eval.tasks import TaskManager

    from raylm.tasks.lmeval.queries import document_queries, query_rule

    pages = tmp_path / "pages.jsonl"
    native_pages = native_queries("wikitext", DATA)
    pages.write_text("".join(json.dumps({"page": p}) + "\n" for p in native_pages))
    _include(tmp_path, "wg_lm", "winogrande/default.yaml", str(DATA / "winogrande" / "dev.jsonl"), "validation",
             "training_split: null\n")
    _include(tmp_path, "hs_lm", "hellaswag/hellaswag.yaml", str(DATA / "hellaswag" / "validation.jsonl"),
             "validation", "training_split: null\n")
    _include(tmp_path, "wt_lm", "wikitext/wikitext.yaml", str(pages), "test",
             "training_split: null\nvalidation_split: null\n")
    loaded = TaskManager(include_path=str(tmp_path), include_defaults=False).load(["wg_lm", "hs_lm", "wt_lm"])
    tasks = loaded["tasks"]
    for name, native in (("wg_lm", "winogrande"), ("hs_lm", "hellaswag"), ("wt_lm", "wikitext")):
        ours = native_queries(native, DATA)
        theirs = [q for _, q in document_queries(name, tasks[name], None)]
        assert theirs == ours, name
    assert [q for _, q in document_queries("wg_lm", tasks["wg_lm"], 3)] == \
        [tasks["wg_lm"].doc_to_decontamination_query(d) for d in list(tasks["wg_lm"].eval_docs)[:3]]
    with pytest.raises((SyntaxError, ValueError)):
        tasks["wt_lm"].doc_to_decontamination_query(tasks["wt_lm"].eval_docs[0])
    assert query_rule(tasks["wg_lm"]) == "doc_to_decontamination_query: sentence"
    assert query_rule(tasks["hs_lm"]).startswith("doc_to_text (lm-eval's default")


def test_tasks_without_a_query_are_searched_for_their_own_text(reference_tasks):
    """No should_decontaminate: doc_to_text (hellaswag_local); a rolling task's document itself, doc_to_target
    (wikitext_local's detokenized page); a multiple-input task's gold choice and target (winogrande_local's
    sentence with its blank filled by the right option)."""
    from lm_eval.tasks import TaskManager
    from lm_eval.tasks.wikitext.preprocess_wikitext import wikitext_detokenizer

    from raylm.tasks.lmeval.queries import document_queries, query_rule

    names = ["hellaswag_local", "wikitext_local", "winogrande_local"]
    tasks = TaskManager(include_path=str(reference_tasks), include_defaults=False).load(names)["tasks"]
    assert [q for _, q in document_queries("hellaswag_local", tasks["hellaswag_local"], 50)] == \
        native_queries("hellaswag", DATA)[:50]
    pages = native_queries("wikitext", DATA)[:3]
    assert [q for _, q in document_queries("wikitext_local", tasks["wikitext_local"], 3)] == \
        [wikitext_detokenizer({"page": p}) for p in pages]
    rows = [json.loads(line) for line in (DATA / "winogrande" / "dev.jsonl").read_text().splitlines()[:50]]
    filled = []
    for row in rows:
        before, after = row["sentence"].split("_", 1)
        filled.append(before + row[f"option{row['answer']}"] + " " + after.strip())
    assert [q for _, q in document_queries("winogrande_local", tasks["winogrande_local"], 50)] == filled
    assert query_rule(tasks["winogrande_local"]).startswith("gold choice + target delimiter + doc_to_target")
    assert query_rule(tasks["wikitext_local"]).startswith("doc_to_target (rolling loglikelihood")


@pytest.mark.parametrize("command", ["contamination", "membership"])
def test_the_docs_reference_lists_exactly_the_options_each_command_accepts(command):
    import re
    from pathlib import Path

    from raylm.cli import build_parser

    docs = (Path(__file__).resolve().parents[1] / "docs" / "contamination.md").read_text().split("## Reference")[1]
    block = re.search(rf"^raylm {command} .*?(?=^raylm |^```)", docs, re.MULTILINE | re.DOTALL).group(0)
    parser = build_parser()._subparsers._group_actions[0].choices[command]
    accepted = {o for action in parser._actions for o in action.option_strings if o.startswith("--")}
    assert set(re.findall(r"--[a-z0-9][a-z0-9-]*", block)) == accepted - {"--help"}
