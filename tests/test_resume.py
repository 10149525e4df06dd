"""Driver killed mid-run: the same command resumes from the checkpoint, scoring only the missing shards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
from conftest import DATA

from raylm.cli import main
from raylm.cluster.checkpoint import CHECKPOINT_DIR, MANIFEST
from raylm.cluster.scheduler import SHARD_DELAY_ENV


def eval_args(model, out, limit=6):
    return ["eval", "--model", str(model), "--tasks", "hellaswag,winogrande,wikitext", "--data-dir", str(DATA),
            "--limit", str(limit), "--shard-size", "4", "--output", str(out), "--no-progress"]


def checkpointed(out):
    return sorted(int(p.stem) for p in (out / CHECKPOINT_DIR / "shards").glob("*.parquet"))


def kill_after_checkpoints(args, out, n, log):
    """Start the CLI in its own session and SIGKILL the whole group (driver and its local Ray) after n shards."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", SHARD_DELAY_ENV: "0.5"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "raylm", *args], env=env, stdout=stderr, stderr=stderr,
                                start_new_session=True)
    deadline = time.monotonic() + 240
    while (out / CHECKPOINT_DIR / "shards").is_dir() is False or len(checkpointed(out)) < n:
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_rerun_after_kill_scores_only_missing_shards_and_matches_uninterrupted_run(ray_session, tiny_llama, tmp_path,
                                                                                   capsys):
    out, reference = tmp_path / "out", tmp_path / "reference"
    kill_after_checkpoints(eval_args(tiny_llama, out), out, 3, tmp_path / "killed.log")
    assert not (out / "results.json").exists()
    done = checkpointed(out)
    shards = json.loads((out / CHECKPOINT_DIR / MANIFEST).read_text())["shards"]
    assert 3 <= len(done) < len(shards)
    missing_requests = sum(rows for i, (_, rows) in enumerate(shards) if i not in done)

    capsys.readouterr()
    assert main(eval_args(tiny_llama, out) + ["--actors", "2"]) == 0
    final = capsys.readouterr().out.strip().splitlines()[-2]
    assert final.startswith(f"{missing_requests} requests scored in {len(shards)} shards, 0 retried, "
                            f"{len(done)} resumed from checkpoint"), final
    assert checkpointed(out) == list(range(len(shards)))

    assert main(eval_args(tiny_llama, reference)) == 0
    resumed, whole = (json.loads((d / "results.json").read_text()) for d in (out, reference))
    assert resumed["results"] == whole["results"] and resumed["sums"] == whole["sums"]
    assert resumed["n-samples"] == whole["n-samples"]

    # The same directory refuses a different run and leaves its results alone.
    assert main(eval_args(tiny_llama, out, limit=5)) == 2
    assert "holds results of a different run (differs in: data, limit, shards)" in capsys.readouterr().err
    assert checkpointed(out) == list(range(len(shards)))

    # Shards scored on another device or dtype (what --device/--dtype auto resolved to elsewhere) are not resumed.
    first = out / CHECKPOINT_DIR / "shards" / "000000.parquet"
    table = pq.read_table(first)
    pq.write_table(table.replace_schema_metadata({**table.schema.metadata, b"raylm.dtype": b"bfloat16"}), first)
    (out / CHECKPOINT_DIR / "shards" / "000001.parquet").unlink()
    assert main(eval_args(tiny_llama, out)) == 2
    assert "holds shards scored on cpu/bfloat16, and this run's actors score on cpu/float32" in capsys.readouterr().err
