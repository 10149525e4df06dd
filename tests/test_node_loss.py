"""Removing a worker node mid-run: the run finishes on the remaining node with identical results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import DATA

DRILL = Path(__file__).with_name("node_loss_drill.py")


@pytest.mark.slow  # a Ray of its own
def test_removed_worker_node_changes_nothing(tiny_llama):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, str(DRILL), str(tiny_llama), str(DATA)], capture_output=True, text=True,
                          env=env, timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    facts = json.loads(proc.stdout.strip().splitlines()[-1])
    assert facts["actor_nodes"] == 2 and facts["removed"] == 1
    assert facts["retried"] >= 1 and facts["replaced"] >= 1
    assert facts["identical"] and facts["counted_once"] and facts["survivors_on_remaining_nodes"]
