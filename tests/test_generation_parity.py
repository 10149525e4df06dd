"""raylm's generations against lm-evaluation-harness 0.4.13's own (tests/golden/lmeval-0.4.13_generation.json, made
by tests/golden/make_generation.py with HFLM, float32, greedy): gsm8k 5-shot at the task's 256 new tokens, gsm8k_cot
8-shot and 1-shot (whose prompts all share the exemplar: the engine attends to it once per step), the mmlu_generative
group 5-shot, gsm8k on seeded gpt2, llama and mistral (sliding window) models whose
128-token context cuts the prompts, and a chat-template multiturn run. Every run goes through `evaluate` on an actor
of the session's Ray, as `raylm eval` runs it: prompts (by lm-eval's hash), generations, filtered responses,
per-document metrics, task and group results equal, character for character."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))

from make_generation import OUT, build_models  # noqa: E402
from make_generation_tasks import write_tasks  # noqa: E402

from raylm.cli.lmeval import parse_pairs  # noqa: E402
from raylm.config import EvalConfig  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402

GOLDEN = json.loads(OUT.read_text())


@pytest.fixture(scope="module")
def setup(tmp_path_factory) -> tuple[Path, dict[str, Path]]:
    root = tmp_path_factory.mktemp("generation-parity")
    write_tasks(root / "tasks")
    return root / "tasks", build_models(root / "models")


@pytest.fixture(scope="module")
def evaluated(ray_session, setup) -> Iterator[dict]:
    """Every golden run's raylm result, each model's runs on one actor of its own."""
    import ray

    from raylm.cluster.runtime import start_actors
    from raylm.evaluate import evaluate

    tasks, models = setup
    out = {}
    by_model: dict[str, list[str]] = {}
    for name, run in GOLDEN["runs"].items():
        by_model.setdefault(run["settings"]["model"], []).append(name)
    for model, names in by_model.items():
        spec = ModelSpec(str(models[model]), dtype="float32", device="cpu")
        actors = start_actors(spec, 1, None)
        try:
            for name in names:
                s = GOLDEN["runs"][name]["settings"]
                cfg = EvalConfig(spec, tuple(s["tasks"]), include_path=tasks, num_fewshot=s["num_fewshot"],
                                 limit=s["limit"], progress=False, log_samples=True, bootstrap_iters=0,
                                 gen_kwargs=parse_pairs([s["gen_kwargs"]], "--gen_kwargs") if "gen_kwargs" in s else None,
                                 apply_chat_template=s.get("apply_chat_template", False),
                                 fewshot_as_multiturn=s.get("fewshot_as_multiturn"))
                out[name] = evaluate(cfg, actors).lmeval
        finally:
            for actor in actors:
                ray.kill(actor)
    yield out


@pytest.mark.parametrize("run", sorted(GOLDEN["runs"]))
def test_generations_filters_and_metrics_are_lm_evals(evaluated, run):
    golden, ours = GOLDEN["runs"][run], evaluated[run]
    for task, samples in golden["samples"].items():
        # lm-eval logs a document once per filter
        mine = {(s["doc_id"], s["filter"]): s for s in ours["samples"][task]}
        assert {doc for doc, _ in mine} == {s["doc_id"] for s in samples}, task
        for theirs in samples:
            for key, filtered in theirs["filters"].items():
                s, where = mine[(theirs["doc_id"], key)], (task, theirs["doc_id"], key)
                assert s["prompt_hash"] == theirs["prompt_hash"], where
                assert s["resps"] == theirs["resps"], where
                assert s["arguments"][0][1] == theirs["gen_kwargs"], where
                assert s["filtered_resps"] == filtered["filtered_resps"], where
                assert {m: s[m] for m in filtered if m != "filtered_resps"} == \
                    {m: v for m, v in filtered.items() if m != "filtered_resps"}, where
    for section in ("results", "groups"):
        for name, metrics in (golden[section] or {}).items():
            assert {k: v for k, v in ours[section][name].items() if "stderr" not in k} == \
                {k: v for k, v in metrics.items() if "stderr" not in k}, (section, name)
    assert ours["n-samples"] == golden["n-samples"]
    assert ours["group_subtasks"] == golden["group_subtasks"]
