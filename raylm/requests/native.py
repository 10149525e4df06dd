"""A run's native tasks' documents -> their request tables, in the prompt format the run asks for."""

from __future__ import annotations

import pyarrow as pa

from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.requests.table import build_requests
from raylm.tasks import get_task
from raylm.tasks.native import TaskDocs
from raylm.tasks.prompt import PLAIN, PromptFormat, render

Tables = dict[str, tuple[str, pa.Table]]  # task -> (kind, request table), native and lm-eval tasks alike


def encode_task_requests(docs: TaskDocs, encoder: Encoder | MaskedEncoder, prompt: PromptFormat = PLAIN) -> Tables:
    """Every native task's requests as an Arrow table of token ids, in the prompt format asked for."""
    out: Tables = {}
    for name, (task_docs, _) in docs.items():
        task = get_task(name)
        if task.kind == "multiple_choice":
            task_docs = [render(d, prompt) for d in task_docs]
        out[name] = (task.kind, build_requests(task, task_docs, encoder))
    return out
