"""The driver's whole job, top to bottom: rows (or lm-eval's tasks) -> requests -> shards -> actors -> sums ->
metrics. How it starts, so that Ray, the first actor and the build overlap, is raylm.evaluate.startup's."""

from __future__ import annotations

import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raylm.cluster.checkpoint import RAYLM_ROOT, Checkpoint, fingerprint, scored_with, source_digest
from raylm.cluster.runtime import (
    ActorHandle,
    connect,
    gcs_address,
    import_transformers,
    loaded_as,
    local_cpus_needed,
    plan_actors,
)
from raylm.cluster.scheduler import ScheduleReport, score_shards
from raylm.cluster.scored import ScoredShard
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.evaluate.startup import (
    Early,
    RayStarted,
    build_threads,
    first_actor,
    launch,
    parameter_count_after,
    score_while_building,
    work_left,
)
from raylm.models.identity import pin_revision, scored_commit
from raylm.models.spec import check_model_path
from raylm.requests.driver import driver_encoder, driver_sampling, prompt_format, scored_spec
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.requests.native import Tables, encode_task_requests
from raylm.requests.order import restore
from raylm.requests.shards import LMEVAL_KIND, Shard, make_shards
from raylm.results.contamination import CleanSets, read_scan
from raylm.results.decontamination import clean_documents, native_decontaminated
from raylm.results.eval_result import EvalResult, TaskResult
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.results.report import prefix_sharing, run_summary, token_counts
from raylm.results.sums import merge
from raylm.storage.lock import output_lock
from raylm.tasks import get_task
from raylm.tasks.base import row_hash
from raylm.tasks.lmeval.selection import select_lmeval
from raylm.tasks.native import TaskDocs, load_task_docs
from raylm.tasks.prompt import PromptFormat

if TYPE_CHECKING:
    from raylm.tasks.lmeval.build import Built
    from raylm.tasks.lmeval.names import Selection

log = logging.getLogger(__name__)


def tokenise(cfg: EvalConfig, docs: TaskDocs, selection: Selection | None, ray_started: RayStarted,
             on_table: Callable[[str, str, pa.Table], None] | None = None
             ) -> tuple[Encoder | MaskedEncoder, Tables, Built | None, PromptFormat]:
    """Every task's request table; `on_table(task, kind, table)` is handed each as soon as it is built, in the
    order the run's tables end up in (native tasks, then lm-eval's)."""
    encoder = driver_encoder(cfg.model)
    if cfg.apply_chat_template and isinstance(encoder, MaskedEncoder):
        raise RaylmError(f"--apply-chat-template applies to causal LMs; '{cfg.model.path}' is scored as a masked LM")
    prompt = run_prompt(cfg, encoder.tokenizer)
    tables = encode_task_requests(docs, encoder, prompt)
    if on_table is not None:
        for name, (kind, table) in tables.items():
            on_table(name, kind, table)
    built = None
    if selection is not None and ray_started.wait():
        each = (lambda name, table: on_table(name, LMEVAL_KIND, table)) if on_table is not None else None
        built, lmeval_tables = run_lmeval_requests(cfg, selection, encoder, prompt, each)
        tables.update(lmeval_tables)
    return encoder, tables, built, prompt


def _tokenise_streaming(cfg: EvalConfig, docs: TaskDocs, selection: Selection | None, ray_started: RayStarted,
                        ready: queue.Queue, importing: Future[None]
                        ) -> tuple[Encoder | MaskedEncoder, Tables, Built | None, PromptFormat]:
    """tokenise once `importing` (torch and transformers) is done, each table put on `ready` as it is built and None
    after the last (or on failure)."""
    try:
        importing.result()
        return tokenise(cfg, docs, selection, ray_started, lambda *table: ready.put(table))
    finally:
        ready.put(None)


# What each stage is handed from a run's EvalConfig (the stages take plain values; only the driver reads the config).

def run_task_docs(cfg: EvalConfig) -> TaskDocs:
    """The run's native tasks' documents (raylm.tasks.native), read before Ray starts so bad data fails first."""
    return load_task_docs(cfg.tasks, cfg.data_dir, limit=cfg.limit, samples=cfg.samples, num_fewshot=cfg.num_fewshot,
                          fewshot_seed=cfg.fewshot_seed)


def run_selection(cfg: EvalConfig) -> Selection | None:
    """The run's lm-eval tasks (raylm.tasks.lmeval.selection), resolved and checked before Ray starts."""
    return select_lmeval(cfg.tasks, cfg.include_path, model_args=cfg.model.lmeval_model_args(), metadata=cfg.metadata,
                         samples=cfg.samples, unsafe_code=cfg.confirm_run_unsafe_code)


