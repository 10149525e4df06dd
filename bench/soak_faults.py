"""Soak under faults: a sweep whose driver is SIGKILLed at random moments and whose actors are killed, rerun until
it finishes, must end with exactly an undisturbed run's numbers.

The sweep is 2 models (the packaged stories260K at fp32 and in 4-bit nf4) x 2 points (batch size auto and 4) x
3 tasks (HellaSwag, WinoGrande, WikiText), offline. It runs once undisturbed, then into a second output directory
under faults: each attempt is `raylm sweep` in its own session; the plan kills the whole session (driver and its
local Ray, as a lost head node does) at random moments, each after a random number of newly checkpointed shards
plus a random delay, five times, and SIGKILLs a scoring actor twice (its driver replaces it). Then the same command
is rerun until it exits 0. Checked, per point: results.json equal to the undisturbed one's (every metric, sum and
count), every request in samples/ exactly once (no shard scored twice into the results) and as many as undisturbed
(nothing lost); and that no point was taken for another config (nothing under superseded/).

    PYTHONPATH=. python bench/soak_faults.py [--limit 40] [--shard-size 16] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
TASKS = ("hellaswag", "winogrande", "wikitext")
DRIVER_KILLS = 5
ACTOR_KILLS = 2
# (kill an actor first?) per driver kill; the attempt after the last kill runs to the end undisturbed.
PLAN = (False, True, False, True, False)
SHARD_DELAY_S = "0.3"  # seconds the driver pauses after each shard, so that kills land inside points
ATTEMPT_TIMEOUT_S = 600


def sweep_file(path: Path, shard_size: int, limit: int) -> Path:
    path.write_text(f"""\
models:
  - path: raylm:demo
    name: fp32
    dtype: float32
  - path: raylm:demo
    name: nf4
    dtype: float32
    load_in_4bit: true
tasks: [{", ".join(TASKS)}]
data_dir: raylm:demo
device: cpu
shard_size: {shard_size}
settings:
  limit: [{limit}]
  batch_size: [auto, 4]
""")
    return path


def env() -> dict[str, str]:
    out = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "RAYLM_SHARD_DELAY_S": SHARD_DELAY_S}
    out.pop("RAY_ADDRESS", None)
    return out


def start(sweep: Path, out: Path, log: Path) -> subprocess.Popen:
    with open(log, "ab") as f:
        return subprocess.Popen([sys.executable, "-m", "raylm", "sweep", str(sweep), "--output", str(out)], env=env(),
                                stdout=f, stderr=subprocess.STDOUT, start_new_session=True)


def shards_saved(out: Path) -> int:
    return sum(1 for _ in out.glob("*/*/checkpoint/shards/*.parquet"))


def wait_for_shards(proc: subprocess.Popen, out: Path, more: int, deadline: float) -> bool:
    """True once `more` shards beyond the present count are checkpointed; False if the run ended first."""
    target = shards_saved(out) + more
    while shards_saved(out) < target:
        if proc.poll() is not None:
            return False
        if time.monotonic() > deadline:
            raise SystemExit(f"no progress within {ATTEMPT_TIMEOUT_S} s; see the logs")
        time.sleep(0.05)
    return True


def scoring_actors(session: int) -> list[psutil.Process]:
    """The session's scoring actors (Ray titles their processes ray::ScoringActor...)."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if os.getsid(proc.pid) == session and "ray::ScoringActor" in " ".join(proc.info["cmdline"] or []):
                found.append(proc)
        except (ProcessLookupError, psutil.Error, PermissionError):
            continue
    return found


