"""The driver's whole job, top to bottom: rows (or lm-eval's tasks) -> requests -> shards -> actors -> sums ->
metrics."""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from raylm.cluster.checkpoint import Checkpoint, fingerprint, scored_with
from raylm.cluster.runtime import (
    ActorHandle,
    LaunchedActors,
    connect,
    gcs_address,
    loaded_as,
    local_cpus_needed,
    plan_actors,
)
from raylm.cluster.scheduler import ScheduleReport, score_shards
from raylm.cluster.scored import ScoredShard
from raylm.config import EvalConfig, limited
from raylm.errors import RaylmError
from raylm.models.context import context_length
from raylm.models.identity import pin_revision, scored_commit
from raylm.models.loading import load_config, load_tokenizer, resolve_scorer
from raylm.models.spec import ModelSpec, check_model_path
from raylm.requests.encoding import Encoder
from raylm.requests.masked import MaskedEncoder
from raylm.requests.order import restore
from raylm.requests.shards import LMEVAL_KIND, Shard, make_shards
from raylm.requests.table import build_requests
from raylm.results.contamination import CleanSets, decontaminated_key, read_scan
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.results.lock import output_lock
from raylm.results.report import EvalResult, TaskResult, prefix_sharing, run_summary, token_counts
from raylm.results.sums import merge, shard_sums
from raylm.tasks import ChoiceDoc, get_task
from raylm.tasks.base import with_fewshot
from raylm.tasks.prompt import PLAIN, PromptFormat, render

if TYPE_CHECKING:
    from raylm.tasks.lmeval.build import Built
    from raylm.tasks.lmeval.names import Selection

log = logging.getLogger(__name__)

# One tokenizer per model for the driver's lifetime: a sweep or soak evaluating the same model again and again
# would otherwise grow the driver by megabytes per run (each new fast tokenizer keeps native memory once used).
driver_tokenizer = functools.lru_cache(maxsize=4)(load_tokenizer)


TaskDocs = dict[str, tuple[list, int]]  # task -> (documents to score, document count before --limit)
Tables = dict[str, tuple[str, pa.Table]]  # task -> (kind, request table), native and lm-eval tasks alike


def load_task_docs(cfg: EvalConfig) -> TaskDocs:
    """Every native task's documents (few-shot examples attached), read and validated before any Ray work starts,
    so that bad data fails at once with its file, row and field."""
    out: TaskDocs = {}
    for name in cfg.tasks:
        if name in cfg.lmeval_tasks:
            continue
        task = get_task(name)
        docs = task.load_docs(cfg.data_dir)
        if not docs:
            raise RaylmError(f"{name}: no documents to evaluate ({cfg.data_dir or 'the hub'} gave none)")
        original = len(docs)
        indices = (cfg.samples or {}).get(name)
        if indices:
            if indices[-1] >= original:
                raise RaylmError(f"--samples: {name} has {original} documents; index {indices[-1]} is out of range")
            chosen = set(indices)
            docs = [d for i, d in enumerate(docs) if i in chosen]
        else:
            docs = docs[: limited(original, cfg.limit)]
        if cfg.num_fewshot and task.kind == "multiple_choice":
            if task.load_fewshot_pool is None:
                raise RaylmError(f"{name}: has no few-shot pool")
            pool = task.load_fewshot_pool(cfg.data_dir)
            docs = with_fewshot(task, [d for d in docs if isinstance(d, ChoiceDoc)], pool, cfg.num_fewshot,
                                cfg.fewshot_seed)
        elif cfg.num_fewshot:
            log.warning("%s is scored zero-shot: few-shot examples do not apply to rolling loglikelihood", name)
        out[name] = (docs, original)
    return out


