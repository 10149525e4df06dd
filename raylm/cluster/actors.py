"""What a scoring actor runs (raylm.cluster.scoring_actor is the Ray actor around it): one model kept resident,
scoring whatever shards it is handed.

`score_shard` is the whole per-shard job as a plain function, so it runs the same in-process (tests,
benchmarks) and inside an actor. An actor scores a causal LM with raylm.scoring.scorer and a masked LM with the
pseudo-log-likelihood scorer of raylm.scoring.mlm; which one, it decides from the model's config as the driver
does (raylm.models.loading.resolve_scorer), and a shard built for the other kind is refused. A causal model whose
attention plan waits for a start-up check (one no test has proven) is checked once, on the first shard the actor
is handed, so start-up itself is not slowed: until then and if the check disagrees, requests are scored one per
row. Every ScoredShard carries the verdict for results.json. A generation shard (raylm.requests.generation) goes to
the generation engine (raylm.scoring.generation) instead, built with the tokenizer on the first such shard;
`generate_shard` is its plain function.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import torch

from raylm.cluster.devices import assigned_gpus, device_here
from raylm.cluster.scored import ScoredShard
from raylm.errors import RaylmError
from raylm.models.context import context_length
from raylm.models.loading import load_config, load_model, load_tokenizer, resolve_scorer
from raylm.models.spec import ModelSpec
from raylm.requests.generation import is_generation
from raylm.requests.masked import UNSCORED
from raylm.requests.shards import LMEVAL_KIND
from raylm.requests.table import MASKED_COLUMNS
from raylm.scoring.documents import DocumentNLL, DocumentPLL, document_scorer
from raylm.scoring.mlm import MASKED_PREFIX_SHARING, MaskedScorer
from raylm.scoring.scorer import RequestDoesNotFit, Scorer
from raylm.scoring.startup_check import REAL_REQUESTS, checked_plan
from raylm.scoring.sums import shard_sums

if TYPE_CHECKING:
    from raylm.scoring.generation import Generator


def score_shard(scorer: Scorer | MaskedScorer, kind: str, shard: pa.Table) -> ScoredShard:
    masked = isinstance(scorer, MaskedScorer)
    if masked != (MASKED_COLUMNS[-1] in shard.column_names):
        raise ValueError(f"a shard of requests for a {'masked' if not masked else 'causal'} LM reached a "
                         f"{'masked' if masked else 'causal'}-LM scorer")
    contexts, continuations = shard["context"].to_pylist(), shard["continuation"].to_pylist()
    if masked:
        word_ids = shard["word_ids"].to_pylist()
        loglik, greedy = scorer.score(contexts, continuations, shard["following"].to_pylist(), word_ids)
        scored_tokens = pa.array([sum(w != UNSCORED for w in words) for words in word_ids], pa.int32())
        scored = shard.drop_columns(["context", "continuation", *MASKED_COLUMNS])
        tokens: tuple[int | None, int | None] = (None, None)
    else:
        in_requests, computed = scorer.tokens_in_requests, scorer.computed_tokens
        try:
            loglik, greedy = scorer.score(contexts, continuations)
        except RequestDoesNotFit as e:
            raise RaylmError(f"document {shard['doc_id'][e.request].as_py()} (request "
                             f"{shard['req_idx'][e.request].as_py()}, {len(contexts[e.request])} + "
                             f"{len(continuations[e.request])} tokens): {e}") from e
        tokens = (scorer.tokens_in_requests - in_requests, scorer.computed_tokens - computed)
        scored_tokens = pc.list_value_length(shard["continuation"])
        scored = shard.drop_columns(["context", "continuation"])
    for name, column in (("loglikelihood", pa.array(loglik, pa.float64())), ("is_greedy", pa.array(greedy)),
                         ("context_tokens", pc.list_value_length(shard["context"])),
                         ("continuation_tokens", scored_tokens)):
        scored = scored.append_column(name, column)
    verdict = MASKED_PREFIX_SHARING if masked else scorer.plan.prefix_sharing
    device, dtype = loaded_as(scorer.model)
    return ScoredShard(scored, shard_sums(kind, scored), os.getpid(), verdict, device, dtype, *tokens)


def generate_shard(generator: Generator, shard: pa.Table, model: torch.nn.Module) -> ScoredShard:
    """A generation shard (raylm.requests.generation) run through the generation engine: each row's text and new
    token count, keyed as the row was, with the shard's documents and generated tokens as its sums and the prompt
    tokens it held and prefilled (a shared prefix once) as its token counts."""
    from raylm.scoring.generation import GenerationRequest

    columns = [shard[name].to_pylist() for name in ("context", "until", "max_gen_toks", "do_sample", "temperature",
                                                    "top_k", "top_p", "seed")]
    requests = [GenerationRequest(tuple(context), tuple(until), max_gen_toks, do_sample, temperature, top_k, top_p,
                                  seed)
                for context, until, max_gen_toks, do_sample, temperature, top_k, top_p, seed in zip(*columns)]
    in_requests, prefilled = generator.tokens_in_requests, generator.prefilled_tokens
    generated = generator.generate(requests)
    table = shard.select(["doc_id", "req_idx", "repeat"])
    for name, column in (("generation", pa.array([g.text for g in generated], pa.string())),
                         ("generated_tokens", pa.array([g.tokens for g in generated], pa.int32())),
                         ("context_tokens", pc.list_value_length(shard["context"]))):
        table = table.append_column(name, column)
    device, dtype = loaded_as(model)
    return ScoredShard(table, shard_sums(LMEVAL_KIND, table), os.getpid(), None, device, dtype,
                       generator.tokens_in_requests - in_requests, generator.prefilled_tokens - prefilled)


def loaded_as(model: torch.nn.Module) -> tuple[str, str]:
    """The device type and dtype the model computes in, as loaded: a quantised model's is its compute dtype."""
    parameter = next(model.parameters())
    dtype = getattr(model, "dtype", parameter.dtype)
    return parameter.device.type, str(dtype).removeprefix("torch.")


