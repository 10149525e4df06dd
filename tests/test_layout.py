"""The layout's rules, checked on the source: each stage imports only the stages before it, scoring is plain torch
(no Ray), the contamination n-gram maths is plain Python, and only cluster/, corpus/ and contamination/ touch
Ray."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

RAYLM = Path(__file__).resolve().parents[1] / "raylm"

# package -> the raylm packages it may import (besides itself and errors). Top-level modules are named bare.
ALLOWED = {
    "cache": set(),  # where computed-once things are kept (lm-eval's task index, weight digests): below every stage
    "data": set(),
    "tasks": {"cache", "data"},
    "models": {"cache"},
    "requests": {"models", "tasks"},  # the driver's encoder is built from a model's tokenizer and config
    "scoring": {"models", "requests"},
    "config": {"models", "requests", "tasks"},
    "results": {"config", "models", "requests", "tasks"},
    "cluster": {"models", "requests", "results", "scoring"},
    "corpus": {"cluster", "data", "models", "requests", "results", "scoring"},
    "evaluate": {"cluster", "config", "models", "requests", "results", "scoring", "tasks"},
    "sweep": {"cluster", "config", "data", "evaluate", "models", "results", "scoring", "tasks"},
    "probe": {"data", "models", "results", "scoring"},
    # a corpus job beside corpus/: task queries (tasks) -> n-grams -> a corpus streamed by Ray Data (corpus,
    # cluster) -> overlaps and clean sets (results); membership's driver sends task documents to corpus/'s model
    # actors, whose maths is scoring/'s (models: which model, pinned)
    "contamination": {"cluster", "config", "corpus", "models", "results", "scoring", "tasks"},
    "cli": {"cluster", "config", "contamination", "corpus", "data", "evaluate", "models", "probe",
            "requests", "results", "scoring", "sweep", "tasks"},
    "api": {"cluster", "config", "models", "requests", "scoring", "tasks"},
    "__main__": {"cli"},
}
RAY_USERS = {"cluster", "corpus", "contamination"}


def modules() -> list[tuple[str, Path]]:
    out = []
    for path in sorted(RAYLM.rglob("*.py")):
        parts = path.relative_to(RAYLM).with_suffix("").parts
        if parts not in (("__init__",), ("errors",)):
            out.append((parts[0], path))
    return out


def imported(path: Path) -> set[str]:
    """Every module name an import statement in the file names, at any depth (function-level imports too)."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


@pytest.mark.parametrize("package,path", modules(), ids=lambda v: str(v.relative_to(RAYLM)) if isinstance(v, Path)
                         else v)
def test_each_module_imports_only_earlier_stages(package, path):
    raylm_packages = {n.split(".")[1] for n in imported(path) if n.startswith("raylm.")} - {package, "errors"}
    assert raylm_packages <= ALLOWED[package], f"{path.name} imports {raylm_packages - ALLOWED[package]}"
    uses_ray = any(n == "ray" or n.startswith("ray.") for n in imported(path))
    assert not uses_ray or package in RAY_USERS, f"{path.name} imports Ray outside {', '.join(sorted(RAY_USERS))}"


def test_every_package_is_covered():
    assert {package for package, _ in modules()} == set(ALLOWED)


def test_scoring_runs_without_ray_installed():
    """The scorer is plain torch: importable, and usable, in a process where `import ray` fails."""
    probe = ("import sys; sys.modules['ray'] = None\n"
             "import raylm.scoring.scorer, raylm.scoring.kl, raylm.models.loading, raylm.scoring.packing, "
             "raylm.scoring.mlm, raylm.scoring.membership\n"
             "print('ok')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_contamination_maths_runs_without_ray_installed():
    """The n-grams and the task queries are plain Python: Ray only runs them."""
    probe = ("import sys; sys.modules['ray'] = None\n"
             "import raylm.contamination.ngrams, raylm.contamination.documents\n"
             "from raylm.contamination.ngrams import NgramIndex, TaskDocument, words\n"
             "index = NgramIndex([TaskDocument('t', 0, words('a b c d'))], 2)\n"
             "assert [c.ngram for c in index.filter.candidates(['x A, b y C d'])] == ['a b', 'c d']\n"
             "print('ok')")
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