def run_prompt(cfg: EvalConfig, tokenizer) -> PromptFormat:
    """The run's system instruction and chat template (raylm.requests.driver.prompt_format)."""
    return prompt_format(tokenizer, system_instruction=cfg.system_instruction,
                         apply_chat_template=bool(cfg.apply_chat_template), chat_template_name=cfg.chat_template_name,
                         chat_template_args=cfg.chat_template_args, multiturn=cfg.multiturn,
                         enable_thinking=cfg.enable_thinking)


def run_lmeval_requests(cfg: EvalConfig, selection: Selection, encoder: Encoder | MaskedEncoder, prompt: PromptFormat,
                        on_table: Callable[[str, pa.Table], None] | None = None) -> tuple[Built, Tables]:
    """The run's lm-eval tasks built and tokenised (raylm.requests.lmeval.build_lmeval_requests), their tables
    kept in raylm's cache directory for the next run with the same requests, tokenizer and request code (the
    requests stage's, which turns lm-eval's request text into tables: raylm.requests.cache)."""
    from raylm.requests.cache import TableCache
    from raylm.requests.lmeval import build_lmeval_requests

    return build_lmeval_requests(selection, encoder, prompt, tasks=cfg.tasks, seeds=cfg.seeds,
                                 num_fewshot=cfg.num_fewshot, limit=cfg.limit, samples=cfg.samples,
                                 gen_kwargs=cfg.gen_kwargs, sampling=lambda: driver_sampling(cfg.model),
                                 predict_only=cfg.predict_only,
                                 cache=TableCache.for_encoder(encoder, source_digest(RAYLM_ROOT / "requests")),
                                 on_table=on_table)


def run_settings(cfg: EvalConfig) -> dict[str, Any]:
    """What the checkpoint fingerprints of a run besides its model, tasks, data, shards and versions."""
    return {"num_fewshot": cfg.num_fewshot, "limit": cfg.limit,
            "seeds": {"random": cfg.random_seed, "numpy": cfg.numpy_seed, "torch": cfg.torch_seed,
                      "fewshot": cfg.fewshot_seed},
            "include_path": str(cfg.include_path.resolve()) if cfg.include_path is not None else None}


def run_manifest(cfg: EvalConfig, encoder: Encoder | MaskedEncoder, tables: Tables, shards: list[Shard]
                 ) -> dict[str, Any]:
    return fingerprint(scored_spec(cfg.model, encoder), cfg.tasks, tables, shards, run_settings(cfg))


def run_fingerprint(cfg: EvalConfig) -> dict[str, Any]:
    """The checkpoint manifest evaluate(cfg) writes, from the driver's side alone (tokenizer, config and data; no
    actor started, no weights loaded beyond their digest): what a sweep compares with a point's manifest to tell
    whether the results there are this run's."""
    cfg.validate()
    check_model_path(cfg.model)
    cfg = replace(cfg, model=pin_revision(cfg.model))
    encoder, tables, _, _ = tokenise(cfg, run_task_docs(cfg), run_selection(cfg), RayStarted(True))
    return run_manifest(cfg, encoder, tables, make_shards(tables, cfg.shard_requests))


def evaluate(cfg: EvalConfig, actors: list[ActorHandle] | None = None,
             on_shard: Callable[[Shard, ScoredShard], None] | None = None) -> EvalResult:
    """Run every task of cfg on the given actors (or on new ones, started and released here).

    With cfg.output, finished shards are checkpointed there and a rerun scores only the missing ones; the
    directory's lock (raylm.storage.lock) is held meanwhile, so a second run there stops at once. A dead
    actor is replaced; in a caller's `actors` list it is swapped for its replacement, so the list stays usable.
    `on_shard` runs on the driver after each shard is scored and checkpointed (progress hooks, fault drills).
    """
    with output_lock(cfg.output) if cfg.output is not None else nullcontext():
        return _evaluate(cfg, actors, on_shard)


