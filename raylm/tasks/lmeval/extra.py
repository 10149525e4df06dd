"""The optional `tasks` extra: lm-eval is imported only for runs that ask for an lm-eval task."""

from __future__ import annotations

from collections.abc import Sequence

from raylm.errors import RaylmError

INSTALL_HINT = 'pip install -e ".[tasks]" in the raylm checkout'


def require_lm_eval(names: Sequence[str]) -> None:
    """Refuse, in one line, a run that names lm-eval tasks in an environment without lm-eval."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise RaylmError(f"{', '.join(names)}: not native raylm tasks, and lm-eval (which defines every other task) "
                         f"is not installed; install it with {INSTALL_HINT}") from e


def require_lm_eval_for_include_path() -> None:
    """An include path is a directory of lm-eval task YAMLs: only lm-eval reads them (and checks their names)."""
    try:
        import lm_eval  # noqa: F401
    except ImportError as e:
        raise RaylmError(f"--include-path holds lm-eval task YAMLs, and lm-eval is not installed; install it with "
                         f"{INSTALL_HINT}") from e
