"""Atomic file writes: readers, and a rerun after a crash, see the old file or the whole new one, never a part.

In each store's own terms: on a local disk (and HDFS) the file is written beside its name and renamed into place;
on an object store (S3, GCS, Azure) it is spooled to a local temporary file and then uploaded, and an object
becomes visible only when its upload completes, so a run killed mid-upload leaves the old object or none.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq

from raylm.storage.location import Location, location


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
    if not out.renames:
        # One upload: the store completes it on close, after the last byte; a process killed before then leaves
        # an incomplete upload, which no reader sees.
        with out.fs.open_output_stream(out.path) as stream:
            shutil.copyfileobj(f, stream, 1 << 20)
        return
    out.parent.mkdir()
    tmp = out.parent / partial
    with out.fs.open_output_stream(tmp.path) as stream:
        shutil.copyfileobj(f, stream, 1 << 20)
    out.fs.move(tmp.path, out.path)


def write_atomic(where: str | os.PathLike[str] | Location, data: bytes) -> None:
    with open_atomic(where) as f:
        f.write(data)


def write_parquet_atomic(where: str | os.PathLike[str] | Location, table: pa.Table) -> None:
    """So that a run killed while writing a Parquet file leaves none a reader would take for finished."""
    with open_atomic(where) as f:
        pq.write_table(table, f)
