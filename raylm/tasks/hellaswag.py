"""HellaSwag: pick the ending of an activity description; lm-eval's preprocessing, acc and acc_norm."""

from __future__ import annotations

import re
from pathlib import Path

from raylm.data.rows import Row, read_hub, read_jsonl
from raylm.tasks.base import ChoiceDoc, Task


def preprocess(text: str) -> str:
    """lm-eval's cleanup: WikiHow rows carry '[title]' and other bracketed artefacts."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def doc_from_row(doc_id: int, row: Row) -> ChoiceDoc:
    label = row.get("activity_label", str)
    ctx_a, ctx_b = row.get("ctx_a", str), row.get("ctx_b", str)
    endings = row.get("endings", list)
    if not endings:
        raise row.fail("empty list of endings", "endings")
    choices = []
    for ending in endings:
        if not isinstance(ending, str) or not ending.strip():
            raise row.fail("every ending must be a non-empty string", "endings")
        choices.append(preprocess(ending))
    gold = _label(row, len(choices))
    query = preprocess(label + ": " + ctx_a + " " + ctx_b.capitalize())
    return ChoiceDoc.plain(doc_id, tuple(query for _ in choices), tuple(choices), gold,
                           tuple(len(c) for c in choices), row.content_key())


def _label(row: Row, n_choices: int) -> int:
    raw = row.get("label", (int, str))
    if isinstance(raw, str) and not raw.strip().isdigit():
        raise row.fail(f"label must be an integer, got {raw!r}", "label")
    gold = int(raw)
    if not 0 <= gold < n_choices:
        raise row.fail(f"label {gold} is out of range for {n_choices} endings", "label")
    return gold


def _docs(rows: list[Row]) -> list[ChoiceDoc]:
    return [doc_from_row(i, row) for i, row in enumerate(rows)]


def _rows(data_dir: Path | None, split: str) -> list[Row]:
    if data_dir is None:
        return read_hub("Rowan/hellaswag", None, split)
    return read_jsonl(data_dir / "hellaswag" / f"{split}.jsonl")


def load_rows(data_dir: Path | None) -> list[Row]:
    return _rows(data_dir, "validation")


def load_pool_rows(data_dir: Path | None) -> list[Row]:
    return _rows(data_dir, "train")


def load_docs(data_dir: Path | None) -> list[ChoiceDoc]:
    return _docs(load_rows(data_dir))


def load_fewshot_pool(data_dir: Path | None) -> list[ChoiceDoc]:
    return _docs(load_pool_rows(data_dir))


TASK = Task("hellaswag", "multiple_choice", load_docs, load_fewshot_pool, load_rows=load_rows,
            load_pool_rows=load_pool_rows)
