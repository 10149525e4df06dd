"""The driver's side of a Ray Data stream: its output batches in order, a worker's failure as one line, and the
Parquet file the batches are appended to, which only a finished stream renames into place."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack
from types import TracebackType

import pyarrow as pa
import pyarrow.parquet as pq
import ray

from raylm.cluster.failures import data_worker_error
from raylm.cluster.waiting import progressed
from raylm.errors import RaylmError
from raylm.storage.atomic import open_atomic
from raylm.storage.location import Location
from raylm.storage.ownership import tagged_schema


def stream_batches(ds: ray.data.Dataset, what: str) -> Iterator[pa.Table]:
    """Every output batch of `ds`, as Arrow tables, in the order Ray Data yields them. A batch that failed in a
    worker stops the stream with one line, `<what> failed: <error>`, its remote traceback kept
    (raylm.cluster.failures.data_worker_error); any other error is raised as it is."""
    try:
        for batch in ds.iter_batches(batch_format="pyarrow", batch_size=None):
            progressed()
            yield batch
    except RaylmError:
        raise
    except Exception as e:
        error = data_worker_error(f"{what} failed", e)
        if error is None:
            raise
        raise error from e


class PartialParquet:
    """A Parquet file appended batch by batch as `.NAME.partial` beside `path` and renamed over `path` when the
    `with` block ends normally; an error in the block removes it, so a failed run leaves nothing that looks final.
    (On an object store the partial file is local and uploaded at the end: raylm.storage.atomic.)

    The partial name is fixed rather than unique: every writer holds the output directory's lock
    (raylm.storage.lock) while it writes, so no two raylm runs write one at once, and a run that was killed
    leaves a partial file the next run overwrites instead of one more that piles up. With `schema` the file is
    opened at once (a stream with no rows still gives a file); without, at the first batch, whose schema it takes.
    """

    def __init__(self, path: Location, schema: pa.Schema | None = None):
        self.path = path
        self.file = ExitStack()
        self.writer: pq.ParquetWriter | None = None
        if schema is not None:
            self._open(schema)

    def _open(self, schema: pa.Schema) -> None:
        sink = self.file.enter_context(open_atomic(self.path, partial=f".{self.path.name}.partial"))
        self.writer = pq.ParquetWriter(sink, tagged_schema(schema))

    def write(self, table: pa.Table) -> None:
        if self.writer is None:
            self._open(table.schema)
        self.writer.write_table(table)

    def __enter__(self) -> PartialParquet:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        if self.writer is not None:
            self.writer.close()
        self.file.__exit__(kind, error, traceback)
