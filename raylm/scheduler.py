"""Hands shards to long-lived actors over `ray.wait`, so each result is attributed to its shard and actor.

Each actor gets up to two shards in flight, so it never idles while the driver collects the previous result.
"""

from __future__ import annotations

from collections import deque

import ray
from ray.actor import ActorHandle
from tqdm import tqdm

from raylm.actors import ScoredShard
from raylm.errors import RaylmError
from raylm.shards import Shard

IN_FLIGHT_PER_ACTOR = 2


def run_shards(actors: list[ActorHandle], shards: list[Shard], progress: bool = True) -> list[ScoredShard]:
    """Score every shard once; results come back in shard order whatever order they finished in."""
    refs = [ray.put(s.table) for s in shards]
    queue = deque(range(len(shards)))
    slots = [a for a in actors for _ in range(IN_FLIGHT_PER_ACTOR)]
    in_flight: dict[ray.ObjectRef, tuple[int, ActorHandle]] = {}
    results: list[ScoredShard | None] = [None] * len(shards)
    with tqdm(total=sum(s.table.num_rows for s in shards), unit="req", disable=not progress,
              desc="scoring") as bar:
        while queue or in_flight:
            while queue and slots:
                actor, i = slots.pop(), queue.popleft()
                in_flight[actor.score.remote(shards[i].kind, refs[i])] = (i, actor)
            done, _ = ray.wait(list(in_flight), num_returns=1)
            for ref in done:
                i, actor = in_flight.pop(ref)
                results[i] = _get(ref, shards[i])
                slots.append(actor)
                bar.update(shards[i].table.num_rows)
    return [r for r in results if r is not None]


def _get(ref: ray.ObjectRef, shard: Shard) -> ScoredShard:
    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        raise RaylmError(f"shard {shard.index} ({shard.task}) failed: {e.cause!r}") from e