def select_lmeval(cfg: EvalConfig) -> Selection | None:
    """The lm-eval names resolved from lm-eval's index alone (no data read): unknown names and task types raylm
    cannot score fail here, before Ray starts, and so does a native name that --include-path also defines. None when
    every name is native: lm-eval is then never imported, unless an --include-path is to be checked."""
    if cfg.include_path is not None:
        from raylm.tasks.lmeval.names import refuse_shadowed_natives

        refuse_shadowed_natives(cfg.tasks, cfg.include_path)
    if not cfg.lmeval_tasks:
        return None
    from raylm.tasks.lmeval.names import select

    selection = select(cfg.lmeval_tasks, cfg.include_path, lmeval_metadata(cfg))
    _refuse_native_clash(cfg, selection.leaves)
    if cfg.samples:
        _refuse_unknown_samples(cfg, selection.leaves)
    return selection


def lmeval_metadata(cfg: EvalConfig) -> dict[str, Any]:
    """What lm-eval's CLI hands its TaskManager: the model's arguments, then --metadata over them."""
    return {**cfg.model.lmeval_model_args(), **(cfg.metadata or {})}


def _refuse_unknown_samples(cfg: EvalConfig, lmeval_leaves: Iterable[str]) -> None:
    """lm-eval ignores --samples entries for tasks it does not run; a misspelt name would then run that task in
    full, so raylm names it instead."""
    known = (set(cfg.tasks) - set(cfg.lmeval_tasks)) | set(lmeval_leaves)
    unknown = sorted(set(cfg.samples or {}) - known)
    if unknown:
        raise RaylmError(f"--samples names {', '.join(unknown)}, which this run does not evaluate (its tasks: "
                         f"{', '.join(sorted(known))})")


def _refuse_native_clash(cfg: EvalConfig, lmeval_tasks: Iterable[str]) -> None:
    clash = sorted((set(cfg.tasks) - set(cfg.lmeval_tasks)) & set(lmeval_tasks))
    if clash:
        raise RaylmError(f"{', '.join(clash)}: asked for as a native task and also reached through lm-eval's "
                         f"{', '.join(cfg.lmeval_tasks)}; results would share a name (use the lm-eval task alone, "
                         "or rename it)")


def encode_task_requests(docs: TaskDocs, encoder: Encoder | MaskedEncoder, prompt: PromptFormat = PLAIN) -> Tables:
    """Every native task's requests as an Arrow table of token ids, in the prompt format asked for."""
    out: Tables = {}
    for name, (task_docs, _) in docs.items():
        task = get_task(name)
        if task.kind == "multiple_choice":
            task_docs = [render(d, prompt) for d in task_docs]
        out[name] = (task.kind, build_requests(task, task_docs, encoder))
    return out


def build_task_requests(cfg: EvalConfig, encoder: Encoder | MaskedEncoder) -> tuple[Tables, dict[str, int]]:
    """Every native task's requests, plus each task's document count before --limit (benchmarks and tests)."""
    docs = load_task_docs(cfg)
    prompt = prompt_format(cfg, encoder.tokenizer)
    return encode_task_requests(docs, encoder, prompt), {name: original for name, (_, original) in docs.items()}


def prompt_format(cfg: EvalConfig, tokenizer) -> PromptFormat:
    """The run's system instruction and chat template (raylm.models.chat: chosen and applied as HFLM does)."""
    chat = None
    if cfg.apply_chat_template:
        from raylm.models.chat import ChatTemplate

        chat = ChatTemplate(tokenizer, cfg.chat_template_name, cfg.chat_template_args)
    return PromptFormat(cfg.system_instruction, chat, cfg.multiturn and chat is not None)


def build_lmeval_requests(cfg: EvalConfig, selection: Selection, encoder: Encoder | MaskedEncoder,
                          prompt: PromptFormat = PLAIN) -> tuple[Built, Tables]:
    """lm-eval's tasks loaded, their requests built in lm-eval's order and seeding, and tokenised into tables."""
    from raylm.requests.lmeval import request_tables
    from raylm.tasks.lmeval.build import load_and_build

    built = load_and_build(selection, cfg.seeds, cfg.num_fewshot, cfg.limit, cfg.samples, prompt)
    _refuse_native_clash(cfg, built.tasks["tasks"])
    return built, {name: (LMEVAL_KIND, table) for name, table in request_tables(built, encoder).items()}


