"""What a task hands the rest of raylm: documents that are either multiple-choice or text to score whole.

A task knows how to turn its rows into documents and nothing else; request building, scoring and metrics are
shared, so no other module ever special-cases a task.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from raylm.errors import RaylmError

FEWSHOT_DELIMITER = "\n\n"


@dataclass(frozen=True)
class ChoiceDoc:
    """One multiple-choice question: request i scores continuations[i] after contexts[i]."""

    doc_id: int
    contexts: tuple[str, ...]
    continuations: tuple[str, ...]
    gold: int
    # acc_norm divides by the character length of the choice text itself (lm-eval: len(choice), no delimiter).
    norm_lengths: tuple[int, ...]

    def solved_example(self) -> str:
        """The text of this doc answered correctly, as lm-eval writes a few-shot example."""
        return self.contexts[self.gold] + self.continuations[self.gold]


@dataclass(frozen=True)
class TextDoc:
    """One document scored whole by rolling loglikelihood; words/bytes are counted on the original text."""

    doc_id: int
    text: str
    words: int
    bytes: int


Doc = ChoiceDoc | TextDoc


@dataclass(frozen=True)
class Task:
    name: str
    kind: Literal["multiple_choice", "rolling"]
    load_docs: Callable[[Path | None], list[Doc]]
    load_fewshot_pool: Callable[[Path | None], list[ChoiceDoc]] | None = None
    choice_metrics: tuple[str, ...] = ("acc", "acc_norm")


def with_fewshot(task: Task, docs: list[ChoiceDoc], pool: list[ChoiceDoc], k: int, seed: int) -> list[ChoiceDoc]:
    """Prefix every context with k solved examples, drawn as lm-eval's default sampler draws them.

    lm-eval seeds one Random per task and draws `sample(pool, k)` for each evaluated doc in order, so the same
    seed gives the same prompts here as there.
    """
    if k > len(pool):
        raise RaylmError(f"{task.name}: --num-fewshot {k} is larger than the few-shot pool ({len(pool)} examples)")
    rnd = random.Random(seed)
    out = []
    for doc in docs:
        prefix = "".join(ex.solved_example() + FEWSHOT_DELIMITER for ex in rnd.sample(pool, k))
        out.append(replace(doc, contexts=tuple(prefix + c for c in doc.contexts)))
    return out
