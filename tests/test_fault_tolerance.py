"""Actors that die or fail mid-run: shards are re-run, every request is counted once, results do not change."""

from __future__ import annotations

import os
import re
import signal
import sys
from dataclasses import replace

import pytest
import ray
import ray.cloudpickle
from conftest import DATA
from task_requests import build_task_requests
from transformers import AutoConfig

from raylm.cluster.scoring_actor import ScoringActor
from raylm.cluster.runtime import ActorRecipe, LaunchedActors, start_actors
from raylm.cluster.scheduler import run_shards
from raylm.config import EvalConfig
from raylm.errors import RaylmError, RemoteError
from raylm.evaluate import evaluate
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.shards import make_shards

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


class DyingActor(ScoringActor):
    """SIGKILLs itself on its first score call, unless `marker` exists (it creates it first): the first actor
    dies while running its first shard with a second queued behind it; its replacement lives."""

    def __init__(self, spec, marker):
        super().__init__(spec, 1, None)
        self.marker = marker

    def score(self, kind, shard):
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().score(kind, shard)


@pytest.fixture(scope="module")
def shards(spec):
    tokenizer = load_tokenizer(spec)
    encoder = Encoder(tokenizer, resolve_max_length(AutoConfig.from_pretrained(spec.path), tokenizer))
    cfg = EvalConfig(spec, ("hellaswag",), DATA, limit=3, shard_requests=4, progress=False)
    tables, _ = build_task_requests(cfg, encoder)
    return make_shards(tables, 4)


def test_scoring_code_that_raises_stops_the_run_at_once_naming_shard_and_cause(ray_session, spec, shards):
    """The same shard on the same model would raise again: no retries, one line, the remote traceback kept."""
    actor = ray.remote(FailingActor).options(num_cpus=0.5).remote(spec, 1)
    with pytest.raises(RemoteError) as err:
        run_shards([actor], shards, progress=False)
    assert str(err.value) == "shard 0 (hellaswag) failed: ValueError: injected scoring failure"
    assert re.search(r'line \d+, in score\n +raise ValueError\("injected scoring failure"\)', err.value.traceback)
    # The actor is still usable: the failure was the code's, not the process's.
    assert ray.get(actor.ready.remote()) > 0
    ray.kill(actor)


def test_an_actor_whose_model_fails_to_load_is_one_line(ray_session, tmp_path):
    (tmp_path / "config.json").write_text('{"model_type": "llama"}')
    recipe = ActorRecipe(ModelSpec(str(tmp_path), "float32", "cpu"), None, 0.5, 0, 1)
    with pytest.raises(RemoteError) as err:
        LaunchedActors(recipe, 1).wait_ready()
    assert str(err.value).startswith(f"a scoring actor failed to start: could not load model '{tmp_path}': ")
    assert "\n" not in str(err.value) and ", in load_model\n" in err.value.traceback


def test_no_live_actor_and_no_replacement_is_an_error_not_a_hang(ray_session, spec, shards):
    actor = ray.remote(FailingActor).options(num_cpus=0.5).remote(spec, 0)
    ray.kill(actor)
    with pytest.raises(RaylmError, match="no scoring actor left"):
        run_shards([actor], shards, progress=False)


def test_only_the_shard_a_dead_actor_was_running_is_charged_a_try(ray_session, spec, shards, tmp_path):
    """Two shards are in flight per actor; the one queued behind the running shard was never tried, so it must not
    be charged (with three tries, an innocent shard would otherwise run out of them and be named as the cause)."""
    marker = str(tmp_path / "died")

    def dying():
        return ray.remote(DyingActor).options(num_cpus=0.5).remote(spec, marker)

    report = run_shards([dying()], shards, progress=False, replace=dying)
    assert os.path.exists(marker) and report.replaced == 1
    assert report.retried == 1  # the running shard only; the queued one is not counted as tried
    assert [r.table.num_rows for r in report.results] == [s.table.num_rows for s in shards]
    for actor in report.actors:
        ray.kill(actor)
