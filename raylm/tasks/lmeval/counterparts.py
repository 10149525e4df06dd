"""lm-eval 0.4.13's own hellaswag, winogrande and wikitext on the rows raylm's native tasks read.

raylm scores its native tasks itself, but what lm-eval logs of a document (the doc as its process_docs leaves it,
the target, the request strings, the per-document metrics) is lm-eval's own to say. Each counterpart is the YAML
lm-eval ships, unchanged but for where its documents come from: the native task's rows (from --data-dir or the
hub) under the split names that YAML evaluates and draws few-shot examples from; every other split is dropped,
so a run needs no file the native task does not read. Its requests are built as lm-eval builds them
(raylm.tasks.lmeval.build), for raylm.results.native_logs to check against raylm's own and log.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import datasets
from lm_eval.api.task import ConfigurableTask
from lm_eval.tasks._yaml_loader import load_yaml
from lm_eval.tasks.manager import TaskDict

from raylm.data.rows import Row
from raylm.tasks import get_task
from raylm.tasks.lmeval.build import LMEVAL_LOCK, Built, build, configure
from raylm.tasks.lmeval.index_cache import builtin_root
from raylm.tasks.prompt import PLAIN, PromptFormat

# Each native task's counterpart among lm-eval's task YAMLs (under lm_eval/tasks/).
YAMLS = {"hellaswag": "hellaswag/hellaswag.yaml", "winogrande": "winogrande/default.yaml",
         "wikitext": "wikitext/wikitext.yaml"}
_SPLITS = ("training_split", "validation_split", "test_split", "fewshot_split")


class _OnRows(ConfigurableTask):
    """A ConfigurableTask whose dataset is handed to it instead of downloaded (lm-eval reads it in __init__)."""

    def __init__(self, config: dict[str, Any], dataset: datasets.DatasetDict):
        self._rows = dataset
        super().__init__(config=config)

    def download(self, dataset_kwargs: dict[str, Any] | None = None, **kwargs: Any) -> None:
        self.dataset = self._rows


def counterpart(name: str, data_dir: Path | None, fewshot: bool) -> ConfigurableTask:
    """lm-eval's task `name` on the native task's rows; with `fewshot`, its training split is the native few-shot
    pool's rows."""
    native = get_task(name)
    config = load_yaml(builtin_root() / YAMLS[name])
    config.pop("tag", None)
    evaluated = "test_split" if config.get("test_split") else "validation_split"
    splits = {config[evaluated]: native.load_rows(data_dir)}
    if fewshot:
        splits[config["training_split"]] = native.load_pool_rows(data_dir)
    for key in _SPLITS:
        if config.get(key) not in splits:
            config[key] = None
    return _OnRows(config, datasets.DatasetDict({split: _dataset(rows) for split, rows in splits.items()}))


def _dataset(rows: list[Row]) -> datasets.Dataset:
    return datasets.Dataset.from_list([row.data for row in rows])


def build_counterparts(names: Sequence[str], data_dir: Path | None, *, num_fewshot: int | None,
                       fewshot_seed: int | None, limit: int | float | None,
                       samples: dict[str, list[int]] | None = None, prompt: PromptFormat = PLAIN) -> Built:
    """The native tasks' counterparts with their requests built for a run's settings (EvalConfig's): few-shot
    examples for multiple choice only, as raylm's native tasks take them (raylm.tasks.native)."""
    with LMEVAL_LOCK:
        tasks = {}
        for name in names:
            shots = num_fewshot if get_task(name).kind == "multiple_choice" and num_fewshot else None
            task = counterpart(name, data_dir, fewshot=shots is not None)
            configure(TaskDict(tasks={name: task}, groups={}, group_map={}), shots, fewshot_seed)
            tasks[name] = task
        return build(TaskDict(tasks=tasks, groups={}, group_map={}), limit, samples, prompt)
