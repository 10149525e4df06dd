"""Native tasks' results in lm-eval's results shape, so one results.json (and lm-eval's make_table) covers both.

raylm's own hellaswag, winogrande and wikitext compute their metrics themselves (tested against lm-eval's
numbers). What lm-eval would record around those numbers is metadata of the lm-eval task each one reproduces:
its version, metric directions and sources, written down here (tests/test_lmeval_results.py checks them against
lm-eval's own YAMLs), and lm-eval's rules for the entries: metrics under `metric,none`, a `metric_stderr,none`
beside each, "N/A" where lm-eval has no stderr (no stderr function, one document, or bootstrap_iters 0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from raylm.results.contamination import SUFFIX

if TYPE_CHECKING:
    from raylm.config import EvalConfig
    from raylm.results.eval_result import TaskResult


@dataclass(frozen=True)
class LmEvalTask:
    """The lm-eval 0.4.13 task a native task reproduces, as its YAML states it."""

    version: float
    output_type: str
    dataset_path: str
    dataset_name: str | None
    higher_is_better: dict[str, bool]
    stderr: bool  # lm-eval's aggregation has a stderr (mean); the perplexities' weighted means have none


MIRRORS = {
    "hellaswag": LmEvalTask(1.0, "multiple_choice", "Rowan/hellaswag", None, {"acc": True, "acc_norm": True}, True),
    "winogrande": LmEvalTask(1.0, "multiple_choice", "allenai/winogrande", "winogrande_xl", {"acc": True}, True),
    "wikitext": LmEvalTask(2.0, "loglikelihood_rolling", "EleutherAI/wikitext_document_level", "wikitext-2-raw-v1",
                           {"word_perplexity": False, "byte_perplexity": False, "bits_per_byte": False}, False),
}
NOT_AVAILABLE = "N/A"


def task_entry(task: TaskResult, bootstrap_iters: int) -> dict[str, Any]:
    """results[name]: lm-eval's fixed keys, then each metric and its stderr in lm-eval's order; with
    --decontaminate, each again over the clean documents under its `_decontaminate` name."""
    mirror = MIRRORS[task.name]
    docs = int(task.sums["docs"])
    entry: dict[str, Any] = {"name": task.name, "alias": task.name, "sample_len": docs}
    passes = [("", task.metrics, docs)]
    if task.decontaminated:
        passes.append((SUFFIX, task.decontaminated, task.n_clean or 0))
    for suffix, metrics, n in passes:
        for metric in mirror.higher_is_better:
            entry[f"{metric}{suffix},none"] = metrics[f"{metric}{suffix},none"]
            stderr = metrics.get(f"{metric}{suffix}_stderr,none")
            has_stderr = (mirror.stderr and bootstrap_iters > 0 and n > 1 and stderr is not None
                          and math.isfinite(stderr))
            entry[f"{metric}{suffix}_stderr,none"] = stderr if has_stderr else NOT_AVAILABLE
    return entry


def higher_is_better(task: TaskResult) -> dict[str, bool]:
    directions = dict(MIRRORS[task.name].higher_is_better)
    if task.decontaminated:
        directions.update({f"{metric}{SUFFIX}": h for metric, h in MIRRORS[task.name].higher_is_better.items()})
    return directions


def sample_counts(task: TaskResult) -> dict[str, int]:
    """n-samples[name]: lm-eval's counts, and with --decontaminate the clean documents (`decontaminate`)."""
    counts = {"original": task.n_docs_original, "effective": int(task.sums["docs"])}
    return counts | ({"decontaminate": task.n_clean} if task.n_clean is not None else {})


def task_config(name: str, cfg: EvalConfig) -> dict[str, Any]:
    """configs[name]: what the native task ran, in lm-eval TaskConfig's keys."""
    mirror = MIRRORS[name]
    return {
        "task": name,
        "dataset_path": str(cfg.data_dir / name) if cfg.data_dir is not None else mirror.dataset_path,
        **({"dataset_name": mirror.dataset_name} if mirror.dataset_name and cfg.data_dir is None else {}),
        "output_type": mirror.output_type,
        "num_fewshot": n_shot(name, cfg),
        "metric_list": [{"metric": m, "higher_is_better": h} for m, h in mirror.higher_is_better.items()],
        "metadata": {"version": mirror.version, "implementation": "raylm native"},
    }


def n_shot(name: str, cfg: EvalConfig) -> int:
    """Few-shot examples the native task used: rolling loglikelihood has no prompt to put them in."""
    return (cfg.num_fewshot or 0) if MIRRORS[name].output_type == "multiple_choice" else 0


def lmeval_shape(tasks: dict[str, TaskResult], cfg: EvalConfig) -> dict[str, dict[str, Any]]:
    """The native tasks' part of every per-task section of lm-eval's results dict."""
    return {
        "results": {name: task_entry(t, cfg.bootstrap_iters) for name, t in tasks.items()},
        "configs": {name: task_config(name, cfg) for name in tasks},
        "versions": {name: MIRRORS[name].version for name in tasks},
        "n-shot": {name: n_shot(name, cfg) for name in tasks},
        "higher_is_better": {name: higher_is_better(t) for name, t in tasks.items()},
        "n-samples": {name: sample_counts(t) for name, t in tasks.items()},
    }