def kill_session(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def run_undisturbed(sweep: Path, out: Path, log: Path) -> float:
    start_s = time.monotonic()
    proc = start(sweep, out, log)
    if proc.wait(timeout=ATTEMPT_TIMEOUT_S) != 0:
        raise SystemExit(f"the undisturbed sweep failed; see {log}")
    return time.monotonic() - start_s


def run_under_faults(sweep: Path, out: Path, log: Path, rng: random.Random) -> dict[str, int]:
    counts = {"attempts": 0, "driver_kills": 0, "actor_kills": 0}
    for kill_actor in PLAN:
        counts["attempts"] += 1
        proc = start(sweep, out, log)
        deadline = time.monotonic() + ATTEMPT_TIMEOUT_S
        alive = True
        if kill_actor:
            alive = wait_for_shards(proc, out, rng.randint(1, 3), deadline)
            actors = scoring_actors(proc.pid) if alive else []
            if actors:
                rng.choice(actors).send_signal(signal.SIGKILL)
                counts["actor_kills"] += 1
        if alive and wait_for_shards(proc, out, rng.randint(1, 4), deadline):
            time.sleep(rng.uniform(0.0, 1.5))
        if proc.poll() is None:
            kill_session(proc)
            counts["driver_kills"] += 1
        elif proc.returncode != 0:
            raise SystemExit(f"attempt {counts['attempts']} failed on its own (exit {proc.returncode}); see {log}")
    while True:
        counts["attempts"] += 1
        proc = start(sweep, out, log)
        try:
            code = proc.wait(timeout=ATTEMPT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            kill_session(proc)
            raise SystemExit(f"the final attempt did not finish within {ATTEMPT_TIMEOUT_S} s; see {log}") from None
        if code == 0:
            return counts
        if counts["attempts"] > len(PLAN) + 3:
            raise SystemExit(f"the sweep did not finish after {counts['attempts']} attempts; see {log}")


def request_keys(table) -> list[tuple]:
    columns = [c for c in ("doc_id", "req_idx", "window") if c in table.column_names]
    return list(zip(*(table[c].to_pylist() for c in columns)))


def same(a, b) -> bool:
    """Equal, floats to 1e-9 relative (what sharding and batching may change)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float):
        return a == b or math.isclose(a, b, rel_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    return a == b


def compare(reference: Path, faulty: Path) -> tuple[list[list[str]], bool]:
    rows, ok = [], True
    for point in sorted(p.relative_to(reference) for p in reference.glob("*/*") if (p / "results.json").is_file()):
        ref = json.loads((reference / point / "results.json").read_text())
        got_path = faulty / point / "results.json"
        got = json.loads(got_path.read_text()) if got_path.is_file() else None
        for task in TASKS:
            samples = pq.read_table(faulty / point / "samples" / f"{task}.parquet") if got else None
            keys = request_keys(samples) if samples is not None else []
            expected = pq.read_table(reference / point / "samples" / f"{task}.parquet").num_rows
            once = len(keys) == len(set(keys))
            lost = expected - len(keys)
            equal = got is not None and same(got["results"][task], ref["results"][task]) and \
                same(got["sums"][task], ref["sums"][task])
            metric = next((k for k in ("acc,none", "word_perplexity,none") if k in ref["results"][task]), None)
            value = ref["results"][task].get(metric)
            rows.append([str(point), task, f"{metric.split(',')[0]} {value:.6g}" if metric else "",
                         "yes" if equal else "NO", "yes" if once else "NO", str(lost),
                         str(got["config"]["shards_resumed"]) if got else "-"])
            ok &= equal and once and lost == 0
    return rows, ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=40, help="documents per task")
    parser.add_argument("--shard-size", type=int, default=16, help="requests per shard")
    parser.add_argument("--seed", type=int, default=0, help="seeds the kill moments")
    parser.add_argument("--keep", type=Path, help="keep outputs and logs here (default: a temporary directory)")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = args.keep or Path(tempfile.mkdtemp(prefix="raylm-soak-faults-"))
    root.mkdir(parents=True, exist_ok=True)
    sweep = sweep_file(root / "soak.yaml", args.shard_size, args.limit)
    reference, faulty = root / "undisturbed", root / "faulty"
    undisturbed_s = run_undisturbed(sweep, reference, root / "undisturbed.log")
    started = time.monotonic()
    counts = run_under_faults(sweep, faulty, root / "faulty.log", rng)
    faulty_s = time.monotonic() - started
    rows, ok = compare(reference, faulty)
    superseded = sorted(str(p.relative_to(faulty)) for p in (faulty / "superseded").glob("*/*/*"))
    log = (root / "faulty.log").read_text(errors="replace")
    taken_over = log.count("was last held by a run that did not finish")
    replaced = log.count("a scoring actor was lost")
    header = ["point", "task", "undisturbed", "equal", "each request once", "lost", "shards resumed (last run)"]
    print(f"sweep: 2 models x 2 points x {len(TASKS)} tasks, limit {args.limit}, shard size {args.shard_size}, "
          f"seed {args.seed}")
    print(f"undisturbed: one run, {undisturbed_s:.0f} s; under faults: {counts['attempts']} attempts, "
          f"{counts['driver_kills']} driver kills (of {DRIVER_KILLS}), {counts['actor_kills']} actor kills "
          f"(of {ACTOR_KILLS}), {faulty_s:.0f} s; {replaced} actor replacement(s) logged, {taken_over} stale "
          "lock(s) taken over")
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    complete = counts["driver_kills"] == DRIVER_KILLS and counts["actor_kills"] == ACTOR_KILLS
    print(f"every point equal: {ok}; points taken for another config: {superseded or 'none'}; "
          f"all planned faults landed: {complete}; outputs and logs under {root}")
    return 0 if ok and not superseded and complete else 1


if __name__ == "__main__":
    raise SystemExit(main())
