"""A run's native tasks: every document read and validated before any Ray work starts, cut to lm-eval's --limit
or --samples, few-shot examples attached."""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from pathlib import Path

from raylm.errors import RaylmError
from raylm.tasks import TASKS, ChoiceDoc, get_task
from raylm.tasks.base import with_fewshot

log = logging.getLogger(__name__)

TaskDocs = dict[str, tuple[list, int]]  # task -> (documents to score, document count before --limit)


def limited(n_docs: int, limit: int | float | None) -> int:
    """How many of a task's n_docs documents --limit keeps (lm_eval.evaluator_utils.get_sample_size)."""
    if limit is None:
        return n_docs
    return min(n_docs, math.ceil(n_docs * limit) if limit < 1 else int(limit))


def load_task_docs(tasks: Sequence[str], data_dir: Path | None, *, limit: int | float | None = None,
                   samples: dict[str, list[int]] | None = None, num_fewshot: int | None = None,
                   fewshot_seed: int | None = None) -> TaskDocs:
    """Every native task's documents among `tasks` (few-shot examples attached), read and validated before any
    Ray work starts, so that bad data fails at once with its file, row and field. The keywords are EvalConfig's
    (lm-eval's --limit, --samples, --num_fewshot and few-shot seed)."""
    out: TaskDocs = {}
    for name in tasks:
        if name not in TASKS:
            continue
        task = get_task(name)
        docs = task.load_docs(data_dir)
        if not docs:
            raise RaylmError(f"{name}: no documents to evaluate ({data_dir or 'the hub'} gave none)")
        original = len(docs)
        indices = (samples or {}).get(name)
        if indices:
            if indices[-1] >= original:
                raise RaylmError(f"--samples: {name} has {original} documents; index {indices[-1]} is out of range")
            chosen = set(indices)
            docs = [d for i, d in enumerate(docs) if i in chosen]
        else:
            docs = docs[: limited(original, limit)]
        if num_fewshot and task.kind == "multiple_choice":
            if task.load_fewshot_pool is None:
                raise RaylmError(f"{name}: has no few-shot pool")
            pool = task.load_fewshot_pool(data_dir)
            docs = with_fewshot(task, [d for d in docs if isinstance(d, ChoiceDoc)], pool, num_fewshot,
                                fewshot_seed)
        elif num_fewshot:
            log.warning("%s is scored zero-shot: few-shot examples do not apply to rolling loglikelihood", name)
        out[name] = (docs, original)
    return out
