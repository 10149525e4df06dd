"""The one placement rule every command uses: from what a command asks and what the cluster has and can become
(raylm.cluster.capacity), how many scoring actors, each asking Ray for what, and the one line that says why.

- GPUs: asked for per actor (--num-gpus), by --device cuda, or by --device auto on a cluster that has GPUs or can
  add nodes with them. The cluster's count is one actor per GPU the cluster can grow to, capped at
  DEFAULT_MAX_ACTORS (never fewer than fit on the nodes up now); the default count is the smaller of that and what
  the work left needs (Work: a run one actor finishes in a few minutes gets one). A GPU actor reserves half a CPU,
  so a node with few CPUs per GPU cannot deadlock.
- CPUs: a CPU actor asks for whole CPUs, at least one, and runs that many torch threads: one actor gets what its
  node has (less `reserve_cpus` left to other work), N actors the largest equal whole share with which all fit.
- No work left (every shard in the checkpoint): no actor, whatever --actors says, so no node is asked for.
- What cannot work stops the run at once, in one line: GPUs on a cluster that has and can add none, more actors
  than the cluster can ever hold, and a cluster whose live nodes hold nothing while what it can add is unknown (a
  guess would place every actor wrongly).
- `cuda:N` (lm-eval's one GPU of one machine): one actor, on GPU N of a cluster of one machine that grows no
  further (the local Ray); Ray counts one of its GPUs as the actor's, and the actor sees the machine's GPUs as the
  driver does (ONE_GPU_ENV) and loads the model onto cuda:N. Elsewhere, or with more actors, it is refused.
Where the autoscaler's node types are unknown, actors that do not fit yet are waited for (runtime.LaunchedActors),
as an autoscaler may add their nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from raylm.cluster.capacity import (NODE_TYPES_ENV, Capacity, actors_that_fit, actors_that_fit_grown, grown_cpus)
from raylm.cluster.estimate import PLACEMENT_CPU_THREAD_FLOPS, PLACEMENT_GPU_ACTOR_FLOPS, placement_flops, seconds
from raylm.errors import RaylmError

GPU_ACTOR_CPUS = 0.5
# Ray's switch that leaves CUDA_VISIBLE_DEVICES as the node has it, for an actor that names its GPU (cuda:N)
ONE_GPU_ENV = {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}
DEFAULT_MAX_ACTORS = 16  # default actors on a cluster that can grow: each loads the model; --actors for more
HINT = f"set {NODE_TYPES_ENV} to the node types it may add (docs/cluster.md)"

# The work estimate (Work) is raylm.cluster.estimate's, the one a dry run's plan reports. An actor is given
# TARGET_ACTOR_MINUTES of estimated work: below that, another actor costs more (a node started, a model loaded,
# minutes each) than it saves.
TARGET_ACTOR_MINUTES = 10.0


@dataclass(frozen=True)
class Work:
    """What is left to score: the shards not yet in the checkpoint, the tokens of their requests (every forward
    pass's input: an upper bound, as prefix sharing and truncation only lower it) and the model's parameters."""

    shards: int
    tokens: int
    parameters: int

    def actor_minutes(self, device: str, threads: int = 1) -> float:
        """The estimated minutes one actor on `device` ("cuda" or "cpu", with `threads` torch threads) takes."""
        return seconds(self.tokens, self.parameters, placement_flops(device, threads)) / 60

    def actors_needed(self, device: str, threads: int = 1) -> int:
        """Actors for the work to take at most TARGET_ACTOR_MINUTES each: 0 with nothing left, else at least 1."""
        if not self.shards:
            return 0
        return max(1, min(self.shards, math.ceil(self.actor_minutes(device, threads) / TARGET_ACTOR_MINUTES)))

    def describe(self, device: str, threads: int = 1) -> str:
        return (f"{self.tokens:,} tokens left in {self.shards} shard{'s' if self.shards != 1 else ''} x "
                f"{_count_words(self.parameters)} parameters ~ {_minutes_words(self.actor_minutes(device, threads))} "
                f"actor-minutes at {_flops_words(device, threads)}")


@dataclass(frozen=True)
class Ask:
    """What a command asks for: the model's --device, and per-actor resources and an actor count if given."""

    device: str = "auto"
    num_gpus: float | None = None
    num_cpus: float | None = None
    actors: int | None = None
    reserve_cpus: float = 0.0  # CPUs CPU actors leave free for other work (Ray Data's read tasks)
    work: Work | None = None  # what is left to score; None where it is not known up front (a streamed corpus)


@dataclass(frozen=True)
class Placement:
    actors: int
    num_cpus: float
    num_gpus: float
    threads: int
    device: str  # what the actors load the model onto: "cuda" or "cpu" (the ask's own where there are none)
    reason: str  # the one log line: what was asked for, and why
    awaits_nodes: bool = False  # some actors fit only on nodes the autoscaler has yet to add

    @property
    def gpu(self) -> bool:
        return self.device.startswith("cuda")


def plan(ask: Ask, capacity: Capacity) -> Placement:
    if ask.work is not None and not ask.work.shards:
        check_ask(ask)
        unasked = f"; --actors {ask.actors} not needed" if ask.actors is not None else ""
        return Placement(0, 0.0, 0.0, 0, ask.device,
                         f"no actor: nothing left to score (every shard is in the checkpoint){unasked}")
    gpu, why = uses_gpu(ask, capacity)
    return _plan_gpu(ask, capacity, why) if gpu else _plan_cpu(ask, capacity, why)


def check_ask(ask: Ask) -> None:
    """Requests no cluster can satisfy as meant, refused before anything starts."""
    if ask.actors is not None and ask.actors < 1:
        raise RaylmError(f"--actors must be at least 1, got {ask.actors}")
    if ask.num_gpus is not None and ask.device != "auto" and (ask.num_gpus > 0) != ask.device.startswith("cuda"):
        raise RaylmError(f"--device {ask.device} contradicts --num-gpus {ask.num_gpus:g}")


def uses_gpu(ask: Ask, capacity: Capacity) -> tuple[bool, str]:
    """Whether the actors score on GPUs, and the reason in words."""
    check_ask(ask)
    if ask.num_gpus is not None:
        return ask.num_gpus > 0, f"--num-gpus {ask.num_gpus:g}"
    if ask.device != "auto":
        return ask.device.startswith("cuda"), f"--device {ask.device}"
    if capacity.live_total("GPU") > 0:
        return True, f"--device auto: {capacity.live_total('GPU'):g} GPU(s) up now{_growth(capacity, 'GPU')}"
    if capacity.addable_with("GPU"):
        return True, f"--device auto: no GPU up yet{_growth(capacity, 'GPU')}"
    if capacity.addable is None:
        if not any(r.get("CPU", 0) >= 1 for r in capacity.live):
            raise RaylmError("no node of this cluster has a GPU or a whole CPU for a scoring actor, and raylm cannot "
                             f"tell which nodes its autoscaler may add: {HINT}, or pass --device cuda")
        return False, (f"--device auto: no GPU up now, and the nodes an autoscaler may add are unknown "
                       f"({NODE_TYPES_ENV} unset)")
    return False, "--device auto: no GPU up now and none the cluster can add"


def _growth(capacity: Capacity, resource: str) -> str:
    types = capacity.addable_with(resource)
    if not types:
        return ""
    return f"; the autoscaler may add {', '.join(t.name for t in types)} nodes (from {capacity.source})"


def _plan_one_gpu(ask: Ask, capacity: Capacity) -> Placement:
    """--device cuda:N: one actor on GPU N of the one machine there is."""
    index = int(ask.device.removeprefix("cuda:"))
    if len(capacity.live) != 1 or capacity.addable != ():
        raise RaylmError(f"--device {ask.device} names one GPU of one machine, but this Ray cluster has "
                         f"{len(capacity.live)} node(s) up{' and may add more' if capacity.addable != () else ''}, "
                         "and Ray gives each actor its own GPUs: use --device cuda")
    gpus = capacity.live[0].get("GPU", 0.0)
    if index >= gpus:
        raise RaylmError(f"--device {ask.device}: this machine has {gpus:g} GPU(s) that Ray sees (cuda:0.."
                         f"cuda:{max(int(gpus) - 1, 0)})" if gpus else f"--device {ask.device}: this machine has no "
                         "GPU that Ray sees")
    if (ask.actors or 1) != 1 or (ask.num_gpus or 1) != 1:
        raise RaylmError(f"--device {ask.device} is one GPU for one actor: use --device cuda for --actors or "
                         "--num-gpus")
    cpus = ask.num_cpus if ask.num_cpus is not None else GPU_ACTOR_CPUS
    return Placement(1, cpus, 1.0, max(1, int(cpus)), ask.device, f"1 actor on GPU {index}: --device {ask.device}")


def _plan_gpu(ask: Ask, capacity: Capacity, why: str) -> Placement:
    if ask.device.startswith("cuda:"):
        return _plan_one_gpu(ask, capacity)
    num_gpus = ask.num_gpus if ask.num_gpus is not None else 1.0
    cpus = ask.num_cpus if ask.num_cpus is not None else GPU_ACTOR_CPUS
    now = actors_that_fit(capacity.live, cpus, num_gpus)
    known = capacity.addable is not None
    per = "GPU" if num_gpus == 1 else f"{num_gpus:g} GPUs"
    most = actors_that_fit_grown(capacity, cpus, num_gpus) if known else now
    if known and most == 0:
        raise RaylmError(f"{why}: no node has {num_gpus:g} GPU(s) and {cpus:g} CPU for a scoring actor, now or once "
                         f"the autoscaler adds nodes ({_describe(capacity)})")
    if ask.actors is not None:
        n, count = ask.actors, f"--actors {ask.actors}"
        if known and n > most:
            raise RaylmError(f"--actors {n} of {num_gpus:g} GPU each: this cluster holds at most {most} at once "
                             f"({_describe(capacity)})")
    elif most > now:
        n = max(now, min(most, DEFAULT_MAX_ACTORS))
        count = f"one per {per} the cluster can grow to ({most}" + (
            f", capped at {DEFAULT_MAX_ACTORS}; --actors for more)" if most > DEFAULT_MAX_ACTORS else ")")
    else:
        n = max(1, now)
        count = f"one per {per} up now ({now})" if now else "one; no GPU is up yet"
    if ask.work is not None:
        needed, estimate = ask.work.actors_needed("cuda"), ask.work.describe("cuda")
        if ask.actors is not None:
            count = f"{count} (the work needs {needed}: {estimate})"
        elif needed < n:
            n, count = needed, f"what the work needs ({estimate}), fewer than {count}"
        else:
            count = f"{count}, no more than the work needs ({needed}: {estimate})"
    return Placement(n, cpus, num_gpus, max(1, int(cpus)), "cuda",
                     f"{n} actor{'s' if n != 1 else ''} x {num_gpus:g} GPU ({cpus:g} CPU each): {count}; {why}",
                     awaits_nodes=n > now)


def _plan_cpu(ask: Ask, capacity: Capacity, why: str) -> Placement:
    n = ask.actors if ask.actors is not None else 1
    grown = False
    if ask.num_cpus is not None:
        cpus, how = ask.num_cpus, "CPUs per actor as asked"
    else:
        share = whole_cpu_share([r.get("CPU", 0.0) for r in capacity.live], n, ask.reserve_cpus)
        how = "the nodes up now"
        if share is None and capacity.addable:
            share = whole_cpu_share(grown_cpus(capacity, n), n, ask.reserve_cpus)
            grown = share is not None
            how = f"the nodes the autoscaler may add{_growth(capacity, 'CPU')}"
        if share is None:
            reserve = f" (and {ask.reserve_cpus:g} left to reading)" if ask.reserve_cpus else ""
            if capacity.addable is None:
                raise RaylmError(f"{n} CPU actor(s) of a whole CPU each{reserve} do not fit the nodes up now "
                                 f"({_describe(capacity)}), and raylm cannot tell which nodes the autoscaler may add: "
                                 f"{HINT}, or use fewer --actors")
            raise RaylmError(f"{n} CPU actor(s) of a whole CPU each{reserve} do not fit this cluster "
                             f"({_describe(capacity)}): use fewer --actors")
        cpus = float(share)
    threads = max(1, int(cpus))
    work = ""
    if ask.work is not None:
        needed = ask.work.actors_needed("cpu", threads)
        more = ", one CPU actor by default (--actors for more)" if ask.actors is None and needed > n else ""
        work = f"; the work needs {needed} ({ask.work.describe('cpu', threads)}){more}"
    return Placement(n, cpus, 0.0, threads, "cpu",
                     f"{n} actor{'s' if n != 1 else ''} x {cpus:g} CPU ({threads} torch thread"
                     f"{'s' if threads != 1 else ''} each), sized to {how}{work}; {why}", awaits_nodes=grown)


def threads_with_reading(threads: int, actors: int, reserve_cpus: float) -> int:
    """A CPU actor's torch threads where `reserve_cpus` are left to Ray Data's read tasks: that CPU is Ray's
    bookkeeping, not the actors' idle core, and reading is light and comes in bursts, so the actors compute on it
    too (one actor on a 2-core machine, 2 torch threads, not 1: scoring ran 1.7x slower so, bench/ppl_domains.py)."""
    return threads + int(reserve_cpus // actors)


def whole_cpu_share(node_cpus: list[float], actors: int, reserve: float = 0.0) -> int | None:
    """The most whole CPUs each of `actors` actors can have with all of them placed at once, one node each and
    `reserve` CPUs kept free on the largest node; None if not even one CPU each fits."""
    free = sorted((c for c in node_cpus if c > 0), reverse=True)
    if free:
        free[0] = max(0.0, free[0] - reserve)
    best = None
    for share in range(1, int(max(free, default=0)) + 1):
        if sum(math.floor(c / share + 1e-9) for c in free) >= actors:
            best = share
    return best


def _describe(capacity: Capacity) -> str:
    nodes = ", ".join(f"{r.get('CPU', 0):g} CPU/{r.get('GPU', 0):g} GPU" for r in capacity.live) or "none"
    grow = f"; may add {_describe_types(capacity)}" if capacity.addable else ""
    return f"nodes up: {nodes}{grow}"


def _describe_types(capacity: Capacity) -> str:
    return ", ".join(f"{t.name} x{t.max_count} of {t.resources.get('CPU', 0):g} CPU/{t.resources.get('GPU', 0):g} GPU"
                     for t in capacity.addable or ()) or "no worker types"


def _count_words(n: int) -> str:
    for scale, unit in ((1e9, "B"), (1e6, "M"), (1e3, "K")):
        if n >= scale:
            return f"{n / scale:.3g}{unit}"
    return str(n)


def _minutes_words(minutes: float) -> str:
    return "<0.1" if minutes < 0.1 else f"{minutes:,.1f}" if minutes < 100 else f"{minutes:,.0f}"


def _flops_words(device: str, threads: int) -> str:
    if device == "cuda":
        return f"{PLACEMENT_GPU_ACTOR_FLOPS / 1e12:g} TFLOP/s per GPU actor, {TARGET_ACTOR_MINUTES:g} min each"
    return (f"{PLACEMENT_CPU_THREAD_FLOPS * threads / 1e9:g} GFLOP/s per CPU actor "
            f"({threads} thread{'s' if threads != 1 else ''}), {TARGET_ACTOR_MINUTES:g} min each")
