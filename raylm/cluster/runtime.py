"""Starting or attaching to Ray, and placing scoring actors on it: the one sizing policy every command uses."""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass

import ray
from ray.actor import ActorHandle

from raylm.cluster.cpus import available_cpus
from raylm.cluster.failures import remote_error
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2
GPU_ACTOR_CPUS = 0.5
CPU_UNITS = 10_000  # Ray counts resources in units of 1/10,000
# Actors that no node of the cluster could hold are waited for this long (an autoscaler may add a node), then the
# run stops naming them; actors that fit but wait for room other jobs hold are waited for as long as it takes.
PLACEMENT_WAIT_S = 600.0
READY_POLL_S = 5.0
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
    ray.init(address="local", num_cpus=available_cpus(), include_dashboard=False,
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


def node_resources() -> list[dict[str, float]]:
    """Each live node's total resources: what actors have to fit into, one node each."""
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


def fitted_share(node_cpus: list[float], actors: int, reserve: float = 0.0) -> float:
    """The largest equal CPU share with which `actors` actors all fit on these nodes at once, `reserve` CPUs
    kept free on the largest node; in Ray's 1e-4 CPU units, so that n shares never add up to more than a node.

    The best share divides some node's CPUs evenly between the actors it holds, so only those values are tried.
    """
    units = sorted((round(c * CPU_UNITS) for c in node_cpus if c > 0), reverse=True)
    if units:
        units[0] = max(0, units[0] - round(reserve * CPU_UNITS))
    for share in sorted({u // k for u in units for k in range(1, actors + 1)}, reverse=True):
        if share > 0 and sum(u // share for u in units) >= actors:
            return share / CPU_UNITS
    return 1 / CPU_UNITS


def cpu_share(actors: int, reserve: float = 0.0) -> float:
    """The CPUs each of `actors` CPU actors gets on this cluster (fitted_share): two actors on a two-core laptop
    get one core each instead of fighting over both, and one actor on two one-CPU nodes asks for one CPU, not
    for the two that no node has."""
    return fitted_share([r.get("CPU", 0.0) for r in node_resources()], actors, reserve)


def actors_that_fit(nodes: list[dict[str, float]], num_cpus: float, num_gpus: float) -> int:
    """How many actors asking for num_cpus and num_gpus the nodes could hold at once, each on one node."""
    def per_node(have: float, need: float) -> float:
        return math.floor(have / need + 1e-9) if need > 0 else math.inf

    total = sum(min(per_node(r.get("CPU", 0.0), num_cpus), per_node(r.get("GPU", 0.0), num_gpus)) for r in nodes)
    return int(min(total, 1_000_000))


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

    CPU actors split the cluster's CPUs between them in shares that fit on its nodes (cpu_share), less
    `reserve_cpus` left to other work (Ray Data's read tasks), and run as many torch threads as their share of the
    cores. The default GPU actor count is how many fit on the nodes' GPUs. GPU actors reserve only a fraction of a
    CPU so that a node with few CPUs per GPU cannot deadlock. `num_cpus` overrides both, so that actors for different
    models (a sweep) can share a machine instead of each claiming all of it.
    """
    gpu = wants_gpu(spec, num_gpus)
    if num_gpus is None:
        num_gpus = 1.0 if gpu else 0.0
    if n is None:
        n = max(1, actors_that_fit(node_resources(), 0.0, num_gpus)) if gpu else 1
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

    def wait_ready(self, placement_wait_s: float = PLACEMENT_WAIT_S) -> list[ActorHandle]:
        """The actors, once every one has loaded its model. The list is this object's own: the scheduler swaps dead
        actors in it for their replacements, so that release() stops whichever are alive at the end.

        Loading may take as long as it takes (a download, a big checkpoint); what would otherwise hang for ever is
        an actor no node can hold, so that stops the run once it has lasted placement_wait_s.
        """
        pending = [a.ready.remote() for a in self.actors]
        unplaceable_since: float | None = None
        while pending:
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=READY_POLL_S)
            try:
                ray.get(done)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                raise remote_error("a scoring actor failed to start", e) from e
            if not pending:
                break
            nodes = node_resources()
            if actors_that_fit(nodes, self.recipe.num_cpus, self.recipe.num_gpus) >= len(self.actors):
                unplaceable_since = None
                continue
            now = time.monotonic()
            if unplaceable_since is None:
                unplaceable_since = now
                log.warning("%s; waiting up to %.0f s for a node with room", self._unplaceable(len(pending), nodes),
                            placement_wait_s)
            if now - unplaceable_since >= placement_wait_s:
                raise RaylmError(f"{self._unplaceable(len(pending), nodes)}; waited {placement_wait_s:.0f} s "
                                 "(use fewer --actors or --num-gpus, or a cluster with bigger nodes)")
        log.info("%d scoring actor(s) ready (%s CPU, %s GPU each)", len(self.actors), self.recipe.num_cpus,
                 self.recipe.num_gpus)
        return self.actors

    def _unplaceable(self, pending: int, nodes: list[dict[str, float]]) -> str:
        fit = actors_that_fit(nodes, self.recipe.num_cpus, self.recipe.num_gpus)
        sizes = ", ".join(f"{r.get('CPU', 0):g} CPU/{r.get('GPU', 0):g} GPU" for r in nodes) or "none"
        return (f"cannot place {pending} of {len(self.actors)} scoring actor(s) asking for {self.recipe.num_cpus:g} "
                f"CPU and {self.recipe.num_gpus:g} GPU each: the cluster's nodes ({sizes}) hold {fit} at once")

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
