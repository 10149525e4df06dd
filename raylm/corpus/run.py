"""`raylm ppl` / `raylm kl` driver: corpus -> Ray Data stream -> model actors -> per-document rows -> sums.

Nothing is materialised: Ray Data reads blocks, a pool of actors (each holding the model, or both models for
KL) turns batches of whole documents into per-document rows, and the driver folds each arriving batch into
sums and appends it to the samples file. Memory is therefore bounded by the blocks in flight, whatever the
corpus size. Per-document rows are written to a temporary file renamed only once the run succeeds, so a failed
run leaves no samples or results that look final.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, replace
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute
import ray
from ray.actor import ActorHandle
from tqdm import tqdm

from raylm.cluster.placement import threads_with_reading
from raylm.cluster.runtime import connect, local_cpus_needed, plan_actors, read_in
from raylm.cluster.scheduler import shard_delay
from raylm.corpus import CHECKPOINT_EVERY_S, READ_CPUS, SCORING_DOCS_PER_BATCH
from raylm.corpus.doc_scoring import DocKL, DocPerplexity, DocPseudoPerplexity, take_prefix_sharing
from raylm.corpus.read import FORMATS, data_files, read_corpus
from raylm.corpus.resident import on_resident_actors
from raylm.corpus.resume import RESUMED_COLUMN, CorpusCheckpoint, Resuming, blocks_of_batches, corpus_manifest
from raylm.corpus.stream import PartialParquet, stream_batches
from raylm.errors import RaylmError
from raylm.models.context import context_length
from raylm.models.identity import pin_revision, scored_commit
from raylm.models.loading import load_config, load_tokenizer, resolve_scorer, text_config
from raylm.models.spec import ModelSpec, check_model_path
from raylm.requests.masked import MaskedEncoder
from raylm.results.corpus_labels import domain_samples_column
from raylm.results.metrics import figures, kl_metrics, ppl_metrics, pseudo_ppl_metrics
from raylm.results.report import prefix_sharing, run_config
from raylm.results.sums import CorpusSums
from raylm.scoring.mlm import MASKED_PREFIX_SHARING
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location, redact
from raylm.storage.lock import output_lock
from raylm.storage.ownership import RESULTS, check_results_owner

if TYPE_CHECKING:
    import ray.data
    from raylm.cluster.runtime import ReadingGroup

log = logging.getLogger(__name__)

KL_PREFIX_SHARING = "unpacked (raylm kl scores each window in its own row)"
PROBE_TEXT = "Probe: the tokenizers of both models must encode this the same way, 0123 äöü 東京 🙂\n  end."


@dataclass(frozen=True)
class CorpusConfig:
    model: ModelSpec
    data: str
    model_b: ModelSpec | None = None
    fmt: str = "auto"
    text_column: str = "text"
    max_length: int | None = None
    stride: int | None = None
    actors: int | None = None
    limit_docs: int | None = None
    docs_per_batch: int = SCORING_DOCS_PER_BATCH
    progress: bool = True
    # --placement-timeout: seconds the model actors may take to start (Ray Data's wait_for_min_actors_s, which
    # counts the model load too); None waits as long as it takes, as Ray Data does
    placement_timeout_s: float | None = None
    domain_column: str | None = None  # a column of the corpus, or `path` (each file a domain); None: no domains
    overwrite: bool = False  # discard another run's results and checkpoint in the output directory
    checkpoint_every_s: float = CHECKPOINT_EVERY_S  # how often the scored documents are saved to the checkpoint

    @property
    def kind(self) -> str:
        return "kl" if self.model_b is not None else "ppl"

    def validate(self) -> None:
        for spec in (self.model, self.model_b):
            if spec is not None:
                spec.validate()
        if self.fmt not in FORMATS:
            raise RaylmError(f"unknown --format '{self.fmt}' (use {', '.join(FORMATS)})")
        if self.checkpoint_every_s < 0:
            raise RaylmError(f"--checkpoint-every must not be negative, got {self.checkpoint_every_s:g}")
        for name, value in (("--max-length", self.max_length), ("--stride", self.stride), ("--actors", self.actors),
                            ("--limit-docs", self.limit_docs), ("docs per batch", self.docs_per_batch)):
            if value is not None and value < 1:
                raise RaylmError(f"{name} must be at least 1, got {value}")


@dataclass
class CorpusResult:
    config: CorpusConfig
    metrics: dict[str, float]
    max_length: int
    stride: int
    wall_s: float
    commits: list[str | None]  # per model (P, then Q for kl): the hub commit scored, None for a local directory
    prefix_sharing: str | list[str] | None = None
    scorer: str = "causal"
    kl_width: int | None = None  # KL over the first kl_width ids (models of different logits widths); None: all
    docs_resumed: int = 0  # documents whose rows came from the checkpoint of an earlier, interrupted run

    @property
    def label(self) -> str:
        return result_label(self.config, self.scorer)


def result_label(cfg: CorpusConfig, scorer: str) -> str:
    """What results.json and the samples file call the numbers: a masked LM's are pseudo-perplexities."""
    return "pseudo_ppl" if scorer == "mlm" else cfg.kind


