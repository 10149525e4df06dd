"""The driver's whole job, top to bottom: rows -> requests -> shards -> actors -> sums -> metrics."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace

import pyarrow as pa

from raylm.cluster.runtime import ActorHandle, LaunchedActors, connect, gcs_address, plan_actors
from raylm.cluster.scheduler import ScheduleReport, score_shards
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.requests.encoding import Encoder, resolve_max_length
from raylm.requests.masked import MaskedEncoder, masked_max_length
from raylm.requests.shards import ScoredShard, Shard, make_shards
from raylm.requests.table import build_requests
from raylm.results.checkpoint import Checkpoint, fingerprint
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.results.model_identity import pin_revision
from raylm.results.report import EvalResult, TaskResult, prefix_sharing, run_summary
from raylm.results.sums import merge
from raylm.scoring.models import (ModelSpec, check_model_path, load_config, load_tokenizer, looks_local,
                                  resolve_scorer)
from raylm.tasks import ChoiceDoc, get_task
from raylm.tasks.base import with_fewshot

log = logging.getLogger(__name__)

# One tokenizer per model for the driver's lifetime: a sweep or soak evaluating the same model again and again
# would otherwise grow the driver by megabytes per run (each new fast tokenizer keeps native memory once used).
driver_tokenizer = functools.lru_cache(maxsize=4)(load_tokenizer)


TaskDocs = dict[str, tuple[list, int]]  # task -> (documents to score, document count before --limit)


def load_task_docs(cfg: EvalConfig) -> TaskDocs:
    """Every task's documents (few-shot examples attached), read and validated before any Ray work starts, so
    that bad data fails at once with its file, row and field."""
    out: TaskDocs = {}
    for name in cfg.tasks:
        task = get_task(name)
        docs = task.load_docs(cfg.data_dir)
        if not docs:
            raise RaylmError(f"{name}: no documents to evaluate ({cfg.data_dir or 'the hub'} gave none)")
        original = len(docs)
        docs = docs[: cfg.limit] if cfg.limit else docs
        if cfg.num_fewshot and task.kind == "multiple_choice":
            if task.load_fewshot_pool is None:
                raise RaylmError(f"{name}: has no few-shot pool")
            pool = task.load_fewshot_pool(cfg.data_dir)
            docs = with_fewshot(task, [d for d in docs if isinstance(d, ChoiceDoc)], pool, cfg.num_fewshot, cfg.seed)
        elif cfg.num_fewshot:
            log.warning("%s is scored zero-shot: few-shot examples do not apply to rolling loglikelihood", name)
        out[name] = (docs, original)
    return out


def encode_task_requests(docs: TaskDocs, encoder: Encoder | MaskedEncoder) -> dict[str, tuple[str, pa.Table]]:
    """Every task's requests as an Arrow table of token ids."""
    return {name: (get_task(name).kind, build_requests(get_task(name), task_docs, encoder))
            for name, (task_docs, _) in docs.items()}


def build_task_requests(cfg: EvalConfig, encoder: Encoder | MaskedEncoder
                        ) -> tuple[dict[str, tuple[str, pa.Table]], dict[str, int]]:
    """Every task's requests, plus each task's document count before --limit (benchmarks and tests)."""
    docs = load_task_docs(cfg)
    return encode_task_requests(docs, encoder), {name: original for name, (_, original) in docs.items()}


def driver_encoder(spec: ModelSpec) -> Encoder | MaskedEncoder:
    """The tokenizer and context length the driver tokenises with (the model's config, not its weights): a
    MaskedEncoder when the model is scored as a masked LM."""
    tokenizer = driver_tokenizer(spec)
    config = load_config(spec)
    kind = resolve_scorer(spec, config)
    if kind == "causal" and spec.pll != "original":
        raise RaylmError(f"--pll {spec.pll} applies to masked language models; '{spec.path}' is scored as a causal "
                         "LM (pass --scorer mlm if it is a masked LM)")
    try:
        if kind == "mlm":
            return MaskedEncoder(tokenizer, masked_max_length(config, tokenizer))
        encoder = Encoder(tokenizer, resolve_max_length(config, tokenizer))
    except ValueError as e:
        raise RaylmError(str(e)) from e
    log.info("empty contexts and rolling windows are conditioned on token %d (%r)", encoder.prefix_token,
             tokenizer.decode(encoder.prefix_token))
    return encoder


