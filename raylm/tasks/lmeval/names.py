"""Task, group and tag names -> lm-eval's TaskManager, checked before any data is read or Ray starts.

Resolution is lm-eval's: names are fnmatch patterns over its index (its CLI's rule), `--include-path` is its
`--include_path` (those YAMLs replace lm-eval's own of the same name). raylm adds only speed and earlier errors:
- when every name, and everything its groups and tags reach, is defined under --include-path, only that
  directory is indexed; lm-eval's own index would resolve those names to the very same entries, since
  include_path entries replace builtin ones;
- otherwise lm-eval's own index is built once per process, and kept between runs in raylm's cache directory
  unless that is turned off (index_cache.py);
- unknown names (with close matches) and task types raylm cannot run are refused from the index alone.
"""

from __future__ import annotations

import difflib
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lm_eval.tasks import TaskManager
from lm_eval.tasks._index import Kind

from raylm.errors import RaylmError
from raylm.tasks import TASKS
from raylm.tasks.lmeval.index_cache import IndexedTaskManager, builtin_index

SUPPORTED_OUTPUT_TYPES = ("multiple_choice", "loglikelihood", "loglikelihood_rolling", "generate_until")
_PATTERN_CHARS = frozenset("*?[")

log = logging.getLogger(__name__)


@dataclass
class Selection:
    """The lm-eval part of a run: the manager that resolved the names, and the names its CLI would load."""

    manager: TaskManager
    names: list[str]  # expanded: patterns matched, tags and groups as named (TaskManager.load takes these)
    leaves: list[str]  # every task the names reach, as far as the index tells (Python-class tasks included)
    unsafe_code: bool = False  # --confirm_run_unsafe_code (raylm.sandbox.policy)


def select(names: Sequence[str], include_path: Path | None, metadata: dict[str, Any] | None = None) -> Selection:
    """The TaskManager for these names and the names expanded, or a one-line error naming the first bad one.
    `metadata` is what lm-eval's TaskManager hands every task it loads (its CLI's model_args | --metadata)."""
    paths = [str(include_path)] if include_path is not None else None
    manager = _include_path_manager(names, paths, metadata) if paths else None
    if manager is None:
        manager = IndexedTaskManager(builtin_index(), paths, metadata)
    expanded = expand_names(names, manager)
    leaves = []
    for name in expanded:
        for task, output_type, via in leaf_output_types(manager, name, name):
            if output_type is not None:
                refuse_output_type(task, output_type, via)
            leaves.append(task)
    return Selection(manager, expanded, leaves)


def refuse_shadowed_natives(names: Sequence[str], include_path: Path) -> None:
    """A native name (hellaswag, winogrande, wikitext) that --include-path also defines is ambiguous: raylm would
    score its own task, lm-eval would score the YAML (include-path entries replace lm-eval's own), and nothing
    would say which ran. raylm refuses it rather than pick one silently."""
    natives = [name for name in names if name in TASKS]
    if not natives:
        return
    index = TaskManager(include_path=[str(include_path)], include_defaults=False).task_index
    for name in natives:
        if name in index:
            where = index[name].yaml_path or include_path
            raise RaylmError(f"'{name}' is raylm's native task and also a task of --include-path ({where}); raylm "
                             f"would score its own and ignore yours: give yours another name (task: my_{name})")


def _include_path_manager(names: Sequence[str], paths: list[str], metadata: dict[str, Any] | None = None
                          ) -> TaskManager | None:
    """A manager of --include-path alone, if it resolves every name exactly as the full index would: no name is
    a pattern (lm-eval's own names could match it too), and every name, group member and tag member is defined
    there. (A group member missing from the index is not an error in lm-eval: it becomes an inline task, so
    a member defined only among lm-eval's own tasks must send the run to the full index.)"""
    if any(_PATTERN_CHARS & set(name) for name in names):
        return None
    manager = TaskManager(include_path=paths, include_defaults=False, metadata=metadata)
    return manager if all(_closed(manager, name) for name in names) else None


def _closed(manager: TaskManager, name: str) -> bool:
    entry = manager.task_index.get(name)
    if entry is None:
        return False
    if entry.kind is Kind.TAG:
        return all(_closed(manager, task) for task in entry.tags)
    if entry.kind is Kind.GROUP:
        for item in (entry.cfg or {}).get("task", []):
            member = item if isinstance(item, str) else item.get("task", item.get("group"))
            if not isinstance(member, str) or not _closed(manager, member):
                return False
    return True


def expand_names(names: Sequence[str], manager: TaskManager) -> list[str]:
    """lm-eval's CLI rule (EvaluatorConfig.process_tasks): each name is an fnmatch pattern over every task, group
    and tag, matches flattened in order without duplicates. lm-eval itself only says "Tasks not found"; the close
    matches are difflib's over lm-eval's own name list."""
    expanded: list[str] = []
    for name in names:
        matches = manager.match_tasks([name])
        if not matches:
            close = difflib.get_close_matches(name, manager.all_tasks, n=3)
            hint = f"; close matches: {', '.join(close)}" if close else ""
            raise RaylmError(f"unknown task '{name}' (not a native raylm task, nor an lm-eval task, group or tag)"
                             f"{hint}")
        expanded += [m for m in matches if m not in expanded]
    return expanded


