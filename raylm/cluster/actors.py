"""Scoring actors: each keeps one model resident and scores whatever shards it is handed.

`score_shard` is the whole per-shard job as a plain function, so it runs the same in-process (tests,
benchmarks) and inside an actor. A model whose attention plan waits for a start-up check (one no test has proven)
is checked once, on the first shard the actor is handed, so start-up itself is not slowed: until then and if the
check disagrees, requests are scored one per row. Every ScoredShard carries the verdict for results.json.
"""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.compute as pc
import ray
import torch

from raylm.requests.encoding import config_max_length, resolve_max_length
from raylm.scoring.models import ModelSpec, load_model, load_tokenizer
from raylm.cluster.failures import DeferredStartup
from raylm.scoring.scorer import Scorer
from raylm.scoring.startup_check import REAL_REQUESTS, checked_plan
from raylm.requests.shards import ScoredShard
from raylm.results.sums import shard_sums


def score_shard(scorer: Scorer, kind: str, shard: pa.Table) -> ScoredShard:
    loglik, greedy = scorer.score(shard["context"].to_pylist(), shard["continuation"].to_pylist(),
                                  shard["doc_id"].to_pylist())
    scored = shard.drop_columns(["context", "continuation"])
    for name, column in (("loglikelihood", pa.array(loglik, pa.float64())), ("is_greedy", pa.array(greedy)),
                         ("context_tokens", pc.list_value_length(shard["context"])),
                         ("continuation_tokens", pc.list_value_length(shard["continuation"]))):
        scored = scored.append_column(name, column)
    return ScoredShard(scored, shard_sums(kind, scored), os.getpid(), scorer.plan.prefix_sharing)


def actor_max_length(spec: ModelSpec, config) -> int:
    """The driver's context length, loading the tokenizer (up to a second of actor start-up) only when the model
    config does not state one."""
    stated = config_max_length(config)
    return stated if stated is not None else resolve_max_length(config, load_tokenizer(spec))


class ScoringActor(DeferredStartup):
    """Constructed as ScoringActor(spec, threads, batch_size); a model that fails to load is reported by ready()."""

    def start(self, spec: ModelSpec, threads: int, batch_size: int | None) -> None:
        torch.set_num_threads(threads)
        self.model = load_model(spec)
        self.scorer = Scorer(self.model, actor_max_length(spec, self.model.config), batch_size)

    def ready(self) -> int:
        """The actor's PID: proof of life once the model is loaded, and what fault-injection tests kill."""
        self.check_started()
        return os.getpid()

    def set_batch_size(self, batch_size: int | None) -> None:
        """Sweep points differ in batch size without being different models, so they must not reload it."""
        self.scorer.batch_size = batch_size

    def score(self, kind: str, shard: pa.Table) -> ScoredShard:
        self.check_started()
        if self.scorer.plan.needs_check:
            head = shard.slice(0, REAL_REQUESTS)
            real = (head["context"].to_pylist(), head["continuation"].to_pylist(), head["doc_id"].to_pylist())
            self.scorer.plan = checked_plan(self.model, self.scorer.max_length, self.scorer.plan, real)
        return score_shard(self.scorer, kind, shard)


RemoteScoringActor = ray.remote(ScoringActor)
