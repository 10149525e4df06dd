#!/usr/bin/env python3
"""Golden generations from lm-evaluation-harness 0.4.13 (tests/golden/lmeval-0.4.13_generation.json): lm-eval's
own simple_evaluate with HFLM (float32, CPU, batch_size 1, greedy as the tasks ask) on lm-eval's gsm8k, gsm8k_cot
and mmlu_generative YAMLs pointed at the offline mirror (tests/golden/make_generation_tasks.py), small --limit and
--gen_kwargs so that re-running any of them takes seconds.

Models, each rebuilt bit-identically by `build_models` (the JSON's `models` keeps every weight file's SHA-256 so a
test can check its rebuild): stories260K as shipped; seeded random gpt2, llama and mistral (16-token sliding
window) from tests/tiny_families.py (seed 0, 128-token context, so few-shot prompts are left-truncated to
128 - max_gen_toks) with stories260K's tokenizer files copied in; stories260K with the Llama-3-style chat template
of tests/parity_fixtures.py (it writes BOS itself) for the chat-template run.

Per run: `settings` (what simple_evaluate was given), `command` (this script's invocation) and `lm_eval_cli` (the
same run as lm-eval's CLI), lm-eval's results, groups, group_subtasks, n-shot, n-samples, and per task per document:
doc_id, target, prompt_hash (lm-eval's SHA-256 of the context; for the first document of each task and run the
context itself is `contexts[prompt_hash]`, to keep the file small), gen_kwargs (as lm-eval passed them to
HFLM.generate_until), resps, and per filter its filtered_resps and per-document metrics. `checks` (kept across
remakes) says what --check found when the file was made.

usage (lm-eval==0.4.13; HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1):
    python tests/golden/make_generation.py [RUN ...]        (default: every run in RUNS)
    python tests/golden/make_generation.py --check [--batch-size N] [RUN ...]   (run again and count generations
        that differ from the JSON: determinism, and HFLM's own batch-shape sensitivity)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import parity_fixtures as fx  # noqa: E402
import tiny_families  # noqa: E402
from make_generation_tasks import write_tasks  # noqa: E402

OUT = HERE / "lmeval-0.4.13_generation.json"
# qwen2 is left out: transformers 5 loads a qwen2 directory's tokenizer as Qwen2Tokenizer whatever its
# tokenizer_config says, which re-tokenizes the stories260K vocabulary (other ids, other decoded text).
FAMILIES = ("gpt2", "llama", "mistral")
FAMILY_SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json")
BATCH_SIZE = 1
FULL_CONTEXTS = 1  # documents per task and run whose context is kept in full (the others by lm-eval's hash)

RUNS: dict[str, dict] = {
    # the task's default max_gen_toks (256)
    "stories_gsm8k_5shot": {"model": "stories", "tasks": ["gsm8k_local"], "num_fewshot": 5, "limit": 8},
    "stories_gsm8k_cot_8shot": {"model": "stories", "tasks": ["gsm8k_cot_local"], "num_fewshot": 8, "limit": 8,
                                "gen_kwargs": "max_gen_toks=32"},
    # one exemplar, the same before every question, leaves every prompt whole in stories260K's 512 positions: they
    # share it, so the engine keeps it once and attends to it once per step (raylm.scoring.shared_prefix_attention)
    "stories_gsm8k_cot_1shot": {"model": "stories", "tasks": ["gsm8k_cot_local"], "num_fewshot": 1, "limit": 8,
                                "gen_kwargs": "max_gen_toks=32"},
    "stories_mmlu_generative_5shot": {"model": "stories", "tasks": ["mmlu_generative_local"], "num_fewshot": 5,
                                      "limit": 2, "gen_kwargs": "max_gen_toks=32"},
    **{f"{family}_gsm8k_5shot": {"model": family, "tasks": ["gsm8k_local"], "num_fewshot": 5, "limit": 8,
                                 "gen_kwargs": "max_gen_toks=32"} for family in FAMILIES},
    "chat_gsm8k_5shot_multiturn": {"model": "chat", "tasks": ["gsm8k_local"], "num_fewshot": 5, "limit": 4,
                                   "gen_kwargs": "max_gen_toks=32", "apply_chat_template": True,
                                   "fewshot_as_multiturn": True},
}


def family_model(family: str, out: Path) -> Path:
    """tiny_families' seeded random `family` with stories260K's tokenizer files (copied, not re-saved)."""
    path = tiny_families.build(family, out, seed=FAMILY_SEED)
    for name in TOKENIZER_FILES:
        shutil.copy(fx.STORIES / name, path / name)
    return path


def build_models(out: Path) -> dict[str, Path]:
    """Every model RUNS names, under `out` (stories260K is used in place)."""
    models = {"stories": fx.STORIES, "chat": fx.chat_model(out / "chat", fx.LLAMA3_STYLE)}
    for family in FAMILIES:
        models[family] = family_model(family, out)
    return models


def weights_sha(model: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(model.glob("*.safetensors"))}


MODEL_RECIPES = {
    "stories": "raylm/demo/models/stories260K-hf (the tests' stories260K) as shipped",
    "chat": "tests/parity_fixtures.chat_model(dir, parity_fixtures.LLAMA3_STYLE)",
    **{family: f"tests/tiny_families.build({family!r}, dir, seed={FAMILY_SEED}) + stories260K's "
               f"{', '.join(TOKENIZER_FILES)} copied in (make_generation.family_model)" for family in FAMILIES},
}


def lm_eval_cli(run: dict, model: str) -> str:
    args = [f"lm_eval --model hf --model_args pretrained={model},dtype=float32 --device cpu",
            f"--batch_size {BATCH_SIZE} --tasks {','.join(run['tasks'])} --include_path TASKS",
            f"--num_fewshot {run['num_fewshot']} --limit {run['limit']} --log_samples --output_path OUT"]
    if run.get("gen_kwargs"):
        args.append(f"--gen_kwargs {run['gen_kwargs']}")
    if run.get("apply_chat_template"):
        args.append("--apply_chat_template")
    if run.get("fewshot_as_multiturn"):
        args.append("--fewshot_as_multiturn")
    return " ".join(args)


def run_one(name: str, run: dict, model: Path, tasks_dir: Path, contexts: dict[str, str],
            batch_size: int = BATCH_SIZE) -> dict:
    """lm-eval's run and what the JSON keeps of it; `contexts` collects the contexts kept in full."""
    import lm_eval
    from lm_eval.api.registry import get_model
    from lm_eval.tasks import TaskManager

    lm = get_model("hf").create_from_arg_obj({"pretrained": str(model), "dtype": "float32"},
                                             {"batch_size": batch_size, "device": "cpu"})
    res = lm_eval.simple_evaluate(
        model=lm, tasks=run["tasks"], num_fewshot=run["num_fewshot"], limit=run["limit"],
        gen_kwargs=run.get("gen_kwargs"), task_manager=TaskManager(include_path=str(tasks_dir)), log_samples=True,
        apply_chat_template=run.get("apply_chat_template", False),
        fewshot_as_multiturn=run.get("fewshot_as_multiturn", False))
    model_arg = "raylm/demo/models/stories260K-hf" if run["model"] == "stories" else f"<{run['model']} model dir>"
    out = {"settings": {**run, "batch_size": batch_size, "dtype": "float32", "device": "cpu"},
           "command": f"python tests/golden/make_generation.py {name}", "lm_eval_cli": lm_eval_cli(run, model_arg),
           **{key: res.get(key) for key in ("results", "groups", "group_subtasks", "n-shot", "n-samples")},
           "samples": {}}
    for task, samples in res["samples"].items():
        docs: dict[int, dict] = {}
        for s in samples:
            (context, gen_kwargs), = s["arguments"]
            assert s["prompt_hash"] == hashlib.sha256(context.encode("utf-8")).hexdigest()
            doc = docs.setdefault(s["doc_id"], {
                "doc_id": s["doc_id"], "target": s["target"], "prompt_hash": s["prompt_hash"],
                "gen_kwargs": gen_kwargs, "resps": s["resps"], "filters": {}})
            assert doc["resps"] == s["resps"]
            doc["filters"][s["filter"]] = {"filtered_resps": s["filtered_resps"],
                                           **{m: s[m] for m in s["metrics"]}}
            if len(docs) <= FULL_CONTEXTS:
                contexts[s["prompt_hash"]] = context
        out["samples"][task] = [docs[d] for d in sorted(docs)]
    print(name, json.dumps({t: {k: v for k, v in r.items() if "stderr" not in k} for t, r in out["results"].items()}))
    return json.loads(json.dumps(out))  # as the JSON holds it (tuples as lists)


