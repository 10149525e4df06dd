"""The one place that knows how a command stops waiting on Ray: on a stall, or when the user asks it to.

A run that waits on Ray can wait for ever when what it waits for can never be placed: actors or read tasks asking
for resources that other work holds (another job's placement group, the run's own actors). Ray then reports
pending demands and nothing moves. The watchdog (`watch`) notices that pair, a demand unmet and no progress, for
`RAYLM_STALL_TIMEOUT_S` seconds, and stops the run with one line naming the demand and what holds the resources.
Progress is what the stages report through `progressed()` as their work comes back: a shard scored, a corpus
batch folded, an actor started. A cluster whose autoscaler is adding nodes is not stalled.

Stopping reaches the main thread as KeyboardInterrupt, as Ctrl-C does: the code on its stack saves what it has
on the way out (every checkpoint layer does so in its `finally`), and the command's entry point prints one line
(raylm.cli). Threads that wait on Ray for the main thread (a sweep runs a model per thread) wait through `get`,
which returns to Python often enough to notice `stopping` and raise `Stopped` there too.
"""

from __future__ import annotations

import _thread
import logging
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import ray

from raylm.errors import RaylmError

log = logging.getLogger(__name__)

STALL_ENV = "RAYLM_STALL_TIMEOUT_S"
STALL_TIMEOUT_S = 600.0  # an unmet demand this long with nothing coming back stops the run
POLL_S = 0.5  # how often a waiting thread looks at `stopping`
WATCH_POLL_S = 2.0  # how often the watchdog asks Ray for its demands
WIND_DOWN_S = 5.0  # how long a stopping main thread gives the others to save what they have

stopping = threading.Event()  # set when the run must stop: a signal, or the watchdog
_last_progress = time.monotonic()


class Stopped(RaylmError):
    """Raised in a thread other than the main one when the run is stopping, so that thread unwinds (saving what
    its stage has) instead of waiting on Ray for ever; the main thread's line says why."""


def progressed() -> None:
    """Some of the run's work came back: the watchdog's clock starts again."""
    global _last_progress
    _last_progress = time.monotonic()


def stall_timeout() -> float:
    text = os.environ.get(STALL_ENV, "").strip()
    try:
        value = float(text) if text else STALL_TIMEOUT_S
    except ValueError:
        raise RaylmError(f"{STALL_ENV} must be a number of seconds, got {text!r}") from None
    if not 0 < value < 1e9:
        raise RaylmError(f"{STALL_ENV} must be more than 0 and less than 1e9 seconds, got {text!r}")
    return value


def wait(refs: list[ray.ObjectRef], num_returns: int = 1, timeout: float | None = None
         ) -> tuple[list[ray.ObjectRef], list[ray.ObjectRef]]:
    """ray.wait that a stopping run interrupts in any thread: it waits in slices of POLL_S, looking at `stopping`
    between them. `timeout` None waits as long as it takes."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        check()
        left = POLL_S if deadline is None else max(0.0, min(POLL_S, deadline - time.monotonic()))
        done, pending = ray.wait(refs, num_returns=num_returns, timeout=left)
        if len(done) >= num_returns or (deadline is not None and time.monotonic() >= deadline):
            return done, pending


def get(refs: ray.ObjectRef | Sequence[ray.ObjectRef]) -> Any:
    """ray.get that a stopping run interrupts in any thread (wait)."""
    pending = [refs] if isinstance(refs, ray.ObjectRef) else list(refs)
    wait(pending, num_returns=len(pending))
    return ray.get(refs)


def check() -> None:
    """Raise Stopped in a thread of a run that is stopping."""
    if stopping.is_set() and threading.current_thread() is not threading.main_thread():
        raise Stopped("stopped")


def wind_down() -> None:
    """In the main thread of a run that is stopping: tell the other threads, and give them WIND_DOWN_S to save
    what they have (a second Ctrl-C ends the wait). They are not waited for beyond it: a thread blocked where it
    cannot look (inside a Ray Data read) would otherwise keep the command alive."""
    stopping.set()
    deadline = time.monotonic() + WIND_DOWN_S
    try:
        for thread in threading.enumerate():
            if thread is not threading.current_thread() and not thread.daemon:
                thread.join(max(0.0, deadline - time.monotonic()))
    except KeyboardInterrupt:
        log.warning("stopping without waiting for the run's threads to save")


def unmet_demands() -> tuple[str, str] | None:
    """(what Ray waits to place, what holds the resources) while Ray reports demands and adds no node for them;
    None otherwise. Read from the GCS's cluster status, which `ray status` shows too."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    status = get_cluster_status(ray.get_runtime_context().gcs_address)
    if status.pending_launches or status.pending_nodes:
        return None
    demands = status.resource_demands
    asked = [(b.bundle, b.count, "task/actor") for d in demands.ray_task_actor_demand for b in d.bundles_by_count]
    asked += [(b.bundle, b.count, "placement group bundle") for d in demands.placement_group_demand
              for b in d.bundles_by_count]
    if not asked:
        return None
    waits = "; ".join(f"{count} {kind}{'s' if count != 1 else ''} asking {_resources(bundle)}"
                      for bundle, count, kind in asked)
    return waits, _holders(status)


