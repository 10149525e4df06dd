"""`raylm membership`'s driver: every task document's query text -> a Ray Data pool of model actors -> per-token
log-probs -> Min-K% Prob and zlib ratio per document (raylm.scoring.membership) -> a summary per task.

The text scored is the document's decontamination query, the text `raylm contamination` searches the corpus
for, so a document's overlap and its membership scores describe the same words. It is scored whole, as `raylm ppl`
scores a document (raylm.corpus.doc_scoring.DocMembership): the tokenizer's own encoding, lm-eval's disjoint
rolling windows (conditioned on the BOS, else EOS, token), every token scored once, in float64. Documents travel
as a small Ray Dataset; each actor holds the model and turns a batch of documents into one row each. The rows are
checkpointed under the output as they come, as `raylm ppl`'s are (raylm.corpus.resume), keyed to the documents,
the model and the options, so that the same command after a kill scores only the rest.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from tqdm import tqdm

from raylm.cluster.runtime import connect, local_cpus_needed, plan_actors
from raylm.contamination.documents import load_scan_tasks
from raylm.cluster.checkpoint import table_digest
from raylm.corpus import CHECKPOINT_EVERY_S, MEMBERSHIP_DOCS_PER_BATCH
from raylm.corpus.doc_scoring import DocMembership, take_prefix_sharing
from raylm.corpus.resume import RESUMED_COLUMN, CorpusCheckpoint, Resuming, corpus_manifest
from raylm.corpus.run import model_max_length
from raylm.corpus.stream import stream_batches
from raylm.errors import RaylmError
from raylm.models.identity import pin_revision, scored_commit
from raylm.models.spec import ModelSpec, check_model_path
from raylm.results.report import prefix_sharing, run_config
from raylm.scoring.membership import DEFAULT_K, check_k
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location
from raylm.storage.lock import output_lock
from raylm.storage.ownership import check_results_owner, tagged

MEMBERSHIP_JSON = "membership.json"
MEMBERSHIP_PARQUET = "membership.parquet"


@dataclass(frozen=True)
class MembershipConfig:
    model: ModelSpec
    tasks: tuple[str, ...]
    k: float = DEFAULT_K
    data_dir: Path | None = None
    include_path: Path | None = None
    limit: int | None = None
    actors: int | None = None
    docs_per_batch: int = MEMBERSHIP_DOCS_PER_BATCH
    progress: bool = True
    overwrite: bool = False  # discard another run's checkpoint in the output directory
    checkpoint_every_s: float = CHECKPOINT_EVERY_S

    def validate(self) -> None:
        if not self.tasks:
            raise RaylmError("no tasks given")
        try:
            check_k(self.k)
        except ValueError as e:
            raise RaylmError(str(e)) from e
        if self.include_path is not None and not self.include_path.is_dir():
            raise RaylmError(f"--include-path '{self.include_path}' is not a directory")
        if self.checkpoint_every_s < 0:
            raise RaylmError(f"--checkpoint-every must not be negative, got {self.checkpoint_every_s:g}")
        for name, value in (("--max-length", self.model.max_length), ("--limit", self.limit),
                            ("--actors", self.actors), ("--docs-per-batch", self.docs_per_batch)):
            if value is not None and value < 1:
                raise RaylmError(f"{name} must be at least 1, got {value}")
        self.model.validate()


def check_output(out_dir: Location) -> None:
    check_results_owner(out_dir, "membership", MEMBERSHIP_JSON, (MEMBERSHIP_PARQUET,))


def run_membership(cfg: MembershipConfig, out_dir: str | os.PathLike[str] | Location) -> dict[str, Any]:
    """Score every document's query text; write DIR/membership.parquet (per document) and DIR/membership.json.
    DIR's lock is held meanwhile (raylm.storage.lock), taken before any work."""
    cfg.validate()
    out_dir = location(out_dir)
    with output_lock(out_dir):
        check_output(out_dir)
        return _run_membership(cfg, out_dir)