def _evaluate(cfg: EvalConfig, actors: list[ActorHandle] | None,
              on_shard: Callable[[Shard, ScoredShard], None] | None) -> EvalResult:
    cfg.validate()
    check_model_path(cfg.model)
    start = time.time()
    asked = cfg
    # One commit for the driver's tokenizer, every actor (replacements too) and the checkpoint's fingerprint.
    cfg = replace(cfg, model=pin_revision(cfg.model))
    docs = run_task_docs(cfg)
    selection = run_selection(cfg)
    scan = None
    if cfg.decontaminate is not None:
        scan = CleanSets(read_scan(cfg.decontaminate), cfg.decontaminate)
        scan.require_tasks([*docs, *(selection.leaves if selection is not None else [])])
    ray_started = RayStarted(actors is not None)
    with build_threads() as tokenising:
        # Importing torch and transformers, then tokenising (and building lm-eval's requests), on a thread while Ray
        # starts and the first actor loads its model: on a small machine these fixed costs are much of a short
        # run's wall time, and they do not depend on each other. Neither starting Ray nor asking it for an actor
        # imports torch or transformers (raylm.cluster.scoring_actor), so the first actor's process starts as soon
        # as Ray is up; whatever imports them next on the driver (the tokenising, the parameter count) waits for
        # the import to finish (raylm.cluster.runtime.import_transformers). The other actors are asked for once the
        # checkpoint says what is left, so that the work sizes them (raylm.cluster.placement.Work) and a run with
        # nothing left starts none.
        importing = tokenising.submit(import_transformers)
        ready: queue.Queue = queue.Queue()
        encoded = tokenising.submit(_tokenise_streaming, cfg, docs, selection, ray_started, ready, importing)
        started, first, parameters = actors is not None, None, None
        try:
            if not started:
                connect(min_cpus=local_cpus_needed(cfg.actors))
                first = first_actor(cfg)
                started = True
        finally:
            ray_started.open(failed=not started)
        if first is not None:
            # There is work: the model's size, which sizes it, is counted meanwhile rather than after tokenising
            # (where it is counted from the config, building the model on the meta device imports its modeling
            # code: seconds of a short run).
            parameters = tokenising.submit(parameter_count_after, importing, cfg.model)
        launched = None
        try:
            early = score_while_building(cfg, first, ready) if first and first.scores_beside_the_build() else Early()
            encoder, tables, built, prompt = encoded.result()
            clean, evaluated = clean_documents(cfg, scan, docs, built) if scan is not None else (None, {})
            shards = make_shards(tables, cfg.shard_requests)
            checkpoint = None
            if cfg.output is not None:
                checkpoint = Checkpoint.open(cfg.output, run_manifest(cfg, encoder, tables, shards), cfg.overwrite)
            scored = checkpoint.load(shards) if checkpoint else {}
            resumed = len(scored)
            if early.results:
                early.settle(shards, checkpoint, on_shard)
                scored.update(early.results)
                log.info("%d of %d shards scored while the tasks were still being built", len(early.results),
                         len(shards))
            todo = [s for s in shards if s.index not in scored]
            if actors is None:
                launched, first = launch(cfg, work_left(cfg, todo, parameters), first), None
            report = ScheduleReport([], 0, 0, [])
            if todo:
                pool = launched.wait_ready(cfg.placement_timeout_s) if launched is not None else actors
                recipe = launched.recipe if launched is not None else plan_actors(
                    cfg.model, len(actors), cfg.batch_size, cfg.num_gpus, cfg.num_cpus)[0]
                actors_score_on = loaded_as(pool)
                if checkpoint is not None:
                    checkpoint.check_scored_with({i: r for i, r in scored.items() if i not in early.results},
                                                 actors_score_on)
                early.check_scored_with(actors_score_on)

                def finished(shard: Shard, result: ScoredShard) -> None:
                    if scored_with(result) != actors_score_on:
                        raise RaylmError(f"shard {shard.index} ({shard.task}) was scored on {scored_with(result)}, "
                                         f"the run's other shards on {actors_score_on} (a replacement actor on "
                                         "another kind of node?); pass --device and --dtype explicitly")
                    if checkpoint is not None:
                        checkpoint.save(shard, result)
                    if on_shard is not None:
                        on_shard(shard, result)

                report = score_shards(pool, recipe, todo, cfg.progress, finished)
                scored.update((s.index, r) for s, r in zip(todo, report.results))
        finally:
            if launched is not None:
                launched.release()
            if first is not None:
                first.launched.release()
    results = {}
    for name, (kind, requests) in tables.items():
        mine = [scored[s.index] for s in shards if s.task == name]
        table = restore(pa.concat_tables(s.table for s in mine), requests, name)
        sums = merge([s.sums for s in mine])
        if kind == LMEVAL_KIND:
            metrics, original = {}, 0  # lm-eval's, filled in below
        elif kind == "rolling":
            metrics, original = rolling_metrics(sums), docs[name][1]
        else:
            metrics, original = choice_metrics(sums, get_task(name).choice_metrics), docs[name][1]
        results[name] = TaskResult(name, kind, metrics, sums, original, table)
        if kind != LMEVAL_KIND:
            results[name].row_hashes = {doc.doc_id: row_hash(doc) for doc in docs[name][0]}
        if clean is not None and kind != LMEVAL_KIND:
            results[name].decontaminated = native_decontaminated(name, kind, table, clean[name])
    lmeval = _lmeval_results(cfg, built, tables, results, clean) if built is not None else None
    if cfg.log_samples and docs:
        log_native_samples(cfg, docs, prompt, results)
    for name, ids in (clean or {}).items():
        results[name].n_clean = len(ids)
    wall = time.time() - start
    scorer = scored_spec(cfg.model, encoder).scorer
    extra = {"scorer": scorer, "pll": cfg.model.pll if scorer == "mlm" else None,
             "shards": len(shards), "max_length": encoder.max_length,
             "prefix_sharing": prefix_sharing(scored[s.index].prefix_sharing for s in shards),
             "tokens": token_counts((s.task, scored[s.index].tokens_in_requests, scored[s.index].computed_tokens)
                                    for s in shards),
             "requests_scored": sum(s.table.num_rows for s in todo) + early.requests,
             "shards_retried": report.retried + early.retried, "shards_resumed": resumed,
             "shards_scored_while_building": len(early.results), "actors_replaced": report.replaced + early.replaced,
             "ray_gcs_address": gcs_address(),
             "model_commit": scored_commit(cfg.model), "peft_commit": cfg.model.peft_revision,
             "chat_template": prompt.chat_template.source if prompt.chat_template is not None else None,
             "scored_with": ", ".join(sorted({scored_with(scored[s.index]) for s in shards}))}
    log.info("%s", run_summary(extra, wall))
    decontamination = scan.summary(clean, evaluated) if scan is not None else None
    return EvalResult(asked, results, wall, extra, lmeval, decontamination)


