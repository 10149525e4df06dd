"""A real fsspec filesystem that fails on cue, for the storage tests: fsspec's in-memory filesystem (which, like
sftp or ftp, makes a file visible under its name as soon as it is opened, and moves by copy and delete) under the
scheme `faulty://`, failing its Nth write to a file or its Nth move with an OSError, as a full disk or a dropped
connection would; or renaming as filesystems that cannot replace a file do (`rename_over`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import fsspec
import pytest
from fsspec.implementations.memory import MemoryFile, MemoryFileSystem


class FaultyFileSystem(MemoryFileSystem):
    protocol = "faulty"
    store: dict[str, Any] = {}
    pseudo_dirs = [""]
    fail_write_at: int | None = None  # counted over every file written, from 1
    fail_move_at: int | None = None
    # "refuse": a move onto an existing file fails, as smb's does; "ignore": every move does nothing and reports
    # success, as webhdfs's does when HDFS answers `false`
    rename_over: str | None = None
    writes = itertools.count(1)
    moves = itertools.count(1)

    def _open(self, path: str, mode: str = "rb", **kwargs: Any) -> MemoryFile:
        f = super()._open(path, mode, **kwargs)
        if "w" not in mode:
            return f
        write = f.write

        def failing_write(data: bytes) -> int:
            if next(FaultyFileSystem.writes) == FaultyFileSystem.fail_write_at:
                raise OSError(28, "No space left on device")
            return write(data)

        f.write = failing_write
        return f

    def mv(self, path1: str, path2: str, **kwargs: Any) -> None:
        if next(FaultyFileSystem.moves) == FaultyFileSystem.fail_move_at:
            raise OSError(104, "Connection reset by peer")
        if FaultyFileSystem.rename_over == "ignore":
            return
        if FaultyFileSystem.rename_over == "refuse" and self.exists(path2):
            raise FileExistsError(17, "File exists", path2)
        super().mv(path1, path2, **kwargs)


fsspec.register_implementation("faulty", FaultyFileSystem, clobber=True)


@pytest.fixture
def faulty() -> Iterator[type[FaultyFileSystem]]:
    """The filesystem's class, emptied, counting from 1 and failing nothing until told (`fail_write_at = 2`)."""
    FaultyFileSystem.store.clear()
    FaultyFileSystem.pseudo_dirs[:] = [""]
    FaultyFileSystem.writes, FaultyFileSystem.moves = itertools.count(1), itertools.count(1)
    FaultyFileSystem.fail_write_at = FaultyFileSystem.fail_move_at = FaultyFileSystem.rename_over = None
    yield FaultyFileSystem
    FaultyFileSystem.fail_write_at = FaultyFileSystem.fail_move_at = FaultyFileSystem.rename_over = None
