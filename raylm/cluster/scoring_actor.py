"""The scoring actor as Ray runs it: a ResidentScorer (raylm.cluster.actors) built in the actor's process.

Nothing here imports torch or transformers, so the driver can ask Ray for its first actor the moment Ray is up,
while its own import of them (seconds) is still running on the tokenising thread: the actor's process imports
them and loads the model meanwhile. Were this class defined beside the scorers, the driver would have to finish
that import before asking, and the actor's start would wait for it.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import ray

from raylm.cluster.failures import DeferredStartup

if TYPE_CHECKING:
    import pyarrow as pa

    from raylm.cluster.actors import ResidentScorer
    from raylm.cluster.scored import ScoredShard
    from raylm.models.spec import ModelSpec


class ScoringActor(DeferredStartup):
    """Constructed as ScoringActor(spec, threads, batch_size[, gpu_share]); a model that fails to load is reported by
    ready()."""

    def start(self, spec: ModelSpec, threads: int, batch_size: int | None, gpu_share: float = 1.0) -> None:
        from raylm.cluster.actors import ResidentScorer

        self.resident: ResidentScorer = ResidentScorer(spec, threads, batch_size, gpu_share)

    def ready(self) -> int:
        """The actor's PID: proof of life once the model is loaded, and what fault-injection tests kill."""
        self.check_started()
        return os.getpid()

    def loaded_as(self) -> tuple[str, str]:
        """Where and at what precision this actor scores: what the checkpoint's resumed shards must match."""
        self.check_started()
        return self.resident.loaded_as()

    def set_batch_size(self, batch_size: int | None) -> None:
        self.check_started()
        self.resident.set_batch_size(batch_size)

    def score(self, kind: str, shard: pa.Table) -> ScoredShard:
        self.check_started()
        return self.resident.score(kind, shard)

    def score_documents(self, batch: pa.Table, max_length: int, stride: int) -> pa.Table:
        self.check_started()
        return self.resident.score_documents(batch, max_length, stride)


RemoteScoringActor = ray.remote(ScoringActor)