def driver_encoder(spec: ModelSpec) -> Encoder | MaskedEncoder:
    """The tokenizer and context length the driver tokenises with (the model's config, not its weights): a
    MaskedEncoder when the model is scored as a masked LM."""
    tokenizer = driver_tokenizer(spec)
    config = load_config(spec)
    kind = resolve_scorer(spec, config)
    max_length = context_length(spec, config, kind, tokenizer)
    try:
        if kind == "mlm":
            _refuse_causal_knobs(spec)
            return MaskedEncoder(tokenizer, max_length)
        encoder = Encoder(tokenizer, max_length, spec.add_bos_token, spec.prefix_token_id)
    except ValueError as e:
        raise RaylmError(str(e)) from e
    log.info("empty contexts and rolling windows are conditioned on token %d (%r)", encoder.prefix_token,
             tokenizer.decode(encoder.prefix_token))
    return encoder


def _refuse_causal_knobs(spec: ModelSpec) -> None:
    """HFLM's tokenisation knobs and adapters are a causal LM's; a masked LM would silently ignore them."""
    for name, value in (("--add-bos-token", spec.add_bos_token), ("--prefix-token-id", spec.prefix_token_id),
                        ("--peft", spec.peft)):
        if value is not None:
            raise RaylmError(f"{name} applies to causal LMs (HFLM's); '{spec.path}' is scored as a masked LM")


def scored_spec(spec: ModelSpec, encoder: Encoder | MaskedEncoder) -> ModelSpec:
    """spec with the scorer it is scored with, as checkpoints and results record it."""
    return replace(spec, scorer="mlm" if isinstance(encoder, MaskedEncoder) else "causal")


class _RayStarted:
    """Opened once Ray is up and the actors are asked for. lm-eval's tasks load and build only then: Ray draws
    from Python's global `random` while it starts (ports, ids), and lm-eval's documented order is to seed that
    generator and then load, so nothing may draw from it in between."""

    def __init__(self, started: bool):
        self._event = threading.Event()
        self.failed = False
        if started:
            self._event.set()

    def open(self, failed: bool) -> None:
        self.failed = failed
        self._event.set()

    def wait(self) -> bool:
        self._event.wait()
        return not self.failed


def _tokenise(cfg: EvalConfig, docs: TaskDocs, selection: Selection | None, ray_started: _RayStarted
              ) -> tuple[Encoder | MaskedEncoder, Tables, Built | None, PromptFormat]:
    encoder = driver_encoder(cfg.model)
    if cfg.apply_chat_template and isinstance(encoder, MaskedEncoder):
        raise RaylmError(f"--apply-chat-template applies to causal LMs; '{cfg.model.path}' is scored as a masked LM")
    prompt = prompt_format(cfg, encoder.tokenizer)
    tables = encode_task_requests(docs, encoder, prompt)
    built = None
    if selection is not None and ray_started.wait():
        built, lmeval_tables = build_lmeval_requests(cfg, selection, encoder, prompt)
        tables.update(lmeval_tables)
    return encoder, tables, built, prompt


def run_settings(cfg: EvalConfig) -> dict[str, Any]:
    """What the checkpoint fingerprints of a run besides its model, tasks, data, shards and versions."""
    return {"num_fewshot": cfg.num_fewshot, "limit": cfg.limit,
            "seeds": {"random": cfg.random_seed, "numpy": cfg.numpy_seed, "torch": cfg.torch_seed,
                      "fewshot": cfg.fewshot_seed},
            "include_path": str(cfg.include_path.resolve()) if cfg.include_path is not None else None}


