"""Starting or attaching to Ray, and placing scoring actors on it."""

from __future__ import annotations

import logging
import os
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from raylm.errors import RaylmError, RemoteError, first_line
from raylm.model_loading import ModelSpec

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2
GPU_ACTOR_CPUS = 0.5
# Ray starts worker processes at niceness +15 so that its own processes stay responsive. On the local Ray a
# scoring actor is the job, not a bystander: at +15 every runnable process at the driver's niceness (the driver
# tokenising, Ray's daemons) preempts its threads, and each preemption stalls the other OpenMP threads at their
# next barrier. On 2 cores GPT-2-small scored 12-15% faster at the driver's niceness. A system setting rather
# than a per-actor runtime_env (Ray's job supervisor's way) keeps the prestarted workers usable: with a
# runtime_env each actor waited about 1.5 s more for a fresh worker process.
LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")  # Ray colours the function names in the remote traceback


def connect() -> None:
    """Attach when RAY_ADDRESS is set (as under `ray job submit`), else start a small local Ray (address="local":
    never silently join a cluster some other `ray start` left on this machine).

    Resource arguments and system settings are only valid when starting a cluster, so an attaching driver passes
    none: on a cluster, workers run at the niceness the cluster was started with.
    """
    if ray.is_initialized():
        return
    if os.environ.get("RAY_ADDRESS"):
        ray.init()
        return
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             object_store_memory=LOCAL_OBJECT_STORE_BYTES, _system_config=LOCAL_SYSTEM_CONFIG)


@dataclass(frozen=True)
class ActorRecipe:
    """How one scoring actor is started, kept so the scheduler can start an identical one when an actor dies."""

    spec: ModelSpec
    batch_size: int | None
    num_cpus: float
    num_gpus: float
    threads: int

    def start(self) -> ActorHandle:
        """Ask Ray for a new actor; it is ready (model loaded) when its `ready()` returns.

        raylm.actors imports torch (1-2 s); importing it here rather than with this module keeps it off the
        driver's path to ray.init, which `raylm eval` starts while its tokenising thread does that import.
        """
        from raylm.actors import RemoteScoringActor

        return RemoteScoringActor.options(num_cpus=self.num_cpus, num_gpus=self.num_gpus).remote(
            self.spec, self.threads, self.batch_size)


def plan_actors(spec: ModelSpec, n: int | None, batch_size: int | None, num_gpus: float | None = None,
                num_cpus: float | None = None) -> tuple[ActorRecipe, int]:
    """The per-actor recipe and actor count (default: one per GPU when scoring on GPUs, else one).

    CPU actors split the cluster's CPUs between them (and set torch's threads to match), so two actors on a
    two-core laptop each get one core instead of fighting over both. GPU actors reserve only a fraction of a CPU
    so that a node with few CPUs per GPU cannot deadlock. `num_cpus` overrides both, so that actors for
    different models (a sweep) can share a machine instead of each claiming all of it.
    """
    resources = ray.cluster_resources()
    gpus_total = resources.get("GPU", 0)
    if num_gpus is None:
        num_gpus = 1.0 if spec.device.startswith("cuda") or (spec.device == "auto" and gpus_total) else 0.0
    if n is None:
        n = max(1, int(gpus_total / num_gpus)) if num_gpus else 1
    if n < 1:
        raise RaylmError(f"--actors must be at least 1, got {n}")
    if num_gpus:
        cpus, threads = GPU_ACTOR_CPUS, 1
    else:
        cpus = max(0.01, resources.get("CPU", 1) / n)
        threads = max(1, int(cpus))
    if num_cpus is not None:
        cpus, threads = num_cpus, max(1, int(num_cpus))
    return ActorRecipe(spec, batch_size, cpus, num_gpus, threads), n


class LaunchedActors:
    """Actors asked of Ray but maybe still loading their models, so the driver can do its own work meanwhile."""

    def __init__(self, recipe: ActorRecipe, n: int):
        self.recipe = recipe
        self.actors = [recipe.start() for _ in range(n)]

    def wait_ready(self) -> list[ActorHandle]:
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            raise remote_error("a scoring actor failed to start", e) from e
        log.info("%d scoring actor(s) ready (%s CPU, %s GPU each)", len(self.actors), self.recipe.num_cpus,
                 self.recipe.num_gpus)
        return list(self.actors)

    def release(self) -> None:
        for actor in self.actors:
            ray.kill(actor)


class DeferredStartup(ABC):
    """Base of classes Ray runs as actors (scoring actors, Ray Data's corpus callables): a failure of `start()` is
    raised by the first call to `check_started()` instead of by the constructor.

    Ray prints the whole traceback of an exception raised in an actor's constructor to the driver's terminal, but
    not one raised by a method: from a method, the error reaches the driver as a RayTaskError carrying the cause
    and its remote traceback, which the driver turns into one line and a log file.
    """

    def __init__(self, *args: object, **kwargs: object):
        self._startup_error: StartupError | None = None
        try:
            self.start(*args, **kwargs)
        except Exception as e:  # noqa: BLE001 - raised again by check_started(), with this one chained
            line = str(e).splitlines()[0] if isinstance(e, RaylmError) and str(e) else first_line(e)
            self._startup_error = StartupError(line)
            self._startup_error.__cause__ = e

    @abstractmethod
    def start(self, *args: object, **kwargs: object) -> None:
        """The constructor's work: load the model(s)."""

    def check_started(self) -> None:
        if self._startup_error is not None:
            raise self._startup_error


class StartupError(RaylmError):
    """What DeferredStartup raises: the startup failure in one line, the original chained as its cause."""


def remote_error(what: str, error: ray.exceptions.RayError) -> RemoteError:
    """`what: cause` in one line, keeping Ray's text (the remote traceback) for the log file.

    A RayTaskError carries the exception the actor raised (a RaylmError's message is already the line to show);
    an actor that died (killed, out of memory, node lost) has only Ray's own message.
    """
    cause = getattr(error, "cause", None)
    if isinstance(cause, RaylmError):
        line = str(cause).splitlines()[0]
    else:
        line = first_line(cause if isinstance(cause, BaseException) else error)
    return RemoteError(f"{what}: {line}", remote_traceback(error))


def remote_traceback(error: BaseException) -> str:
    return ANSI_ESCAPE.sub("", str(error))


def start_actors(spec: ModelSpec, n: int | None, batch_size: int | None, num_gpus: float | None = None,
                 num_cpus: float | None = None) -> list[ActorHandle]:
    """Start n actors as `plan_actors` sizes them and wait until their models load."""
    recipe, n = plan_actors(spec, n, batch_size, num_gpus, num_cpus)
    return LaunchedActors(recipe, n).wait_ready()
