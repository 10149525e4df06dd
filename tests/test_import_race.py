"""The driver imports transformers before it starts threads that use it: a second thread's `import` during
transformers' first import is handed the module object transformers then replaces with its lazy one, which has
none of its names ("cannot import name 'DynamicCache' from 'transformers'", a `raylm eval` that failed at random
before it started)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from conftest import STORIES


def test_the_driver_imports_the_actor_code_before_its_tokenising_thread_starts():
    """raylm's order never fails; the two threads' imports at once do, within a few tries (most tries on a quiet
    machine, fewer beside other test workers; so the harness can catch a regression), with the error `raylm eval`
    met."""
    child = subprocess.run([sys.executable, str(Path(__file__).with_name("import_race.py")), str(STORIES), "2", "10"],
                           capture_output=True, text=True, timeout=300)
    assert child.returncode == 0, child.stderr[-3000:]
    tries = json.loads(child.stdout.splitlines()[-1])
    assert tries["pre-import"] == {"failures": 0, "first": None}
    assert tries["none"]["failures"] >= 1
    assert "cannot import name" in tries["none"]["first"], tries["none"]["first"]
