"""`raylm contamination`: corpus throughput and memory.

Throughput: the same Parquet corpus scanned for the same tasks' 13-grams by
- lm-eval's own way, in one process: each document's `word_ngrams(Janitor.normalize_string(doc), 13)` looked up
  in the set of task n-grams (decontaminate.py's lookup; the pre-built, sorted 13-gram files it expects are
  exactly this work done ahead), reading the Parquet row groups with pyarrow;
- raylm's n-gram filter in one process without Ray (raylm.contamination.ngrams: word ids, vectorised hashes);
- `raylm contamination` (run_scan) with 1 and 2 scanning actors: its whole wall time (task loading, index, Ray Data
  start-up) and its streaming time alone (the actors' start-up included), which is what a large corpus pays.
Every scanner must find the same dirty documents; MB/s is corpus text (UTF-8) over time.

Memory: corpora 1x and 4x (both larger than Ray's object store) scanned with one actor, peak memory (PSS, so the
object store's shared pages are not counted twice) of the driver, the scanning actor, the other Ray workers and
Ray's own processes, sampled every 0.5 s. A scan that held the corpus, or its matches, would peak near 4x; a
streamed one stays flat.

The corpus is real text: WikiText-2 validation lines (no task uses them), shuffled into documents of ~40 lines,
with one task query injected (re-cased) every `--inject-every` documents, so the match path runs too.

    PYTHONPATH=$PWD python bench/contamination.py [--mb 100] [--object-store-mb 80]
        [--tasks hellaswag,winogrande,wikitext]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import random
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from common import DATA
from ppl_memory import ROLES, MemorySampler

DOC_LINES = 40
SHARD_MB = 32


def make_corpus(directory: Path, megabytes: float, queries: list[str], inject_every: int, seed: int) -> int:
    """Parquet shards of ~SHARD_MB of text each, `megabytes` in all; returns the document count."""
    directory.mkdir(parents=True)
    lines = [line.strip() for line in (DATA / "wikitext-2" / "valid.txt").read_text().splitlines() if line.strip()]
    rng = random.Random(seed)
    target, written, docs, shard, texts, size = megabytes * 2**20, 0, 0, 0, [], 0
    while written < target:
        text = "\n".join(rng.choices(lines, k=DOC_LINES))
        if docs % inject_every == inject_every - 1:
            text += "\n" + rng.choice(queries).upper()
        texts.append(text)
        docs += 1
        n = len(text.encode())
        written, size = written + n, size + n
        if size >= SHARD_MB * 2**20 or written >= target:
            pq.write_table(pa.table({"text": texts}), directory / f"shard-{shard:05d}.parquet", row_group_size=256)
            shard, texts, size = shard + 1, [], 0
    return docs


def corpus_bytes(directory: Path) -> int:
    return sum(sum(len(t.encode()) for t in pq.read_table(p, columns=["text"])["text"].to_pylist())
               for p in sorted(directory.glob("*.parquet")))


def lmeval_reference(directory: Path, tasks) -> tuple[float, int]:
    """lm-eval's Janitor n-grams, one process: (wall s, dirty task documents)."""
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        from lm_eval.decontamination.janitor import Janitor, word_ngrams  # prints that its C++ module is missing
    start = time.perf_counter()
    janitor = Janitor()
    lookup: dict[str, list[tuple[str, int]]] = {}
    for task in tasks.tasks.values():
        for doc_id, query in task.queries:
            for gram in word_ngrams(janitor.normalize_string(query), 13):
                lookup.setdefault(gram, []).append((task.name, doc_id))
    dirty = set()
    for path in sorted(directory.glob("*.parquet")):
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            for text in file.read_row_group(group, columns=["text"])["text"].to_pylist():
                for gram in word_ngrams(janitor.normalize_string(text), 13):
                    if gram in lookup:
                        dirty.update(lookup[gram])
    return time.perf_counter() - start, len(dirty)


def filter_in_process(directory: Path, tasks) -> tuple[float, int]:
    """raylm's NgramFilter, one process, no Ray: (wall s, dirty task documents)."""
    from raylm.contamination.scan import build_index

    start = time.perf_counter()
    index = build_index(tasks, 13)
    dirty = set()
    for path in sorted(directory.glob("*.parquet")):
        file = pq.ParquetFile(path)
        for group in range(file.num_row_groups):
            texts = file.read_row_group(group, columns=["text"])["text"].to_pylist()
            for c in index.filter.candidates(texts):
                dirty.update(d for d, _ in index.owners(c.ngram))
    return time.perf_counter() - start, len(dirty)


def raylm_scan(directory: Path, out: Path, task_names, actors: int, sampler: MemorySampler | None = None
               ) -> tuple[float, int, dict]:
    from raylm.contamination.report import contamination_dict
    from raylm.contamination.scan import ScanConfig, run_scan

    cfg = ScanConfig(tuple(task_names), (str(directory / "*.parquet"),), data_dir=DATA, actors=actors,
                     progress=False)
    if sampler is not None:
        sampler.start()
    start = time.perf_counter()
    result = run_scan(cfg, out)
    wall = time.perf_counter() - start
    if sampler is not None:
        sampler.stop.set()
        sampler.join()
    report = contamination_dict(result)
    return wall, sum(t["dirty"] for t in report["tasks"].values()), report


