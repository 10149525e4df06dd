"""Starting or attaching to Ray, and placing scoring actors on it: the one sizing policy every command uses."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from raylm.cluster.failures import remote_error
from raylm.errors import RaylmError
from raylm.scoring.models import ModelSpec

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


def gcs_address() -> str | None:
    """Which cluster the results came from, for results.json."""
    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


def disconnect() -> None:
    """Stop the Ray this process started (GCS, raylet, actors); attached to a cluster, only disconnect."""
    if ray.is_initialized():
        ray.shutdown()


def wants_gpu(spec: ModelSpec, num_gpus: float | None) -> bool:
    """The one rule for scoring on GPUs: GPUs asked for per actor, --device cuda, or --device auto on a cluster
    that has GPUs."""
    if num_gpus is not None:
        return num_gpus > 0
    return spec.device.startswith("cuda") or (spec.device == "auto" and ray.cluster_resources().get("GPU", 0) > 0)


def cpu_share(actors: int, reserve: float = 0.0) -> float:
    """The CPUs each of `actors` CPU actors gets when they split the cluster's CPUs, less `reserve` for other
    work; two actors on a two-core laptop get one core each instead of fighting over both."""
    return max(0.01, (ray.cluster_resources().get("CPU", 1) - reserve) / actors)


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

        raylm.cluster.actors imports torch (1-2 s); importing it here rather than with this module keeps it off the
        driver's path to ray.init, which `raylm eval` starts while its tokenising thread does that import.
        """
        from raylm.cluster.actors import RemoteScoringActor

        return RemoteScoringActor.options(num_cpus=self.num_cpus, num_gpus=self.num_gpus).remote(
            self.spec, self.threads, self.batch_size)


def plan_actors(spec: ModelSpec, n: int | None, batch_size: int | None, num_gpus: float | None = None,
                num_cpus: float | None = None, reserve_cpus: float = 0.0) -> tuple[ActorRecipe, int]:
    """The per-actor recipe and actor count (default: one per GPU when scoring on GPUs, else one).

    CPU actors split the cluster's CPUs between them, less `reserve_cpus` left to other work (Ray Data's read
    tasks), and run as many torch threads as their share of the cores. GPU actors reserve only a fraction of a CPU
    so that a node with few CPUs per GPU cannot deadlock. `num_cpus` overrides both, so that actors for different
    models (a sweep) can share a machine instead of each claiming all of it.
    """
    gpu = wants_gpu(spec, num_gpus)
    if num_gpus is None:
        num_gpus = 1.0 if gpu else 0.0
    if n is None:
        n = max(1, int(ray.cluster_resources().get("GPU", 0) / num_gpus)) if gpu else 1
    if n < 1:
        raise RaylmError(f"--actors must be at least 1, got {n}")
    if gpu:
        cpus, threads = GPU_ACTOR_CPUS, 1
    else:
        cpus, threads = cpu_share(n, reserve_cpus), max(1, int(cpu_share(n)))
    if num_cpus is not None:
        cpus, threads = num_cpus, max(1, int(num_cpus))
    return ActorRecipe(spec, batch_size, cpus, num_gpus, threads), n


class LaunchedActors:
    """Actors asked of Ray but maybe still loading their models, so the driver can do its own work meanwhile."""

    def __init__(self, recipe: ActorRecipe, n: int):
        self.recipe = recipe
        self.actors = [recipe.start() for _ in range(n)]

    def wait_ready(self) -> list[ActorHandle]:
        """The actors, once every one has loaded its model. The list is this object's own: the scheduler swaps dead
        actors in it for their replacements, so that release() stops whichever are alive at the end."""
        try:
            ray.get([a.ready.remote() for a in self.actors])
        except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
            raise remote_error("a scoring actor failed to start", e) from e
        log.info("%d scoring actor(s) ready (%s CPU, %s GPU each)", len(self.actors), self.recipe.num_cpus,
                 self.recipe.num_gpus)
        return self.actors

    def release(self) -> None:
        kill(self.actors)


def start_actors(spec: ModelSpec, n: int | None, batch_size: int | None, num_gpus: float | None = None,
                 num_cpus: float | None = None) -> list[ActorHandle]:
    """Start n actors as `plan_actors` sizes them and wait until their models load."""
    recipe, n = plan_actors(spec, n, batch_size, num_gpus, num_cpus)
    return LaunchedActors(recipe, n).wait_ready()


def actor_pids(actors: list[ActorHandle]) -> list[int]:
    return ray.get([a.ready.remote() for a in actors])


def set_batch_size(actors: list[ActorHandle], batch_size: int | None) -> None:
    ray.get([a.set_batch_size.remote(batch_size) for a in actors])


def kill(actors: list[ActorHandle]) -> None:
    for actor in actors:
        ray.kill(actor)
