"""`raylm tasks` (also `raylm ls`): lm-eval's `lm-eval ls`, the tasks, groups and tags `--tasks` can name, listed
by lm-eval's own TaskManager.list_all_tasks over the index raylm resolves names with (raylm.tasks.lmeval)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.errors import RaylmError
from raylm.tasks import TASKS

# What to list -> lm-eval's list_all_tasks arguments, as its `ls` command passes them.
LISTINGS = {"tasks": {}, "groups": {"list_subtasks": False, "list_tags": False},
            "subtasks": {"list_groups": False, "list_tags": False},
            "tags": {"list_groups": False, "list_subtasks": False}}


def add_tasks_command(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("tasks", aliases=["ls"], help="list lm-eval's tasks, groups and tags (lm-eval ls)")
    ls.add_argument("what", nargs="?", choices=list(LISTINGS), default="tasks",
                    help="tasks: groups, tags and subtasks (default); groups, subtasks or tags alone (subtasks, and "
                         "so tasks, read every task's YAML for its output type, as lm-eval does: minutes)")
    ls.add_argument("--include-path", "--include_path", type=Path, metavar="DIR",
                    help="a directory of your own lm-eval task YAMLs, listed with lm-eval's own")
    ls.set_defaults(run=run_tasks, output=None)  # writes nothing: an error names no output folder


def run_tasks(args: argparse.Namespace) -> int:
    from raylm.tasks.lmeval.extra import INSTALL_HINT

    if args.include_path is not None and not args.include_path.is_dir():
        raise RaylmError(f"--include-path '{args.include_path}' is not a directory")
    try:
        from raylm.tasks.lmeval.index_cache import IndexedTaskManager, builtin_index
    except ImportError as e:
        raise RaylmError(f"raylm tasks lists lm-eval's tasks, and lm-eval is not installed; install it with "
                         f"{INSTALL_HINT}") from e

    paths = [str(args.include_path)] if args.include_path is not None else None
    manager = IndexedTaskManager(builtin_index(), paths)
    if LISTINGS[args.what].get("list_subtasks", True) is False:
        # list_all_tasks builds its subtask table (reading every task's YAML: minutes for lm-eval's 14,000) even
        # when it does not print it; without subtasks to tabulate it prints the same groups or tags in seconds.
        manager._all_subtasks = []
    print(f"raylm's native tasks (scored by raylm itself under these names): {', '.join(TASKS)}")
    print(manager.list_all_tasks(**LISTINGS[args.what]))
    return 0
