"""The whole driver path on real Ray actors: results independent of actor count and shard size."""

from __future__ import annotations

import math
import os

import pytest
import ray
from conftest import DATA
from task_requests import build_task_requests

from raylm.cluster.runtime import start_actors
from raylm.config import EvalConfig
from raylm.evaluate import evaluate
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_config, load_tokenizer
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.results.metrics import choice_metrics, rolling_metrics
from raylm.results.report import results_dict
from raylm.results.sums import merge
from raylm.scoring.sums import shard_sums
from raylm.tasks import get_task

TASKS = ("hellaswag", "winogrande", "wikitext")


@pytest.fixture(scope="module")
def runs(ray_session, tiny_llama):
    """The same evaluation on 1 actor with big shards and on 2 actors with small shards. The two actors are started
    once (starting one, a process importing torch, costs more than the evaluation): the first scores alone."""
    spec = ModelSpec(str(tiny_llama), dtype="float32", device="cpu")
    out = {}
    actors = start_actors(spec, 2, None)
    try:
        for n_actors, shard_requests in ((1, 512), (2, 7)):
            pids = ray.get([a.ready.remote() for a in actors[:n_actors]])
            cfg = EvalConfig(spec, TASKS, DATA, limit=24, shard_requests=shard_requests, progress=False)
            out[n_actors] = (evaluate(cfg, actors[:n_actors]), pids)
    finally:
        for actor in actors:
            ray.kill(actor)
    return out


def test_two_actors_are_two_processes_that_both_score(runs):
    result, pids = runs[2]
    assert len(set(pids)) == 2 and os.getpid() not in pids
    assert result.extra["shards"] > 2


def test_results_record_the_actors_prefix_sharing_verdict(runs):
    for result, _ in runs.values():
        assert results_dict(result)["config"]["prefix_sharing"] == "packed (proven family: LlamaForCausalLM, sdpa)"


def test_metrics_do_not_depend_on_actors_or_shard_size(runs):
    one, two = runs[1][0], runs[2][0]
    for name in TASKS:
        a, b = one.tasks[name], two.tasks[name]
        if a.kind == "multiple_choice":
            assert a.sums == b.sums
        else:
            assert {k: v for k, v in a.sums.items() if k != "nll"} == {k: v for k, v in b.sums.items() if k != "nll"}
            assert a.sums["nll"] == pytest.approx(b.sums["nll"], rel=1e-8)
        assert a.scored["doc_id"].to_pylist() == b.scored["doc_id"].to_pylist()
        assert a.scored["req_idx"].to_pylist() == b.scored["req_idx"].to_pylist()


def test_merged_shard_sums_equal_metrics_from_all_requests(runs):
    result, _ = runs[2]
    for name, task in result.tasks.items():
        whole = shard_sums(task.kind, task.scored)
        assert merge([whole]) == pytest.approx(task.sums, rel=1e-12)
        if task.kind == "multiple_choice":
            assert choice_metrics(whole, get_task(name).choice_metrics) == task.metrics
        else:
            for key, value in rolling_metrics(whole).items():
                assert math.isclose(value, task.metrics[key], rel_tol=1e-12)


def test_every_request_counted_once(runs, tiny_llama):
    """Exactly the requests the driver built (the same (doc_id, req_idx) keys, each once) came back scored, and
    every task counts its 24 documents, the rolling one too."""
    result, _ = runs[2]
    spec = ModelSpec(str(tiny_llama), dtype="float32", device="cpu")
    tokenizer = load_tokenizer(spec)
    tables, _ = build_task_requests(result.config, Encoder(tokenizer, resolve_max_length(load_config(spec), tokenizer)))
    for name, task in result.tasks.items():
        keys = list(zip(task.scored["doc_id"].to_pylist(), task.scored["req_idx"].to_pylist()))
        requests = tables[name][1]
        assert sorted(keys) == sorted(zip(requests["doc_id"].to_pylist(), requests["req_idx"].to_pylist())), name
        assert len(keys) == len(set(keys))
        assert int(task.sums["docs"]) == len({doc for doc, _ in keys}) == 24, name
    assert result.tasks["wikitext"].scored.num_rows > 24  # pages span several windows: more requests than documents


def test_actors_launched_alongside_tokenising_are_released_when_tokenising_fails(ray_session, tiny_llama,
                                                                                monkeypatch):
    """evaluate() starts its actors while the driver tokenises; a failure there must not leave them running."""
    import raylm.evaluate.driver
    import raylm.evaluate.startup
    from raylm.errors import RaylmError

    launched = []

    class Recorded(raylm.evaluate.startup.LaunchedActors):
        def __init__(self, *args):
            super().__init__(*args)
            launched.append(self)

    def broken_encoder(spec):
        raise RaylmError("tokenizer exploded")

    monkeypatch.setattr(raylm.evaluate.startup, "LaunchedActors", Recorded)
    monkeypatch.setattr(raylm.evaluate.driver, "driver_encoder", broken_encoder)
    spec = ModelSpec(str(tiny_llama), dtype="float32", device="cpu")
    with pytest.raises(RaylmError, match="tokenizer exploded"):
        evaluate(EvalConfig(spec, ("hellaswag",), DATA, limit=2, progress=False))
    assert len(launched) == 1 and launched[0].actors
    for actor in launched[0].actors:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=60)


def test_bad_data_fails_before_any_actor_is_launched(ray_session, tiny_llama, tmp_path, monkeypatch):
    import raylm.evaluate.startup
    from raylm.errors import InputError

    def no_launch(*args):
        raise AssertionError("an actor was launched for data that cannot be read")

    monkeypatch.setattr(raylm.evaluate.startup, "LaunchedActors", no_launch)
    (tmp_path / "hellaswag").mkdir()
    (tmp_path / "hellaswag" / "validation.jsonl").write_text("{oops\n")
    spec = ModelSpec(str(tiny_llama), dtype="float32", device="cpu")
    with pytest.raises(InputError, match="row 1: malformed JSON"):
        evaluate(EvalConfig(spec, ("hellaswag",), tmp_path, progress=False))
