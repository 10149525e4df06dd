#!/usr/bin/env python3
"""lm-evaluation-harness 0.4.13's own outputs for a model on the tests' data: how tests/golden/
lmeval-0.4.13_stories260K*.json.xz were made (stories260K, the runs each file's `runs` lists; see README.md here).

lm-eval runs HFLM (float32, CPU) through lm_eval.simple_evaluate on the task YAMLs of tests/offline_tasks.py,
written over tests/data: the reference tasks (hellaswag_local, winogrande_local, wikitext_local) and lm-eval's own
tasks on the offline mirror (arc_easy_local, boolq_local, piqa_local, mmlu_local, ...). Written as JSON: lm-eval's
results, groups, group_subtasks, n-shot, versions, n-samples and higher_is_better, the wall time, and per document
the (context, continuation) pairs, loglikelihoods and is_greedy of every request.

usage (lm-eval==0.4.13 installed; HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1):
    python tests/golden/make_stories260K.py MODEL TASKS OUT.json [--limit N] [--num-fewshot K]
        [--include-path DIR]      (DIR: task YAMLs to run instead of those written over tests/data)
e.g.  python tests/golden/make_stories260K.py raylm/demo/models/stories260K-hf \\
          hellaswag_local,winogrande_local,wikitext_local out.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixture_data import data_dir  # noqa: E402
from offline_tasks import wikitext_pages, write_mirror_tasks, write_pages, write_reference_tasks  # noqa: E402

KEPT = ("results", "groups", "group_subtasks", "n-shot", "versions", "n-samples", "higher_is_better")


def write_tasks(data: Path, out: Path) -> Path:
    """Every task YAML the goldens ran, over `data` (tests/data unpacked), in `out`."""
    write_mirror_tasks(data / "hf", out)
    pages = write_pages(wikitext_pages(data / "wikitext-2" / "test.txt"), out / "pages.jsonl")
    return write_reference_tasks(data, pages, out)


def sample_entry(sample: dict) -> dict:
    """One document as lm-eval logged it: its requests' arguments and lm-eval's (loglikelihood, is_greedy)."""
    responses = [r[0] for r in sample["resps"]]
    return {"doc_id": sample["doc_id"], "target": sample["target"],
            "arguments": [list(a) if isinstance(a, (list, tuple)) else a for a in sample["arguments"]],
            "loglikelihood": [r[0] if isinstance(r, (list, tuple)) else r for r in responses],
            "is_greedy": [r[1] if isinstance(r, (list, tuple)) and len(r) > 1 else None for r in responses]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("tasks", help="comma-separated task and group names")
    parser.add_argument("out", type=Path)
    parser.add_argument("--limit", type=int)
    parser.add_argument("--num-fewshot", type=int)
    parser.add_argument("--batch-size", default="auto")
    parser.add_argument("--bootstrap-iters", type=int, default=1000)
    parser.add_argument("--include-path", type=Path)
    args = parser.parse_args()
    import lm_eval
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as tmp:
        tasks = args.include_path or write_tasks(data_dir(), Path(tmp))
        start = time.time()
        res = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={args.model},dtype=float32",
                                      tasks=args.tasks.split(","), batch_size=args.batch_size, device="cpu",
                                      limit=args.limit, num_fewshot=args.num_fewshot,
                                      task_manager=TaskManager(include_path=str(tasks)), log_samples=True,
                                      bootstrap_iters=args.bootstrap_iters)
        wall = time.time() - start
    out = {"wall_s": wall, **{key: res[key] for key in KEPT if key in res},
           "samples": {task: [sample_entry(s) for s in samples] for task, samples in res["samples"].items()}}
    args.out.write_text(json.dumps(out, default=str))
    print(json.dumps({"wall_s": round(wall, 2), "results": res["results"]}, default=str, indent=1))


if __name__ == "__main__":
    main()
