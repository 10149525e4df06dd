"""Task names -> every document's decontamination query, through the task layer `raylm eval` uses.

Native names read their documents as `raylm eval` does (raylm.tasks.queries); every other name resolves through
lm-eval's TaskManager (names, groups, tags, --include-path) and its tasks load with lm-eval's seeding, as for an
evaluation, so that a process_docs that draws from Python's `random` gives the documents the evaluation scores.
No requests are built and no model is needed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from raylm.config import DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED
from raylm.errors import RaylmError
from raylm.tasks import TASKS
from raylm.tasks.lmeval.selection import refuse_native_clash
from raylm.tasks.queries import QUERY_RULES, native_queries

SEEDS = (DEFAULT_RANDOM_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED)


@dataclass(frozen=True)
class TaskQueries:
    name: str
    rule: str  # which text of a document its query is, in words
    queries: list[tuple[int, str]]  # (doc_id, query), doc_id order
    original: int  # documents in the task before --limit


@dataclass
class ScanTasks:
    tasks: dict[str, TaskQueries]
    groups: dict[str, list[str]] = field(default_factory=dict)  # group -> every task under it
    group_subtasks: dict[str, list[str]] = field(default_factory=dict)  # group -> its direct children


def load_scan_tasks(names: tuple[str, ...], data_dir: Path | None, include_path: Path | None,
                    limit: int | None) -> ScanTasks:
    """Every named task's queries (the first `limit` documents of each, as `raylm eval --limit`)."""
    out = ScanTasks({})
    for name in names:
        if name in TASKS:
            queries = native_queries(name, data_dir)
            if not queries:
                raise RaylmError(f"{name}: no documents ({data_dir or 'the hub'} gave none)")
            kept = queries[:limit] if limit else queries
            out.tasks[name] = TaskQueries(name, QUERY_RULES[name], list(enumerate(kept)), len(queries))
    lmeval_names = tuple(n for n in names if n not in TASKS)
    if lmeval_names:
        _add_lmeval(out, lmeval_names, include_path, limit)
    ordered = {n: out.tasks[n] for n in names if n in out.tasks}
    out.tasks = {**ordered, **{n: t for n, t in out.tasks.items() if n not in ordered}}
    return out


def _add_lmeval(out: ScanTasks, names: tuple[str, ...], include_path: Path | None, limit: int | None) -> None:
    from raylm.tasks.lmeval.build import LMEVAL_LOCK, load, seed_globals
    from raylm.tasks.lmeval.extra import require_lm_eval

    require_lm_eval(names)
    from raylm.tasks.lmeval.names import select
    from raylm.tasks.lmeval.queries import document_queries, query_rule

    selection = select(names, include_path)
    refuse_native_clash([*out.tasks, *names], selection.leaves)
    with LMEVAL_LOCK:
        seed_globals(*SEEDS)
        loaded = load(selection)
    for name, task in loaded["tasks"].items():
        out.tasks[name] = TaskQueries(name, query_rule(task), list(document_queries(name, task, limit)),
                                      len(task.eval_docs))
    for name, group in loaded.get("groups", {}).items():
        out.groups[name] = [t.task_name for t in group.get_all_tasks()]
        out.group_subtasks[name] = list(group.child_names)

