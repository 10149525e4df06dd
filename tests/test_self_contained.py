"""A clone tests itself: nothing under tests/ (nor CI's script) reads a path outside the checkout."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# A sibling of the checkout by name, or the checkout's parent by way of __file__.
SIBLING = re.compile(r"(?<![.\w])\.\./[A-Za-z_]|/\s*[\"']shared[\"']|REPO\.parent\b")
PARENTS = re.compile(r"parents\[(\d+)\]")


def outside_references(path: Path) -> list[str]:
    """The lines of `path` that name a path above the repository: a sibling directory, or `Path(__file__)...
    .parents[k]` with k past the repository root for this file's depth."""
    depth = len(path.relative_to(REPO).parts) - 1  # parents[depth] is the repository root
    found = []
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if SIBLING.search(line) or any(int(k) > depth for k in PARENTS.findall(line)):
            found.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    return found


def test_tests_read_nothing_outside_the_repository():
    files = [p for p in [*(REPO / "tests").rglob("*"), *(REPO / ".ci").rglob("*")]
             if p.is_file() and p.suffix in {".py", ".sh", ".yaml", ".yml", ""} and p != Path(__file__)]
    assert [line for path in files for line in outside_references(path)] == []
