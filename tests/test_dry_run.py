"""`raylm eval --dry-run`: a plan from the config, tokenizer and data alone (raylm.evaluate.dry_run), whose token
counts are the ones a run's actors record, checked in-process against the code an actor runs (score_shard)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import ray

from conftest import DATA
from raylm.cli import main
from raylm.cluster.actors import ResidentScorer, score_shard
from raylm.config import EvalConfig
from raylm.evaluate.driver import run_selection, run_task_docs, tokenise
from raylm.evaluate.dry_run import eval_plan
from raylm.evaluate.startup import RayStarted
from raylm.models.spec import ModelSpec
from raylm.requests.shards import make_shards

FEWSHOT_TASKS = ("winogrande", "wikitext")  # a loglikelihood task with 1-shot prefixes, and a rolling corpus


@pytest.fixture(scope="module")
def weightless_llama(tiny_llama: Path, tmp_path_factory) -> Path:
    """tiny_llama's folder without its weights: config and tokenizer only."""
    path = tmp_path_factory.mktemp("weightless-llama")
    for item in tiny_llama.iterdir():
        if item.name != "model.safetensors":
            shutil.copy(item, path / item.name)
    return path


def refuse_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every way a command reaches Ray (each module that calls connect, and an actor's start) fails the test."""
    import raylm.evaluate.driver
    import raylm.sweep.run
    from raylm.cluster import runtime

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run asked for an actor or a Ray cluster")

    for module in (runtime, raylm.evaluate.driver, raylm.sweep.run):
        monkeypatch.setattr(module, "connect", refuse)
    monkeypatch.setattr(runtime.ActorRecipe, "start", refuse)


def test_a_dry_run_without_weights_plans_and_starts_no_ray(weightless_llama, tiny_llama, tmp_path, monkeypatch):
    refuse_ray(monkeypatch)
    out = tmp_path / "out"
    before = ray.is_initialized()  # another test file's session Ray may be up in this process
    assert main(["eval", "--model", str(weightless_llama), "--tasks", *FEWSHOT_TASKS, "--data-dir", str(DATA),
                 "--limit", "4", "--num-fewshot", "1", "--output", str(out), "--dry-run"]) == 0
    assert ray.is_initialized() == before
    plan = json.loads((out / "plan.json").read_text())
    assert not (out / "results.json").exists()
    # counted from the config on the meta device, as the checkpoint's headers count the full folder
    assert plan["model"]["parameters"] == eval_plan(_config(tiny_llama))["model"]["parameters"] > 0
    assert set(plan["tasks"]) == set(FEWSHOT_TASKS)
    assert plan["shards"]["left"] == plan["shards"]["total"] > 0
    assert set(plan["cost"]) == {"cpu", "A10G", "L4", "A100", "H100", "H200"}
    assert all(c["actors"] >= 1 for c in plan["cost"].values())


def _config(model: Path, **kwargs) -> EvalConfig:
    return EvalConfig(ModelSpec(str(model), device="cpu"), FEWSHOT_TASKS, DATA, limit=4, num_fewshot=1,
                      progress=False, **kwargs)


def test_a_dry_runs_token_counts_are_what_the_actors_record(tiny_llama):
    cfg = _config(tiny_llama, shard_requests=8)
    plan = eval_plan(cfg)
    _, tables, _, _ = tokenise(cfg, run_task_docs(cfg), run_selection(cfg), RayStarted(True))
    resident = ResidentScorer(cfg.model, threads=1, batch_size=None)
    recorded: dict[str, list[int]] = {name: [0, 0] for name in tables}
    for shard in make_shards(tables, cfg.shard_requests):
        scored = score_shard(resident.scorer, shard.kind, shard.table)
        recorded[shard.task][0] += scored.tokens_in_requests
        recorded[shard.task][1] += scored.computed_tokens
    planned = {name: [t["in_requests"], t["computed"]["cpu"]] for name, t in plan["tasks"].items()}
    assert planned == recorded
    # the few-shot prefixes are shared: the tree computes fewer tokens than the requests hold
    assert planned["winogrande"][1] < planned["winogrande"][0]


def test_a_sweeps_dry_run_plans_every_point_in_model_order_without_ray(tiny_llama, tiny_gpt2, tmp_path,
                                                                        monkeypatch):
    from test_sweep import POINTS, write_sweep

    refuse_ray(monkeypatch)
    out = tmp_path / "out"
    before = ray.is_initialized()
    assert main(["sweep", str(write_sweep(tmp_path, tiny_llama, tiny_gpt2)), "--output", str(out), "--dry-run"]) == 0
    assert ray.is_initialized() == before
    plan = json.loads((out / "plan.json").read_text())
    assert plan["order"] == ["llama-float32", "gpt2-float32"]
    for model in plan["models"]:
        assert model["runs"][:len(POINTS)] == list(POINTS) and model["skips"] == []
        assert all(p["plan"]["shards"]["left"] > 0 for p in model["points"] if p["kind"] == "eval")
    assert not (out / "llama-float32").exists()  # nothing written but the plan
