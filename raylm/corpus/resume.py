"""A corpus run's checkpoint: the per-document rows of the batches already scored, so that the same command after
a kill scores only the rest and ends with the numbers an undisturbed run gives.

It is the one checkpoint layer the evaluation shards use (raylm.cluster.checkpoint): a manifest under
`--output/checkpoint/` keys it to what can change a number (the models, the data files with their sizes and
modification times, the options, the library versions, raylm's code), and parts `shards/<index>.parquet` hold
the rows. A rerun reads the corpus again, cut into the same batches (every `--docs-per-batch` documents of the
corpus's order: blocks_of_batches), and each actor looks its batch up by content (batch_key): a batch already
scored is answered with its saved rows, never scored again. So every document's numbers are bit for bit those of
the first run, whether it was scored then or now, and the sums (exact, raylm.results.sums.CorpusSums) equal an
undisturbed run's.

Batches of the same content (a text corpus of boilerplate lines) share a key. The checkpoint keeps each one
apart by its position, the index of its first document in the corpus, which only the driver knows (it sees the
rows in the corpus's order; an actor of the pool sees batches in an order it cannot know). An actor needs no
position: every batch of one key holds the same documents and is scored on its own, so any saved occurrence's
rows are its rows, provided they are one per document (checked; saved rows of another count are never used, the
batch is scored). The driver saves each position's rows once, so none is counted twice.
"""

from __future__ import annotations

import hashlib
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute

import raylm
from raylm.cluster.checkpoint import Checkpoint, library_versions, model_fingerprint, source_digest
from raylm.cluster.waiting import Stopped
from raylm.storage.location import Location

if TYPE_CHECKING:
    import ray.data

BATCH_COLUMN = "batch"  # every row's batch_key, kept in the checkpoint
START_COLUMN = "batch_start"  # the index in the corpus of the first document of the row's batch, kept in the checkpoint
SIZE_COLUMN = "batch_rows"  # how many rows the actor answered the row's batch with; taken off by the driver
RESUMED_COLUMN = "resumed"  # whether the actor answered the row from the checkpoint; taken off by the driver
TAG_COLUMNS = (BATCH_COLUMN, SIZE_COLUMN, RESUMED_COLUMN)  # what the actors add to the rows the driver folds


