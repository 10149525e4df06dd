"""Atomic file writes: readers, and a rerun after a crash, see the old file or the whole new one, never a part."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.parquet as pq


@contextmanager
def _replacing(path: Path) -> Iterator[BinaryIO]:
    """A file written beside its final name, flushed to disk and renamed into place once the block ends; an error
    in the block removes it and leaves the previous file (or none)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def write_atomic(path: Path, data: bytes) -> None:
    with _replacing(path) as f:
        f.write(data)


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    """So that a run killed while writing a Parquet file leaves none a reader would take for finished."""
    with _replacing(path) as f:
        pq.write_table(table, f)