def model_max_length(spec: ModelSpec):
    """The model's tokenizer, context length and scorer ("causal" or "mlm"), read without loading weights (a
    folder without them too: a dry run plans from it; a run checks them first, check_model_path)."""
    tokenizer = load_tokenizer(spec)
    config = load_config(spec)
    scorer = resolve_scorer(spec, config)
    return tokenizer, context_length(spec, config, scorer, tokenizer), scorer


def check_same_tokenizer(a, b, name_a: str, name_b: str) -> None:
    """KL compares distributions position by position, so both models must mean the same thing by each id."""
    if a.get_vocab() != b.get_vocab():
        raise RaylmError(f"the tokenizers of '{name_a}' and '{name_b}' have different vocabularies; "
                         "KL needs models that share a tokenizer")
    if a(PROBE_TEXT)["input_ids"] != b(PROBE_TEXT)["input_ids"]:
        raise RaylmError(f"the tokenizers of '{name_a}' and '{name_b}' encode the same text differently; "
                         "KL needs models that share a tokenizer")


def logits_width(spec: ModelSpec) -> int:
    """How many ids the model's LM head scores, from its config (the embedding rows it was saved with)."""
    return text_config(load_config(spec)).vocab_size


def kl_width(tokenizer, spec_p: ModelSpec, spec_q: ModelSpec) -> int | None:
    """The ids KL compares over, from the configs, before any weights load: None when both models' logits are as
    wide; else the narrower width, which must cover every id of the tokenizer they share (Pythia's sizes pad their
    embeddings to different widths; the rows past the tokenizer's ids are padding no text is encoded to)."""
    width_p, width_q = logits_width(spec_p), logits_width(spec_q)
    if width_p == width_q:
        return None
    (narrow, narrow_path), (wide, wide_path) = sorted([(width_p, spec_p.path), (width_q, spec_q.path)])
    if len(tokenizer) > narrow:
        raise RaylmError(f"'{narrow_path}' scores {narrow} ids, fewer than the {len(tokenizer)} of the tokenizer both "
                         f"models share ('{wide_path}' scores {wide}): KL needs both distributions over every id")
    log.info("the models' logits are %d and %d ids wide: KL compares them over the first %d (every tokenizer id), "
             "each distribution renormalised over those", width_p, width_q, narrow)
    return narrow