class ResidentScorer:
    """One model loaded and kept, with whatever scores on it: its scorer, and the generation engine and corpus
    scorers built on first use. Plain torch, callable without Ray; the Ray actor around it is
    raylm.cluster.scoring_actor.ScoringActor."""

    def __init__(self, spec: ModelSpec, threads: int, batch_size: int | None, gpu_share: float = 1.0):
        """`gpu_share`: the fraction of its GPU the actor was given (ActorRecipe.gpu_share), what its KV budget may
        fill."""
        torch.set_num_threads(threads)
        spec = device_here(spec)
        self.spec, self.batch_size, self.gpu_share = spec, batch_size, gpu_share
        self.generator: Generator | None = None  # built on the first generation shard: most runs have none
        # a sweep's corpus scorer, by (max_length, stride): built on its first batch of documents
        self.documents: dict[tuple[int, int], DocumentNLL | DocumentPLL] = {}
        config = load_config(spec)
        if resolve_scorer(spec, config) == "mlm":
            self.scorer: Scorer | MaskedScorer = MaskedScorer.from_spec(spec, batch_size)
        else:
            self.scorer = Scorer(load_model(spec, gpus=assigned_gpus(spec)), context_length(spec, config, "causal"),
                                 batch_size)

    def loaded_as(self) -> tuple[str, str]:
        return loaded_as(self.scorer.model)

    def set_batch_size(self, batch_size: int | None) -> None:
        """Sweep points differ in batch size without being different models, so they must not reload it."""
        self.scorer.batch_size = self.batch_size = batch_size
        self.generator = None  # rebuilt at the new size on the next generation shard

    def score(self, kind: str, shard: pa.Table) -> ScoredShard:
        if is_generation(shard):
            return generate_shard(self.generation_engine(), shard, self.scorer.model)
        if isinstance(self.scorer, Scorer) and self.scorer.plan.needs_check:
            head = shard.slice(0, REAL_REQUESTS)
            real = (head["context"].to_pylist(), head["continuation"].to_pylist())
            self.scorer.plan = checked_plan(self.scorer.model, self.scorer.max_length, self.scorer.plan, real)
        return score_shard(self.scorer, kind, shard)

    def score_documents(self, batch: pa.Table, max_length: int, stride: int) -> pa.Table:
        """A batch of corpus documents -> a row per document (raylm.scoring.documents) on the resident model: a
        sweep's corpora are scored by the actor that holds the model for its tasks, not by a model loaded again."""
        if (max_length, stride) not in self.documents:
            self.documents[max_length, stride] = document_scorer(load_tokenizer(self.spec), self.scorer, max_length,
                                                                 stride)
        return self.documents[max_length, stride](batch)

    def generation_engine(self) -> Generator:
        """The model's generation engine, with the tokenizer it decodes with (loaded as the driver loads it)."""
        if isinstance(self.scorer, MaskedScorer):
            raise RaylmError("a generation shard reached a masked-LM actor; a masked LM cannot generate")
        if self.generator is None:
            # Imported here, not with the module: only an actor handed a generation shard needs the engine.
            from raylm.scoring.generation import Generator

            # One token budget for the model's scoring and generation: out of memory in either halves it for both.
            self.generator = Generator(self.scorer.model, load_tokenizer(self.spec), self.batch_size,
                                       budget=self.scorer.budget, gpu_share=self.gpu_share)
        return self.generator
