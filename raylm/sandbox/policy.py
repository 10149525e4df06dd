"""Whether a node runs a generated program in its sandbox, without one, or not at all.

A node that can sandbox always does, whatever the flags. One that cannot refuses, naming why, unless the user
passed --confirm_run_unsafe_code: then the program runs as lm-eval runs code (in a process of its own with the
same limits, but seeing the node's files and network), and the node says so once.
"""

from __future__ import annotations

import logging

from raylm.errors import RaylmError
from raylm.sandbox.programs import Limits, Outcome, run_program, sandbox_unavailable

log = logging.getLogger(__name__)
_warned: set[str] = set()


def sandboxed_here(unsafe_allowed: bool) -> bool:
    """Whether this node runs programs in its sandbox (True) or, allowed to, without one (False, warned once);
    one line where it cannot and may not. A run checks this where it loads code tasks, before any model work."""
    why = sandbox_unavailable()
    if why is None:
        return True
    if not unsafe_allowed:
        raise RaylmError(why)
    if why not in _warned:
        _warned.add(why)
        log.warning("running generated programs WITHOUT a sandbox (--confirm_run_unsafe_code): they can read this "
                    "node's files and reach its network; %s", why)
    return False


def run_checked(source: str, limits: Limits, unsafe_allowed: bool) -> Outcome:
    return run_program(source, limits, sandboxed=sandboxed_here(unsafe_allowed))
