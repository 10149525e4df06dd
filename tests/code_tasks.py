#!/usr/bin/env python3
"""Offline mirrors of the code-execution datasets lm-eval's humaneval and mbpp tasks read, in their exact schemas,
and `<task>_local` YAMLs over them (lm-eval's own YAML included, only the data pointed here), as a user passes
them with --include-path.

The datasets (openai/openai_humaneval, evalplus/humanevalplus, google-research-datasets/mbpp `full`,
evalplus/mbppplus) cannot be fetched here, so the rows are this file's own small problems, written for these tests
(the repository's licence), each with the columns and types of the dataset it stands in for. Each problem has a
correct solution (`SOLUTIONS`) and a wrong one (`WRONG`), which the tests feed as generations.

usage: python tests/code_tasks.py OUT_DIR      (prints the task names)
"""

from __future__ import annotations

import sys
from pathlib import Path

from offline_tasks import data_files, lmeval_tasks_dir, override

# (entry point, HumanEval-style prompt, a correct completion of it, a wrong one, assertions on `candidate`)
PROBLEMS = [
    ("add_two", 'def add_two(a: int, b: int) -> int:\n    """Return the sum of a and b.\n    >>> add_two(2, 3)\n'
     '    5\n    """\n', "    return a + b\n", "    return a - b\n",
     ["candidate(2, 3) == 5", "candidate(-1, 1) == 0", "candidate(10, 0) == 10"]),
    ("count_vowels", 'def count_vowels(text: str) -> int:\n    """How many of the letters in text are vowels (a, e, i,'
     ' o, u, either case).\n    >>> count_vowels("Ray")\n    1\n    """\n',
     '    return sum(ch in "aeiouAEIOU" for ch in text)\n', '    return sum(ch in "aeiou" for ch in text)\n',
     ['candidate("Ray") == 1', 'candidate("ORANGE") == 3', 'candidate("") == 0']),
    ("running_max", 'def running_max(xs: list) -> list:\n    """The largest value so far at each position.\n'
     '    >>> running_max([1, 3, 2])\n    [1, 3, 3]\n    """\n',
     "    out, best = [], None\n    for x in xs:\n        best = x if best is None else max(best, x)\n"
     "        out.append(best)\n    return out\n", "    return sorted(xs)\n",
     ["candidate([1, 3, 2]) == [1, 3, 3]", "candidate([]) == []", "candidate([5, 4, 6, 1]) == [5, 5, 6, 6]"]),
    ("is_palindrome", 'def is_palindrome(text: str) -> bool:\n    """Whether text reads the same backwards, ignoring'
     ' case.\n    >>> is_palindrome("Level")\n    True\n    """\n', "    return text.lower() == text.lower()[::-1]\n",
     "    return text == text[::-1]\n",
     ['candidate("Level") is True', 'candidate("raylm") is False', 'candidate("") is True']),
]
SOLUTIONS = [solution for _, _, solution, _, _ in PROBLEMS]
WRONG = [wrong for _, _, _, wrong, _ in PROBLEMS]


def humaneval_rows() -> list[dict]:
    """openai/openai_humaneval's columns: task_id, prompt, canonical_solution, test (a `check(candidate)`),
    entry_point."""
    return [{"task_id": f"HumanEval/{i}", "prompt": prompt, "canonical_solution": solution,
             "test": "\n\nMETADATA = {}\n\n\ndef check(candidate):\n" + "".join(f"    assert {a}\n" for a in asserts),
             "entry_point": name} for i, (name, prompt, solution, _, asserts) in enumerate(PROBLEMS)]


def mbpp_rows() -> list[dict]:
    """google-research-datasets/mbpp `full`'s columns: task_id (int32), text, code, test_list, test_setup_code,
    challenge_test_list; task ids from 11, where the real test split starts."""
    return [{"task_id": 11 + i, "text": prompt.split('"""')[1].split("\n")[0], "code": prompt.split('\n')[0] + "\n"
             + solution, "test_list": [f"assert {a.replace('candidate', name)}" for a in asserts],
             "test_setup_code": "", "challenge_test_list": []}
            for i, (name, prompt, solution, _, asserts) in enumerate(PROBLEMS)]


