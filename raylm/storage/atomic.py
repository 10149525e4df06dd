"""Atomic file writes: readers, and a rerun after a crash, see the old file or the whole new one, never a part.

On a local disk the file is written beside its name and renamed into place. Elsewhere it is spooled to a local
temporary file, uploaded under a name beside its final one, and only then put in place: on an object store (S3,
GCS, Azure) by a server-side copy, which makes the object visible whole or not at all; on fsspec's filesystems
(sftp, ftp, ...) by the filesystem's rename, where a probe found that it replaces an existing file in one step (one
whose rename cannot, HDFS, smb, webhdfs, is refused: raylm.storage.filesystems). The upload goes to another
name because pyarrow's output streams cannot be aborted: a stream interrupted midway (an error, Ctrl-C) still
completes what it wrote when it closes. A failed write deletes its temporary file; a process killed outright may
leave one, under a name starting with '.', which no reader takes for the file.

A file larger than pyarrow's S3 copy can take (one CopyObject request, at most 5 GB) is uploaded under its final
name instead: S3 shows a multipart upload only once it completes, and the upload runs in pyarrow's C++ code from
the local spool without returning to Python, so that Ctrl-C, which Python raises only between its own steps, takes
effect after the object is whole, never with a part of it sent; a kill leaves the upload incomplete, so invisible.
(An error reading the spool midway, a failing local disk, is the one case left: Arrow closes the upload it could
not fill, which completes it.)

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
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from raylm.storage import filesystems
from raylm.storage.location import Location, location

log = logging.getLogger(__name__)

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
    copying = filesystems.kind(out.fs) == filesystems.OBJECT_STORE
    if not copying:  # before the block, so that a filesystem raylm cannot write to stops a run before its work
        out.parent.mkdir()  # a filesystem with directories (sftp) needs its parent made
        filesystems.check_replaces(out.fs, out.parent.path, str(out.parent))
    with tempfile.NamedTemporaryFile() as f:
        yield f
        f.flush()
        if copying and os.fstat(f.fileno()).st_size > filesystems.copy_limit(out.fs):
            _check_fences(out)
            pafs.copy_files(f.name, out.path, source_filesystem=pafs.LocalFileSystem(),
                            destination_filesystem=out.fs)
            return
        f.seek(0)
        tmp = out.parent / (partial or f".{out.name}.{uuid.uuid4().hex}")
        _upload(f, out, tmp, copying)


def _upload(f: BinaryIO, out: Location, tmp: Location, copying: bool) -> None:
    try:
        with out.fs.open_output_stream(tmp.path) as stream:
            shutil.copyfileobj(f, stream, 1 << 20)
        _check_fences(out)
        if copying:
            out.fs.copy_file(tmp.path, out.path)
        else:
            filesystems.rename_file(out.fs, tmp.path, out.path)
    except BaseException:
        _discard(tmp)
        raise
    if copying:
        try:
            tmp.unlink()
        except OSError as e:  # the file is in place: a temporary left beside it is litter, not a failed write
            log.warning("could not delete the temporary file %s after putting %s in place: %s", tmp, out, e)


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