def peak(sampler: MemorySampler) -> dict[str, float]:
    totals = [sum(pss for _, pss in s.values()) for s in sampler.samples]
    row = {"all": max(totals) / 2**20}
    for r in ROLES:
        row[r] = max(s[r][1] for s in sampler.samples) / 2**20
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=100, help="size of the 1x corpus in MB of text")
    parser.add_argument("--object-store-mb", type=int, default=80)
    parser.add_argument("--tasks", default="hellaswag,winogrande,wikitext", help="native tasks (tests/data)")
    parser.add_argument("--inject-every", type=int, default=500, help="one task query per this many documents")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.pop("RAY_ADDRESS", None)
    import ray

    from raylm.contamination.documents import load_scan_tasks

    names = [t for t in args.tasks.split(",") if t]
    tasks = load_scan_tasks(tuple(names), DATA, None, None)
    queries = [q for t in tasks.tasks.values() for _, q in t.queries if 13 <= len(q.split()) <= 200]
    # As `raylm contamination --actors 2` starts its local Ray: a logical CPU per actor and one for the read tasks,
    # sharing the machine's cores where it has fewer.
    ray.init(address="local", num_cpus=max(os.cpu_count(), 3), include_dashboard=False, log_to_driver=False,
             object_store_memory=args.object_store_mb * 2**20)
    ray.data.DataContext.get_current().enable_progress_bars = False
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        corpora = {}
        for scale in (1, 4):
            docs = make_corpus(root / f"corpus-{scale}x", args.mb * scale, queries, args.inject_every, scale)
            corpora[scale] = (docs, corpus_bytes(root / f"corpus-{scale}x"))
            print(f"{scale}x corpus: {docs} documents, {corpora[scale][1] / 2**20:.1f} MB of text", file=sys.stderr,
                  flush=True)
        one = root / "corpus-1x"
        mb = corpora[1][1] / 2**20
        rows = []
        wall, dirty = lmeval_reference(one, tasks)
        rows.append(("lm-eval Janitor + set lookup, 1 process", "-", wall, wall, dirty))
        print(f"reference done: {wall:.1f} s", file=sys.stderr, flush=True)
        wall, dirty = filter_in_process(one, tasks)
        rows.append(("raylm n-gram filter, 1 process, no Ray", "-", wall, wall, dirty))
        for actors in (1, 2):
            wall, dirty, report = raylm_scan(one, root / f"out-{actors}", names, actors)
            rows.append(("raylm contamination (run_scan)", str(actors), wall, report["config"]["stream_time_s"], dirty))
            print(f"{actors} actor(s) done: {wall:.1f} s", file=sys.stderr, flush=True)
        memory = {}
        for scale in (1, 4):
            sampler = MemorySampler()
            wall, dirty, report = raylm_scan(root / f"corpus-{scale}x", root / f"mem-{scale}", names, 1, sampler)
            memory[scale] = {"wall": wall, "dirty": dirty, "mb": corpora[scale][1] / 2**20,
                             "matches": report["corpus"]["match_rows"], **peak(sampler)}
            print(f"{scale}x memory run done: {wall:.1f} s", file=sys.stderr, flush=True)
    reference = rows[0][2]
    print(f"tasks: {', '.join(names)} ({sum(len(t.queries) for t in tasks.tasks.values())} documents); corpus "
          f"{mb:.1f} MB of text in {corpora[1][0]} documents; {os.cpu_count()} cores; object store "
          f"{args.object_store_mb} MB")
    print("| scanner | actors | wall s | MB/s | vs lm-eval's way | streaming s | MB/s streaming | dirty documents |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for label, actors, wall, stream, dirty in rows:
        print(f"| {label} | {actors} | {wall:.1f} | {mb / wall:.2f} | {reference / wall:.2f}x | {stream:.1f} | "
              f"{mb / stream:.2f} | {dirty} |")
    if len({dirty for *_, dirty in rows}) != 1:
        print("MISMATCH: the scanners disagree on the dirty documents")
        return 1
    print("\npeak PSS in MB, 1 scanning actor ('scoring actor' is the Ray Data map actor)")
    print(f"| corpus | text MB | wall s | match rows | all | {' | '.join(ROLES)} |")
    print(f"|---|---:|---:|---:|---:|{'---:|' * len(ROLES)}")
    for scale, m in memory.items():
        print(f"| {scale}x | {m['mb']:.0f} | {m['wall']:.0f} | {m['matches']} | {m['all']:.0f} | "
              + " | ".join(f"{m[r]:.0f}" for r in ROLES) + " |")
    print(f"ratio 4x/1x: text {memory[4]['mb'] / memory[1]['mb']:.2f}, all {memory[4]['all'] / memory[1]['all']:.2f}, "
          + ", ".join(f"{r} {memory[4][r] / memory[1][r]:.2f}" for r in ROLES if memory[1][r]))
    ray.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
