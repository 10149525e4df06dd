"""Hands shards to long-lived actors over `ray.wait`, so each result is attributed to its shard and actor.

Each actor gets up to two shards in flight, so it never idles while the driver collects the previous result.

Failures are survived here and nowhere else. A shard whose actor died (killed, out of memory, node gone) goes
back to the queue and a replacement actor is started; only the shard the actor was running is charged a try, not
the one queued behind it. A shard's result is kept only from the one try that returned it, so every request is
counted exactly once, and a shard whose actors die `MAX_TRIES` times while running it stops the run with one
line naming it and the cause. An exception raised by the scoring code stops the run at once: the same shard on the
same model would raise it again.
"""

from __future__ import annotations

import logging
import os
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle
from tqdm import tqdm

from raylm.cluster.failures import remote_error
from raylm.cluster.runtime import ActorRecipe
from raylm.cluster.scored import ScoredShard
from raylm.cluster.waiting import progressed, wait
from raylm.errors import RaylmError, first_line
from raylm.requests.shards import Shard

log = logging.getLogger(__name__)

IN_FLIGHT_PER_ACTOR = 2
MAX_TRIES = 3
REPLACEMENT_WAIT_S = 600.0
# Seconds the driver pauses after each finished shard: lets fault drills and tests kill a process mid-run.
SHARD_DELAY_ENV = "RAYLM_SHARD_DELAY_S"

# The actor or its node is gone; the scoring code itself did not fail.
ACTOR_LOST = (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError, ray.exceptions.NodeDiedError,
              ray.exceptions.WorkerCrashedError, ray.exceptions.OutOfMemoryError)


@dataclass
class ScheduleReport:
    results: list[ScoredShard]  # in the order of the shards given
    retried: int  # shards that needed more than one try
    replaced: int  # actors started in place of dead ones
    actors: list[ActorHandle]  # the live actors at the end, replacements included


def run_shards(actors: list[ActorHandle], shards: list[Shard], progress: bool = True,
               replace: Callable[[], ActorHandle] | None = None,
               on_result: Callable[[Shard, ScoredShard], None] | None = None,
               max_tries: int = MAX_TRIES) -> ScheduleReport:
    """Score every shard exactly once, surviving dead actors and transient failures.

    `replace` starts a new actor when one dies (without it, the survivors carry on alone); `on_result` runs on
    the driver as each shard finishes (checkpointing, progress hooks).
    """
    return _Schedule(actors, shards, replace, on_result, max_tries).run(progress)


def score_shards(actors: list[ActorHandle], recipe: ActorRecipe, shards: list[Shard], progress: bool = True,
                 on_result: Callable[[Shard, ScoredShard], None] | None = None) -> ScheduleReport:
    """run_shards with replacements started from `recipe`, keeping `actors` usable: a dead actor in the list is
    swapped for its replacement, so whoever owns the list can go on using it or release it."""
    report = run_shards(actors, shards, progress=progress, replace=recipe.start, on_result=on_result)
    actors[:] = report.actors
    return report


def shard_delay() -> float:
    text = os.environ.get(SHARD_DELAY_ENV, "").strip()
    try:
        delay = float(text) if text else 0.0
    except ValueError:
        raise RaylmError(f"{SHARD_DELAY_ENV} must be a number of seconds, got {text!r}") from None
    if delay < 0:
        raise RaylmError(f"{SHARD_DELAY_ENV} must be 0 or more, got {text!r}")
    return delay


