"""Atomic file writes: readers, and a rerun after a crash, see the old file or the whole new one, never a part.

On a local disk the file is written beside its name and renamed into place. Elsewhere it is spooled to a local
temporary file, uploaded under a name beside its final one, and only then put in place: on an object store (S3,
GCS, Azure) by a server-side copy, which makes the object visible whole or not at all; on HDFS and fsspec's
filesystems (sftp, smb, ftp, ...) by the filesystem's rename. The upload goes to another name because pyarrow's
output streams cannot be aborted: a stream interrupted midway (an error, Ctrl-C) still completes what it wrote
when it closes. A failed write deletes its temporary file; a process killed outright may leave one, under a name
starting with '.', which no reader takes for the file.

Before a file is put in place, the checks registered for its directory run (`fence`): the lock registers one per
leased directory, so that a run whose lease was taken over stops instead of overwriting the new holder's files.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from raylm.storage.location import Location, location

log = logging.getLogger(__name__)

# Object stores, where an object is put in place by a server-side copy (a move there is a copy and a delete anyway,
# and Azure without a hierarchical namespace has none); the other filesystems rename.
COPYING = ("s3", "gcs", "abfs")

_fences: dict[tuple[str, str], Callable[[], None]] = {}  # (filesystem, directory) -> check


def fence(directory: Location, check: Callable[[], None]) -> Callable[[], None]:
    """Run `check` (which raises to refuse) before any file under `directory` is put in place, until the returned
    function is called."""
    key = (directory.fs.type_name, directory.path)
    _fences[key] = check
    return lambda: _fences.pop(key, None)


def _check_fences(out: Location) -> None:
    for (fs, directory), check in list(_fences.items()):
        if fs == out.fs.type_name and out.path.startswith(directory + "/"):
            check()


@contextmanager
def _replacing(path: Path, partial: str | None) -> Iterator[BinaryIO]:
    """A file written beside its final name, flushed to disk and renamed into place once the block ends; an error
    in the block removes it and leaves the previous file (or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # Created as any file is (0o666 less the umask), so results are as readable as the user's other files; a
    # mkstemp file would keep its owner-only 0o600 through the rename.
    if partial is None:
        tmp = str(path.with_name(f".{path.name}.{uuid.uuid4().hex}"))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)
    else:
        tmp = str(path.with_name(partial))
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


@contextmanager
def open_atomic(where: str | os.PathLike[str] | Location, partial: str | None = None) -> Iterator[BinaryIO]:
    """A binary file that appears at `where`, whole, once the block ends; an error in the block leaves the previous
    file (or none). `partial` fixes the name the file has beside its final one while it is written (a rerun then
    overwrites what a killed run left, rather than leaving one more); else it is unique."""
    out = location(where)
    if out.local is not None:
        with _replacing(out.local, partial) as f:
            yield f
        return
    with tempfile.TemporaryFile() as f:
        yield f
        f.seek(0)
        _upload(f, out, partial or f".{out.name}.{uuid.uuid4().hex}")


def _upload(f: BinaryIO, out: Location, partial: str) -> None:
    tmp = out.parent / partial
    if out.fs.type_name not in COPYING:  # a filesystem with directories (sftp) needs its parent made
        out.parent.mkdir()
    try:
        with out.fs.open_output_stream(tmp.path) as stream:
            shutil.copyfileobj(f, stream, 1 << 20)
        _check_fences(out)
        if out.fs.type_name in COPYING:
            out.fs.copy_file(tmp.path, out.path)
        else:
            out.fs.move(tmp.path, out.path)
    except BaseException:
        _discard(tmp)
        raise
    if out.fs.type_name in COPYING:
        tmp.unlink()


def _discard(tmp: Location) -> None:
    """The temporary file of a write that failed, deleted where it can be (the error that failed the write is the
    one raised)."""
    try:
        if tmp.exists():
            tmp.unlink()
    except OSError as e:
        log.warning("could not delete the temporary file %s of a failed write: %s", tmp, e)


def write_atomic(where: str | os.PathLike[str] | Location, data: bytes) -> None:
    with open_atomic(where) as f:
        f.write(data)


def write_parquet_atomic(where: str | os.PathLike[str] | Location, table: pa.Table) -> None:
    """So that a run killed while writing a Parquet file leaves none a reader would take for finished."""
    with open_atomic(where) as f:
        pq.write_table(table, f)
