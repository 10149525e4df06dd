#!/usr/bin/env python3
"""The golden Open LLM Leaderboard v2 run (tests/golden/lmeval-0.4.13_leaderboard.json.xz): lm-eval 0.4.13's own
simple_evaluate of its `leaderboard` group, its YAMLs unchanged, on the offline mirror of tests/leaderboard_mirror.py
(the datasets' schemas with made-up rows, found under their hub names in a `datasets` cache; a test-only untrained
punkt_tab), with HFLM (float32, CPU, batch size 1) on the chat model of make_generation.py (stories260K with
parity_fixtures' Llama-3-style template), `apply_chat_template=True, fewshot_as_multiturn=True`, `--limit 2`,
`--gen_kwargs max_gen_toks=8`, 1,000 bootstrap iterations. The tasks are indexed from lm-eval's own
`tasks/leaderboard` folder alone (include_defaults=False): the same YAMLs its full index resolves the names to.

langdetect is seeded (`DetectorFactory.seed = 0`) as raylm seeds it where it computes lm-eval's metrics: unseeded,
IFEval's language checks may answer differently from one run to the next.

The file keeps `settings`, the lm-eval CLI of the same run, lm-eval's results, groups, group_subtasks, n-shot,
n-samples, higher_is_better, and per task per document: doc_id, target, prompt_hash (the first request's context;
the first document's contexts themselves under `contexts`), each request's arguments but its context (the
continuation of a loglikelihood request, the generation kwargs of a generation), resps, and per filter its
filtered_resps and metrics.

usage (lm-eval==0.4.13 with its ifeval and math extras):  python tests/golden/make_leaderboard.py
"""

from __future__ import annotations

import hashlib
import json
import lzma
import os
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

OUT = HERE / "lmeval-0.4.13_leaderboard.json.xz"
TASKS = ["leaderboard"]
SETTINGS = {"tasks": TASKS, "limit": 2, "gen_kwargs": "max_gen_toks=8", "apply_chat_template": True,
            "fewshot_as_multiturn": True, "batch_size": 1, "dtype": "float32", "device": "cpu",
            "bootstrap_iters": 1000, "model": "chat"}
LM_EVAL_CLI = ("HF_DATASETS_CACHE=MIRROR/hf-datasets NLTK_DATA=MIRROR/nltk_data HF_HUB_OFFLINE=1 "
               "HF_DATASETS_OFFLINE=1 lm_eval --model hf --model_args pretrained=<chat model dir>,dtype=float32 "
               "--device cpu --batch_size 1 --tasks leaderboard --limit 2 --gen_kwargs max_gen_toks=8 "
               "--apply_chat_template --fewshot_as_multiturn --bootstrap_iters 1000 --log_samples --output_path OUT "
               "(after `python tests/leaderboard_mirror.py MIRROR`; lm-eval's CLI does not seed langdetect)")


def leaderboard_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent / "leaderboard"


def kept(res: dict) -> dict:
    """What the golden keeps of simple_evaluate's output (module docstring)."""
    out = {key: res.get(key) for key in ("results", "groups", "group_subtasks", "n-shot", "n-samples",
                                         "higher_is_better")}
    out["samples"], out["contexts"] = {}, {}
    for task, samples in res["samples"].items():
        docs: dict[int, dict] = {}
        for s in samples:
            context = s["arguments"][0][0]
            assert s["prompt_hash"] == hashlib.sha256(context.encode("utf-8")).hexdigest()
            doc = docs.setdefault(s["doc_id"], {
                "doc_id": s["doc_id"], "target": s["target"], "prompt_hash": s["prompt_hash"],
                "arguments": [list(a[1:]) for a in s["arguments"]], "resps": s["resps"], "filters": {}})
            doc["filters"][s["filter"]] = {"filtered_resps": s["filtered_resps"],
                                           **{m: s[m] for m in s["metrics"]}}
            if s["doc_id"] == min(d["doc_id"] for d in samples):
                out["contexts"][task] = [a[0] for a in s["arguments"]]
        out["samples"][task] = [docs[d] for d in sorted(docs)]
    return json.loads(json.dumps(out, default=str))


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        mirror = tmp / "mirror"
        # before datasets and nltk are imported: both read these once, at import
        os.environ.update({"HF_DATASETS_CACHE": str(mirror / "hf-datasets"), "NLTK_DATA": str(mirror / "nltk_data"),
                           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"})
        from leaderboard_mirror import write_mirror

        assert write_mirror(mirror) == (mirror / "hf-datasets", mirror / "nltk_data")
        import langdetect
        import lm_eval
        import parity_fixtures as fx
        import torch
        import transformers
        from lm_eval.api.registry import get_model
        from lm_eval.tasks import TaskManager

        langdetect.DetectorFactory.seed = 0
        model = fx.chat_model(tmp / "chat", fx.LLAMA3_STYLE)
        lm = get_model("hf").create_from_arg_obj({"pretrained": str(model), "dtype": "float32"},
                                                 {"batch_size": 1, "device": "cpu"})
        res = lm_eval.simple_evaluate(
            model=lm, tasks=TASKS, limit=SETTINGS["limit"], gen_kwargs=SETTINGS["gen_kwargs"],
            task_manager=TaskManager(include_path=str(leaderboard_dir()), include_defaults=False), log_samples=True,
            apply_chat_template=True, fewshot_as_multiturn=True, bootstrap_iters=SETTINGS["bootstrap_iters"])
        golden = {"settings": SETTINGS, "command": "python tests/golden/make_leaderboard.py",
                  "lm_eval_cli": LM_EVAL_CLI,
                  "model": "tests/parity_fixtures.chat_model(dir, parity_fixtures.LLAMA3_STYLE)",
                  "versions": {"lm_eval": lm_eval.__version__, "transformers": transformers.__version__,
                               "torch": torch.__version__},
                  **kept(res)}
    with lzma.open(OUT, "wt", encoding="utf-8") as f:
        json.dump(golden, f, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    print(json.dumps({t: {k: v for k, v in r.items() if "stderr" not in k} for t, r in golden["groups"].items()}))
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
