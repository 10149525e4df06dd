"""User-facing errors: one line that names where the bad input is, so the CLI can print it and exit non-zero."""

from __future__ import annotations


class RaylmError(Exception):
    """An error the user can fix; the CLI prints its message alone, without a traceback."""


class InputError(RaylmError):
    """Bad input data, pointing at the file, row and field so the user can find it without a debugger."""

    def __init__(self, source: str, message: str, row: int | None = None, field: str | None = None):
        where = source
        if row is not None:
            where += f": row {row}"
        if field is not None:
            where += f": field '{field}'"
        super().__init__(f"{where}: {message}")
        self.source, self.row, self.field = source, row, field


class RemoteError(RaylmError):
    """An error raised inside a Ray actor. The terminal gets one line; the remote traceback, which a user needs to
    report or debug it, is kept so the CLI can write it to a file under the output directory and name that file."""

    def __init__(self, message: str, traceback: str):
        super().__init__(message)
        self.traceback = traceback


def first_line(error: BaseException) -> str:
    """`Type: first line of the message`: enough to recognise an error in one line of a terminal."""
    text = str(error).strip()
    first = text.splitlines()[0] if text else ""
    return f"{type(error).__name__}: {first}" if first else type(error).__name__