def resolve_lengths(cfg: CorpusConfig) -> tuple[int, int, str, int | None]:
    """(max_length, stride, scorer, KL width): --max-length may shorten the model's context, never extend it.

    A masked LM's stride is the number of tokens each window scores, at most what a window holds besides its
    special tokens; the default, or a stride of the whole max length, is exactly that (disjoint spans)."""
    tokenizer, limit, scorer = model_max_length(cfg.model)
    if cfg.model_b is not None:
        tokenizer_b, limit_b, scorer_b = model_max_length(cfg.model_b)
        if "mlm" in (scorer, scorer_b):
            raise RaylmError("raylm kl compares causal LMs' next-token distributions; "
                             f"'{cfg.model.path if scorer == 'mlm' else cfg.model_b.path}' is a masked LM")
        check_same_tokenizer(tokenizer, tokenizer_b, cfg.model.path, cfg.model_b.path)
        width = kl_width(tokenizer, cfg.model, cfg.model_b)
        limit = min(limit, limit_b)
    else:
        width = None
    max_length = cfg.max_length or limit
    if max_length > limit:
        raise RaylmError(f"--max-length {max_length} exceeds the model's context length {limit}")
    stride = cfg.stride or max_length
    if stride > max_length:
        raise RaylmError(f"--stride {stride} must not exceed the max length {max_length}")
    if scorer == "mlm":
        try:
            stride = min(stride, MaskedEncoder(tokenizer, max_length).room)
        except ValueError as e:
            raise RaylmError(str(e)) from e
    return max_length, stride, scorer, width


def run_corpus(cfg: CorpusConfig, out_dir: str | os.PathLike[str] | Location,
               actors: list[ActorHandle] | None = None, reading: ReadingGroup | None = None) -> CorpusResult:
    """Score the corpus, write DIR/samples/<kind>.parquet and DIR/results.json, and return the metrics; DIR's lock
    is held meanwhile (raylm.storage.lock), and the scored documents are checkpointed under DIR as they come
    (raylm.corpus.resume), so that the same command after a kill resumes. `actors`: a sweep's resident scoring
    actors, which score a ppl corpus on the model they hold (raylm.corpus.resident); without them, a Ray Data
    actor pool loads the model(s) for this run. `reading`: CPUs the sweep holds for the reads beside its actors
    (raylm.cluster.runtime.reserved_for_reading)."""
    cfg.validate()
    out_dir = location(out_dir)
    with output_lock(out_dir):
        check_results_owner(out_dir, cfg.kind)
        return _run_corpus(cfg, out_dir, actors, reading)


@dataclass(frozen=True)
class Plan:
    """A corpus run as its numbers are decided before anything is read: models pinned to a commit, the lengths,
    the scorer, and what its checkpoint is keyed to."""

    config: CorpusConfig
    max_length: int
    stride: int
    scorer: str
    kl_width: int | None
    manifest: dict[str, Any]


def plan_corpus(cfg: CorpusConfig) -> Plan:
    """Also what a sweep compares a corpus point's checkpoint with, to tell whether its results are current."""
    # Actors of the pool may start at different times: each must load the same commit of a hub model.
    cfg = replace(cfg, model=pin_revision(cfg.model),
                  model_b=pin_revision(cfg.model_b) if cfg.model_b is not None else None)
    max_length, stride, scorer, width = resolve_lengths(cfg)
    options = {"format": cfg.fmt, "text_column": cfg.text_column, "domain_column": cfg.domain_column,
               "max_length": max_length, "stride": stride, "scorer": scorer, "kl_width": width,
               "limit_docs": cfg.limit_docs, "docs_per_batch": cfg.docs_per_batch}
    manifest = corpus_manifest(cfg.kind, [m for m in (cfg.model, cfg.model_b) if m], data_files(cfg.data), options)
    return Plan(cfg, max_length, stride, scorer, width, manifest)