def scored_spec(spec: ModelSpec, encoder: Encoder | MaskedEncoder) -> ModelSpec:
    """spec with the scorer it is scored with, as checkpoints and results record it."""
    return replace(spec, scorer="mlm" if isinstance(encoder, MaskedEncoder) else "causal")


def _tokenise(spec: ModelSpec, docs: TaskDocs) -> tuple[Encoder | MaskedEncoder, dict[str, tuple[str, pa.Table]]]:
    encoder = driver_encoder(spec)
    return encoder, encode_task_requests(docs, encoder)


def evaluate(cfg: EvalConfig, actors: list[ActorHandle] | None = None,
             on_shard: Callable[[Shard, ScoredShard], None] | None = None) -> EvalResult:
    """Run every task of cfg on the given actors (or on new ones, started and released here).

    With cfg.output, finished shards are checkpointed there and a rerun scores only the missing ones. A dead
    actor is replaced; in a caller's `actors` list it is swapped for its replacement, so the list stays usable.
    `on_shard` runs on the driver after each shard is scored and checkpointed (progress hooks, fault drills).
    """
    cfg.validate()
    check_model_path(cfg.model)
    start = time.time()
    asked = cfg
    # One commit for the driver's tokenizer, every actor (replacements too) and the checkpoint's fingerprint.
    cfg = replace(cfg, model=pin_revision(cfg.model))
    docs = load_task_docs(cfg)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="raylm-tokenise") as tokenising:
        # Tokenising on a thread while Ray starts and the actors load their models: on a small machine these
        # fixed costs are most of a short run's wall time, and they do not depend on each other.
        encoded = tokenising.submit(_tokenise, cfg.model, docs)
        launched = _launch(cfg) if actors is None else None
        try:
            encoder, tables = encoded.result()
            shards = make_shards(tables, cfg.shard_requests)
            checkpoint = None
            if cfg.output is not None:
                manifest = fingerprint(scored_spec(cfg.model, encoder), cfg.tasks, tables, shards, cfg.num_fewshot,
                                       cfg.seed, cfg.limit)
                checkpoint = Checkpoint.open(cfg.output, manifest, cfg.overwrite)
            scored = checkpoint.load(shards) if checkpoint else {}
            resumed = len(scored)
            todo = [s for s in shards if s.index not in scored]
            report = ScheduleReport([], 0, 0, [])
            if todo:
                def finished(shard: Shard, result: ScoredShard) -> None:
                    if checkpoint is not None:
                        checkpoint.save(shard, result)
                    if on_shard is not None:
                        on_shard(shard, result)

                pool = launched.wait_ready() if launched is not None else actors
                recipe = launched.recipe if launched is not None else plan_actors(
                    cfg.model, len(actors), cfg.batch_size, cfg.num_gpus, cfg.num_cpus)[0]
                report = score_shards(pool, recipe, todo, cfg.progress, finished)
                scored.update((s.index, r) for s, r in zip(todo, report.results))
        finally:
            if launched is not None:
                launched.release()
    results = {}
    for name, (kind, requests) in tables.items():
        mine = [scored[s.index] for s in shards if s.task == name]
        table = pa.concat_tables(s.table for s in mine)
        if table.num_rows != requests.num_rows:
            raise RaylmError(f"{name}: {table.num_rows} results for {requests.num_rows} requests")
        sums = merge([s.sums for s in mine])
        metrics = rolling_metrics(sums) if kind == "rolling" else choice_metrics(sums, get_task(name).choice_metrics)
        results[name] = TaskResult(name, kind, metrics, sums, docs[name][1], table)
    wall = time.time() - start
    scorer = scored_spec(cfg.model, encoder).scorer
    extra = {"scorer": scorer, "pll": cfg.model.pll if scorer == "mlm" else None,
             "shards": len(shards), "max_length": encoder.max_length,
             "prefix_sharing": prefix_sharing(scored[s.index].prefix_sharing for s in shards),
             "requests_scored": sum(s.table.num_rows for s in todo), "shards_retried": report.retried,
             "shards_resumed": resumed, "actors_replaced": report.replaced, "ray_gcs_address": gcs_address(),
             "model_commit": None if looks_local(cfg.model.path) else cfg.model.revision}
    log.info("%s", run_summary(extra, wall))
    return EvalResult(asked, results, wall, extra)


def _launch(cfg: EvalConfig) -> LaunchedActors:
    connect()
    recipe, n = plan_actors(cfg.model, cfg.actors, cfg.batch_size, cfg.num_gpus, cfg.num_cpus)
    return LaunchedActors(recipe, n)