def batch_key(batch: pa.Table) -> str:
    """A batch of documents by content: its files and texts, in order (and its domains, or a membership run's task
    document ids, when it has them: rows answered from the checkpoint keep the ids they were saved with)."""
    digest = hashlib.blake2b(digest_size=16)
    columns = [c for c in ("path", "text", "domain", "task", "doc_id") if c in batch.column_names]
    for row in zip(*(batch[c].to_pylist() for c in columns)):
        for value in row:
            data = str(value).encode("utf-8", "surrogatepass")
            digest.update(len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def blocks_of_batches(ds: ray.data.Dataset, docs_per_batch: int) -> ray.data.Dataset:
    """The corpus in blocks of exactly `docs_per_batch` documents (the last one fewer), in order, for a Ray Data
    actor pool that scores a batch of that size: each of its tasks then scores one batch and returns it as one
    block, which reaches the driver (and the checkpoint) as soon as it is scored. Otherwise an actor's output is
    buffered into blocks of up to Ray Data's target block size (128 MiB), which the rows of a small or medium
    corpus never fill, so a task's batches all arrive when its input block (a file, or several small files) is
    done. The cuts are also the corpus's, every `docs_per_batch` documents, whatever the read parallelism, so
    a rerun on another cluster finds its batches in the checkpoint. Reading itself keeps Ray Data's blocks."""
    return ds.repartition(target_num_rows_per_block=docs_per_batch, strict=True)


class SavedBatches:
    """The checkpoint's rows as batches: every occurrence of a key, apart (consecutive rows of one key and one
    START_COLUMN), and the positions (key, start) the checkpoint holds."""

    def __init__(self, rows: pa.Table | None):
        self.by_key: dict[str, list[pa.Table]] = {}
        self.positions: set[tuple[str, int]] = set()
        if rows is None or rows.num_rows == 0:
            return
        keys, starts = rows[BATCH_COLUMN].to_pylist(), rows[START_COLUMN].to_pylist()
        begin = 0
        for i in range(1, len(keys) + 1):
            if i == len(keys) or (keys[i], starts[i]) != (keys[begin], starts[begin]):
                if (keys[begin], starts[begin]) not in self.positions:
                    self.positions.add((keys[begin], starts[begin]))
                    self.by_key.setdefault(keys[begin], []).append(
                        rows.slice(begin, i - begin).drop_columns([START_COLUMN]))
                begin = i

    def answer(self, batch: pa.Table, key: str) -> pa.Table | None:
        """The saved rows of a batch of these documents, one per document; None: score the batch."""
        for rows in self.by_key.get(key, ()):
            if rows.num_rows == batch.num_rows:
                return rows
        return None


def tagged(rows: pa.Table, key: str, resumed: bool) -> pa.Table:
    """Rows as the driver folds them: rows scored now get their batch's key (saved rows have it already), and every
    row how many rows its batch has (so that the driver tells neighbouring batches of one key apart) and whether
    it came from the checkpoint."""
    if not resumed:
        rows = rows.append_column(BATCH_COLUMN, pa.array([key] * rows.num_rows, pa.string()))
    rows = rows.append_column(SIZE_COLUMN, pa.array([rows.num_rows] * rows.num_rows, pa.int64()))
    return rows.append_column(RESUMED_COLUMN, pa.array([resumed] * rows.num_rows, pa.bool_()))


class Resuming:
    """A Ray Data callable around a corpus scorer (raylm.corpus.doc_scoring): a batch whose rows the checkpoint
    holds is answered with them, any other is scored. Every row is tagged (tagged)."""

    def __init__(self, scorer: type, args: tuple, saved: SavedBatches):
        self.scorer = scorer(*args)
        self.saved = saved

    def __call__(self, batch: pa.Table) -> pa.Table:
        key = batch_key(batch)
        rows = self.saved.answer(batch, key)
        return tagged(self.scorer(batch), key, False) if rows is None else tagged(rows, key, True)


def corpus_manifest(kind: str, models: list, data: list[dict[str, Any]], options: dict[str, Any]) -> dict[str, Any]:
    """What a corpus run's numbers depend on, each its own key so that a refusal names the one that changed:
    the pinned models, the data files (raylm.corpus.read.data_files) and every option that changes a
    document's numbers or which documents are read (including --docs-per-batch: documents scored together share
    kernel shapes, which move float32 results by a rounding). The actor count is left out, as for eval."""
    return {
        "command": kind,
        "model": model_fingerprint(models[0]),
        "model_b": model_fingerprint(models[1]) if len(models) > 1 else None,
        "data": data,
        **options,
        "versions": library_versions(),
        "code": {"raylm": raylm.__version__, "source": source_digest()},
    }


class CorpusCheckpoint:
    """The driver's side: the rows saved so far (saved), and the rows of newly finished batches saved in parts, at
    most `every_s` seconds after they arrived, also while no more rows arrive (a thread of its own, for the
    `with` block, saves them on time)."""

    def __init__(self, out_dir: Location, manifest: dict[str, Any], overwrite: bool, every_s: float):
        self.checkpoint = Checkpoint.open(out_dir, manifest, overwrite, command=manifest["command"])
        parts = self.checkpoint.tables()
        self.saved = SavedBatches(pa.concat_tables([p.replace_schema_metadata(None) for p in parts]) if parts
                                  else None)
        parts_dir = self.checkpoint.parts
        self.index = len(parts_dir.iterdir()) if parts_dir.is_dir() else 0
        self.every_s = every_s
        self.pending: list[pa.Table] = []
        self.last_save = time.monotonic()
        self.docs = 0  # rows arrived, one per document: the next batch's start
        self.start = 0  # the start of the batch whose rows are arriving
        self.left = 0  # rows of that batch still to come
        self.lock = threading.RLock()
        self.stopped = threading.Event()
        self.timer: threading.Thread | None = None
        self.error: Exception | None = None  # the timer's failed save, raised to the driver

    def __enter__(self) -> CorpusCheckpoint:
        if self.every_s > 0:
            self.timer = threading.Thread(target=self._save_on_time, name="raylm-checkpoint", daemon=True)
            self.timer.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        """A run that is stopped (Ctrl-C, SIGTERM, the watchdog: raylm.cluster.waiting) saves every whole batch that
        came back, not only those of the last interval, so the rerun resumes from them; a run that failed saves
        nothing more."""
        self.stopped.set()
        if self.timer is not None:
            self.timer.join()
        if kind is not None and issubclass(kind, (KeyboardInterrupt, Stopped)):
            self.save(final=False)

    def _save_on_time(self) -> None:
        while not self.stopped.wait(max(self.every_s - (time.monotonic() - self.last_save), 0.01)):
            try:
                self.save_due()
            except Exception as e:  # noqa: BLE001 - kept for the driver, whose next add or save raises it
                self.error = e
                return

    def add(self, rows: pa.Table) -> pa.Table:
        """Rows as the actors returned them (tagged), in the corpus's order: those of a position the checkpoint does
        not hold are kept to save. Returns them untagged, for the fold."""
        with self.lock:
            self._raise_error()
            starts = []
            for size in rows[SIZE_COLUMN].to_pylist():
                if self.left == 0:
                    self.start, self.left = self.docs, size
                starts.append(self.start)
                self.left -= 1
                self.docs += 1
            held = self.saved.positions
            new = [not resumed or (key, start) not in held for key, start, resumed in
                   zip(rows[BATCH_COLUMN].to_pylist(), starts, rows[RESUMED_COLUMN].to_pylist())]
            keep = rows.append_column(START_COLUMN, pa.array(starts, pa.int64())).filter(pa.array(new, pa.bool_()))
            if keep.num_rows:
                self.pending.append(keep.drop_columns([SIZE_COLUMN, RESUMED_COLUMN]))
            self.save_due()
        return rows.drop_columns(list(TAG_COLUMNS))

    def save_due(self) -> None:
        """Save the finished batches' pending rows once `every_s` seconds have passed since the last save."""
        with self.lock:
            if time.monotonic() - self.last_save >= self.every_s:
                self.save(final=False)

    def save(self, final: bool) -> None:
        """Save the pending rows of every finished batch (with final, every pending row)."""
        with self.lock:
            self._raise_error()
            self.last_save = time.monotonic()
            if not self.pending:
                return
            rows = pa.concat_tables(self.pending)
            done, self.pending = rows, []
            if not final and self.left:
                unfinished = pa.compute.equal(rows[START_COLUMN], self.start)
                done = rows.filter(pa.compute.invert(unfinished))
                self.pending = [rows.filter(unfinished)]
            if done.num_rows:
                self.checkpoint.save_table(self.index, done)
                self.index += 1

    def _raise_error(self) -> None:
        if self.error is not None:
            raise self.error