class _Schedule:
    def __init__(self, actors: list[ActorHandle], shards: list[Shard], replace: Callable[[], ActorHandle] | None,
                 on_result: Callable[[Shard, ScoredShard], None] | None, max_tries: int):
        self.shards, self.replace, self.on_result, self.max_tries = shards, replace, on_result, max_tries
        self.refs = [ray.put(s.table) for s in shards]
        self.queue = deque(range(len(shards)))
        self.tries = [0] * len(shards)
        self.results: list[ScoredShard | None] = [None] * len(shards)
        self.live = list(actors)
        self.original = set(actors)
        self.slots = [a for a in actors for _ in range(IN_FLIGHT_PER_ACTOR)]
        # In the order the calls were sent, which is the order each actor runs its own.
        self.in_flight: dict[ray.ObjectRef, tuple[int, ActorHandle]] = {}
        self.starting: dict[ray.ObjectRef, ActorHandle] = {}
        self.start_failures = 0
        self.replaced = 0
        self.last_cause = "none"
        self.delay = shard_delay()
        self.generated = {"docs": 0, "generated_tokens": 0}  # generation shards' documents and tokens, for the bar

    def run(self, progress: bool) -> ScheduleReport:
        try:
            with tqdm(total=sum(s.table.num_rows for s in self.shards), unit="req", disable=not progress,
                      desc="scoring") as bar:
                while self.queue or self.in_flight:
                    self._dispatch()
                    self._wait(bar)
        except BaseException:
            # Replacements started here are nobody else's to stop once the run has failed.
            for actor in self.live:
                if actor not in self.original:
                    ray.kill(actor, no_restart=True)
            raise
        finally:
            for actor in self.starting.values():
                ray.kill(actor, no_restart=True)
        done = [r for r in self.results if r is not None]
        return ScheduleReport(done, sum(t > 0 for t, r in zip(self.tries, self.results) if r is not None),
                              self.replaced, self.live)

    def _dispatch(self) -> None:
        while self.queue and self.slots:
            actor, i = self.slots.pop(), self.queue.popleft()
            self.in_flight[actor.score.remote(self.shards[i].kind, self.refs[i])] = (i, actor)

    def _wait(self, bar: tqdm) -> None:
        if not self.in_flight and not self.starting:
            raise RaylmError(f"no scoring actor left for the {len(self.queue)} remaining shard(s); "
                             f"last failure: {self.last_cause}")
        # Only a replacement that never starts (no room left on the cluster) could block for ever.
        done, _ = wait([*self.in_flight, *self.starting], timeout=None if self.in_flight else REPLACEMENT_WAIT_S)
        if not done:
            raise RaylmError(f"no live scoring actor and no replacement could start within {REPLACEMENT_WAIT_S:.0f} s "
                             f"(does the cluster still have room for one?); last failure: {self.last_cause}")
        for ref in done:
            if ref in self.starting:
                self._started(ref)
            else:
                self._finished(ref, bar)

    def _finished(self, ref: ray.ObjectRef, bar: tqdm) -> None:
        i, actor = self.in_flight[ref]
        try:
            scored = ray.get(ref)
        except ACTOR_LOST as e:
            self._actor_died(actor, e, bar)
            return
        except ray.exceptions.RayTaskError as e:
            raise self._shard_error(i, e) from e
        del self.in_flight[ref]
        self._accept(i, scored, bar)
        self.slots.append(actor)

    def _accept(self, i: int, scored: ScoredShard, bar: tqdm) -> None:
        self.results[i] = scored
        progressed()
        bar.update(self.shards[i].table.num_rows)
        if "generated_tokens" in scored.sums:
            self.generated["docs"] += int(scored.sums["docs"])
            self.generated["generated_tokens"] += int(scored.sums["generated_tokens"])
        postfix = {**({"retries": sum(self.tries)} if any(self.tries) else {}),
                   **({"docs generated": self.generated["docs"], "tokens": self.generated["generated_tokens"]}
                      if self.generated["docs"] else {})}
        if postfix:
            bar.set_postfix(postfix, refresh=False)
        if self.on_result is not None:
            self.on_result(self.shards[i], scored)
        if self.delay:
            time.sleep(self.delay)

    def _shard_error(self, i: int, e: ray.exceptions.RayTaskError) -> Exception:
        shard = self.shards[i]
        return remote_error(f"shard {shard.index} ({shard.task}) failed", e)

    def _actor_died(self, actor: ActorHandle, error: Exception, bar: tqdm) -> None:
        """Settle every shard the dead actor held, charging a try only to the one it was running.

        An actor runs its calls one at a time in the order they were sent, so of the shards it held, the oldest
        one not finished was running and the others were only queued behind it: those go back to the queue
        uncharged, or a shard could use up its tries, and be named as the cause, for deaths it had no part in. A
        shard that finished before the death (its result already out of the actor) keeps that result."""
        held = [(r, j) for r, (j, a) in self.in_flight.items() if a == actor]
        for r, _ in held:
            del self.in_flight[r]
        self._lose(actor, error)
        charged = False
        for r, j in held:
            try:
                scored = ray.get(r)
            except ACTOR_LOST as e:
                if charged:
                    self.queue.appendleft(j)
                else:
                    self._retry(j, f"scoring actor lost ({first_line(e)})")
                    charged = True
                continue
            except ray.exceptions.RayTaskError as e:
                raise self._shard_error(j, e) from e
            self._accept(j, scored, bar)

    def _retry(self, i: int, cause: str) -> None:
        shard = self.shards[i]
        self.tries[i] += 1
        self.last_cause = cause
        if self.tries[i] >= self.max_tries:
            raise RaylmError(f"shard {shard.index} ({shard.task}) failed {self.tries[i]} times; last cause: {cause}")
        log.warning("shard %d (%s) failed (%s); trying again (%d of %d)", shard.index, shard.task, cause,
                    self.tries[i] + 1, self.max_tries)
        self.queue.appendleft(i)

    def _lose(self, actor: ActorHandle, error: Exception) -> None:
        """Drop a dead actor and start one in its place."""
        self.live.remove(actor)
        self.slots = [a for a in self.slots if a != actor]
        ray.kill(actor, no_restart=True)
        log.warning("a scoring actor was lost (%s); %s", type(error).__name__,
                    "starting a replacement" if self.replace else "carrying on with the others")
        if self.replace is not None:
            self._start_replacement()

    def _start_replacement(self) -> None:
        new = self.replace()
        self.starting[new.ready.remote()] = new
        self.replaced += 1

    def _started(self, ref: ray.ObjectRef) -> None:
        actor = self.starting.pop(ref)
        try:
            ray.get(ref)
        except ACTOR_LOST as e:
            self.start_failures += 1
            self.last_cause = f"replacement actor failed to start ({first_line(e)})"
            if self.start_failures >= self.max_tries:
                raise remote_error("could not start a replacement scoring actor", e) from e
            self._start_replacement()
            return
        except ray.exceptions.RayTaskError as e:
            raise remote_error("a replacement scoring actor failed to start", e) from e
        progressed()
        self.live.append(actor)
        self.slots.extend([actor] * IN_FLIGHT_PER_ACTOR)
