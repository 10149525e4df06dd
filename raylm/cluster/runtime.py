"""Starting or attaching to Ray, and placing scoring actors on it: the one sizing policy every command uses."""

from __future__ import annotations

import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import ray
from ray._private import state as ray_state
from ray.actor import ActorHandle
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raylm.cluster.capacity import Capacity, actors_that_fit, capacity_of, hint_from_env
from raylm.cluster.cpus import available_cpus
from raylm.cluster.placement import ONE_GPU_ENV, Ask, Work, plan, uses_gpu, whole_cpu_share
from raylm.cluster.failures import remote_error
from raylm.cluster.waiting import check, progressed, wait
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec

if TYPE_CHECKING:
    import ray.data

log = logging.getLogger(__name__)

LOCAL_OBJECT_STORE_BYTES = 512 * 1024**2
# Actors that no node of the cluster could hold are waited for this long by default (--placement-timeout: an
# autoscaler may add a node), then the run stops naming them; actors that fit but wait for room other jobs hold are
# waited for as long as it takes.
PLACEMENT_WAIT_S = 600.0
READY_POLL_S = 1.0  # also how soon a stopping sweep thread notices (raylm.cluster.waiting)
# Ray starts worker processes at niceness +15 so that its own processes stay responsive. On the local Ray a
# scoring actor is the job, not a bystander: at +15 every runnable process at the driver's niceness (the driver
# tokenising, Ray's daemons) preempts its threads, and each preemption stalls the other OpenMP threads at their
# next barrier. On 2 cores GPT-2-small scored 12-15% faster at the driver's niceness. A system setting rather
# than a per-actor runtime_env (Ray's job supervisor's way) keeps the prestarted workers usable: with a
# runtime_env each actor waited about 1.5 s more for a fresh worker process.
LOCAL_SYSTEM_CONFIG = {"worker_niceness": 0}
_started_here = False  # this process started the Ray it uses (a local one, which no autoscaler grows)


def connect(min_cpus: int = 0) -> None:
    """Attach when RAY_ADDRESS is set (as under `ray job submit`), else start a small local Ray (address="local":
    never silently join a cluster some other `ray start` left on this machine).

    Resource arguments and system settings are only valid when starting a cluster, so an attaching driver passes
    none: on a cluster, workers run at the niceness the cluster was started with. The local Ray has at least
    `min_cpus` logical CPUs, so that the actors a user asks for (each a whole CPU) and the CPU other work keeps all
    fit even where the machine has fewer cores: they then share them, as any processes would.
    """
    global _started_here
    if ray.is_initialized():
        return
    with keeps_sigterm_handler():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
            return
        ray.init(address="local", num_cpus=max(available_cpus(), min_cpus), include_dashboard=False,
                 object_store_memory=LOCAL_OBJECT_STORE_BYTES, _system_config=LOCAL_SYSTEM_CONFIG)
    _started_here = True


@contextmanager
def keeps_sigterm_handler() -> Iterator[None]:
    """ray.init replaces the driver's SIGTERM handler with a bare sys.exit, which unwinds no stage's saving and
    ended `raylm` in an abort; the handler the command set (raylm.cli: SIGTERM as Ctrl-C) is put back."""
    main = threading.current_thread() is threading.main_thread()
    before = signal.getsignal(signal.SIGTERM) if main else None
    try:
        yield
    finally:
        if main:
            signal.signal(signal.SIGTERM, before)


def local_cpus_needed(actors: int | None, reserve_cpus: float = 0.0) -> int:
    """The logical CPUs a local Ray needs for `actors` actors of a whole CPU each and `reserve_cpus` kept free."""
    return math.ceil((actors or 1) + reserve_cpus)


def gcs_address() -> str | None:
    """Which cluster the results came from, for results.json."""
    return ray.get_runtime_context().gcs_address if ray.is_initialized() else None


def disconnect() -> None:
    """Stop the Ray this process started (GCS, raylet, actors); attached to a cluster, only disconnect."""
    global _started_here
    if ray.is_initialized():
        ray.shutdown()
    _started_here = False


def node_resources() -> list[dict[str, float]]:
    """Each live node's total resources: what actors have to fit into, one node each."""
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


def cluster_capacity() -> Capacity:
    """The live nodes, and the node types an autoscaler may add as Ray reports them, else as RAYLM_NODE_TYPES
    says (raylm.cluster.capacity)."""
    read_config = getattr(ray_state.state, "get_cluster_config", None)  # a private API Ray Data reads too
    return capacity_of(node_resources(), read_config() if read_config else None, hint_from_env(), _started_here)


def wants_gpu(spec: ModelSpec, num_gpus: float | None) -> bool:
    """Whether actors for this model score on GPUs here (raylm.cluster.placement's rule)."""
    return uses_gpu(Ask(spec.device, num_gpus), cluster_capacity())[0]


