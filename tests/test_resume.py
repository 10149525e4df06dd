"""Head loss survived: output on shared storage (S3; moto's server, tests/s3_server.py), the whole Ray cluster
(driver, head and actors: the process group of a CLI that started its own Ray) killed mid-run, a new cluster, and
the same command resumes from the store, scoring only the missing shards, equal to an undisturbed run. The run
holds native tasks and lm-eval's (a task and a group), so both kinds of results are rebuilt from resumed shards."""

from __future__ import annotations

import json
import logging
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
from raylm.storage.atomic import write_parquet_atomic
from raylm.storage.location import location
from raylm.storage.lock import LEASE_ENV, LOCK_FILE

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3

LEASE_S = 2  # the killed run's lease: a dead holder's lease must run out before the rerun may take the lock


def eval_args(model, tasks, out, limit=6):
    return ["eval", "--model", str(model), "--tasks", "hellaswag,winogrande,wikitext,arc_easy_local,mmlu_local",
            "--include-path", str(tasks), "--data-dir", str(DATA), "--limit", str(limit), "--shard-size", "4",
            "--bootstrap-iters", "100", "--output", str(out), "--no-progress"]


def checkpointed(out):
    return sorted(int(p.name.split(".")[0]) for p in (location(out) / CHECKPOINT_DIR / "shards").iterdir()
                  if p.suffix == ".parquet")


def read_json(out, name):
    return json.loads((location(out) / name).read_bytes())


def kill_after_checkpoints(args, out, n, log):
    """Start the CLI in its own session and SIGKILL the whole group (driver and its local Ray) after n shards."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", SHARD_DELAY_ENV: "0.5", LEASE_ENV: str(LEASE_S)}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "raylm", *args], env=env, stdout=stderr, stderr=stderr,
                                start_new_session=True)
    deadline = time.monotonic() + 240
    while len(checkpointed(out)) < n:
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_rerun_after_the_cluster_is_lost_resumes_from_s3_and_matches_an_undisturbed_run(
        ray_session, tiny_llama, local_tasks, s3, tmp_path, capsys, caplog):
    out, reference = f"{s3}/out", tmp_path / "reference"
    kill_after_checkpoints(eval_args(tiny_llama, local_tasks, out), out, 3, tmp_path / "killed.log")
    assert not (location(out) / "results.json").exists()
    done = checkpointed(out)
    shards = read_json(out, f"{CHECKPOINT_DIR}/{MANIFEST}")["shards"]
    assert 3 <= len(done) < len(shards)
    missing_requests = sum(rows for i, (_, rows) in enumerate(shards) if i not in done)
    dead = read_json(out, LOCK_FILE)  # the killed run's lease, never released
    time.sleep(max(0.0, dead["expires"] - time.time()))

    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main(eval_args(tiny_llama, local_tasks, out) + ["--actors", "2"]) == 0
    assert f"whose lease expired (pid {dead['pid']} on {dead['host']}" in caplog.text
    final = capsys.readouterr().out.strip().splitlines()[-2]
    assert final.startswith(f"{missing_requests} requests scored in {len(shards)} shards, 0 retried, "
                            f"{len(done)} resumed from checkpoint"), final
    assert "tokens computed (" in final
    assert checkpointed(out) == list(range(len(shards)))

    assert main(eval_args(tiny_llama, local_tasks, reference)) == 0
    resumed, whole = read_json(out, "results.json"), json.loads((reference / "results.json").read_text())
    for section in ("results", "groups", "group_subtasks", "n-samples", "versions", "n-shot", "higher_is_better",
                    "sums"):
        assert resumed[section] == whole[section], section
    assert resumed["groups"]["mmlu_local"]["acc,none"] is not None
    assert resumed["config"]["tokens"] == whole["config"]["tokens"]  # resumed shards kept their computed counts

    # The same output refuses a different run and leaves its results alone.
    assert main(eval_args(tiny_llama, local_tasks, out, limit=5)) == 2
    assert "holds results of a different run (differs in: data, limit, shards)" in capsys.readouterr().err
    assert checkpointed(out) == list(range(len(shards)))

    # Shards scored on another device or dtype (what --device/--dtype auto resolved to elsewhere) are not resumed.
    first = location(out) / CHECKPOINT_DIR / "shards" / "000000.parquet"
    with first.open_input() as f:
        table = pq.read_table(f)
    write_parquet_atomic(first, table.replace_schema_metadata({**table.schema.metadata, b"raylm.dtype": b"bfloat16"}))
    (location(out) / CHECKPOINT_DIR / "shards" / "000001.parquet").unlink()
    assert main(eval_args(tiny_llama, local_tasks, out)) == 2
    assert "holds shards scored on cpu/bfloat16, and this run's actors score on cpu/float32" in capsys.readouterr().err
