"""`--dry-run`: a plan from the config, tokenizer and data alone (raylm.evaluate.dry_run, raylm.corpus.dry_run),
whose token counts are the ones a run's actors record, checked in-process against the code an actor runs
(score_shard; DocPerplexity and DocKL for a corpus)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest
import ray

from conftest import DATA
from raylm.cli import main
from raylm.cluster.actors import ResidentScorer, score_shard
from raylm.cluster.estimate import CPU_RUN_START_S, seconds
from raylm.config import EvalConfig
from raylm.corpus.doc_scoring import DocKL, DocPerplexity
from raylm.corpus.run import CorpusConfig, run_corpus
from raylm.errors import RaylmError
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
    import raylm.corpus.run
    import raylm.evaluate.driver
    import raylm.sweep.run
    from raylm.cluster import runtime

    def refuse(*args, **kwargs):
        raise AssertionError("a dry run asked for an actor or a Ray cluster")

    for module in (runtime, raylm.evaluate.driver, raylm.sweep.run, raylm.corpus.run):
        monkeypatch.setattr(module, "connect", refuse)
    monkeypatch.setattr(runtime.ActorRecipe, "start", refuse)
    monkeypatch.setattr(raylm.corpus.run, "read_corpus", refuse)  # Ray Data's reader


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


def test_a_generation_tasks_plan_holds_the_prompt_tokens_the_actor_records_and_bounds_the_rest(tiny_llama, tmp_path):
    """A generation's prompt tokens are exact; what it prefills (a prefix shared while requests are admitted
    together, which depends on when generations end) and generates are bounded from above."""
    from generation_tasks import write_generation_tasks

    cfg = EvalConfig(ModelSpec(str(tiny_llama), device="cpu"), ("gsm8k_local",), limit=3, progress=False,
                     include_path=write_generation_tasks(tmp_path), gen_kwargs={"max_gen_toks": 4})
    task = eval_plan(cfg)["tasks"]["gsm8k_local"]
    _, tables, _, _ = tokenise(cfg, run_task_docs(cfg), run_selection(cfg), RayStarted(True))
    resident = ResidentScorer(cfg.model, threads=1, batch_size=None)
    scored = [resident.score(shard.kind, shard.table) for shard in make_shards(tables, cfg.shard_requests)]
    assert task["in_requests"] == sum(s.tokens_in_requests for s in scored) > 0
    assert task["computed"]["cpu"] >= sum(s.computed_tokens for s in scored) and not task["computed_exact"]
    assert task["generation_tokens_max"] == 3 * 4 >= sum(sum(s.table["generated_tokens"].to_pylist()) for s in scored)


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


CORPUS_OPTIONS = ("--format", "txt", "--max-length", "32", "--stride", "24", "--docs-per-batch", "4",
                  "--limit-docs", "11")


def corpus_batches(tmp_path: Path) -> tuple[str, list[pa.Table]]:
    """A corpus folder as Ray Data reads it (files in name order, empty lines dropped, a name starting with `_`
    skipped), and the batches of 4 of its first 11 documents a run scores, written out by hand."""
    from test_corpus import wikitext_lines

    lines = wikitext_lines(16)
    folder = tmp_path / "corpus"
    folder.mkdir()
    (folder / "b.txt").write_text("\n\n".join(lines[7:]) + "\n", encoding="utf-8")
    (folder / "a.txt").write_text("\n".join(lines[:7]) + "\n  \n", encoding="utf-8")
    (folder / "_notes.txt").write_text("not a document\n", encoding="utf-8")
    paths = [str(folder / "a.txt")] * 7 + [str(folder / "b.txt")] * 4
    return str(folder), [pa.table({"text": lines[i:min(i + 4, 11)], "path": paths[i:i + 4]}) for i in range(0, 11, 4)]


def test_a_ppl_dry_run_without_weights_counts_what_the_actors_compute(weightless_llama, tiny_llama, tmp_path,
                                                                      monkeypatch):
    refuse_ray(monkeypatch)
    data, batches = corpus_batches(tmp_path)
    before = ray.is_initialized()
    assert main(["ppl", "--model", str(weightless_llama), "--data", data, *CORPUS_OPTIONS, "--output",
                 str(tmp_path / "out"), "--dry-run"]) == 0
    assert ray.is_initialized() == before
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    actor = DocPerplexity(ModelSpec(str(tiny_llama), device="cpu"), 32, 24)
    rows = pa.concat_tables([actor(batch) for batch in batches])
    corpus = plan["corpus"]
    assert (corpus["documents"], corpus["batches"], corpus["tokens"]) == (11, 3, sum(rows["tokens"].to_pylist()))
    assert corpus["computed"]["cpu"] == actor.documents.scorer.computed_tokens
    assert corpus["windows"] > corpus["documents"]  # documents longer than a window: the stride rule counts
    assert plan["model"]["parameters"] > 0 and plan["model_b"] is None
    assert all(c["actors"] >= 1 for c in plan["cost"].values())
    cpu = plan["cost"]["cpu"]  # Ray Data's start besides a run's: a corpus run's fixed cost is the larger
    assert cpu["wall_s"] == pytest.approx(cpu["start_s"] + seconds(corpus["computed"]["cpu"],
                                                                   plan["model"]["parameters"], cpu["flops_per_actor"]))
    assert cpu["start_s"] > CPU_RUN_START_S


def test_a_kl_dry_run_plans_both_models_and_counts_what_the_actor_computes(weightless_llama, tiny_llama, tmp_path,
                                                                           monkeypatch):
    refuse_ray(monkeypatch)
    data, batches = corpus_batches(tmp_path)
    assert main(["kl", "--model", str(weightless_llama), "--model-b", str(weightless_llama), "--data", data,
                 *CORPUS_OPTIONS, "--output", str(tmp_path / "out"), "--dry-run"]) == 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    spec = ModelSpec(str(tiny_llama), device="cpu")
    actor = DocKL(spec, spec, 32, 24)
    for batch in batches:
        actor(batch)
    assert plan["corpus"]["computed"]["cpu"] == plan["corpus"]["computed"]["cuda"] == actor.scorer.computed_tokens
    assert plan["model_b"]["parameters"] == plan["model"]["parameters"]
    h100 = plan["cost"]["H100"]
    one = seconds(actor.scorer.computed_tokens, 2 * plan["model"]["parameters"], h100["flops_per_actor"])
    assert h100["gpu_hours"] == pytest.approx(one / 3600)  # both models run every token


def test_the_run_still_refuses_a_model_folder_without_weights_before_ray(weightless_llama, tmp_path, monkeypatch):
    """The weights check a dry run skips is the run's first step."""
    refuse_ray(monkeypatch)
    data, _ = corpus_batches(tmp_path)
    with pytest.raises(RaylmError, match="has no weights"):
        run_corpus(CorpusConfig(ModelSpec(str(weightless_llama)), data, fmt="txt", progress=False), tmp_path / "out")