def _manifest(cfg: EvalConfig, encoder: Encoder | MaskedEncoder, tables: Tables, shards: list[Shard]
              ) -> dict[str, Any]:
    return fingerprint(scored_spec(cfg.model, encoder), cfg.tasks, tables, shards, run_settings(cfg))


def run_fingerprint(cfg: EvalConfig) -> dict[str, Any]:
    """The checkpoint manifest evaluate(cfg) writes, from the driver's side alone (tokenizer, config and data; no
    actor started, no weights loaded beyond their digest): what a sweep compares with a point's manifest to tell
    whether the results there are this run's."""
    cfg.validate()
    check_model_path(cfg.model)
    cfg = replace(cfg, model=pin_revision(cfg.model))
    encoder, tables, _, _ = _tokenise(cfg, load_task_docs(cfg), select_lmeval(cfg), _RayStarted(True))
    return _manifest(cfg, encoder, tables, make_shards(tables, cfg.shard_requests))


def evaluate(cfg: EvalConfig, actors: list[ActorHandle] | None = None,
             on_shard: Callable[[Shard, ScoredShard], None] | None = None) -> EvalResult:
    """Run every task of cfg on the given actors (or on new ones, started and released here).

    With cfg.output, finished shards are checkpointed there and a rerun scores only the missing ones; the
    directory's lock (raylm.results.lock) is held meanwhile, so a second run there stops at once. A dead
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
    docs = load_task_docs(cfg)
    selection = select_lmeval(cfg)
    scan = None
    if cfg.decontaminate is not None:
        scan = CleanSets(read_scan(cfg.decontaminate), cfg.decontaminate)
        scan.require_tasks([*docs, *(selection.leaves if selection is not None else [])])
    ray_started = _RayStarted(actors is not None)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="raylm-tokenise") as tokenising:
        # Tokenising (and building lm-eval's requests) on a thread while Ray starts and the actors load their
        # models: on a small machine these fixed costs are most of a short run's wall time, and they do not
        # depend on each other.
        encoded = tokenising.submit(_tokenise, cfg, docs, selection, ray_started)
        launched = None
        try:
            launched = _launch(cfg) if actors is None else None
        finally:
            ray_started.open(failed=actors is None and launched is None)
        try:
            encoder, tables, built, prompt = encoded.result()
            clean, evaluated = clean_documents(cfg, scan, docs, built) if scan is not None else (None, {})
            shards = make_shards(tables, cfg.shard_requests)
            checkpoint = None
            if cfg.output is not None:
                checkpoint = Checkpoint.open(cfg.output, _manifest(cfg, encoder, tables, shards), cfg.overwrite)
            scored = checkpoint.load(shards) if checkpoint else {}
            resumed = len(scored)
            todo = [s for s in shards if s.index not in scored]
            report = ScheduleReport([], 0, 0, [])
            if todo:
                pool = launched.wait_ready() if launched is not None else actors
                recipe = launched.recipe if launched is not None else plan_actors(
                    cfg.model, len(actors), cfg.batch_size, cfg.num_gpus, cfg.num_cpus)[0]
                actors_score_on = loaded_as(pool)
                if checkpoint is not None:
                    checkpoint.check_scored_with(scored, actors_score_on)

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
        if clean is not None and kind != LMEVAL_KIND:
            results[name].decontaminated = native_decontaminated(name, kind, table, clean[name])
    lmeval = _lmeval_results(cfg, built, tables, results, clean) if built is not None else None
    for name, ids in (clean or {}).items():
        results[name].n_clean = len(ids)
    wall = time.time() - start
    scorer = scored_spec(cfg.model, encoder).scorer
    extra = {"scorer": scorer, "pll": cfg.model.pll if scorer == "mlm" else None,
             "shards": len(shards), "max_length": encoder.max_length,
             "prefix_sharing": prefix_sharing(scored[s.index].prefix_sharing for s in shards),
             "tokens": token_counts((s.task, scored[s.index].input_tokens, scored[s.index].computed_tokens)
                                    for s in shards),
             "requests_scored": sum(s.table.num_rows for s in todo), "shards_retried": report.retried,
             "shards_resumed": resumed, "actors_replaced": report.replaced, "ray_gcs_address": gcs_address(),
             "model_commit": scored_commit(cfg.model), "peft_commit": cfg.model.peft_revision,
             "chat_template": prompt.chat_template.source if prompt.chat_template is not None else None,
             "scored_with": ", ".join(sorted({scored_with(scored[s.index]) for s in shards}))}
    log.info("%s", run_summary(extra, wall))
    decontamination = scan.summary(clean, evaluated) if scan is not None else None
    return EvalResult(asked, results, wall, extra, lmeval, decontamination)


def clean_documents(cfg: EvalConfig, scan: CleanSets, docs: TaskDocs, built: Built | None
                    ) -> tuple[dict[str, set[int]], dict[str, int]]:
    """Each task's evaluated documents that the scan found clean, and how many it evaluates, after checking the
    scan holds exactly those texts: native tasks' by their lm-eval counterpart's query rule, lm-eval tasks' by
    lm-eval's (raylm.tasks.queries, raylm.tasks.lmeval.queries)."""
    from raylm.tasks.queries import native_queries

    evaluated: dict[str, list[tuple[int, str]]] = {}
    for name, (task_docs, _) in docs.items():
        queries = native_queries(name, cfg.data_dir)
        evaluated[name] = [(d.doc_id, queries[d.doc_id]) for d in task_docs]
    if built is not None:
        from raylm.tasks.lmeval.queries import document_queries

        for name, task in built.tasks["tasks"].items():
            evaluated[name] = list(document_queries(name, task, cfg.limit))
    return ({name: scan.clean(name, queries) for name, queries in evaluated.items()},
            {name: len(queries) for name, queries in evaluated.items()})