def mbppplus_rows() -> list[dict]:
    """evalplus/mbppplus's columns: task_id (int64), code, prompt, source_file, test_imports, test_list, test."""
    return [{"task_id": row["task_id"], "code": row["code"], "prompt": row["text"], "source_file": "raylm tests",
             "test_imports": [], "test_list": row["test_list"], "test": "\n".join(row["test_list"]) + "\n"}
            for row in mbpp_rows()]


def features(schema: str):
    """The columns' types of each dataset (`datasets` is imported here, when a mirror is written)."""
    import datasets

    return {
        "humaneval": datasets.Features({k: datasets.Value("string") for k in
                                        ("task_id", "prompt", "canonical_solution", "test", "entry_point")}),
        "mbpp": datasets.Features({"task_id": datasets.Value("int32"), "text": datasets.Value("string"),
                                   "code": datasets.Value("string"),
                                   "test_list": datasets.Sequence(datasets.Value("string")),
                                   "test_setup_code": datasets.Value("string"),
                                   "challenge_test_list": datasets.Sequence(datasets.Value("string"))}),
        "mbppplus": datasets.Features({"task_id": datasets.Value("int64"), "code": datasets.Value("string"),
                                       "prompt": datasets.Value("string"), "source_file": datasets.Value("string"),
                                       "test_imports": datasets.Sequence(datasets.Value("string")),
                                       "test_list": datasets.Sequence(datasets.Value("string")),
                                       "test": datasets.Value("string")}),
    }[schema]


# mirror folder -> (its rows, their features); the layout of tests/data/hf (<dataset_path>/<name or none>/<split>)
MIRRORS = {
    "openai/openai_humaneval/none": (humaneval_rows, "humaneval"),
    "evalplus/humanevalplus/none": (humaneval_rows, "humaneval"),
    "google-research-datasets/mbpp/full": (mbpp_rows, "mbpp"),
    "evalplus/mbppplus/none": (mbppplus_rows, "mbppplus"),
}
# lm-eval task -> (its YAML under lm_eval/tasks, its mirror folder)
TASKS = {
    "humaneval": ("humaneval/humaneval.yaml", "openai/openai_humaneval/none"),
    "humaneval_64": ("humaneval/humaneval_64.yaml", "openai/openai_humaneval/none"),
    "humaneval_instruct": ("humaneval/humaneval_instruct.yaml", "openai/openai_humaneval/none"),
    "humaneval_plus": ("humaneval/humaneval_plus.yaml", "evalplus/humanevalplus/none"),
    "mbpp": ("mbpp/mbpp.yaml", "google-research-datasets/mbpp/full"),
    "mbpp_plus": ("mbpp/mbpp_plus.yaml", "evalplus/mbppplus/none"),
}


def write_code_tasks(out: Path) -> list[str]:
    """The mirrors under `out`/mirror and each task's `<task>_local` YAML in `out`; returns the task names."""
    from lm_eval.tasks._yaml_loader import load_yaml

    import datasets

    for folder, (rows, schema) in MIRRORS.items():
        datasets.Dataset.from_list(rows(), features=features(schema)).save_to_disk(str(out / "mirror" / folder
                                                                                     / "test"))
    names = []
    for task, (rel, folder) in TASKS.items():
        include = lmeval_tasks_dir() / rel
        config = load_yaml(str(include), resolve_func=False)
        (out / f"{task}_local.yaml").write_text(
            override(f"{task}_local", include, data_files(out / "mirror" / folder), config))
        names.append(f"{task}_local")
    # humaneval_64 at 4 samples a problem, for a run that samples in seconds (its pass@2 is reported; pass@8 and
    # above need 8 and more)
    (out / "humaneval_4_local.yaml").write_text((out / "humaneval_64_local.yaml").read_text().replace(
        "task: humaneval_64_local", "task: humaneval_4_local") + "repeats: 4\n")
    return names + ["humaneval_4_local"]


if __name__ == "__main__":
    print("\n".join(write_code_tasks(Path(sys.argv[1]))))
