"""lm-eval's index of its own ~14,000 task YAMLs, kept between runs.

TaskManager() parses every YAML lm-eval ships (and every file they include) on each construction: 7-23 s on 2
cores, more than the whole of a small evaluation. The index depends only on those files, so it is kept as JSON
(plain YAML values: no pickle) under raylm's cache directory, keyed by lm-eval's version and every YAML's path,
size and modification time: any change to lm-eval's task files builds it afresh. An index JSON cannot hold
exactly is not kept, and a kept one that cannot be read back (a full disk, a crash mid-write on a filesystem
without atomic rename) is built and kept afresh. The cache directory and its switches are raylm.cache's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from lm_eval.tasks import TaskManager
from lm_eval.tasks._index import Entry, Kind, TaskIndex

from raylm.cache import NO_CACHE_ENV, cache_dir
from raylm.errors import first_line

log = logging.getLogger(__name__)


def builtin_root() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def _yaml_files(root: Path) -> list[str]:
    """Every YAML under root, as TaskIndex walks them (os.walk: a quarter of the time of Path.glob here)."""
    out = []
    for folder, dirs, files in os.walk(root):
        dirs[:] = [d for d in dirs if d not in ("__pycache__", ".ipynb_checkpoints")]
        out.extend(os.path.join(folder, f) for f in files if f.endswith(".yaml"))
    return sorted(out)


def _key(root: Path) -> str:
    import lm_eval

    digest = hashlib.sha256(f"{lm_eval.__version__}\0{root}\n".encode())
    for path in _yaml_files(root):
        stat = os.stat(path)
        digest.update(f"{path}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return f"lm-eval-{lm_eval.__version__}-index-{digest.hexdigest()[:20]}.json"


def _encode(index: dict[str, Entry]) -> str:
    return json.dumps([[e.name, e.kind.name, None if e.yaml_path is None else str(e.yaml_path), e.cfg, sorted(e.tags)]
                       for e in index.values()])


def _decode(text: str) -> dict[str, Entry]:
    return {name: Entry(name, Kind[kind], None if path is None else Path(path), cfg, set(tags))
            for name, kind, path, cfg, tags in json.loads(text)}


@functools.lru_cache(maxsize=1)
def builtin_index() -> dict[str, Entry]:
    """TaskIndex.build([lm_eval/tasks]): once per process (a sweep resolves names for every point), and from the
    cache directory when lm-eval's YAMLs are unchanged since it was written there."""
    return cached_index(builtin_root())


def cached_index(root: Path) -> dict[str, Entry]:
    """TaskIndex.build([root]), from the cache directory when root's YAMLs are unchanged since it was kept there."""
    directory = cache_dir()
    if directory is None:
        return TaskIndex.build([root])
    path = directory / _key(root)
    if path.is_file():
        try:
            return _decode(path.read_text())
        except (OSError, ValueError, KeyError, TypeError) as e:
            log.warning("lm-eval's task index kept in %s cannot be read (%s); indexing the tasks again", path,
                        first_line(e))
    index = TaskIndex.build([root])
    try:
        text = _encode(index)
    except TypeError as e:  # a YAML value JSON has no type for
        log.warning("lm-eval's task index is not kept in %s (%s)", directory, e)
        return index
    if _decode(text) != index:
        log.warning("lm-eval's task index is not kept in %s (JSON would not give it back exactly)", directory)
        return index
    try:
        directory.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f".{path.name}.{os.getpid()}")
        partial.write_text(text)
        partial.replace(path)
        for stale in directory.glob("lm-eval-*-index-*.json"):
            if stale != path:
                stale.unlink(missing_ok=True)
    except OSError as e:
        log.warning("could not keep lm-eval's task index in %s (%s); the next run will index it again (set %s=1 "
                    "to stop trying)", directory, e.strerror or e, NO_CACHE_ENV)
    return index


class IndexedTaskManager(TaskManager):
    """A TaskManager whose index is `builtin` (lm-eval's own tasks) merged with include_path's, exactly as
    TaskManager merges its paths: include_path entries replace builtin ones of the same name, in place."""

    def __init__(self, builtin: dict[str, Entry], include_path: list[str] | None = None,
                 metadata: dict[str, Any] | None = None) -> None:
        super().__init__(include_path=include_path, include_defaults=False, metadata=metadata)
        self._index = {**builtin, **self._index}
        self._all_tasks = sorted(self._index)
        self._all_subtasks = sorted(k for k, e in self._index.items() if e.kind in (Kind.TASK, Kind.PY_TASK))
        self._all_groups = sorted(k for k, e in self._index.items() if e.kind is Kind.GROUP)
        self._all_tags = sorted(k for k, e in self._index.items() if e.kind is Kind.TAG)
