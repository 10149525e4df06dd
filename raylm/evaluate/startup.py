"""How a run starts before its work is known, so that the fixed costs overlap: Ray starting, the first actor
loading its model, and the driver importing torch and transformers and building the tasks. The first actor scores
the first tables while the later ones are still being built (where that takes no core the build needs), the rest
of the actors are sized by what is left once the build and the checkpoint say so, and lm-eval's tasks are built
only once Ray is up (RayStarted). raylm.evaluate.driver runs these steps in that order."""

from __future__ import annotations

import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from typing import NamedTuple

from raylm.cluster.capacity import Capacity
from raylm.cluster.checkpoint import Checkpoint, scored_with
from raylm.cluster.placement import Work
from raylm.cluster.runtime import ActorRecipe, LaunchedActors, cluster_capacity, plan_actors
from raylm.cluster.scheduler import IN_FLIGHT_PER_ACTOR, ScheduleReport, score_shards
from raylm.cluster.scored import ScoredShard
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.models.loading import parameter_count
from raylm.models.spec import ModelSpec
from raylm.requests.shards import Shard, cut
from raylm.requests.table import forward_tokens
from raylm.storage.location import location
from raylm.storage.ownership import CHECKPOINT_DIR


@contextmanager
def build_threads() -> Iterator[ThreadPoolExecutor]:
    """The driver's threads for the import of torch and transformers and the build. A run that stops (Ctrl-C,
    SIGTERM, an error) does not wait for a build still running there: lm-eval's build of a large group takes
    minutes, and nothing would use it."""
    pool = ThreadPoolExecutor(max_workers=2, thread_name_prefix="raylm-tokenise")
    try:
        yield pool
    except BaseException:
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    pool.shutdown(wait=True)


