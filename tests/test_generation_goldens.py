"""What the lm-eval generation goldens (tests/golden/lmeval-0.4.13_generation.json) stand on, rebuilt as a test
must rebuild it: the seeded models bit for bit (a transformers upgrade that changes random initialisation would
silently change every golden generation), and the task YAMLs as lm-eval's own gsm8k, gsm8k_cot and
mmlu_generative with only their data moved to the offline mirror."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(GOLDEN_DIR))

from make_generation import OUT, build_models, weights_sha  # noqa: E402
from make_generation_tasks import MMLU_GROUP, write_tasks  # noqa: E402

DATA_KEYS = {"task", "dataset_path", "dataset_name", "dataset_kwargs", "validation_split", "training_split", "tag"}


@pytest.fixture(scope="module")
def golden() -> dict:
    return json.loads(OUT.read_text())


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("generation-tasks")
    write_tasks(out)
    return out


def test_the_golden_models_rebuild_bit_for_bit(golden, tmp_path):
    models = build_models(tmp_path)
    assert {name: weights_sha(models[name]) for name in golden["models"]} == \
        {name: model["weights_sha256"] for name, model in golden["models"].items()}


@pytest.mark.parametrize("local, lmeval", [("gsm8k_local", "gsm8k/gsm8k.yaml"),
                                           ("gsm8k_cot_local", "gsm8k/gsm8k-cot.yaml"),
                                           ("mmlu_anatomy_generative_local", "mmlu/generative/mmlu_anatomy.yaml")])
def test_local_tasks_are_lm_evals_own_but_for_their_data(tasks, local, lmeval):
    import lm_eval.tasks
    from lm_eval.tasks._yaml_loader import load_yaml

    ours = load_yaml(str(tasks / f"{local}.yaml"), resolve_func=False)
    theirs = load_yaml(str(Path(lm_eval.tasks.__file__).parent / lmeval), resolve_func=False)
    assert {k: v for k, v in ours.items() if k not in DATA_KEYS} == \
        {k: v for k, v in theirs.items() if k not in DATA_KEYS}
    assert (ours["task"], ours["dataset_path"]) == (local, "arrow")


def test_the_mmlu_group_is_the_mirrors_six_subjects_by_category(tasks, golden):
    from lm_eval.tasks import TaskManager

    # include_defaults=False: the YAMLs include lm-eval's by absolute path; its index takes a minute to build.
    loaded = TaskManager(include_path=str(tasks), include_defaults=False).load([MMLU_GROUP])
    run = golden["runs"]["stories_mmlu_generative_5shot"]
    assert sorted(loaded["tasks"]) == sorted(run["n-samples"])
    assert {name: len(task.eval_docs) for name, task in loaded["tasks"].items()} == \
        {name: n["original"] for name, n in run["n-samples"].items()}
    assert sorted(loaded["group_map"][MMLU_GROUP]) == sorted(run["group_subtasks"][MMLU_GROUP])
