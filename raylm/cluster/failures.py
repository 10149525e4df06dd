"""Errors raised inside actors, as the driver reports them: one line for the terminal, the traceback for a file.

Ray prints the whole traceback of an exception raised in an actor's constructor to the driver's terminal, but not
one raised by a method: from a method, the error reaches the driver as a RayTaskError carrying the cause and its
remote traceback. So everything raylm runs as an actor loads its model(s) through DeferredStartup, and the driver
turns what comes back into a RemoteError.
"""

from __future__ import annotations

import re
from abc import ABC, abstractmethod

import ray

from raylm.errors import RaylmError, RemoteError, first_line

ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the function names in the remote traceback
# The first exception line of a remote traceback is the error the worker raised (Ray Data's own wrapping follows).
_WORKER_ERROR = re.compile(r"^((?:\w+\.)*\w*(?:Error|Exception)): (.+)$", re.MULTILINE)


class StartupError(RaylmError):
    """What DeferredStartup raises: the startup failure in one line, the original chained as its cause."""


class DeferredStartup(ABC):
    """Base of classes Ray runs as actors (scoring actors, Ray Data's corpus callables): a failure of `start()` is
    raised by the first call to `check_started()` instead of by the constructor."""

    def __init__(self, *args: object, **kwargs: object):
        self._startup_error: StartupError | None = None
        try:
            self.start(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - raised again by check_started(), with this one chained
            line = str(e).splitlines()[0] if isinstance(e, RaylmError) and str(e) else first_line(e)
            self._startup_error = StartupError(line)
            self._startup_error.__cause__ = e

    @abstractmethod
    def start(self, *args: object, **kwargs: object) -> None:
        """The constructor's work: load the model(s)."""

    def check_started(self) -> None:
        if self._startup_error is not None:
            raise self._startup_error


def remote_error(what: str, error: ray.exceptions.RayError) -> RemoteError:
    """`what: cause` in one line, keeping Ray's text (the remote traceback) for the log file.

    A RayTaskError carries the exception the actor raised (a RaylmError's message is already the line to show);
    an actor that died (killed, out of memory, node lost) has only Ray's own message.
    """
    cause = getattr(error, "cause", None)
    if isinstance(cause, RaylmError):
        line = str(cause).splitlines()[0]
    else:
        line = first_line(cause if isinstance(cause, BaseException) else error)
    return RemoteError(f"{what}: {line}", remote_traceback(error))


def remote_traceback(error: BaseException) -> str:
    return ANSI_ESCAPE.sub("", str(error))


def data_worker_error(what: str, e: Exception) -> RemoteError | None:
    """An error a Ray Data worker raised, as `what: error` in one line with its remote traceback; None if `e` is
    not one.

    Ray Data re-raises a failed batch as its own UserCodeException, keeping the worker's exception only as text,
    so the error is found by its traceback line. A raylm error's message is the line to show as it is.
    """
    if not isinstance(e, ray.exceptions.RayError):
        return None
    text = remote_traceback(e)
    match = _WORKER_ERROR.search(text)
    if match is None:
        return None
    name, message = match.groups()
    line = message if name.startswith("raylm.") else f"{name.rsplit('.', 1)[-1]}: {message}"
    return RemoteError(f"{what}: {line}", text)