def _resources(bundle: dict[str, float]) -> str:
    return "{" + ", ".join(f"{k}: {v:g}" for k, v in sorted(bundle.items())) + "}"


def _holders(status: Any) -> str:
    """The cluster's CPU and GPU in use, and how much of them placement groups hold (Ray names a group's share of
    a resource `<resource>_group_<id>`)."""
    usage = {u.resource_name: u for u in status.cluster_resource_usage}
    parts = []
    for name in ("CPU", "GPU"):
        if name in usage and usage[name].total:
            grouped = sum(u.total for key, u in usage.items()
                          if key.startswith(f"{name}_group_") and key.count("_") == 2)
            held = f", {grouped:g} of them reserved by placement groups" if grouped else ""
            parts.append(f"{usage[name].used:g} of {usage[name].total:g} {name} in use{held}")
    return "; ".join(parts) or "no CPU or GPU in the cluster"


class Watchdog:
    """A daemon thread that stops the run (KeyboardInterrupt in the main thread, `stopping` set for the others)
    once Ray has reported an unmet demand for `timeout_s` with no progress; `reason` is then the line to print."""

    def __init__(self, timeout_s: float):
        self.timeout_s = timeout_s
        self.reason: str | None = None
        self.unreadable = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, name="raylm-watchdog", daemon=True)

    def _watch(self) -> None:
        unmet_since: float | None = None
        while not self.done.wait(WATCH_POLL_S):
            if not ray.is_initialized():
                unmet_since = None
                continue
            try:
                unmet = unmet_demands()
            except Exception as e:  # a status read that fails is no stall; said once, and looked at again
                if not self.unreadable:
                    log.warning("watchdog: cannot read Ray's cluster status (%s); trying again", e)
                self.unreadable = True
                unmet_since = None
                continue
            now = time.monotonic()
            if unmet is None:
                unmet_since = None
                continue
            unmet_since = unmet_since if unmet_since is not None else now
            quiet = now - max(unmet_since, _last_progress)
            if quiet >= self.timeout_s:
                waits, holders = unmet
                self.reason = (f"no progress for {quiet:.0f} s while Ray waits to place {waits} ({holders}); "
                               f"stopped ({STALL_ENV}={self.timeout_s:g})")
                stopping.set()
                _thread.interrupt_main()
                return


@contextmanager
def watch(dog: Watchdog) -> Iterator[Watchdog]:
    """The watchdog over a command's run; it looks at Ray only once the command has connected."""
    stopping.clear()
    dog.thread.start()
    try:
        yield dog
    finally:
        dog.done.set()
