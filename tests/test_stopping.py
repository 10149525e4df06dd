"""Stopping a command as users do: Ctrl-C (SIGINT) or SIGTERM at each stage ends it within seconds with one line,
nothing it started left running, and what it scored kept for the same command to resume; a run waiting on
resources nothing will free is stopped by the watchdog with one line naming what Ray waits for.

Each command runs in its own process with SIGINT and SIGTERM at their default disposition (as a terminal's
foreground job has them), started in a session of its own so that a failing test can still clean up after it.
The stuck runs attach to the session's Ray while this test holds every CPU in a placement group: another job
holding the cluster, the case a user meets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import DATA

from raylm.cli import main
from raylm.cluster.scheduler import SHARD_DELAY_ENV
from raylm.cluster.waiting import STALL_ENV
from raylm.storage.ownership import CHECKPOINT_DIR

STOP_WITHIN_S = 10


def _default_signals() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start(args: list[str], log: Path, env_extra: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", **env_extra}
    if "RAY_ADDRESS" not in env_extra:
        env.pop("RAY_ADDRESS", None)
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "raylm", *args], env=env, stdout=out, stderr=out,
                                start_new_session=True, preexec_fn=_default_signals)


def wait_for(proc: subprocess.Popen, log: Path, ready, what: str, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        assert proc.poll() is None, f"exited before {what}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {what}:\n{log.read_text()[-3000:]}"
        time.sleep(0.2)


def stop(proc: subprocess.Popen, log: Path, signum: int) -> tuple[int, list[str]]:
    """Signal the command; it must exit within STOP_WITHIN_S, and every process it started be gone."""
    started = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signum)
    try:
        code = proc.wait(STOP_WITHIN_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        pytest.fail(f"still running {STOP_WITHIN_S} s after {signal.Signals(signum).name}:\n{log.read_text()[-3000:]}")
    _, alive = psutil.wait_procs(started, timeout=STOP_WITHIN_S)
    assert not alive, f"left running: {[(p.pid, p.name()) for p in alive]}"
    return code, log.read_text().strip().splitlines()


@pytest.fixture
def held_cluster(ray_session) -> Iterator[str]:
    """The session Ray's address while a placement group holds every CPU of it."""
    from ray.util import placement_group, remove_placement_group

    every_cpu = placement_group([{"CPU": ray_session.cluster_resources()["CPU"]}])
    ray_session.get(every_cpu.ready())
    try:
        yield ray_session.get_runtime_context().gcs_address
    finally:
        remove_placement_group(every_cpu)
    deadline = time.monotonic() + STOP_WITHIN_S  # nothing of the stopped command took the CPUs given back
    while ray_session.available_resources().get("CPU") != ray_session.cluster_resources()["CPU"]:
        assert time.monotonic() < deadline, ray_session.available_resources()
        time.sleep(0.2)


def eval_args(model: Path, out: Path) -> list[str]:
    return ["eval", "--model", str(model), "--tasks", "hellaswag", "--data-dir", str(DATA), "--limit", "4",
            "--shard-size", "4", "--no-progress", "--output", str(out)]


def test_ctrl_c_while_scoring_stops_in_one_line_and_the_rerun_resumes(ray_session, tiny_llama, tmp_path, capsys):
    """The command starts a Ray of its own, as a user's does; the rerun runs here, on the session's."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = start(eval_args(tiny_llama, out), log, {SHARD_DELAY_ENV: "1"})
    shards = out / CHECKPOINT_DIR / "shards"
    wait_for(proc, log, lambda: shards.is_dir() and any(p.suffix == ".parquet" for p in shards.iterdir()),
             "shard checkpointed")
    code, lines = stop(proc, log, signal.SIGINT)
    assert code == 128 + signal.SIGINT
    assert lines[-1] == f"raylm: SIGINT received, stopped; what was scored is kept in {out}; the same command " \
                        "resumes from it", lines[-5:]
    assert "Traceback" not in "\n".join(lines)
    kept = len([p for p in shards.iterdir() if p.suffix == ".parquet"])
    assert not (out / "results.json").exists()

    capsys.readouterr()
    assert main(eval_args(tiny_llama, out)) == 0
    assert f", {kept} resumed from checkpoint" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["results"]["hellaswag"]


def ppl_args(model: Path, corpus: Path, out: Path) -> list[str]:
    return ["ppl", "--model", str(model), "--data", str(corpus), "--max-length", "32", "--no-progress",
            "--output", str(out)]


@pytest.mark.parametrize("command,signum", [("eval", signal.SIGTERM), ("ppl", signal.SIGINT)])
def test_a_signal_while_waiting_for_placement_or_reading_stops_in_one_line(held_cluster, tiny_llama, tmp_path,
                                                                           command, signum):
    """eval waits for its actor; ppl for its read tasks and its actor pool."""
    out, log = tmp_path / "out", tmp_path / "run.log"
    if command == "eval":
        args = eval_args(tiny_llama, out)
    else:
        corpus = tmp_path / "corpus.parquet"
        pq.write_table(pa.table({"text": ["one document", "and another"]}), corpus)
        args = ppl_args(tiny_llama, corpus, out)
    proc = start(args, log, {"RAY_ADDRESS": held_cluster})
    wait_for(proc, log, lambda: "placement: " in log.read_text(), "placement")
    time.sleep(1)  # into the wait
    code, lines = stop(proc, log, signum)
    assert code == 128 + signum
    assert lines[-1].startswith(f"raylm: {signal.Signals(signum).name} received, stopped; "), lines[-5:]


SLOW_TASK = """\
task: slow_build
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: multiple_choice
doc_to_text: "{{{{question}}}}"
doc_to_choice: "{{{{choices}}}}"
doc_to_target: 0
process_docs: !function slow.process
metric_list:
  - metric: acc
