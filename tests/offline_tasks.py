#!/usr/bin/env python3
"""lm-eval task YAMLs over the tests' offline data, as a user passes them with --include-path.

- Mirror tasks: for each lm-eval task whose data an offline mirror holds (MIRROR/<dataset_path>/<dataset_name or
  none>/<split>/*.arrow, the layout of tests/data/hf), `<task>_local` includes lm-eval's own YAML unchanged and
  overrides only where the data comes from (`dataset_path: arrow` and its `data_files`), setting to null the splits
  the mirror lacks. MMLU subjects also get the groups `mmlu_local` and `mmlu_local_{stem,other,social_sciences,
  humanities}`, built like lm-eval's `mmlu` (size-weighted mean of acc).
- Reference tasks: hellaswag_local, winogrande_local and wikitext_local, lm-eval's own preprocessing on the native
  tasks' files (HellaSwag and WinoGrande JSONL, WikiText-2 split into pages), the tasks the stories260K goldens'
  native numbers were made with.

The YAMLs hold absolute paths: write them where they are used.

usage: python tests/offline_tasks.py MIRROR OUT_DIR      (prints the task and group names)
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

# lm-eval task -> (its YAML under lm_eval/tasks, its folder in the mirror)
MIRROR_TASKS = {
    "arc_easy": ("arc/arc_easy.yaml", "allenai/ai2_arc/ARC-Easy"),
    "piqa": ("piqa/piqa.yaml", "baber/piqa/none"),
    "boolq": ("super_glue/boolq/default.yaml", "aps/super_glue/boolq"),
}
MMLU = "cais/mmlu"
# A task config's split keys and the split lm-eval reads when the key is absent.
SPLIT_KEYS = {"training_split": "train", "validation_split": "validation", "test_split": "test",
              "fewshot_split": None}
MMLU_AGGREGATE = "aggregate_metric_list:\n  - metric: acc\n    weight_by_size: true\nmetadata:\n  version: 2\n"
# The start of a WikiText-2 article: a level-1 heading line.
ARTICLE_HEADING = re.compile(r"^ = [^=].* = $")


def lmeval_tasks_dir() -> Path:
    import lm_eval.tasks

    return Path(lm_eval.tasks.__file__).parent


def data_files(folder: Path) -> dict[str, list[Path]]:
    """The mirror's splits under `folder` that hold Arrow files, by split name."""
    splits = {}
    for split in sorted(p.name for p in folder.iterdir()):
        files = sorted((folder / split).glob("*.arrow"))
        if files:
            splits[split] = files
    return splits


def override(task: str, include: Path | str, files: dict[str, list[Path]], config: dict,
             tag: str | None = None) -> str:
    """The YAML of `task`: lm-eval's `include` with its data from `files`, and null for the splits that `config`
    (the included YAML) reads but `files` lacks, so lm-eval does not look for them."""
    lines = [f"task: {task}", f"include: {include}", "dataset_path: arrow", "dataset_name: null", "dataset_kwargs:",
             "  data_files:"]
    lines += [f"    {split}: [{', '.join(map(str, paths))}]" for split, paths in files.items()]
    for key, default in SPLIT_KEYS.items():
        split = config.get(key, default)
        if split is not None and split not in files:
            lines.append(f"{key}: null")
    if tag:
        lines.append(f"tag: {tag}")
    return "\n".join(lines) + "\n"


def write_mirror_tasks(mirror: Path, out: Path) -> list[str]:
    """The mirror tasks of every dataset `mirror` holds, in `out`; returns the task and group names."""
    from lm_eval.tasks._yaml_loader import load_yaml

    tasks = lmeval_tasks_dir()
    out.mkdir(parents=True, exist_ok=True)
    names = []
    for task, (rel, folder) in MIRROR_TASKS.items():
        if (mirror / folder).is_dir():
            include = tasks / rel
            config = load_yaml(str(include), resolve_func=False)
            (out / f"{task}_local.yaml").write_text(
                override(f"{task}_local", include, data_files(mirror / folder), config))
            names.append(f"{task}_local")
    if (mirror / MMLU).is_dir():
        categories = set()
        for subject in sorted(p.name for p in (mirror / MMLU).iterdir()):
            include = tasks / "mmlu" / "default" / f"mmlu_{subject}.yaml"
            config = load_yaml(str(include), resolve_func=False)
            category = config["tag"].removeprefix("mmlu_").removesuffix("_tasks")
            categories.add(category)
            (out / f"mmlu_{subject}_local.yaml").write_text(
                override(f"mmlu_{subject}_local", include, data_files(mirror / MMLU / subject), config,
                         tag=f"mmlu_local_{category}_tasks"))
        for category in sorted(categories):
            (out / f"_mmlu_local_{category}.yaml").write_text(
                f"group: mmlu_local_{category}\ngroup_alias: {category}\ntask:\n  - mmlu_local_{category}_tasks\n"
                + MMLU_AGGREGATE)
        (out / "_mmlu_local.yaml").write_text(
            "group: mmlu_local\ntask:\n" + "".join(f"  - mmlu_local_{c}\n" for c in sorted(categories))
            + MMLU_AGGREGATE)
        names.append("mmlu_local")
    return names


