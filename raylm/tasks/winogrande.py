"""WinoGrande by partial evaluation: each option fills the blank in the context, the rest is the shared continuation.

Scoring only the text after the blank makes the two requests comparable: they differ in the conditioning
context, not in what is scored (Trinh & Le 2018, as lm-eval does it).
"""

from __future__ import annotations

from pathlib import Path

from raylm.data.rows import Row, read_hub, read_jsonl
from raylm.errors import InputError
from raylm.tasks.base import ChoiceDoc, Task

# The largest training split present is the few-shot pool; lm-eval samples winogrande_xl's train split.
TRAIN_FILES = ("train_xl.jsonl", "train_l.jsonl", "train_m.jsonl", "train_s.jsonl", "train_xs.jsonl")


def doc_from_row(doc_id: int, row: Row) -> ChoiceDoc:
    sentence = row.get("sentence", str)
    if "_" not in sentence:
        raise row.fail("sentence has no blank '_'", "sentence")
    options = (row.get("option1", str), row.get("option2", str))
    answer = row.get("answer", (str, int))
    if str(answer) not in ("1", "2"):
        raise row.fail(f"answer must be '1' or '2', got {answer!r}", "answer")
    blank = sentence.index("_")
    target = sentence[blank + 1:].strip()
    contexts = tuple(sentence[:blank] + option for option in options)
    return ChoiceDoc.plain(doc_id, contexts, (target, target), int(answer) - 1, tuple(len(c) for c in contexts),
                           row.content_key())


def _docs(rows: list[Row]) -> list[ChoiceDoc]:
    return [doc_from_row(i, row) for i, row in enumerate(rows)]


def load_rows(data_dir: Path | None) -> list[Row]:
    if data_dir is None:
        return read_hub("allenai/winogrande", "winogrande_xl", "validation")
    return read_jsonl(data_dir / "winogrande" / "dev.jsonl")


def load_pool_rows(data_dir: Path | None) -> list[Row]:
    if data_dir is None:
        return read_hub("allenai/winogrande", "winogrande_xl", "train")
    for name in TRAIN_FILES:
        if (data_dir / "winogrande" / name).is_file():
            return read_jsonl(data_dir / "winogrande" / name)
    raise InputError(str(data_dir / "winogrande"), f"no few-shot training file (looked for {', '.join(TRAIN_FILES)})")


def load_docs(data_dir: Path | None) -> list[ChoiceDoc]:
    return _docs(load_rows(data_dir))


def load_fewshot_pool(data_dir: Path | None) -> list[ChoiceDoc]:
    return _docs(load_pool_rows(data_dir))


TASK = Task("winogrande", "multiple_choice", load_docs, load_fewshot_pool, choice_metrics=("acc",),
            load_rows=load_rows, load_pool_rows=load_pool_rows)