def native_decontaminated(name: str, kind: str, scored: pa.Table, clean: set[int]) -> dict[str, float]:
    """A native task's metrics over its clean documents alone, under lm-eval's `_decontaminate` names (none when
    no document is clean, as lm-eval had no values to aggregate)."""
    import pyarrow.compute as pc

    if not clean:
        return {}
    sums = shard_sums(kind, scored.filter(pc.is_in(scored["doc_id"], pa.array(sorted(clean), pa.int64()))))
    metrics = rolling_metrics(sums) if kind == "rolling" else choice_metrics(sums, get_task(name).choice_metrics)
    return {decontaminated_key(key): value for key, value in metrics.items()}


def _lmeval_results(cfg: EvalConfig, built: Built, tables: Tables, results: dict[str, TaskResult],
                    clean: dict[str, set[int]] | None) -> dict[str, Any]:
    """lm-eval's results for its tasks, from their scores, through lm-eval itself; each task's metrics and
    document count also go on its TaskResult."""
    from raylm.results.lmeval import results as lmeval_results
    from raylm.results.lmeval import task_scores

    scores = {}
    for name in built.tasks["tasks"]:
        scores.update(task_scores(name, built.output_type(name), tables[name][1], results[name].scored))
    out = lmeval_results(built, scores, cfg.bootstrap_iters, cfg.log_samples, clean)
    for name in built.tasks["tasks"]:
        results[name].metrics = {k: v for k, v in out["results"][name].items()
                                 if k not in ("name", "alias", "sample_len")}
        results[name].n_docs_original = out["n-samples"][name]["original"]
    return out


def _launch(cfg: EvalConfig) -> LaunchedActors:
    connect(min_cpus=local_cpus_needed(cfg.actors))
    recipe, n = plan_actors(cfg.model, cfg.actors, cfg.batch_size, cfg.num_gpus, cfg.num_cpus)
    return LaunchedActors(recipe, n)
