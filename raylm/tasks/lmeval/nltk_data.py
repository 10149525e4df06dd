"""nltk's `punkt_tab`, which lm-eval's IFEval code needs, found before that code is imported.

IFEval's instructions_util looks for `tokenizers/punkt_tab` on nltk's data path when imported (which loading an
IFEval task does) and downloads it where it is missing; without a network that download only prints an error, the
task loads, and the run fails at scoring on nltk's many-line LookupError. raylm looks first: found, nothing
changes; missing and offline (HF_HUB_OFFLINE or HF_DATASETS_OFFLINE set), or missing and not downloadable, the
run stops before any data is read with one line saying how to get it.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from lm_eval.tasks import TaskManager

from raylm.errors import RaylmError

PUNKT_TAB = "tokenizers/punkt_tab"
IFEVAL_CODE = "lm_eval.tasks.ifeval"  # what every IFEval task's utils.py imports (its own, the leaderboard's)
OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
HOW = ("download it where there is a network with python -c \"import nltk; nltk.download('punkt_tab', "
       "download_dir=DIR)\", then set NLTK_DATA=DIR")


def ifeval_tasks(manager: TaskManager, leaves: Iterable[str]) -> list[str]:
    """The tasks among `leaves` whose YAML, or a YAML it includes, sits beside a utils.py importing IFEval's code."""
    out = []
    for task in leaves:
        entry = manager.task_index.get(task)
        if entry is not None and entry.yaml_path is not None and _imports_ifeval(Path(entry.yaml_path), set()):
            out.append(task)
    return out


def _imports_ifeval(yaml_path: Path, seen: set[Path]) -> bool:
    from lm_eval.tasks._yaml_loader import load_yaml

    yaml_path = yaml_path.resolve()
    if yaml_path in seen or not yaml_path.is_file():
        return False
    seen.add(yaml_path)
    utils = yaml_path.parent / "utils.py"
    if utils.is_file() and IFEVAL_CODE in utils.read_text(encoding="utf-8"):
        return True
    include = load_yaml(yaml_path, resolve_func=False, recursive=False).get("include") or []
    return any(_imports_ifeval(yaml_path.parent / name, seen)
               for name in (include if isinstance(include, list) else [include]))


def offline() -> bool:
    """huggingface_hub's reading of its offline variables, at call time (its own constants are read at import)."""
    return any(os.environ.get(name, "").upper() in ("1", "ON", "YES", "TRUE") for name in OFFLINE_VARIABLES)


def _found(nltk: Any) -> bool:
    try:
        nltk.data.find(PUNKT_TAB)
    except LookupError:  # nltk's answer for data not on its path
        return False
    return True


def require_punkt_tab(manager: TaskManager, leaves: Iterable[str]) -> None:
    """punkt_tab on nltk's data path (NLTK_DATA and nltk's default folders) when an IFEval task is selected:
    downloaded as lm-eval would, unless offline; or one line saying what is missing and how to get it."""
    tasks = ifeval_tasks(manager, leaves)
    if not tasks:
        return
    import nltk

    if _found(nltk):
        return
    missing = (f"{tasks[0]} needs nltk's punkt_tab ({PUNKT_TAB}), which is not on nltk's data path "
               f"({os.pathsep.join(map(str, nltk.data.path))})")
    if offline():
        raise RaylmError(f"{missing} and cannot be downloaded offline: {HOW}")
    try:
        nltk.download("punkt_tab", quiet=True, raise_on_error=True)
    except (OSError, ValueError) as e:
        raise RaylmError(f"{missing} and could not be downloaded ({' '.join(str(e).split())}): {HOW}") from e
