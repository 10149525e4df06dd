"""The tests' data, kept in the repository: public evaluation sets and the GPT-2 tokenizer in tests/data/ (where
each file came from and under which licence: tests/data/PROVENANCE.md and LICENSES.md), and lm-eval's stored
outputs for stories260K in tests/golden/.

Files that compress well are stored xz-compressed as `<name>.xz`. The code under test reads the original files
from a data directory, so a test session unpacks tests/data once into a directory of its own; the goldens are
read straight from their compressed files.

usage: python tests/fixture_data.py DIR      (tests/data unpacked into DIR; a DIR that exists is taken as unpacked)
"""

from __future__ import annotations

import atexit
import json
import lzma
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from raylm.data.demo import DEMO_MODEL

TESTS = Path(__file__).resolve().parent
PACKED = TESTS / "data"
NOTES = ("PROVENANCE.md", "LICENSES.md")  # about the data, not part of it
GOLDEN_DIR = TESTS / "golden"
ORIGINAL = "lmeval-0.4.13_stories260K.json"  # hellaswag, winogrande, wikitext zero-shot
ZERO_SHOT = "lmeval-0.4.13_stories260K_tasks.json"  # arc_easy, boolq, mmlu, piqa
FEW_SHOT = "lmeval-0.4.13_stories260K_fewshot.json"  # mmlu 5-shot, arc_easy 3-shot, winogrande 5-shot
# The stories260K Llama the goldens were made with: the copy raylm packages for its demo (PROVENANCE.md, 4b).
STORIES = DEMO_MODEL


def data_dir() -> Path:
    """tests/data unpacked: into the test session's directory (tests/conftest.py names it in
    RAYLM_TEST_SESSION_CACHE, for its xdist workers and subprocesses too) or, for a script run on its own (a
    golden's generator, a benchmark), into a temporary directory removed at exit."""
    session = os.environ.get("RAYLM_TEST_SESSION_CACHE")
    if session:
        return unpack(Path(session) / "data")
    scratch = Path(tempfile.mkdtemp(prefix="raylm-test-data-"))
    atexit.register(shutil.rmtree, scratch, True)
    return unpack(scratch / "data")


def unpack(dest: Path) -> Path:
    """`dest` holding tests/data's files as the code reads them, made once: a later call (another xdist worker,
    a subprocess of the same session) finds it whole. Written beside `dest` and renamed into place, so no reader
    sees a directory half written."""
    if dest.is_dir():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f"{dest.name}.", dir=dest.parent))
    for packed in sorted(PACKED.rglob("*")):
        if packed.is_dir() or packed.parent == PACKED and packed.name in NOTES:
            continue
        target = staging / packed.relative_to(PACKED)
        target.parent.mkdir(parents=True, exist_ok=True)
        if packed.suffix == ".xz":
            with lzma.open(packed) as source, open(target.with_suffix(""), "wb") as sink:
                shutil.copyfileobj(source, sink)
        else:
            shutil.copyfile(packed, target)
    try:
        staging.rename(dest)
    except OSError:
        if not dest.is_dir():  # not another process that unpacked first
            raise
        shutil.rmtree(staging)
    return dest


def read_golden(name: str) -> Any:
    """The golden `name` (ORIGINAL, ZERO_SHOT or FEW_SHOT), parsed from tests/golden/<name>.xz."""
    with lzma.open(GOLDEN_DIR / f"{name}.xz", "rt", encoding="utf-8") as f:
        return json.load(f)


if __name__ == "__main__":
    print(unpack(Path(sys.argv[1]).resolve()))