def leaf_output_types(manager: TaskManager, name: str, via: str, override: str | None = None
                      ) -> Iterator[tuple[str, str | None, str]]:
    """(task, output_type, how it was reached) for every task under `name`, from lm-eval's index alone.

    A group's own keys override its children's, a parent's override a group's, a dict member's override both,
    as TaskFactory merges them; a task YAML without output_type gets TaskConfig's default, generate_until; a
    Python-class task's type is known only once built (None here; checked again after loading)."""
    entry = manager.task_index.get(name)
    if entry is None:
        return
    if entry.kind is Kind.TAG:
        for task in sorted(entry.tags):
            yield from leaf_output_types(manager, task, via, override)
    elif entry.kind is Kind.GROUP:
        cfg = entry.cfg or {}
        override = override if override is not None else cfg.get("output_type")
        for item in cfg.get("task", []):
            member = item if isinstance(item, dict) else {"task": item}
            child = member.get("task", member.get("group"))
            if isinstance(child, str):
                yield from leaf_output_types(manager, child, f"{via} > {child}", member.get("output_type", override))
    elif entry.kind is Kind.TASK:
        yield name, override or (entry.cfg or {}).get("output_type", "generate_until"), via
    else:
        yield name, override, via


def refuse_output_type(task: str, output_type: str | None, via: str) -> None:
    if output_type not in SUPPORTED_OUTPUT_TYPES:
        where = f" (in {via})" if via and via != task else ""
        raise RaylmError(f"lm-eval task '{task}'{where} has output_type {output_type}; raylm runs "
                         f"{', '.join(SUPPORTED_OUTPUT_TYPES)}")


def task_folder(name: str, include_path: Path | None) -> tuple[str, ...]:
    """lm-eval's CLI rule for `--tasks DIR` (EvaluatorConfig.process_tasks): a lone entry that is a directory and
    matches no task, group or tag (its index, --include-path's entries included) stands for every `DIR/*.yaml`,
    each loaded as a task file (task_files); one that also names a task is that task, with lm-eval's warning."""
    import glob

    manager = IndexedTaskManager(builtin_index(), [str(include_path)] if include_path is not None else None)
    if manager.match_tasks([name]):
        log.warning("A local directory named '%s' exists but a registered task with the same name was found - using "
                    "the registered task. To load tasks from a directory, use --include_path or rename the "
                    "directory.", name)
        return (name,)
    files = sorted(glob.glob(str(Path(name) / "*.yaml")))
    if not files:
        raise RaylmError(f"--tasks {name}: a directory without task files (*.yaml) in it")
    return tuple(files)


def task_files(names: Sequence[str], include_path: Path | None) -> tuple[tuple[str, ...], Path | None]:
    """lm-eval's task files in --tasks as the names they define, with their folder as the include path.

    lm-eval's CLI (EvaluatorConfig.process_tasks) takes an entry ending in `.yaml` as a file path or glob and loads
    each file's config (load_yaml, its `include:` resolved from the file's folder). raylm indexes the folder as
    --include-path, whose entries replace lm-eval's own of the same name, so each name loads that same file,
    through the same load_yaml; a folder whose index would resolve the name to another of its files, files in
    several folders, or a folder other than --include-path's, are refused in one line."""
    import glob

    import yaml
    from lm_eval.tasks._yaml_loader import load_yaml

    out: list[str] = []
    files: dict[str, Path] = {}
    for name in names:
        if not name.endswith(".yaml"):
            out.append(name)
            continue
        matched = sorted(glob.glob(name))
        if not matched:
            raise RaylmError(f"--tasks {name}: no such task file")
        for path in (Path(m).resolve() for m in matched):
            try:
                config = load_yaml(path, resolve_func=False)
            except (OSError, ValueError, yaml.YAMLError) as e:
                raise RaylmError(f"--tasks {path}: not a task file lm-eval can read: {e}") from None
            defined = config.get("task") if isinstance(config.get("task"), str) else config.get("group")
            if not isinstance(defined, str):
                raise RaylmError(f"--tasks {path}: defines no task or group name (a `task:` or `group:` key)")
            files[defined] = path
            out.append(defined)
    folders = {path.parent for path in files.values()} | ({include_path.resolve()} if include_path else set())
    if len(folders) > 1:
        raise RaylmError(f"task files in --tasks and --include-path span {len(folders)} folders "
                         f"({', '.join(sorted(map(str, folders)))}); raylm reads tasks from one folder: put them "
                         "in one")
    if not files:
        return tuple(out), include_path
    folder = folders.pop()
    index = TaskManager(include_path=[str(folder)], include_defaults=False).task_index
    for name, path in files.items():
        indexed = index[name].yaml_path if name in index else None
        if indexed is None or Path(indexed).resolve() != path:
            raise RaylmError(f"--tasks {path}: its folder defines '{name}' again in {indexed}; raylm reads the "
                             "folder as --include-path, so give one of them another name")
    return tuple(dict.fromkeys(out)), folder
