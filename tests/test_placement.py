"""Sizing actors to fit the cluster's nodes, and an actor no node can hold stopping the run with one line."""

from __future__ import annotations

import math
import random

import pytest

import raylm.cluster.runtime as runtime
from raylm.cluster.runtime import ActorRecipe, LaunchedActors, actors_that_fit, fitted_share, plan_actors
from raylm.errors import RaylmError
from raylm.models.spec import ModelSpec


def fits(node_cpus: list[float], actors: int, share: float, reserve: float) -> bool:
    """Place actors one by one on any node with room left, the reserve taken first from the largest node."""
    free = sorted(node_cpus, reverse=True)
    free[0] -= reserve
    placed = 0
    for i, cpus in enumerate(free):
        while cpus - share >= -1e-9 and placed < actors:
            cpus -= share
            placed += 1
        free[i] = cpus
    return placed == actors


def slow_share(node_cpus: list[float], actors: int, reserve: float) -> float:
    """Every share in Ray's 1e-4 CPU units, largest first, until all actors fit."""
    for units in range(int(max(node_cpus) * 10_000), 0, -1):
        if fits(node_cpus, actors, units / 10_000, reserve):
            return units / 10_000
    return 1e-4


@pytest.mark.parametrize("nodes,actors,reserve,expected", [
    ([2], 1, 0, 2), ([2], 2, 0, 1), ([1, 1], 1, 0, 1), ([1, 1], 2, 0, 1), ([1, 1], 3, 0, 0.5),
    ([3, 1], 2, 0, 1.5), ([4, 2], 1, 1, 3), ([2, 2], 3, 0, 1), ([3], 3, 0, 1), ([2], 3, 0, 0.6666),
])
def test_fitted_share_on_known_clusters(nodes, actors, reserve, expected):
    assert fitted_share(nodes, actors, reserve) == pytest.approx(expected, abs=1e-12)


def test_fitted_share_is_the_largest_share_that_fits_on_random_clusters():
    rnd = random.Random(7)
    for _ in range(40):
        nodes = [rnd.choice([1, 2, 3, 4, 6, 8, 0.5]) for _ in range(rnd.randint(1, 4))]
        actors, reserve = rnd.randint(1, 7), rnd.choice([0, 0, 1])
        if max(nodes) <= reserve:
            continue
        share = fitted_share(nodes, actors, reserve)
        assert fits(nodes, actors, share, reserve), (nodes, actors, reserve, share)
        assert math.isclose(share, slow_share(nodes, actors, reserve), abs_tol=1e-9), (nodes, actors, reserve)


def test_one_actor_on_two_one_cpu_nodes_asks_for_one_cpu(monkeypatch):
    """The defect: the whole cluster's two CPUs were asked for one actor, which no node could hold."""
    monkeypatch.setattr(runtime, "node_resources", lambda: [{"CPU": 1.0}, {"CPU": 1.0}])
    monkeypatch.setattr(runtime, "wants_gpu", lambda spec, num_gpus: False)
    recipe, n = plan_actors(ModelSpec("unused"), None, None)
    assert (n, recipe.num_cpus, recipe.threads) == (1, 1.0, 1)
    recipe, n = plan_actors(ModelSpec("unused"), 3, None)
    assert (n, recipe.num_cpus) == (3, 0.5)


def test_default_gpu_actors_are_as_many_as_fit_on_each_nodes_gpus(monkeypatch):
    monkeypatch.setattr(runtime, "node_resources", lambda: [{"CPU": 8.0, "GPU": 1.0}, {"CPU": 8.0, "GPU": 1.0}])
    recipe, n = plan_actors(ModelSpec("unused"), None, None, num_gpus=0.4)
    assert n == 4 == actors_that_fit(runtime.node_resources(), recipe.num_cpus, 0.4)


def test_an_actor_no_node_can_hold_stops_the_run_with_one_line(ray_session, tiny_llama, monkeypatch):
    """On the session's 2-CPU Ray, an actor asking for 3 CPUs would wait for ever."""
    monkeypatch.setattr(runtime, "READY_POLL_S", 0.2)
    launched = LaunchedActors(ActorRecipe(ModelSpec(str(tiny_llama), "float32", "cpu"), None, 3.0, 0.0, 1), 1)
    try:
        with pytest.raises(RaylmError) as err:
            launched.wait_ready(placement_wait_s=1.0)
    finally:
        launched.release()
    message = str(err.value)
    assert message.startswith("cannot place 1 of 1 scoring actor(s) asking for 3 CPU and 0 GPU each: the cluster's "
                              "nodes (2 CPU/0 GPU) hold 0 at once; waited 1 s")
    assert "\n" not in message