"""
SLOW_PY = """\
import os, pathlib, time


def process(dataset):
    pathlib.Path(os.environ["SLOW_BUILD_MARKER"]).touch()
    time.sleep(300)
    return dataset
"""


def test_ctrl_c_while_an_lmeval_task_builds_stops_in_one_line(held_cluster, tiny_llama, tmp_path):
    """A task of the user's own whose documents take long to process: the build runs on the driver's tokenising
    thread, which the stop does not wait for."""
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    (tasks / "docs.jsonl").write_text(json.dumps({"question": "Is it?", "choices": ["yes", "no"]}) + "\n")
    (tasks / "slow_build.yaml").write_text(SLOW_TASK.format(data=tasks / "docs.jsonl"))
    (tasks / "slow.py").write_text(SLOW_PY)
    out, log, marker = tmp_path / "out", tmp_path / "run.log", tmp_path / "building"
    proc = start(["eval", "--model", str(tiny_llama), "--tasks", "slow_build", "--include-path", str(tasks),
                  "--no-progress", "--output", str(out)], log,
                 {"RAY_ADDRESS": held_cluster, "SLOW_BUILD_MARKER": str(marker)})
    wait_for(proc, log, marker.exists, "build")
    code, lines = stop(proc, log, signal.SIGINT)
    assert code == 128 + signal.SIGINT
    assert lines[-1].startswith("raylm: SIGINT received, stopped; "), lines[-5:]


def test_a_sweep_whose_model_threads_wait_on_ray_stops_on_sigterm(held_cluster, tiny_llama, tiny_gpt2, tmp_path):
    """Each model of a sweep waits for its actor on a thread of its own; interpreter shutdown would wait for them
    for ever. They notice the stop and end."""
    sweep = tmp_path / "sweep.yaml"
    sweep.write_text(f"models:\n  - {{path: {tiny_llama}}}\n  - {{path: {tiny_gpt2}}}\ntasks: [wikitext]\n"
                     f"data_dir: {DATA}\ndevice: cpu\nsettings:\n  limit: [2]\n")
    log = tmp_path / "run.log"
    proc = start(["sweep", str(sweep), "--output", str(tmp_path / "out")], log, {"RAY_ADDRESS": held_cluster})
    wait_for(proc, log, lambda: log.read_text().count("placement: ") == 2, "both models' placements")
    time.sleep(1)
    code, lines = stop(proc, log, signal.SIGTERM)
    assert code == 128 + signal.SIGTERM
    assert lines[-1].startswith("raylm: SIGTERM received, stopped; "), lines[-5:]


def test_a_run_that_can_never_be_placed_is_stopped_by_the_watchdog(held_cluster, tiny_llama, tmp_path):
    out, log = tmp_path / "out", tmp_path / "run.log"
    proc = start(eval_args(tiny_llama, out), log, {"RAY_ADDRESS": held_cluster, STALL_ENV: "3"})
    try:
        code = proc.wait(120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    lines = log.read_text().strip().splitlines()
    assert code == 1, lines[-5:]
    assert lines[-1].startswith("raylm: error: no progress for "), lines[-5:]
    assert "while Ray waits to place 1 task/actor asking {CPU: " in lines[-1]
    assert "(2 of 2 CPU in use, 2 of them reserved by placement groups); stopped (RAYLM_STALL_TIMEOUT_S=3)" in lines[-1]
    assert lines[-1].endswith(f"what was scored is kept in {out}; the same command resumes from it")
