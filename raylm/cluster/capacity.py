"""What a Ray cluster has, and what its autoscaler can make of it: the two halves placement plans from.

Placement must ask for what a job needs before the autoscaler has added the nodes (a GPU cluster usually starts as
a head with no CPUs for actors and no GPUs), so it needs the node types the autoscaler may add. Ray tells a driver
that only in part: an autoscaler that reports its node groups to the GCS (`ray._private.state`'s cluster config,
which Ray Data reads) says it, but on Ray 2.60 neither autoscaler reports it (the v1 autoscaler that `ray up` and
KubeRay run by default writes only its status of live and pending nodes, and v2 nothing about node types), so
get_cluster_config() is None on both. A cluster therefore says it in RAYLM_NODE_TYPES, in the shape of Ray's own
cluster config (`available_node_types`, `max_workers`, `head_node_type`): as the path of the config its autoscaler
runs (`ray up` leaves it on the head as ~/ray_bootstrap_config.yaml), or inline as JSON (a KubeRay RayJob, whose
autoscaler reads its config from the RayCluster resource). Where neither Ray nor the hint says, what the cluster
can add is unknown, and placement says so instead of guessing.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from raylm.errors import RaylmError

NODE_TYPES_ENV = "RAYLM_NODE_TYPES"
HEAD_RESOURCE = "node:__internal_head__"  # Ray's marker resource of the head node
UNBOUNDED = 1_000_000  # a node group without a maximum (Ray's -1), as a count no cluster reaches
HINT_KEYS = {"available_node_types", "max_workers", "head_node_type"}
TYPE_KEYS = {"resources", "max_workers", "min_workers"}


@dataclass(frozen=True)
class NodeType:
    """A kind of node the autoscaler may add: its resources, and at most how many of it."""

    name: str
    resources: Mapping[str, float]
    max_count: int


@dataclass(frozen=True)
class Capacity:
    """The live nodes' total resources, and the node types an autoscaler may add (None: unknown; empty: none, as
    on the Ray this process started, or a config that names no worker types)."""

    live: tuple[Mapping[str, float], ...]
    addable: tuple[NodeType, ...] | None
    source: str  # where `addable` was read: shown in the placement line
    max_added: int = UNBOUNDED  # the config's global max_workers: added nodes of all types together

    @property
    def head(self) -> tuple[Mapping[str, float], ...]:
        return tuple(r for r in self.live if r.get(HEAD_RESOURCE, 0) > 0)

    def live_total(self, resource: str) -> float:
        return sum(r.get(resource, 0.0) for r in self.live)

    def addable_with(self, resource: str) -> tuple[NodeType, ...]:
        return tuple(t for t in self.addable or () if t.max_count > 0 and t.resources.get(resource, 0) > 0)


def actors_per_node(resources: Mapping[str, float], num_cpus: float, num_gpus: float) -> int:
    """How many actors asking for num_cpus and num_gpus one node of these resources holds at once."""
    def per(have: float, need: float) -> float:
        return math.floor(have / need + 1e-9) if need > 0 else math.inf

    fit = min(per(resources.get("CPU", 0.0), num_cpus), per(resources.get("GPU", 0.0), num_gpus))
    return int(min(fit, UNBOUNDED))


def actors_that_fit(nodes: list[Mapping[str, float]] | tuple[Mapping[str, float], ...], num_cpus: float,
                    num_gpus: float) -> int:
    """How many such actors the nodes could hold at once, each on one node."""
    return int(min(sum(actors_per_node(r, num_cpus, num_gpus) for r in nodes), UNBOUNDED))


def actors_that_fit_grown(capacity: Capacity, num_cpus: float, num_gpus: float) -> int:
    """How many such actors the cluster holds once the autoscaler has added all it may: the head as it is, and the
    added nodes that hold the most, within each type's and the config's limits. Live workers are taken to be nodes
    of the addable types (on an autoscaling cluster they are), so the larger of this and the live count is what the
    cluster can hold."""
    best = sorted(((actors_per_node(t.resources, num_cpus, num_gpus), t.max_count) for t in capacity.addable or ()),
                  reverse=True)
    total, room = actors_that_fit(capacity.head, num_cpus, num_gpus), capacity.max_added
    for per_node, count in best:
        taken = min(count, room)
        total, room = total + per_node * taken, room - taken
    return int(min(max(total, actors_that_fit(capacity.live, num_cpus, num_gpus)), UNBOUNDED))


def grown_cpus(capacity: Capacity, nodes: int) -> list[float]:
    """The CPUs of the head and of up to `nodes` added nodes with the most CPUs: where `nodes` CPU actors could go
    once the autoscaler has added them."""
    sizes = [t.resources.get("CPU", 0.0) for t in capacity.addable or () for _ in range(min(t.max_count, nodes))]
    sizes = sorted(sizes, reverse=True)[:min(nodes, capacity.max_added)]
    return [r.get("CPU", 0.0) for r in capacity.head] + sizes


def parse_node_types(text: str, where: str = NODE_TYPES_ENV) -> tuple[tuple[NodeType, ...], int]:
    """RAYLM_NODE_TYPES: inline JSON, or the path of a Ray cluster config (YAML); the worker node types and the
    global max_workers. Malformed hints stop the run: a wrong guess would place every actor wrongly."""
    text = text.strip()
    inline = text.startswith("{")
    if inline:
        try:
            config = json.loads(text)
        except json.JSONDecodeError as e:
            raise RaylmError(f"{where} is not valid JSON: {e}") from None
    else:
        path = Path(text).expanduser()
        try:
            config = yaml.safe_load(path.read_text())
        except OSError as e:
            raise RaylmError(f"{where}: cannot read the cluster config '{path}': {e.strerror or e}") from None
        except yaml.YAMLError as e:
            raise RaylmError(f"{where}: '{path}' is not valid YAML: {str(e).splitlines()[0]}") from None
        where = f"{where} ('{path}')"
    return node_types_from_config(config, where, strict=inline)


def node_types_from_config(config: Any, where: str, strict: bool = True) -> tuple[tuple[NodeType, ...], int]:
    """The worker node types of a cluster config (the head type is not one the autoscaler adds) and its global
    max_workers. `strict` refuses keys raylm does not read (inline hints); a launcher config has many more."""
    if not isinstance(config, dict) or not isinstance(config.get("available_node_types"), dict):
        raise RaylmError(f"{where} must be a mapping with available_node_types (Ray's cluster config shape)")
    if strict and set(config) - HINT_KEYS:
        raise RaylmError(f"{where}: unknown key(s) {', '.join(sorted(set(config) - HINT_KEYS))} "
                         f"(use {', '.join(sorted(HINT_KEYS))})")
    max_added = _count(config.get("max_workers", UNBOUNDED), f"{where}: max_workers")
    head = config.get("head_node_type")
    types = []
    for name, node in config["available_node_types"].items():
        what = f"{where}: node type '{name}'"
        if not isinstance(node, dict) or not isinstance(node.get("resources"), dict):
            raise RaylmError(f"{what} needs a resources mapping (e.g. {{\"CPU\": 4, \"GPU\": 1}})")
        if strict and set(node) - TYPE_KEYS:
            raise RaylmError(f"{what}: unknown key(s) {', '.join(sorted(set(node) - TYPE_KEYS))} "
                             f"(use {', '.join(sorted(TYPE_KEYS))})")
        resources = {}
        for key, value in node["resources"].items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise RaylmError(f"{what}: resource {key} must be a number 0 or more, got {value!r}")
            resources[str(key)] = float(value)
        if name != head:
            types.append(NodeType(str(name), resources, min(_count(node.get("max_workers", max_added),
                                                                   f"{what}: max_workers"), max_added)))
    return tuple(types), max_added


def _count(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RaylmError(f"{what} must be a whole number 0 or more, got {value!r}")
    return min(value, UNBOUNDED)


def node_types_from_ray(cluster_config: Any) -> tuple[tuple[NodeType, ...], int]:
    """Ray's own ClusterConfig (autoscaler.proto), as an autoscaler reports it to the GCS: every node group it may
    scale, -1 meaning unbounded. Its max_resources caps are not node counts and are left to Ray."""
    types = tuple(NodeType(g.name, {k: float(v) for k, v in g.resources.items()},
                           UNBOUNDED if g.max_count < 0 else min(g.max_count, UNBOUNDED))
                  for g in cluster_config.node_group_configs)
    return types, UNBOUNDED


def capacity_of(live: list[Mapping[str, float]], ray_config: Any, hint: str | None, started_here: bool) -> Capacity:
    """The cluster's capacity from what Ray reports, the hint, and whether this process started its Ray."""
    if ray_config is not None and ray_config.node_group_configs:
        types, cap = node_types_from_ray(ray_config)
        return Capacity(tuple(live), types, "the autoscaler's config in Ray", cap)
    if hint:
        types, cap = parse_node_types(hint)
        return Capacity(tuple(live), types, NODE_TYPES_ENV, cap)
    if started_here:
        return Capacity(tuple(live), (), "the Ray raylm started on this machine")
    return Capacity(tuple(live), None, "")


def hint_from_env() -> str | None:
    return os.environ.get(NODE_TYPES_ENV) or None
