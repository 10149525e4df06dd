"""What a task hands the rest of raylm: documents that are either multiple-choice or text to score whole.

A task knows how to turn its rows into documents and nothing else; request building, scoring and metrics are
shared, so no other module ever special-cases a task.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from raylm.data.rows import Row
from raylm.errors import RaylmError

# lm-eval's defaults, which its hellaswag and winogrande keep: question and answer joined by a space, few-shot
# examples by a blank line.
TARGET_DELIMITER = " "
FEWSHOT_DELIMITER = "\n\n"


@dataclass(frozen=True)
class ChoiceDoc:
    """One multiple-choice question: request i scores continuations[i] after contexts[i].

    The request strings are plain text, as lm-eval writes them without a chat template. What they are made of is
    kept beside them so that a prompt format (raylm.tasks.prompt: a system instruction, a chat template) can
    build them again as lm-eval does: each choice's question (the evaluated turn), each choice's answer (without
    the delimiter), and the few-shot examples as (question, answer) pairs."""

    doc_id: int
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    # acc_norm divides by the character length of the choice text itself (lm-eval: len(choice), no delimiter).
    norm_lengths: tuple[int, ...]
    # The source row's content (raylm.data.rows.Row.content_key): few-shot draws drop examples equal to it.
    row_key: str
    questions: tuple[str, ...]
    answers: tuple[str, ...]
    examples: tuple[tuple[str, str], ...] = ()

    @classmethod
    def plain(cls, doc_id: int, questions: tuple[str, ...], answers: tuple[str, ...], gold: int,
              norm_lengths: tuple[int, ...], row_key: str) -> ChoiceDoc:
        """A zero-shot document whose requests are lm-eval's plain text: question, then delimiter + answer."""
        return cls(doc_id, questions, tuple(TARGET_DELIMITER + a for a in answers), gold, norm_lengths, row_key,
                   questions, answers)

    def solved_example(self) -> tuple[str, str]:
        """This doc answered correctly, as a few-shot (question, answer) pair."""
        return self.questions[self.gold], self.answers[self.gold]

    def with_examples(self, examples: tuple[tuple[str, str], ...]) -> ChoiceDoc:
        """The document with few-shot examples in front of every context, as lm-eval writes them in plain text."""
        prefix = "".join(q + TARGET_DELIMITER + a + FEWSHOT_DELIMITER for q, a in examples)
        return replace(self, contexts=tuple(prefix + q for q in self.questions), examples=examples)


@dataclass(frozen=True)
class TextDoc:
    """One document scored whole by rolling loglikelihood; words/bytes are counted on the original text."""

    doc_id: int
    text: str
    words: int
    bytes: int


Doc = ChoiceDoc | TextDoc


def row_hash(doc: Doc) -> str:
    """The document's content as a sha256 (its source row's fields, or its text), so that two raylm runs'
    documents under one doc_id can be told the same or not (raylm compare) where lm-eval, which alone computes
    its doc_hash of a document, is not installed."""
    content = doc.row_key if isinstance(doc, ChoiceDoc) else doc.text
    return hashlib.sha256(content.encode()).hexdigest()


@dataclass(frozen=True)
class Task:
    name: str
    kind: Literal["multiple_choice", "rolling"]
    load_docs: Callable[[Path | None], list[Doc]]
    load_fewshot_pool: Callable[[Path | None], list[ChoiceDoc]] | None = None
    choice_metrics: tuple[str, ...] = ("acc", "acc_norm")
    # The rows the documents and the few-shot pool are made from, as lm-eval's own task of this name would read
    # them: its counterpart is built on these (raylm.tasks.lmeval.counterparts) for what lm-eval logs of a doc.
    load_rows: Callable[[Path | None], list[Row]] | None = None
    load_pool_rows: Callable[[Path | None], list[Row]] | None = None


def with_fewshot(task: Task, docs: list[ChoiceDoc], pool: list[ChoiceDoc], k: int, seed: int) -> list[ChoiceDoc]:
    """Prefix every context with k solved examples, drawn as lm-eval 0.4.13's default sampler draws them.

    lm-eval seeds one Random per task (its fewshot_random_seed) and, for a task whose fewshot_split and test_split
    are both unset (its hellaswag and winogrande), draws `sample(pool, k + 1)` for each evaluated doc in order,
    drops the examples equal to that doc and keeps the first k. The extra draw happens even when the pool is
    another split, and it moves the random stream, so drawing only k would change every prompt after the first.
    """
    if k == 0:
        return docs
    if k + 1 > len(pool):
        raise RaylmError(f"{task.name}: --num-fewshot {k} needs a few-shot pool of at least {k + 1} examples "
                         f"(lm-eval draws k + 1 and drops the evaluated document); the pool has {len(pool)}")
    rnd = random.Random(seed)
    out = []
    for doc in docs:
        examples = [ex for ex in rnd.sample(pool, k + 1) if ex.row_key != doc.row_key][:k]
        if len(examples) < k:
            # The evaluated row is in the pool more than once and was drawn more than once: lm-eval draws again
            # from the pool without it.
            others = [ex for ex in pool if ex.row_key != doc.row_key]
            if len(others) < k:
                raise RaylmError(f"{task.name}: doc {doc.doc_id}: the few-shot pool has only {len(others)} examples "
                                 f"other than this document, fewer than --num-fewshot {k}")
            examples = rnd.sample(others, k)
        out.append(doc.with_examples(tuple(ex.solved_example() for ex in examples)))
    return out