def cpu_share(actors: int, reserve: float = 0.0) -> int:
    """The whole CPUs each of `actors` CPU actors can have with all placed at once on the live nodes, `reserve`
    CPUs left to other work; 1 where they do not all fit, so that the rest queue for CPUs (a sweep's models run
    one after another)."""
    return whole_cpu_share([r.get("CPU", 0.0) for r in node_resources()], actors, reserve) or 1


ReadingGroup = PlacementGroup  # what reserved_for_reading holds, named for the stages above that pass it on


@contextmanager
def reserved_for_reading(cpus: float | None) -> Iterator[ReadingGroup | None]:
    """CPUs held for Ray Data's reads while actors outside Ray Data's view (a sweep's resident actors) hold the
    rest. Reads that asked the cluster for a CPU would wait for ever where those actors hold every one, and not
    every read step takes a CPU request of 0 (Parquet's file listing asks for one whatever the read asks), so the
    run holds what reading needs instead: a placement group made before any actor starts, that only the reads
    are scheduled into (read_in). None: nothing to read, nothing held."""
    if cpus is None:
        yield None
        return
    group = placement_group([{"CPU": cpus}])
    try:
        wait([group.ready()])  # a cluster with no CPU free waits here in view of the watchdog
        yield group
    finally:
        remove_placement_group(group)


def read_in(ds: ray.data.Dataset, group: PlacementGroup) -> None:
    """Every task of the dataset's execution scheduled into `group` (reserved_for_reading)."""
    inside = PlacementGroupSchedulingStrategy(group)
    ds.context.scheduling_strategy = inside
    ds.context.scheduling_strategy_large_args = inside


def import_transformers() -> None:
    """Imports torch and transformers on the driver before anything else there imports transformers (the
    tokenising, the parameter count, a sweep's models' threads), so that no import of it runs beside another.
    transformers' first import ends by replacing its module in sys.modules with a lazy one, and CPython hands an
    `import` statement that another thread runs meanwhile, once the import is done, the module object it found
    before waiting: the replaced one, which holds none of transformers' names. `raylm eval` failed so at random,
    "cannot import name 'DynamicCache' from 'transformers'" (tests/test_import_race.py). Once it is done, the lazy
    module's own imports of its parts are safe from any thread. Not done when this module is imported: torch takes
    seconds, and bad input should fail before that. The scorers are not imported: the driver runs none, and
    starting actors imports neither torch nor transformers (raylm.cluster.scoring_actor)."""
    import torch  # noqa: F401
    import transformers  # noqa: F401


@dataclass(frozen=True)
class ActorRecipe:
    """How one scoring actor is started, kept so the scheduler can start an identical one when an actor dies."""

    spec: ModelSpec  # its device is the placement's: "cuda" or "cpu"
    batch_size: int | None
    num_cpus: float
    num_gpus: float
    threads: int
    reason: str = ""  # the placement's log line
    awaits_nodes: bool = False  # some actors fit only on nodes the autoscaler has yet to add

    def starts_like(self, other: ActorRecipe) -> bool:
        """Whether an actor started from this recipe is one `other` would start (their placement lines aside)."""
        return replace(self, reason="", awaits_nodes=False) == replace(other, reason="", awaits_nodes=False)

    @property
    def gpu_share(self) -> float:
        """The fraction of its GPU the actor may fill: under one GPU, Ray packs other actors beside it on the card
        (--num-gpus 0.5: two); with one or more, each of its GPUs is its own (and a CPU actor has none to share)."""
        return self.num_gpus if 0 < self.num_gpus < 1 else 1.0

    def start(self) -> ActorHandle:
        """Ask Ray for a new actor; it is ready (model loaded) when its `ready()` returns."""
        from raylm.cluster.scoring_actor import RemoteScoringActor

        return RemoteScoringActor.options(**self.options()).remote(self.spec, self.threads, self.batch_size,
                                                                   self.gpu_share)

    def options(self) -> dict[str, object]:
        """What the actor asks of Ray: its CPUs and GPUs, and for a GPU named by index (--device cuda:N) the
        machine's GPUs left visible to it as they are to the driver."""
        named_gpu = self.spec.device.startswith("cuda:")
        return {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus,
                **({"runtime_env": {"env_vars": dict(ONE_GPU_ENV)}} if named_gpu else {})}