class RayStarted:
    """Opened once Ray is up and the first actor is asked for. lm-eval's tasks load and build only then: Ray draws
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


def parameter_count_after(importing: Future[None], spec: ModelSpec) -> int:
    """parameter_count once the driver's import of transformers is done: counting from the config imports its
    modeling code, which must not run beside that import (raylm.cluster.runtime.import_transformers)."""
    importing.result()
    return parameter_count(spec)


def work_left(cfg: EvalConfig, todo: list[Shard], parameters: Future[int] | None) -> Work:
    """What is left to score, for placement to size the actors by: nothing at all when every shard is in the
    checkpoint (the model's config is then not even read, unless `parameters` already counted it)."""
    counted = parameters.result() if parameters is not None else None
    if not todo:
        return Work(0, 0, 0)
    return shards_work(todo, counted if counted is not None else parameter_count(cfg.model))


def shards_work(todo: list[Shard], parameters: int) -> Work:
    """The Work of these shards: what placement sizes a run's actors by, and what a dry run's plan sizes them by."""
    return Work(len(todo), sum(forward_tokens(s.table) for s in todo), parameters)


class FirstActor(NamedTuple):
    """The actor asked for before the work is known, and the cluster as it was then."""

    capacity: Capacity
    recipe: ActorRecipe
    launched: LaunchedActors

    def scores_beside_the_build(self) -> bool:
        """Whether it may score while the driver builds the rest of the tasks without taking the cores the build
        runs on: it computes on a GPU, or the cluster has a CPU beyond its threads. Where its threads are every
        core (the local Ray of a small machine), the tokenising would preempt them, each preemption stalling its
        other OpenMP threads at their next barrier: on 2 cores, a run of 57 MMLU tasks took 119 s so, against
        99 s with the build first (bench/RESULTS.md)."""
        return self.recipe.num_gpus > 0 or self.capacity.live_total("CPU") >= self.recipe.threads + 1


def first_actor(cfg: EvalConfig) -> FirstActor | None:
    """One actor asked for before the work is known, where there surely is work (no checkpoint to resume from):
    its node starting and its model loading then overlap the tokenising. None where a checkpoint may hold every
    shard."""
    if cfg.output is not None and not cfg.overwrite and (location(cfg.output) / CHECKPOINT_DIR).exists():
        return None
    capacity = cluster_capacity()
    recipe, _ = plan_actors(cfg.model, cfg.actors, cfg.batch_size, cfg.num_gpus, cfg.num_cpus, capacity=capacity)
    # No placement line yet: the one that counts comes with the work estimate (_launch).
    return FirstActor(capacity, recipe, LaunchedActors(replace(recipe, reason=""), 1))


class Early:
    """Shards the first actor scored while the rest of the tasks were still being built, by global index."""

    def __init__(self) -> None:
        self.results: dict[int, ScoredShard] = {}
        self.shards: dict[int, Shard] = {}
        self.retried = self.replaced = self.requests = 0

    def add(self, shards: list[Shard], report: ScheduleReport) -> None:
        for shard, result in zip(shards, report.results):
            self.shards[shard.index], self.results[shard.index] = shard, result
            self.requests += shard.table.num_rows
        self.retried += report.retried
        self.replaced += report.replaced

    def settle(self, shards: list[Shard], checkpoint: Checkpoint | None,
               on_shard: Callable[[Shard, ScoredShard], None] | None) -> None:
        """Check each early shard is the run's shard of that index, then checkpoint it and report it, as a shard
        scored after the build would have been."""
        for index, shard in self.shards.items():
            final = shards[index] if index < len(shards) else None
            if final is None or final.task != shard.task or not final.table.equals(shard.table):
                raise RuntimeError(f"shard {index} ({shard.task}) scored while the tasks were built is not the run's "
                                   "shard of that index: the streamed tables came in another order than the run's")
            if checkpoint is not None:
                checkpoint.save(final, self.results[index])
            if on_shard is not None:
                on_shard(final, self.results[index])

    def check_scored_with(self, actors: str) -> None:
        other = sorted({scored_with(r) for r in self.results.values()} - {actors})
        if other:
            raise RaylmError(f"the shards scored while the tasks were built were scored on {', '.join(other)}, the "
                             f"rest of the run's actors score on {actors}; pass --device and --dtype explicitly")


def score_while_building(cfg: EvalConfig, first: FirstActor, ready: queue.Queue) -> Early:
    """Score the tables the tokenising thread puts on `ready` on the first actor, while it builds the rest, until
    it puts None (built, or failed). Shards go out two at a time (the actor's in-flight pair) and the build's end
    is looked for between pairs, so a run of one huge task still spreads over every actor once they are known;
    shards of a table still waiting then are scored with the rest. Indices follow make_shards: tables arrive in the
    run's order, so a table's shards come after every earlier table's."""
    early, pending, pool, offered = Early(), deque[Shard](), None, 0
    while True:
        # Every table built by now joins the pending shards; with none pending, the next one is waited for.
        items = [] if pending else [ready.get()]
        while not ready.empty():
            items.append(ready.get_nowait())
        for item in items:
            if item is None:
                return early
            name, kind, table = item
            pieces = cut(table, cfg.shard_requests)
            pending.extend(Shard(name, kind, offered + j, piece) for j, piece in enumerate(pieces))
            offered += len(pieces)
        group = [pending.popleft() for _ in range(min(IN_FLIGHT_PER_ACTOR, len(pending)))]
        pool = pool or first.launched.wait_ready(cfg.placement_timeout_s)
        early.add(group, score_shards(pool, first.launched.recipe, group, progress=False))


def launch(cfg: EvalConfig, work: Work, first: FirstActor | None) -> LaunchedActors:
    """The actors the work needs, the first one among them where it was asked for already and is the same. The
    count is planned from the cluster as the first actor found it, not as that actor's own node has changed it."""
    recipe, n = plan_actors(cfg.model, cfg.actors, cfg.batch_size, cfg.num_gpus, cfg.num_cpus, work=work,
                            capacity=first.capacity if first is not None else None)
    started = []
    if first is not None:
        if first.recipe.starts_like(recipe):
            started = first.launched.actors
        else:
            first.launched.release()
    return LaunchedActors(recipe, n, started)