def _run_membership(cfg: MembershipConfig, out_dir: Location) -> dict[str, Any]:
    import ray.data  # see raylm.corpus.read.read_corpus

    start = time.time()
    asked = cfg
    check_model_path(cfg.model)
    cfg = replace(cfg, model=pin_revision(cfg.model))
    _, max_length, scorer = model_max_length(cfg.model)  # the model's context, or --max-length
    if scorer == "mlm":
        raise RaylmError(f"'{cfg.model.path}' is a masked LM; Min-K% Prob and the zlib ratio need a causal LM's "
                         "next-token log-probabilities")
    tasks = load_scan_tasks(cfg.tasks, cfg.data_dir, cfg.include_path, cfg.limit)
    table = pa.table({
        "task": pa.array([t.name for t in tasks.tasks.values() for _ in t.queries], pa.string()),
        "doc_id": pa.array([d for t in tasks.tasks.values() for d, _ in t.queries], pa.int64()),
        "text": pa.array([q for t in tasks.tasks.values() for _, q in t.queries], pa.string()),
    })
    table = table.append_column("path", table["task"])  # what a bad document's error names
    connect(min_cpus=local_cpus_needed(cfg.actors))
    recipe, n = plan_actors(cfg.model, cfg.actors, None)
    manifest = corpus_manifest("membership", [cfg.model], [{"task_documents": table_digest(table)}],
                               {"k": cfg.k, "max_length": max_length, "docs_per_batch": cfg.docs_per_batch})
    # One block per batch, cut here rather than by a Ray Data task (the actors hold every CPU): each batch's rows
    # reach the driver, and the checkpoint, as soon as it is scored (raylm.corpus.resume.blocks_of_batches).
    step = cfg.docs_per_batch
    ds = ray.data.from_arrow([table.slice(i, step) for i in range(0, table.num_rows, step)] or [table])
    ds.context.execution_options.preserve_order = True
    parts = []
    verdicts: set[str] = set()
    resumed = 0
    with CorpusCheckpoint(out_dir, manifest, cfg.overwrite, cfg.checkpoint_every_s) as checkpoint:
        # The actors load onto the placement's device (recipe.spec), as `raylm ppl`'s do.
        scored = ds.map_batches(
            Resuming, fn_constructor_args=(DocMembership, (recipe.spec, max_length, cfg.k, recipe.threads),
                                           checkpoint.saved),
            batch_size=cfg.docs_per_batch, batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=n),
            **recipe.options())
        with tqdm(total=table.num_rows, unit="doc", disable=not cfg.progress, desc="scoring") as bar:
            for batch in stream_batches(scored, "membership scoring"):
                resumed += pc.sum(batch[RESUMED_COLUMN]).as_py() or 0
                parts.append(take_prefix_sharing(checkpoint.add(batch), verdicts))
                bar.update(batch.num_rows)
        checkpoint.save(final=True)
    rows = pa.concat_tables(parts)
    sink = pa.BufferOutputStream()
    pq.write_table(tagged(rows), sink)
    write_atomic(out_dir / MEMBERSHIP_PARQUET, sink.getvalue().to_pybytes())
    report = {
        "k": cfg.k,
        "tasks": {name: task_summary(rows, name) for name in tasks.tasks},
        "config": run_config(asked.model, time.time() - start, command="membership", tasks=list(cfg.tasks),
                             k=cfg.k, max_length=max_length, limit=cfg.limit, actors=n,
                             data_dir=str(cfg.data_dir) if cfg.data_dir else None,
                             include_path=str(cfg.include_path) if cfg.include_path else None,
                             prefix_sharing=prefix_sharing(sorted(verdicts)),
                             model_commit=scored_commit(cfg.model), docs_resumed=resumed),
    }
    write_atomic(out_dir / MEMBERSHIP_JSON, json.dumps(report, indent=2).encode())
    return report


def task_summary(rows: pa.Table, task: str) -> dict[str, Any]:
    mine = rows.filter(pc.equal(rows["task"], task))
    out: dict[str, Any] = {"documents": mine.num_rows, "tokens": int(sum(mine["tokens"].to_pylist()))}
    for column in ("min_k_prob", "zlib_ratio"):
        values = [v for v in mine[column].to_pylist() if not math.isnan(v)]
        out[f"{column}_mean"] = math.fsum(values) / len(values) if values else math.nan
        out[f"{column}_median"] = statistics.median(values) if values else math.nan
    return out


def format_table(report: dict[str, Any]) -> str:
    k = f"{report['k']:g}"
    w = max([len("task"), *map(len, report["tasks"])])
    lines = [f"| {'task':<{w}} | {'documents':>9} | {'tokens':>9} | {f'Min-{k}% mean':>13} | {'median':>8} | "
             f"{'zlib ratio mean':>15} | {'median':>8} |",
             f"|{'-' * (w + 2)}|{'-' * 10}:|{'-' * 10}:|{'-' * 14}:|{'-' * 9}:|{'-' * 16}:|{'-' * 9}:|"]
    for name, s in report["tasks"].items():
        lines.append(f"| {name:<{w}} | {s['documents']:>9} | {s['tokens']:>9} | {s['min_k_prob_mean']:>13.4f} | "
                     f"{s['min_k_prob_median']:>8.4f} | {s['zlib_ratio_mean']:>15.6f} | "
                     f"{s['zlib_ratio_median']:>8.6f} |")
    lines.append(f"Min-{k}% Prob: mean of the lowest {k}% token log-probs (higher: more member-like); zlib ratio: "
                 "mean NLL / zlib bytes (lower: more member-like). Weak, model-side evidence; overlap with the "
                 "corpus (`raylm contamination`) is the evidence.")
    return "\n".join(lines)