def plan_actors(spec: ModelSpec, n: int | None, batch_size: int | None, num_gpus: float | None = None,
                num_cpus: float | None = None, reserve_cpus: float = 0.0, work: Work | None = None,
                capacity: Capacity | None = None) -> tuple[ActorRecipe, int]:
    """The per-actor recipe and actor count for this cluster (or `capacity`, as it was read before), by
    raylm.cluster.placement's rule; `num_cpus` overrides the CPUs per actor (a sweep's models share a machine
    instead of each claiming all of it), `reserve_cpus` is kept free of CPU actors for other work (Ray Data's read
    tasks), and `work` (what is left to score, where known) bounds the default count: none when nothing is left."""
    capacity = capacity if capacity is not None else cluster_capacity()
    placement = plan(Ask(spec.device, num_gpus, num_cpus, n, reserve_cpus, work), capacity)
    recipe = ActorRecipe(replace(spec, device=placement.device), batch_size, placement.num_cpus, placement.num_gpus,
                         placement.threads, placement.reason, placement.awaits_nodes)
    return recipe, placement.actors


class LaunchedActors:
    """Actors asked of Ray but maybe still loading their models, so the driver can do its own work meanwhile."""

    def __init__(self, recipe: ActorRecipe, n: int, started: list[ActorHandle] | None = None):
        """n actors of `recipe`: those `started` already from it (up to n; the others are stopped), and new ones."""
        self.recipe = recipe
        if recipe.reason:
            log.info("placement: %s", recipe.reason)
        started = started or []
        kill(started[n:])
        self.actors = started[:n] + [recipe.start() for _ in range(n - len(started[:n]))]

    def wait_ready(self, placement_wait_s: float | None = None) -> list[ActorHandle]:
        """The actors, once every one has loaded its model. The list is this object's own: the scheduler swaps dead
        actors in it for their replacements, so that release() stops whichever are alive at the end.

        Loading may take as long as it takes (a download, a big checkpoint); what would otherwise hang for ever is
        an actor no node can hold, so that stops the run once it has lasted placement_wait_s (--placement-timeout).
        """
        placement_wait_s = PLACEMENT_WAIT_S if placement_wait_s is None else placement_wait_s
        pending = [a.ready.remote() for a in self.actors]
        unplaceable_since: float | None = None
        while pending:
            check()
            done, pending = ray.wait(pending, num_returns=len(pending), timeout=READY_POLL_S)
            try:
                ray.get(done)
            except (ray.exceptions.RayTaskError, ray.exceptions.RayActorError) as e:
                raise remote_error("a scoring actor failed to start", e) from e
            if done:
                progressed()
            if not pending:
                break
            nodes = node_resources()
            if actors_that_fit(nodes, self.recipe.num_cpus, self.recipe.num_gpus) >= len(self.actors):
                unplaceable_since = None
                continue
            now = time.monotonic()
            if unplaceable_since is None:
                unplaceable_since = now
                awaited = "the autoscaler to add nodes" if self.recipe.awaits_nodes else "a node with room"
                (log.info if self.recipe.awaits_nodes else log.warning)(
                    "%s; waiting up to %g s for %s", self._unplaceable(len(pending), nodes), placement_wait_s,
                    awaited)
            if now - unplaceable_since >= placement_wait_s:
                raise RaylmError(f"{self._unplaceable(len(pending), nodes)}; waited {placement_wait_s:g} s "
                                 "(use fewer --actors or --num-gpus, a cluster with bigger nodes, or a longer "
                                 "--placement-timeout for an autoscaler that adds nodes slowly)")
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
                 num_cpus: float | None = None, placement_wait_s: float | None = None) -> list[ActorHandle]:
    """Start n actors as `plan_actors` sizes them and wait until their models load."""
    recipe, n = plan_actors(spec, n, batch_size, num_gpus, num_cpus)
    launched = LaunchedActors(recipe, n)
    try:
        return launched.wait_ready(placement_wait_s)
    except BaseException:
        launched.release()  # an actor left waiting for a node would keep asking the autoscaler for one
        raise


def actor_pids(actors: list[ActorHandle]) -> list[int]:
    return ray.get([a.ready.remote() for a in actors])


def loaded_as(actors: list[ActorHandle]) -> str:
    """'device/dtype' the actors score with (raylm.cluster.checkpoint.scored_with's form); actors that loaded
    their model differently (nodes of different kinds under --device auto) cannot share one run."""
    seen = sorted({f"{device}/{dtype}" for device, dtype in ray.get([a.loaded_as.remote() for a in actors])})
    if len(seen) > 1:
        raise RaylmError(f"the scoring actors loaded the model differently ({', '.join(seen)}); their results "
                         "cannot be merged: pass --device and --dtype explicitly")
    return seen[0]


def set_batch_size(actors: list[ActorHandle], batch_size: int | None) -> None:
    ray.get([a.set_batch_size.remote(batch_size) for a in actors])


def kill(actors: list[ActorHandle]) -> None:
    for actor in actors:
        ray.kill(actor)
