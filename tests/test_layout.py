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

# The data path, first to last: a package may import only packages before it (tests below check the table too).
STAGES = ("storage", "cache", "sandbox", "data", "tasks", "models", "requests", "scoring", "config", "cluster",
          "results", "corpus", "evaluate", "sweep", "probe", "contamination", "compare", "cli", "api", "lm_eval",
          "__main__")

# package -> the raylm packages it imports (besides itself and errors): exactly those, so the table says what the
# code does. Top-level modules are named bare.
ALLOWED = {
    "storage": set(),  # where outputs live (atomic writes, the output lock, ownership): below every stage that writes
    "cache": set(),  # where computed-once things are kept (lm-eval's task index, weight digests): below every stage
    "sandbox": set(),  # generated programs run under bubblewrap (code-execution tasks): plain subprocesses
    "data": set(),
    "tasks": {"cache", "data", "sandbox"},  # lm-eval's code tasks' metric runs programs in the sandbox
    "models": {"cache"},
    # the driver's encoder is built from a model's tokenizer and config; tables are kept in the cache, atomically
    "requests": {"cache", "models", "storage", "tasks"},
    "scoring": {"models", "requests"},  # and a scored shard's predictions and sums, which its actor computes
    "config": {"models", "requests", "storage", "tasks"},  # an output is a storage Location, parsed once
    "cluster": {"models", "requests", "sandbox", "scoring", "storage"},
    "results": {"config", "models", "requests", "scoring", "storage", "tasks"},
    "corpus": {"cluster", "models", "requests", "results", "scoring", "storage"},
    # --dry-run counts the tokens a run computes with the scorer's own planner (plain functions, no model)
    "evaluate": {"cluster", "config", "models", "requests", "results", "scoring", "storage", "tasks"},
    # a sweep's corpora are raylm ppl runs (corpus) on its resident actors
    "sweep": {"cluster", "config", "corpus", "data", "evaluate", "models", "results", "storage", "tasks"},
    "probe": {"data", "models", "results", "scoring", "storage"},
    # a corpus job beside corpus/: task queries (tasks) -> n-grams -> a corpus streamed by Ray Data (corpus,
    # cluster) -> overlaps and clean sets (results); membership's driver sends task documents to corpus/'s model
    # actors, whose maths is scoring/'s (models: which model, pinned)
    "contamination": {"cluster", "config", "corpus", "models", "requests", "results", "scoring", "storage", "tasks"},
    # finished outputs read back (raylm compare, raylm report): a stage after every one that writes them
    "compare": {"results", "storage"},
    "cli": {"cluster", "compare", "config", "contamination", "corpus", "data", "evaluate", "models", "probe",
            "requests", "results", "storage", "sweep", "tasks"},
    "api": {"cluster", "config", "models", "requests", "tasks"},
    "lm_eval": {"api"},  # the Python API's earlier home, kept for old scripts (deprecated)
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


@pytest.mark.parametrize("path", [path for package, path in modules() if package == "scoring"],
                         ids=lambda p: str(p.relative_to(RAYLM)))
def test_a_scoring_module_imports_no_other_modules_private_names(path):
    """A helper two modules use has one public home: imported under its private name, it is owned by a module that
    may change it for its own use alone."""
    private = [f"{node.module}.{alias.name}" for node in ast.walk(ast.parse(path.read_text()))
               if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("raylm.")
               for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    assert not private, f"{path.name} imports private {', '.join(private)}"


def test_every_package_is_covered():
    assert {package for package, _ in modules()} == set(ALLOWED) == set(STAGES)


@pytest.mark.parametrize("package", STAGES)
def test_no_package_may_import_a_later_stage(package):
    later = ALLOWED[package] & set(STAGES[STAGES.index(package):])
    assert not later, f"{package} is allowed to import {later}, which come after it"


def test_the_table_allows_only_imports_in_use():
    """A permission no module uses is a door left open: the next upward import would pass unnoticed."""
    used: dict[str, set[str]] = {package: set() for package in ALLOWED}
    for package, path in modules():
        used[package] |= {n.split(".")[1] for n in imported(path) if n.startswith("raylm.")} - {package, "errors"}
    unused = {package: allowed - used[package] for package, allowed in ALLOWED.items() if allowed - used[package]}
    assert not unused, f"ALLOWED grants imports no module makes: {unused}"


def test_scoring_runs_without_ray_installed():
    """The scorer is plain torch: importable, and usable, in a process where `import ray` fails."""
    probe = ("import sys; sys.modules['ray'] = None\n"
             "import raylm.scoring.scorer, raylm.scoring.kl, raylm.models.loading, raylm.scoring.packing, "
             "raylm.scoring.mlm, raylm.scoring.membership, raylm.scoring.sums\n"
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


def test_no_benchmark_script_shadows_a_standard_library_module():
    """A benchmark runs with bench/ first on sys.path: a script named after a standard module (profile.py) is what
    `import profile` then finds, and cProfile, which torch and transformers import, fails with it."""
    scripts = {path.stem for path in (Path(__file__).resolve().parents[1] / "bench").glob("*.py")}
    assert not scripts & set(sys.stdlib_module_names)
