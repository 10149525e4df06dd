"""A corpus scored by a sweep's resident scoring actors: the model already loaded for the sweep's tasks scores
the sweep's corpora too, instead of a Ray Data actor pool loading it once more per corpus.

The driver reads the corpus (Ray Data, in input order), answers a batch the checkpoint holds from it, hands every
other batch to the actor with the fewest in flight (raylm.cluster.actors.ResidentScorer.score_documents), and
yields the rows in the corpus's order, tagged as Ray Data's Resuming tags them, so the same fold, checkpoint and
results serve both paths. An actor that dies or raises stops the point with one line; its checkpoint keeps the
batches already saved for the sweep's rerun.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pyarrow as pa
import ray
from ray.actor import ActorHandle

from raylm.cluster.failures import remote_error
from raylm.cluster.scheduler import IN_FLIGHT_PER_ACTOR
from raylm.cluster.waiting import get, progressed
from raylm.corpus.resume import SavedBatches, batch_key, tagged

if TYPE_CHECKING:
    import ray.data


def on_resident_actors(ds: ray.data.Dataset, actors: list[ActorHandle], max_length: int, stride: int,
                       saved: SavedBatches, docs_per_batch: int) -> Iterator[pa.Table]:
    load = {i: 0 for i in range(len(actors))}
    pending: deque[tuple[str, int | None, pa.Table | ray.ObjectRef]] = deque()

    def head() -> pa.Table:
        key, actor, rows = pending.popleft()
        if actor is None:
            return tagged(rows, key, True)
        load[actor] -= 1
        try:
            scored = get(rows)  # a stopping sweep's model thread stops here (raylm.cluster.waiting)
            progressed()
            return tagged(scored, key, False)
        except ray.exceptions.RayError as e:
            raise remote_error("corpus scoring failed", e) from e

    for batch in ds.iter_batches(batch_size=docs_per_batch, batch_format="pyarrow"):
        key = batch_key(batch)
        rows = saved.answer(batch, key)
        if rows is not None:
            pending.append((key, None, rows))
        else:
            actor = min(load, key=load.get)
            load[actor] += 1
            pending.append((key, actor, actors[actor].score_documents.remote(batch, max_length, stride)))
        while pending and (pending[0][1] is None or sum(load.values()) >= IN_FLIGHT_PER_ACTOR * len(actors)):
            yield head()
    while pending:
        yield head()