def _run_corpus(cfg: CorpusConfig, out_dir: Location, actors: list[ActorHandle] | None,
                reading: ReadingGroup | None) -> CorpusResult:
    start = time.time()
    for spec in (cfg.model, cfg.model_b):
        if spec is not None:
            check_model_path(spec)
    asked = cfg
    plan = plan_corpus(cfg)
    cfg = plan.config
    if actors is None:
        # Ray Data's actor pool leaves one CPU to its read tasks, or the stream would stall with every CPU held by
        # an actor waiting for input (_on_actor_pool).
        connect(min_cpus=local_cpus_needed(cfg.actors, READ_CPUS))
    elif cfg.kind != "ppl":
        raise RaylmError(f"raylm {cfg.kind} runs on actors of its own; a sweep's resident actors score ppl only")
    # A sweep's resident actors hold the CPUs they were given, outside Ray Data's view: its reads ask for none.
    ds = read_corpus(cfg.data, cfg.fmt, cfg.text_column, cfg.limit_docs, domain_column=cfg.domain_column,
                     read_cpus=None if actors is None else 0)
    if reading is not None:
        read_in(ds, reading)
    label = result_label(cfg, plan.scorer)
    samples = out_dir / "samples" / f"{label}.parquet"
    with CorpusCheckpoint(out_dir, plan.manifest, cfg.overwrite, cfg.checkpoint_every_s) as checkpoint:
        if actors is None:
            sums, domains, verdicts, resumed = _on_actor_pool(ds, plan, checkpoint, samples)
        else:
            batches = on_resident_actors(ds, actors, plan.max_length, plan.stride, checkpoint.saved,
                                         cfg.docs_per_batch)
            sums, domains, verdicts, resumed = _stream(batches, samples, cfg, checkpoint)
    metrics = domain_metrics({"ppl": ppl_metrics, "pseudo_ppl": pseudo_ppl_metrics, "kl": kl_metrics}[label],
                             sums, domains if cfg.domain_column else None)
    sharing = {"ppl": prefix_sharing(verdicts), "pseudo_ppl": MASKED_PREFIX_SHARING, "kl": KL_PREFIX_SHARING}[label]
    commits = [scored_commit(m) for m in (cfg.model, cfg.model_b) if m]
    result = CorpusResult(asked, metrics, plan.max_length, plan.stride, time.time() - start, commits, sharing,
                          plan.scorer, plan.kl_width, resumed)
    write_atomic(out_dir / RESULTS, json.dumps(results_dict(result), indent=2, default=str).encode())
    return result


def _on_actor_pool(ds: ray.data.Dataset, plan: Plan, checkpoint: CorpusCheckpoint, samples: Location
                   ) -> tuple[dict[str, float], dict[str, dict[str, float]], list[str], int]:
    """The corpus scored by a Ray Data actor pool that loads the model(s) for this run, folded by _stream."""
    import ray.data  # see raylm.corpus.read.read_corpus

    cfg = plan.config
    # The work of a streamed corpus is not known before it is read: the cluster's count (raylm.cluster.placement).
    recipe, n = plan_actors(cfg.model, cfg.actors, None, reserve_cpus=READ_CPUS)
    log.info("placement: %s", recipe.reason)
    if recipe.num_gpus == 0:
        recipe = replace(recipe, threads=threads_with_reading(recipe.threads, n, READ_CPUS))
    if cfg.placement_timeout_s is not None:
        ds.context.wait_for_min_actors_s = cfg.placement_timeout_s
    # The actors load onto the placement's device (recipe.spec); Q lives beside P.
    if cfg.model_b is None:
        fn = DocPseudoPerplexity if plan.scorer == "mlm" else DocPerplexity
        args = (recipe.spec, plan.max_length, plan.stride, recipe.threads)
    else:
        model_b = replace(cfg.model_b, device=recipe.spec.device)
        fn, args = DocKL, (recipe.spec, model_b, plan.max_length, plan.stride, recipe.threads, plan.kl_width)
    scored = blocks_of_batches(ds, cfg.docs_per_batch).map_batches(
        Resuming, fn_constructor_args=(fn, args, checkpoint.saved), batch_size=cfg.docs_per_batch,
        batch_format="pyarrow", compute=ray.data.ActorPoolStrategy(size=n), **recipe.options())
    try:
        return _stream(stream_batches(scored, "corpus scoring"), samples, cfg, checkpoint)
    except ray.exceptions.GetTimeoutError as e:
        raise RaylmError(f"{n} model actor(s) asking for {recipe.num_cpus:g} CPU and {recipe.num_gpus:g} GPU each did "
                         f"not all start within --placement-timeout {cfg.placement_timeout_s:g} s (a node with room "
                         "for them, or their model load, took longer)") from e


