#!/usr/bin/env python3
"""lm-eval 0.4.13's own generate_until task YAMLs pointed at the offline mirror (tests/data/hf), as an
--include-path: `gsm8k_local`, `gsm8k_cot_local` (openai/gsm8k/main train + test) and the group
`mmlu_generative_local` over the mirror's six MMLU subjects (`mmlu_<subject>_generative_local`, grouped by category
as lm-eval's `mmlu_generative` is, exact_match of the get_response filter weighted by size).

Each task YAML `include`s the installed lm-eval YAML unchanged and overrides only where its data comes from and the
splits the mirror lacks, written by tests/offline_tasks.py's own `override` (called, so the two
generators cannot drift). The YAMLs hold absolute paths: write them where they are used (a test's tmp directory).

usage: python tests/golden/make_generation_tasks.py OUT_DIR      (prints the task and group names)
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from fixture_data import data_dir  # noqa: E402
from offline_tasks import data_files, override  # noqa: E402

MIRROR = data_dir() / "hf"
GSM8K = MIRROR / "openai" / "gsm8k" / "main"
MMLU = MIRROR / "cais" / "mmlu"
GSM8K_TASKS = {"gsm8k_local": "gsm8k/gsm8k.yaml", "gsm8k_cot_local": "gsm8k/gsm8k-cot.yaml"}
MMLU_GROUP = "mmlu_generative_local"


def _aggregate(indent: str) -> list[str]:
    """lm-eval's mmlu/generative/_mmlu.yaml aggregation, the same at every level of the group."""
    return [f"{indent}aggregate_metric_list:", f"{indent}  - metric: exact_match", f"{indent}    weight_by_size: true",
            f"{indent}    filter_list: get_response"]


def gsm8k_yaml(task: str, rel: str) -> str:
    """`task`: lm-eval's YAML at `rel` (under lm_eval/tasks) unchanged but for its data, the mirror's GSM8K."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    include = Path(lm_eval.tasks.__file__).parent / rel
    return override(task, include, data_files(GSM8K), load_yaml(str(include), resolve_func=False))


def data_yaml(folder: Path) -> str:
    """The data keys offline_tasks.override writes for a mirror folder (its lines after `task:` and `include:`),
    for a test's own task YAML on the same data."""
    return "".join(line + "\n" for line in override("", "", data_files(folder), {}).splitlines()[2:])


def write_tasks(out: Path) -> list[str]:
    """Write the YAMLs into `out` and return the names to pass as --tasks (tasks and the MMLU group)."""
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    lmeval_tasks = Path(lm_eval.tasks.__file__).parent
    out.mkdir(parents=True, exist_ok=True)
    for task, rel in GSM8K_TASKS.items():
        (out / f"{task}.yaml").write_text(gsm8k_yaml(task, rel))
    categories = set()
    for subject in sorted(p.name for p in MMLU.iterdir() if p.is_dir()):
        include = lmeval_tasks / "mmlu" / "generative" / f"mmlu_{subject}.yaml"
        cfg = load_yaml(str(include), resolve_func=False)
        category = cfg["tag"].removeprefix("mmlu_").removesuffix("_generative")
        categories.add(category)
        (out / f"mmlu_{subject}_generative_local.yaml").write_text(
            override(f"mmlu_{subject}_generative_local", include, data_files(MMLU / subject), cfg,
                        tag=f"{MMLU_GROUP}_{category}_tasks"))
    group = [f"group: {MMLU_GROUP}", "group_alias: mmlu (generative)", "task:"]
    for category in sorted(categories):
        group += [f"  - group: {MMLU_GROUP}_{category}", f"    group_alias: {category.replace('_', ' ')}",
                  "    task:", f"      - {MMLU_GROUP}_{category}_tasks", *_aggregate("    ")]
    group += [*_aggregate(""), "metadata:", "  version: 3"]
    (out / f"_{MMLU_GROUP}.yaml").write_text("\n".join(group) + "\n")
    return [*GSM8K_TASKS, MMLU_GROUP]


if __name__ == "__main__":
    print(",".join(write_tasks(Path(sys.argv[1]).resolve())))
