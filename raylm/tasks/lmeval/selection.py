"""Which lm-eval tasks a run evaluates, and what it refuses before Ray starts: lm-eval names resolved from its
index alone (raylm.tasks.lmeval.names), a native name an lm-eval name also reaches, --samples naming a task the
run does not evaluate. Importing this module does not import lm-eval; a run whose names are all native never
does."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from raylm.errors import RaylmError
from raylm.tasks import TASKS

if TYPE_CHECKING:
    from raylm.tasks.lmeval.names import Selection


def select_lmeval(tasks: Sequence[str], include_path: Path | None = None, *, model_args: dict[str, Any] | None = None,
                  metadata: dict[str, Any] | None = None, samples: dict[str, list[int]] | None = None,
                  unsafe_code: bool = False) -> Selection | None:
    """The lm-eval names resolved from lm-eval's index alone (no data read): unknown names and task types raylm
    cannot score fail here, before Ray starts, and so does a native name that --include-path also defines. None when
    every name is native: lm-eval is then never imported, unless an --include-path is to be checked. The arguments
    are EvalConfig's (model_args: its ModelSpec's lmeval_model_args())."""
    if include_path is not None:
        from raylm.tasks.lmeval.names import refuse_shadowed_natives

        refuse_shadowed_natives(tasks, include_path)
    lmeval_tasks = tuple(name for name in tasks if name not in TASKS)
    if not lmeval_tasks:
        return None
    from raylm.tasks.lmeval.names import select

    selection = select(lmeval_tasks, include_path, lmeval_metadata(model_args or {}, metadata))
    refuse_native_clash(tasks, selection.leaves)
    selection.unsafe_code = unsafe_code
    if samples:
        _refuse_unknown_samples(tasks, samples, selection.leaves)
    return selection


def lmeval_metadata(model_args: dict[str, Any], metadata: dict[str, Any] | None) -> dict[str, Any]:
    """What lm-eval's CLI hands its TaskManager: the model's arguments, then --metadata over them."""
    return {**model_args, **(metadata or {})}


def _refuse_unknown_samples(tasks: Sequence[str], samples: dict[str, list[int]], lmeval_leaves: Iterable[str]
                            ) -> None:
    """lm-eval ignores --samples entries for tasks it does not run; a misspelt name would then run that task in
    full, so raylm names it instead."""
    known = {name for name in tasks if name in TASKS} | set(lmeval_leaves)
    unknown = sorted(set(samples) - known)
    if unknown:
        raise RaylmError(f"--samples names {', '.join(unknown)}, which this run does not evaluate (its tasks: "
                         f"{', '.join(sorted(known))})")


def refuse_native_clash(tasks: Sequence[str], reached: Iterable[str]) -> None:
    """A native name among `tasks` that the lm-eval names among them also reach (`reached`: their leaves) would
    put two tasks' results under one name. The one rule for `raylm eval` (from lm-eval's index, and again once
    its tasks are built), sweep files and `raylm contamination`."""
    clash = sorted({name for name in tasks if name in TASKS} & set(reached))
    if clash:
        lmeval_tasks = [name for name in tasks if name not in TASKS]
        raise RaylmError(f"{', '.join(clash)}: asked for as a native task and also reached through lm-eval's "
                         f"{', '.join(lmeval_tasks)}; results would share a name (use the lm-eval task alone, "
                         "or rename it)")