def domain_metrics(metrics_of: Callable[[dict[str, float]], dict[str, Any]], sums: dict[str, float],
                   domains: dict[str, dict[str, float]] | None) -> dict[str, Any]:
    """The corpus's metrics; with domains, also each domain's (`domains`, by name) and Paloma's macro average,
    the unweighted mean over the domains of each figure computed from the sums (`macro`;
    raylm.results.metrics.figures)."""
    metrics = metrics_of(sums)
    if domains is None:
        return metrics
    per_domain = {name: metrics_of(domains[name]) for name in sorted(domains)}
    macro = {key: math.fsum(m[key] for m in per_domain.values()) / len(per_domain) for key in figures(metrics)}
    return {**metrics, "domains": per_domain, "macro": macro}


def _stream(batches: Iterator[pa.Table], samples: Location, cfg: CorpusConfig, checkpoint: CorpusCheckpoint
            ) -> tuple[dict[str, float], dict[str, dict[str, float]], list[str], int]:
    """Fold per-document batches into sums, the corpus's and each domain's, while appending them to the samples
    file, numbering documents, and handing the newly scored ones to the checkpoint. Also returns the actors'
    distinct prefix-sharing verdicts, which are taken off the rows, and how many documents were resumed. A
    corpus with nothing to score leaves no samples file behind."""
    total, domains = CorpusSums(), defaultdict(CorpusSums)
    verdicts: set[str] = set()
    docs = resumed = 0
    domain = domain_samples_column(cfg.domain_column)
    delay = shard_delay()  # RAYLM_SHARD_DELAY_S: a pause after each arriving block, for kill drills
    with PartialParquet(samples) as out, tqdm(unit="doc", disable=not cfg.progress, desc="scoring") as bar:
        for batch in batches:
            if batch.num_rows == 0:
                continue
            resumed += pa.compute.sum(batch[RESUMED_COLUMN]).as_py() or 0
            batch = take_prefix_sharing(checkpoint.add(batch), verdicts)
            batch = batch.add_column(0, "doc", pa.array(range(docs, docs + batch.num_rows), pa.int64()))
            docs += batch.num_rows
            out.write(batch)
            total.add(batch)
            if cfg.domain_column:
                for name, rows in _by_domain(batch, domain):
                    domains[name].add(rows)
            bar.update(batch.num_rows)
            time.sleep(delay)
        sums = total.value()
        if not sums.get("tokens"):
            raise RaylmError(f"{redact(cfg.data)}: the corpus has no text to score "
                             f"({int(sums.get('docs', 0))} documents, 0 tokens)")
    checkpoint.save(final=True)
    return sums, {name: d.value() for name, d in domains.items()}, sorted(verdicts), resumed


def _by_domain(batch: pa.Table, column: str) -> list[tuple[str, pa.Table]]:
    names = batch[column]
    return [(name, batch.filter(pa.compute.equal(names, name))) for name in names.unique().to_pylist()]


def results_dict(result: CorpusResult) -> dict[str, Any]:
    cfg = result.config
    return {
        "results": {result.label: result.metrics},
        "config": run_config(
            cfg.model, result.wall_s, command=cfg.kind, model_b=cfg.model_b.path if cfg.model_b else None,
            model_b_args=cfg.model_b.as_dict() if cfg.model_b else None,
            data=redact(cfg.data),  # as every stored URI, less its secrets (raylm.storage.location)
            **{k: v for k, v in asdict(cfg).items() if k not in ("model", "model_b", "data", "max_length", "stride")},
            max_length=result.max_length, stride=result.stride, prefix_sharing=result.prefix_sharing,
            scorer=result.scorer, pll=cfg.model.pll if result.scorer == "mlm" else None,
            model_commit=result.commits[0], model_b_commit=result.commits[1] if cfg.model_b else None,
            docs_resumed=result.docs_resumed,
            **({"kl_width": result.kl_width} if cfg.model_b else {})),
    }
