"""Head loss survived: output on shared storage (S3; moto's server, tests/s3_server.py), the whole Ray cluster
(driver, head and actors: the process group of a CLI that started its own Ray) killed mid-run, a new cluster, and
the same command resumes from the store, scoring only the missing shards, equal to an undisturbed run. The run
holds native tasks and lm-eval's (a task, a group, and gsm8k's generate_until last), and is killed once a
generation shard is checkpointed and before the last one is: every kind of result is rebuilt from resumed shards,
and the generations a killed run finished are kept, not generated again."""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
from conftest import DATA
from generation_tasks import write_generation_tasks

from raylm.cli import main
from raylm.cluster.checkpoint import CHECKPOINT_DIR, MANIFEST
from raylm.cluster.scheduler import SHARD_DELAY_ENV
from raylm.storage.atomic import write_parquet_atomic
from raylm.storage.location import location
from raylm.storage.lock import LOCK_FILE

pytest_plugins = ["s3_server"]  # its fixtures: s3_server, s3

GENERATION = "gsm8k_local"


@pytest.fixture(scope="module")
def drill_tasks(local_tasks, tmp_path_factory):
    """The offline loglikelihood tasks and gsm8k in one --include-path."""
    out = tmp_path_factory.mktemp("drill-tasks")
    shutil.copytree(local_tasks, out, dirs_exist_ok=True)
    return write_generation_tasks(out)


def eval_args(model, tasks, out, limit=6):
    return ["eval", "--model", str(model), "--tasks",
            f"hellaswag,winogrande,wikitext,arc_easy_local,mmlu_local_humanities,{GENERATION}",
            "--include-path", str(tasks), "--data-dir", str(DATA), "--limit", str(limit), "--shard-size", "4",
            "--gen-kwargs", "max_gen_toks=8", "--bootstrap-iters", "100", "--output", str(out), "--no-progress"]


def checkpointed(out):
    return sorted(int(p.name.split(".")[0]) for p in (location(out) / CHECKPOINT_DIR / "shards").iterdir()
                  if p.suffix == ".parquet")


def read_json(out, name):
    return json.loads((location(out) / name).read_bytes())


def read_shard(out, index):
    with (location(out) / CHECKPOINT_DIR / "shards" / f"{index:06d}.parquet").open_input() as f:
        return pq.read_table(f)


def generation_shards(out) -> list[int]:
    shards = read_json(out, f"{CHECKPOINT_DIR}/{MANIFEST}")["shards"]
    return [i for i, (task, _) in enumerate(shards) if task == GENERATION]


def kill_mid_generation(args, out, log):
    """Start the CLI in its own session and SIGKILL the whole group (driver and its local Ray) once the first of
    the generation shards (the last in the manifest) is checkpointed."""
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", SHARD_DELAY_ENV: "0.3"}
    env.pop("RAY_ADDRESS", None)
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "raylm", *args], env=env, stdout=stderr, stderr=stderr,
                                start_new_session=True)
    deadline = time.monotonic() + 240
    while not (location(out) / CHECKPOINT_DIR / MANIFEST).exists() or \
            not set(generation_shards(out)) & set(checkpointed(out)):
        assert proc.poll() is None, log.read_text()[-2000:]
        assert time.monotonic() < deadline, "no checkpoint appeared"
        time.sleep(0.1)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def test_rerun_after_the_cluster_is_lost_resumes_from_s3_and_matches_an_undisturbed_run(
        ray_session, tiny_llama, drill_tasks, s3, tmp_path, capsys, caplog):
    out, reference = f"{s3}/out", tmp_path / "reference"
    kill_mid_generation(eval_args(tiny_llama, drill_tasks, out), out, tmp_path / "killed.log")
    assert not (location(out) / "results.json").exists()
    done = checkpointed(out)
    shards = read_json(out, f"{CHECKPOINT_DIR}/{MANIFEST}")["shards"]
    generating = generation_shards(out)
    assert generating == list(range(len(shards) - len(generating), len(shards))) and len(generating) > 1
    assert set(generating) & set(done) and not set(generating) <= set(done)
    kept = {i: read_shard(out, i) for i in generating if i in done}
    missing_requests = sum(rows for i, (_, rows) in enumerate(shards) if i not in done)
    dead = read_json(out, LOCK_FILE)  # the killed run's lease, never released, with most of a minute to run

    capsys.readouterr()
    with caplog.at_level(logging.WARNING):
        assert main(eval_args(tiny_llama, drill_tasks, out) + ["--actors", "2"]) == 0
    # Its driver ran on this host and is gone: the lease is taken over at once, not after it expires.
    assert f"held by a run of this host that is no longer running (pid {dead['pid']} on {dead['host']}" in caplog.text
    final = capsys.readouterr().out.strip().splitlines()[-2]
    assert final.startswith(f"{missing_requests} requests scored in {len(shards)} shards, 0 retried, "
                            f"{len(done)} resumed from checkpoint"), final
    assert "tokens computed (" in final
    assert checkpointed(out) == list(range(len(shards)))

    assert main(eval_args(tiny_llama, drill_tasks, reference)) == 0
    resumed, whole = read_json(out, "results.json"), json.loads((reference / "results.json").read_text())
    for section in ("results", "groups", "group_subtasks", "n-samples", "versions", "n-shot", "higher_is_better",
                    "sums"):
        assert resumed[section] == whole[section], section
    assert resumed["groups"]["mmlu_local_humanities"]["acc,none"] is not None
    assert resumed["config"]["tokens"] == whole["config"]["tokens"]  # resumed shards kept their computed counts
    # The killed run's generation shards are the rerun's, untouched, and the texts equal the undisturbed run's.
    for i, table in kept.items():
        assert read_shard(out, i).equals(table), i
    assert resumed["results"][GENERATION]["exact_match,strict-match"] is not None

    # The same output refuses a different run and leaves its results alone.
    assert main(eval_args(tiny_llama, drill_tasks, out, limit=5)) == 2
    assert "holds results of a different run (differs in: data, limit, shards)" in capsys.readouterr().err
    assert checkpointed(out) == list(range(len(shards)))

    # Shards scored on another device or dtype (what --device/--dtype auto resolved to elsewhere) are not resumed.
    first, table = location(out) / CHECKPOINT_DIR / "shards" / "000000.parquet", read_shard(out, 0)
    write_parquet_atomic(first, table.replace_schema_metadata({**table.schema.metadata, b"raylm.dtype": b"bfloat16"}))
    (location(out) / CHECKPOINT_DIR / "shards" / "000001.parquet").unlink()
    assert main(eval_args(tiny_llama, drill_tasks, out)) == 2
    assert "holds shards scored on cpu/bfloat16, and this run's actors score on cpu/float32" in capsys.readouterr().err