def wikitext_pages(test_txt: Path) -> list[str]:
    """WikiText-2 split into articles: one starts at each level-1 heading once the current one holds any
    non-blank text (lines before the first heading belong to the first), newlines kept."""
    pages: list[list[str]] = [[]]
    for line in test_txt.read_text(encoding="utf-8").splitlines(keepends=True):
        if ARTICLE_HEADING.match(line.rstrip("\n")) and "".join(pages[-1]).strip():
            pages.append([])
        pages[-1].append(line)
    return ["".join(page) for page in pages if page]


def write_pages(pages: list[str], path: Path) -> Path:
    """`pages` as the JSONL wikitext_local reads (one {"page": text} per line)."""
    path.write_text("".join(json.dumps({"page": page}) + "\n" for page in pages))
    return path


# The reference tasks' preprocessing: lm-eval's own functions, imported from the installed lm_eval.
REFERENCE_UTILS = """\
from lm_eval.tasks.hellaswag.utils import process_docs as hellaswag_process_docs
from lm_eval.tasks.winogrande.preprocess_winogrande import (
    doc_to_text as wg_doc_to_text, doc_to_target as wg_doc_to_target, doc_to_choice as wg_doc_to_choice)
from lm_eval.tasks.wikitext.preprocess_wikitext import (
    wikitext_detokenizer, process_results as wikitext_process_results)
"""
ACC_METRICS = "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"


def write_reference_tasks(data: Path, pages: Path, out: Path) -> Path:
    """hellaswag_local, winogrande_local (few-shot pool: train_s.jsonl) on `data`'s files and wikitext_local on
    `pages` (write_pages' JSONL), with their utils.py, in `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "utils.py").write_text(REFERENCE_UTILS)
    (out / "hellaswag_local.yaml").write_text(
        "task: hellaswag_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    validation: {data / 'hellaswag' / 'validation.jsonl'}\n"
        "output_type: multiple_choice\nvalidation_split: validation\n"
        "process_docs: !function utils.hellaswag_process_docs\n"
        "doc_to_text: \"{{query}}\"\ndoc_to_target: \"{{gold}}\"\ndoc_to_choice: \"choices\"\n" + ACC_METRICS
        + "  - metric: acc_norm\n    aggregation: mean\n    higher_is_better: true\n")
    (out / "winogrande_local.yaml").write_text(
        "task: winogrande_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n"
        f"    validation: {data / 'winogrande' / 'dev.jsonl'}\n    train: {data / 'winogrande' / 'train_s.jsonl'}\n"
        "output_type: multiple_choice\ntraining_split: train\nvalidation_split: validation\n"
        "doc_to_text: !function utils.wg_doc_to_text\ndoc_to_target: !function utils.wg_doc_to_target\n"
        "doc_to_choice: !function utils.wg_doc_to_choice\n" + ACC_METRICS)
    (out / "wikitext_local.yaml").write_text(
        f"task: wikitext_local\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {pages}\n"
        "output_type: loglikelihood_rolling\ntest_split: test\ndoc_to_text: \"\"\n"
        "doc_to_target: !function utils.wikitext_detokenizer\n"
        "process_results: !function utils.wikitext_process_results\n"
        "metric_list:\n  - metric: word_perplexity\n  - metric: byte_perplexity\n  - metric: bits_per_byte\n")
    return out


if __name__ == "__main__":
    print(",".join(write_mirror_tasks(Path(sys.argv[1]).resolve(), Path(sys.argv[2]).resolve())))
