"""A corpus run's checkpoint: the per-document rows of the batches already scored, so that the same command after
a kill scores only the rest and ends with the numbers an undisturbed run gives.

It is the one checkpoint layer the evaluation shards use (raylm.cluster.checkpoint): a manifest under
`--output/checkpoint/` keys it to what can change a number (the models, the data files with their sizes and
modification times, the options, the library versions, raylm's code), and parts `shards/<index>.parquet` hold
the rows. A rerun reads the corpus again, which Ray Data cuts into the same batches, and each actor looks its
batch up by content (batch_key): a batch already scored is answered with its saved rows, never scored again.
So every document's numbers are bit for bit those of the first run, whether it was scored then or now, and the
sums (exact, raylm.results.sums.CorpusSums) equal an undisturbed run's. A batch cut differently (another
cluster's read parallelism) is simply scored again.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow as pa
import pyarrow.compute

import raylm
from raylm.cluster.checkpoint import Checkpoint, library_versions, model_fingerprint, source_digest
from raylm.storage.location import Location

BATCH_COLUMN = "batch"  # every row's batch_key, kept in the checkpoint only
RESUMED_COLUMN = "resumed"  # whether the actor answered the row from the checkpoint; taken off by the driver


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


def saved_batches(rows: pa.Table | None) -> dict[str, pa.Table]:
    """Checkpointed rows by batch key (a batch's rows are saved together, in order)."""
    if rows is None or rows.num_rows == 0:
        return {}
    keys = rows[BATCH_COLUMN].to_pylist()
    out: dict[str, pa.Table] = {}
    start = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            out.setdefault(keys[start], rows.slice(start, i - start))
            start = i
    return out


def tagged(rows: pa.Table, key: str, resumed: bool) -> pa.Table:
    """Rows as the driver folds them: rows scored now get their batch's key (saved rows have it already), and every
    row whether it came from the checkpoint."""
    if not resumed:
        rows = rows.append_column(BATCH_COLUMN, pa.array([key] * rows.num_rows, pa.string()))
    return rows.append_column(RESUMED_COLUMN, pa.array([resumed] * rows.num_rows, pa.bool_()))


class Resuming:
    """A Ray Data callable around a corpus scorer (raylm.corpus.doc_scoring): a batch whose rows the checkpoint
    holds is answered with them, any other is scored. Every row gets its batch's key and whether it was resumed."""

    def __init__(self, scorer: type, args: tuple, saved: pa.Table | None):
        self.scorer = scorer(*args)
        self.saved = saved_batches(saved)

    def __call__(self, batch: pa.Table) -> pa.Table:
        key = batch_key(batch)
        rows = self.saved.get(key)
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
    """The driver's side: the rows saved so far (resumed), and new rows saved in parts every `every_s` seconds,
    only whole batches (a batch's last rows may still be on their way)."""

    def __init__(self, out_dir: Location, manifest: dict[str, Any], overwrite: bool, every_s: float):
        self.checkpoint = Checkpoint.open(out_dir, manifest, overwrite, command=manifest["command"])
        parts = self.checkpoint.tables()
        self.saved = pa.concat_tables([p.replace_schema_metadata(None) for p in parts]) if parts else None
        shards = self.checkpoint.root / "shards"
        self.index = len(shards.iterdir()) if shards.is_dir() else 0
        self.every_s = every_s
        self.pending: list[pa.Table] = []
        self.last_save = time.monotonic()
        self.last_key: str | None = None

    def add(self, rows: pa.Table) -> None:
        """Rows as the actors returned them: those not resumed are kept to save."""
        if rows.num_rows == 0:
            return
        self.last_key = rows[BATCH_COLUMN][-1].as_py()
        self.pending.append(rows.filter(pa.compute.invert(rows[RESUMED_COLUMN])).drop_columns([RESUMED_COLUMN]))
        if time.monotonic() - self.last_save >= self.every_s:
            self.save(final=False)

    @contextmanager
    def kept_on_stop(self) -> Iterator[None]:
        """Whatever stops the stream (Ctrl-C, SIGTERM, the watchdog, a failed batch), the whole batches that came
        back are saved on the way out, not only those of the last interval: the rerun resumes from them."""
        try:
            yield
        except BaseException:
            self.save(final=False)
            raise

    def save(self, final: bool) -> None:
        """Save the pending rows but (unless final) the last batch's, which may not be whole yet."""
        if not self.pending:
            return
        rows = pa.concat_tables(self.pending)
        keep = 0
        if not final:
            keys = rows[BATCH_COLUMN].to_pylist()
            while keep < len(keys) and keys[len(keys) - 1 - keep] == self.last_key:
                keep += 1
        done, self.pending = rows.slice(0, rows.num_rows - keep), [rows.slice(rows.num_rows - keep)] if keep else []
        if done.num_rows:
            self.checkpoint.save_table(self.index, done)
            self.index += 1
        self.last_save = time.monotonic()