def differing(made: dict, golden: dict) -> tuple[int, int]:
    """(documents whose resps differ, documents) between two runs' samples."""
    pairs = [(a["resps"], b["resps"]) for task, docs in made["samples"].items()
             for a, b in zip(docs, golden["samples"][task], strict=True)]
    return sum(a != b for a, b in pairs), len(pairs)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("runs", nargs="*", help="runs to (re)make (default: all)")
    ap.add_argument("--check", action="store_true", help="compare to the JSON instead of writing it")
    ap.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="HFLM's batch size (with --check only)")
    a = ap.parse_args()
    if a.batch_size != BATCH_SIZE and not a.check:
        ap.error(f"the goldens are made at batch size {BATCH_SIZE}; --batch-size is for --check")
    golden = json.loads(OUT.read_text()) if OUT.is_file() else {"runs": {}, "contexts": {}}
    contexts: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        tasks_dir = tmp / "tasks"
        write_tasks(tasks_dir)
        models = build_models(tmp / "models")
        made = {name: run_one(name, RUNS[name], models[RUNS[name]["model"]], tasks_dir, contexts, a.batch_size)
                for name in a.runs or list(RUNS)}
        if a.check:
            for name, run in made.items():
                n_diff, n = differing(run, golden["runs"][name])
                same = {k: v for k, v in run.items() if k != "settings"} == \
                    {k: v for k, v in golden["runs"][name].items() if k != "settings"}
                print(f"{name} at batch size {a.batch_size}: {n_diff}/{n} generations differ from {OUT.name}; "
                      f"the run {'is identical' if same else 'DIFFERS'} apart from its settings")
            return
        import lm_eval
        import torch
        import transformers

        golden["versions"] = {"lm_eval": lm_eval.__version__, "transformers": transformers.__version__,
                              "torch": torch.__version__}
        golden["models"] = {name: {"recipe": MODEL_RECIPES[name], "weights_sha256": weights_sha(path)}
                            for name, path in models.items() if name != "stories"}
        golden["tasks"] = "python tests/golden/make_generation_tasks.py TASKS (the --include-path of every run)"
        golden["runs"] = {name: golden["runs"][name] for name in RUNS if name in golden["runs"]} | made
    kept = {**golden.get("contexts", {}), **contexts}
    firsts = {docs[0]["prompt_hash"] for run in golden["runs"].values() for docs in run["samples"].values()}
    golden["contexts"] = {h: kept[h] for h in sorted(firsts)}
    OUT.write_text(json.dumps(golden, sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
