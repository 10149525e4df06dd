"""What a scoring actor sends back for one shard. Kept apart from raylm.cluster.actors (torch) so the driver's
checkpoint and scheduler can name it without importing either."""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa


@dataclass
class ScoredShard:
    """What an actor sends back for one shard: its scored requests, their sums, who scored them, whether that
    actor shared prefixes between requests (its config.prefix_sharing verdict; None where no actor said), and the
    device type and dtype its model was loaded with (what --device auto and --dtype auto resolved to there), and,
    for a causal LM, the tokens its requests hold (what scoring each alone would compute) and the tokens the actor
    actually ran through the model (each shared prefix once: raylm.scoring.tree)."""

    table: pa.Table
    sums: dict[str, float]
    pid: int
    prefix_sharing: str | None = None
    device: str = "unknown"
    dtype: str = "unknown"
    tokens_in_requests: int | None = None
    computed_tokens: int | None = None
