"""`raylm contamination`'s driver: task queries -> n-gram index -> corpus streamed through Ray Data -> overlaps.

The task n-grams' filter (word ids and hashes, megabytes for a whole benchmark suite) is put in the object store
once and every actor of the pool fetches it when it starts. The corpus is never materialised: Ray Data reads
blocks, the actors turn batches of rows into candidate n-grams (raylm.contamination.ngrams, plain Python), and the
driver confirms each candidate against the task n-grams' text, counts rows per file (output order is input order,
so a row's index in its file is counted on the driver), and appends the matches to a Parquet file renamed only
once the scan succeeds. The driver keeps only which task n-grams were found, so its memory depends on the tasks,
not on the corpus. An actor that dies is restarted by Ray Data and its batches run again (their output had not
reached the driver); any other failure leaves no partial results behind.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import ray
from tqdm import tqdm

from raylm.cluster.runtime import connect, local_cpus_needed, node_resources
from raylm.contamination import DEFAULT_NGRAM
from raylm.contamination.documents import ScanTasks, load_scan_tasks
from raylm.contamination.ngrams import NgramFilter, NgramIndex, TaskDocument, words
from raylm.corpus import READ_CPUS, SCAN_ROWS_PER_BATCH
from raylm.corpus.read import FORMATS, read_corpus
from raylm.requests.documents import document_texts
from raylm.corpus.stream import PartialParquet, stream_batches
from raylm.errors import RaylmError
from raylm.storage.location import Location, location
from raylm.storage.lock import output_lock

MATCHES = "matches.parquet"
MATCH_SCHEMA = pa.schema([("task", pa.string()), ("doc_id", pa.int64()), ("file", pa.string()), ("row", pa.int64()),
                          ("ngram", pa.string()), ("offset", pa.int64())])
_FLUSH_ROWS = 8192
_CANDIDATE = pa.struct([("row", pa.int64()), ("offset", pa.int64()), ("ngram", pa.string())])


@dataclass(frozen=True)
class ScanConfig:
    tasks: tuple[str, ...]
    corpus: tuple[str, ...]  # files, directories or globs, local or any pyarrow filesystem URI
    fmt: str = "auto"
    text_column: str = "text"
    ngram: int = DEFAULT_NGRAM
    data_dir: Path | None = None
    include_path: Path | None = None
    limit: int | None = None  # first N documents of each task
    limit_docs: int | None = None  # first N corpus documents
    actors: int | None = None
    docs_per_batch: int = SCAN_ROWS_PER_BATCH
    progress: bool = True

    def validate(self) -> None:
        if not self.tasks:
            raise RaylmError("no tasks given")
        if not self.corpus:
            raise RaylmError("no corpus given (--corpus PATHS)")
        if self.fmt not in FORMATS:
            raise RaylmError(f"unknown --format '{self.fmt}' (use {', '.join(FORMATS)})")
        if self.include_path is not None and not self.include_path.is_dir():
            raise RaylmError(f"--include-path '{self.include_path}' is not a directory")
        for name, value in (("--ngram", self.ngram), ("--limit", self.limit), ("--limit-docs", self.limit_docs),
                            ("--actors", self.actors), ("--docs-per-batch", self.docs_per_batch)):
            if value is not None and value < 1:
                raise RaylmError(f"{name} must be at least 1, got {value}")


@dataclass
class ScanResult:
    config: ScanConfig
    tasks: ScanTasks
    index: NgramIndex
    found: dict[int, set[int]]  # task document index -> word indices where a found n-gram starts
    corpus_rows: int = 0
    corpus_bytes: int = 0
    files: int = 0
    collisions: int = 0  # candidates whose hash was a task n-gram's but whose text was not
    match_rows: int = 0
    actors: int = 0
    wall_s: float = 0.0
    stream_s: float = 0.0  # of wall_s, the corpus streaming through the actors (their start-up included)
    per_file: dict[str, int] = field(default_factory=dict)


class NgramScan:
    """Ray Data callable: a batch of corpus rows -> one row per run of rows from the same file, with its row count,
    UTF-8 bytes and candidate n-grams (row within the run, code-point offset, n-gram text)."""

    def __init__(self, filter_ref: list[ray.ObjectRef]):
        self.filter: NgramFilter = ray.get(filter_ref[0])

    def __call__(self, batch: pa.Table) -> pa.Table:
        texts = document_texts(batch)
        paths = batch["path"].to_pylist()
        sizes = pc.binary_length(batch["text"]).to_pylist()
        runs: list[tuple[str, int, int]] = []  # (path, first row in batch, rows)
        for i, path in enumerate(paths):
            if runs and runs[-1][0] == path:
                runs[-1] = (path, runs[-1][1], runs[-1][2] + 1)
            else:
                runs.append((path, i, 1))
        found: list[list[dict]] = [[] for _ in runs]
        run_of = [r for r, (_, _, rows) in enumerate(runs) for _ in range(rows)]
        for c in self.filter.candidates(texts):
            r = run_of[c.doc]
            found[r].append({"row": c.doc - runs[r][1], "offset": c.offset, "ngram": c.ngram})
        return pa.table({
            "path": pa.array([p for p, _, _ in runs], pa.string()),
            "rows": pa.array([rows for _, _, rows in runs], pa.int64()),
            "bytes": pa.array([sum(s or 0 for s in sizes[start:start + rows]) for _, start, rows in runs], pa.int64()),
            "candidates": pa.array(found, pa.list_(_CANDIDATE)),
        })


def build_index(tasks: ScanTasks, n: int) -> NgramIndex:
    return NgramIndex([TaskDocument(t.name, doc_id, words(query)) for t in tasks.tasks.values()
                       for doc_id, query in t.queries], n)


def default_actors() -> int:
    """All the cluster's CPUs but the one Ray Data's read tasks keep."""
    return max(1, int(_cluster_cpus() - READ_CPUS))


def actor_cpus(actors: int) -> float:
    """A scanning actor is one Python thread: a whole CPU where the cluster has one for each actor beside the read
    tasks' (a local Ray is started with that many), else an equal share of what the read tasks leave, so that the
    stream never waits with every CPU held by an actor that waits for input."""
    share = (_cluster_cpus() - READ_CPUS) / actors
    return 1.0 if share >= 1 else max(0.01, round(share, 2))


def _cluster_cpus() -> float:
    return sum(r.get("CPU", 0.0) for r in node_resources())


def run_scan(cfg: ScanConfig, out_dir: str | os.PathLike[str] | Location,
             on_batch: Callable[[int], None] | None = None) -> ScanResult:
    """Scan the corpus for the tasks' n-grams; matches go to out_dir/matches.parquet, written under DIR's lock
    (raylm.storage.lock). `on_batch` runs on the driver after each output batch with the number of batches so far
    (progress hooks, fault drills)."""
    cfg.validate()
    out_dir = location(out_dir)
    with output_lock(out_dir):
        return _run_scan(cfg, out_dir, on_batch)


def _run_scan(cfg: ScanConfig, out_dir: Location, on_batch: Callable[[int], None] | None) -> ScanResult:
    import ray.data  # see raylm.corpus.read.read_corpus

    start = time.time()
    tasks = load_scan_tasks(cfg.tasks, cfg.data_dir, cfg.include_path, cfg.limit)
    index = build_index(tasks, cfg.ngram)
    connect(min_cpus=local_cpus_needed(cfg.actors, READ_CPUS))
    ds = read_corpus(list(cfg.corpus), cfg.fmt, cfg.text_column, cfg.limit_docs, keep_empty_lines=True)
    n = cfg.actors or default_actors()
    filter_ref = ray.put(index.filter)
    scanned = ds.map_batches(NgramScan, fn_constructor_args=([filter_ref],), batch_size=cfg.docs_per_batch,
                             batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=n),
                             num_cpus=actor_cpus(n))
    result = ScanResult(cfg, tasks, index, defaultdict(set), actors=n)
    streaming = time.time()
    _stream(scanned, result, out_dir / MATCHES, on_batch)
    result.wall_s, result.stream_s = time.time() - start, time.time() - streaming
    return result


def _stream(scanned: ray.data.Dataset, result: ScanResult, matches: Location,
            on_batch: Callable[[int], None] | None) -> None:
    owners: dict[str, list[tuple[int, int]]] = {}
    pending: dict[str, list] = {name: [] for name in MATCH_SCHEMA.names}
    documents = result.index.documents
    with PartialParquet(matches, MATCH_SCHEMA) as out, tqdm(
            unit="B", unit_scale=True, unit_divisor=1024, disable=not result.config.progress, desc="scanning") as bar:
        for batches, batch in enumerate(stream_batches(scanned, "contamination scan"), 1):
            for path, rows, size, candidates in zip(*(batch[c].to_pylist() for c in
                                                      ("path", "rows", "bytes", "candidates"))):
                base = result.per_file.get(path, 0)
                result.per_file[path] = base + rows
                result.corpus_rows += rows
                result.corpus_bytes += size
                for c in candidates:
                    if c["ngram"] not in owners:
                        owners[c["ngram"]] = result.index.owners(c["ngram"])
                    found = owners[c["ngram"]]
                    if not found:
                        result.collisions += 1
                    seen = set()
                    for d, k in found:
                        result.found[d].add(k)
                        if d in seen:
                            continue
                        seen.add(d)
                        for key, value in (("task", documents[d].task), ("doc_id", documents[d].doc_id),
                                           ("file", path), ("row", base + c["row"]), ("ngram", c["ngram"]),
                                           ("offset", c["offset"])):
                            pending[key].append(value)
                bar.update(size)
            if len(pending["task"]) >= _FLUSH_ROWS:
                result.match_rows += _flush(out, pending)
            if on_batch is not None:
                on_batch(batches)
        result.match_rows += _flush(out, pending)
    result.files = len(result.per_file)


def _flush(out: PartialParquet, pending: dict[str, list]) -> int:
    rows = len(pending["task"])
    if rows:
        out.write(pa.table(pending, schema=MATCH_SCHEMA))
        for column in pending.values():
            column.clear()
    return rows
