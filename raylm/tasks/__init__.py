"""The task registry: one small module per benchmark."""

from __future__ import annotations

from raylm.errors import RaylmError
from raylm.tasks import hellaswag, wikitext, winogrande
from raylm.tasks.base import ChoiceDoc, Doc, Task, TextDoc

TASKS: dict[str, Task] = {t.name: t for t in (hellaswag.TASK, winogrande.TASK, wikitext.TASK)}


def get_task(name: str) -> Task:
    if name not in TASKS:
        raise RaylmError(f"unknown task '{name}' (known: {', '.join(TASKS)})")
    return TASKS[name]


__all__ = ["TASKS", "ChoiceDoc", "Doc", "Task", "TextDoc", "get_task"]