def _lmeval_results(cfg: EvalConfig, built: Built, tables: Tables, results: dict[str, TaskResult],
                    clean: dict[str, set[int]] | None) -> dict[str, Any]:
    """lm-eval's results for its tasks, from their scores, through lm-eval itself; each task's metrics and
    document count also go on its TaskResult."""
    from raylm.cluster.programs import run_programs
    from raylm.results.lmeval import results as lmeval_results
    from raylm.results.lmeval import task_scores

    scores = {}
    for name in built.tasks["tasks"]:
        scores.update(task_scores(name, built.output_type(name), tables[name][1], results[name].scored,
                                  cfg.think_end_token))
    out = lmeval_results(built, scores, cfg.bootstrap_iters, cfg.log_samples, clean, run_programs)
    for name in built.tasks["tasks"]:
        results[name].metrics = {k: v for k, v in out["results"][name].items()
                                 if k not in ("name", "alias", "sample_len")}
        results[name].n_docs_original = out["n-samples"][name]["original"]
    return out


def log_native_samples(cfg: EvalConfig, docs: TaskDocs, prompt: PromptFormat, results: dict[str, TaskResult]
                        ) -> None:
    """Each native task's samples as lm-eval logs them, on its TaskResult, for its jsonl, and their doc_hashes for
    its Parquet: computed by lm-eval's own task of that name on the same rows (raylm.results.native_logs). Without
    lm-eval, which that takes, the native tasks' samples are Parquet only, without doc_hash."""
    try:
        import lm_eval  # noqa: F401
    except ImportError:
        log.warning("native tasks' samples are written as Parquet only: their lm-eval jsonl is written by lm-eval's "
                    "own code, and lm-eval is not installed")
        return
    from raylm.results.native_logs import logged_doc_hashes, native_samples
    from raylm.tasks.lmeval.counterparts import build_counterparts

    built = build_counterparts(list(docs), cfg.data_dir, num_fewshot=cfg.num_fewshot, fewshot_seed=cfg.fewshot_seed,
                               limit=cfg.limit, samples=cfg.samples, prompt=prompt)
    logged = native_samples(built, {name: task_docs for name, (task_docs, _) in docs.items()},
                            {name: results[name].scored for name in docs}, prompt)
    for name, samples in logged.items():
        results[name].samples = samples
        results[name].doc_hashes = logged_doc_hashes(name, samples)

