"""Actors that die or fail mid-run: shards are re-run, every request is counted once, results do not change."""

from __future__ import annotations

import os
import signal
import sys
from dataclasses import replace

import pytest
import ray
import ray.cloudpickle

from transformers import AutoConfig

from conftest import DATA
from raylm.actors import ScoringActor
from raylm.errors import RaylmError
from raylm.evaluate import EvalConfig, build_task_requests, evaluate
from raylm.encoding import Encoder, resolve_max_length
from raylm.model_loading import ModelSpec, load_tokenizer
from raylm.runtime import ActorRecipe, start_actors
from raylm.scheduler import MAX_TRIES, run_shards
from raylm.shards import make_shards

TASKS = ("hellaswag", "winogrande", "wikitext")


@pytest.fixture(scope="module")
def spec(tiny_llama):
    return ModelSpec(str(tiny_llama), dtype="float32", device="cpu")


@pytest.fixture(scope="module")
def config(spec):
    return EvalConfig(spec, TASKS, DATA, limit=12, shard_requests=4, progress=False)


@pytest.fixture(scope="module")
def undisturbed(ray_session, config):
    return evaluate(config)


def assert_same_results(a, b):
    for name in TASKS:
        assert a.tasks[name].scored.equals(b.tasks[name].scored), name
        assert a.tasks[name].sums == b.tasks[name].sums
        assert a.tasks[name].metrics == b.tasks[name].metrics


def assert_counted_once(result):
    for task in result.tasks.values():
        keys = list(zip(task.scored["doc_id"].to_pylist(), task.scored["req_idx"].to_pylist()))
        assert len(keys) == len(set(keys))


def test_sigkilled_actor_is_replaced_and_results_are_identical(ray_session, config, undisturbed, monkeypatch):
    config = replace(config, num_cpus=0.5)  # replacements must keep the caller's CPU share, not the default
    started = []
    original_start = ActorRecipe.start

    def recorded_start(recipe):
        started.append(recipe)
        return original_start(recipe)

    monkeypatch.setattr(ActorRecipe, "start", recorded_start)
    actors = start_actors(config.model, 2, None, num_cpus=0.5)
    pids = ray.get([a.ready.remote() for a in actors])
    killed = []

    def kill_the_other_actor(shard, scored):
        if not killed:
            victim = next(pid for pid in pids if pid != scored.pid)
            os.kill(victim, signal.SIGKILL)
            killed.append(victim)

    result = evaluate(config, actors, on_shard=kill_the_other_actor)
    assert killed and result.extra["shards"] > 10
    assert result.extra["actors_replaced"] >= 1 and result.extra["shards_retried"] >= 1
    assert result.extra["requests_scored"] == sum(t.scored.num_rows for t in undisturbed.tasks.values())
    assert_same_results(result, undisturbed)
    assert_counted_once(result)
    assert len(started) >= 3 and {r.num_cpus for r in started} == {0.5}
    # The caller's list lost the dead actor (and holds its replacement if that was ready before the run ended).
    assert 1 <= len(actors) <= 2 and killed[0] not in ray.get([a.ready.remote() for a in actors])
    for actor in actors:
        ray.kill(actor)


# Workers cannot import this test module, so its actor class travels by value.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


class FailingActor(ScoringActor):
    """Raises on the first `failures` calls, as a scoring bug or a transient CUDA error would."""

    def __init__(self, spec, failures):
        super().__init__(spec, 1, None)
        self.failures = failures

    def score(self, kind, shard):
        if self.failures:
            self.failures -= 1
            raise ValueError("injected scoring failure")
        return super().score(kind, shard)


@pytest.fixture(scope="module")
def shards(spec):
    tokenizer = load_tokenizer(spec)
    encoder = Encoder(tokenizer, resolve_max_length(AutoConfig.from_pretrained(spec.path), tokenizer))
    cfg = EvalConfig(spec, ("hellaswag",), DATA, limit=3, shard_requests=4, progress=False)
    tables, _ = build_task_requests(cfg, encoder)
    return make_shards(tables, 4)


def test_transient_scoring_failure_is_retried_once(ray_session, spec, shards):
    actor = ray.remote(FailingActor).options(num_cpus=0.5).remote(spec, 1)
    report = run_shards([actor], shards, progress=False)
    assert len(report.results) == len(shards) and report.retried == 1 and report.replaced == 0
    for shard, scored in zip(shards, report.results):
        assert scored.table["doc_id"].to_pylist() == shard.table["doc_id"].to_pylist()
    ray.kill(actor)


def test_shard_that_keeps_failing_stops_the_run_naming_shard_and_cause(ray_session, spec, shards):
    actor = ray.remote(FailingActor).options(num_cpus=0.5).remote(spec, 100)
    with pytest.raises(RaylmError) as err:
        run_shards([actor], shards[:1], progress=False)
    message = str(err.value)
    assert f"shard 0 (hellaswag) failed {MAX_TRIES} times" in message
    assert "ValueError: injected scoring failure" in message and "\n" not in message
    ray.kill(actor)


def test_no_live_actor_and_no_replacement_is_an_error_not_a_hang(ray_session, spec, shards):
    actor = ray.remote(FailingActor).options(num_cpus=0.5).remote(spec, 0)
    ray.kill(actor)
    with pytest.raises(RaylmError, match="no scoring actor left"):
        run_shards([actor], shards, progress=False)
