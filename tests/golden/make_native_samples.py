#!/usr/bin/env python3
"""lm-eval 0.4.13's own --log_samples jsonl for its hellaswag, winogrande and wikitext on the first rows of the tests'
data (tests/data), for tests/test_sample_logs.py to hold raylm's native tasks' jsonl against.

lm-eval runs its installed task YAMLs unchanged (included), with only the data pointed at the tests' files:
`json` data_files for HellaSwag's validation rows and WinoGrande's dev rows, and WikiText-2's test.txt split
into pages by the goldens' rule (tests/offline_tasks.py's wikitext_pages). The model is
stories260K (HFLM, float32, CPU, batch size 1), zero-shot, the first LIMIT documents of each task; the files are
saved by lm-eval's EvaluationTracker, as its CLI saves them, then renamed without their date.

usage (from the repository root, lm-eval==0.4.13 installed):
    HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 python tests/golden/make_native_samples.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from fixture_data import STORIES as MODEL  # noqa: E402
from fixture_data import data_dir  # noqa: E402
from offline_tasks import wikitext_pages, write_pages  # noqa: E402

DATA = data_dir()
OUT = HERE / "lmeval-0.4.13_native_samples"
LIMIT = 3


def task_yamls(out: Path) -> None:
    import lm_eval.tasks

    tasks = Path(lm_eval.tasks.__file__).parent
    pages = write_pages(wikitext_pages(DATA / "wikitext-2" / "test.txt"), out / "pages.jsonl")
    data = {"hellaswag": ("hellaswag/hellaswag.yaml", "validation", DATA / "hellaswag" / "validation.jsonl"),
            "winogrande": ("winogrande/default.yaml", "validation", DATA / "winogrande" / "dev.jsonl"),
            "wikitext": ("wikitext/wikitext.yaml", "test", pages)}
    for name, (yaml, split, path) in data.items():
        (out / f"{name}.yaml").write_text(
            f"task: {name}\ninclude: {tasks / yaml}\ntag: null\ndataset_path: json\ndataset_name: null\n"
            f"dataset_kwargs:\n  data_files:\n    {split}: {path}\ntraining_split: null\nfewshot_split: null\n"
            + "".join(f"{key}: null\n" for key in ("validation_split", "test_split") if not key.startswith(split)))


def main() -> None:
    import lm_eval
    from lm_eval.loggers import EvaluationTracker
    from lm_eval.tasks import TaskManager

    with tempfile.TemporaryDirectory() as tmp:
        tasks_dir = Path(tmp) / "tasks"
        tasks_dir.mkdir()
        task_yamls(tasks_dir)
        names = ["hellaswag", "winogrande", "wikitext"]
        out = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={MODEL},dtype=float32", tasks=names,
                                      batch_size=1, device="cpu", limit=LIMIT, log_samples=True, bootstrap_iters=0,
                                      task_manager=TaskManager(include_path=str(tasks_dir), include_defaults=False))
        tracker = EvaluationTracker(output_path=str(Path(tmp) / "results.json"))
        tracker.date_id = "date"
        OUT.mkdir(exist_ok=True)
        for name in names:
            tracker.save_results_samples(name, out["samples"][name])
            (Path(tmp) / f"samples_{name}_date.jsonl").replace(OUT / f"samples_{name}.jsonl")


if __name__ == "__main__":
    main()
