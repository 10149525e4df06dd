"""Where every second of a whole `raylm eval` command goes: the command run under py-spy (every process, idle
samples included), each thread's samples named by the innermost stage they are in, and a table per thread of the
driver (main and tokenising threads) and the scoring actor.

The driver's main thread is the command's critical path: its stages add up to the command's wall time. The
tokenising thread and the actor run beside it, and their "idle" rows are time they waited.

    PYTHONPATH=$PWD python bench/profile_run.py -- --model M --tasks hellaswag --limit 200 --data-dir D
    PYTHONPATH=$PWD python bench/profile_run.py --keep /tmp/mmlu.json -- --model M --tasks mmlu_local \\
        --num-fewshot 5 --limit 20 --include-path DIR

Everything after `--` is passed to `raylm eval` after `--no-progress --dtype float32 --device cpu --actors 1` and a
fresh `--output`. Needs py-spy (the `bench` extra). Run it on a quiet machine: samples are wall time.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import env, print_table  # noqa: E402

RATE = 50  # samples per second

# (function, stage), innermost match first: a sample is named by the first of these found walking its stack from
# the innermost frame outwards.
DRIVER = (
    ("wait_ready", "wait for actors to load their model"),
    ("connect", "start Ray"),
    ("_first_actor", "ask for the first actor"),
    ("score_shards", "score (waiting on the actors)"),
    ("_score_while_building", "score while building"),
    ("_manifest", "fingerprint the run"),
    ("Checkpoint.open", "open the checkpoint"),
    ("Checkpoint.save", "checkpoint shards"),
    ("_launch", "ask for the other actors"),
    ("_lmeval_results", "lm-eval's filters and metrics"),
    ("log_native_samples", "native tasks' logged samples"),
    ("disconnect", "stop Ray"),
    ("_evaluate", "wait for the build"),
    ("write_results", "write results"),
    ("write_samples", "write samples"),
    ("run_eval", "after evaluate (CLI)"),
    ("run_task_docs", "read native tasks"),
    ("run_selection", "resolve lm-eval tasks"),
    ("main", "CLI before evaluate"),
)
TOKENISE = (
    ("import_transformers", "import torch, transformers"),
    ("driver_encoder", "load the tokenizer"),
    ("parameter_count", "count the model's parameters"),
    ("encode_task_requests", "build native tasks' requests"),
    ("_RayStarted.wait", "wait for Ray (lm-eval's seeding)"),
    ("request_tables", "tokenise lm-eval's requests"),
    ("load_and_build", "lm-eval builds its requests"),
    ("tokenise", "other"),
)
ACTOR = (
    ("load_model", "load the model"),
    ("ScoringActor.start", "start (threads, config, scorer)"),
    ("generate_shard", "generate"),
    ("score_shard", "score"),
    ("load_actor_class", "import the actor's code"),
    ("main_loop", "idle"),
)


def stage(stack: list[str], stages: tuple[tuple[str, str], ...]) -> str:
    for name in reversed(stack):
        for function, label in stages:
            if name == function or name.endswith("." + function):
                return label
    return "idle" if stages is not DRIVER else "imports and start-up"


def threads(profile: dict) -> dict[str, tuple[list[list[str]], str]]:
    """Each sampled thread's stacks (outermost first, function names) and the process line py-spy gave it."""
    frames = profile["shared"]["frames"]
    out = {}
    for p in profile["profiles"]:
        out[p["name"]] = [[frames[f]["name"] for f in sample] for sample in p["samples"]]
    return out


def table(stacks: list[list[str]], stages: tuple[tuple[str, str], ...]) -> list[list[object]]:
    counts = Counter(stage(s, stages) for s in stacks)
    total = sum(counts.values())
    return [[label, n / RATE, 100 * n / total] for label, n in counts.most_common()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--keep", type=Path, help="also keep py-spy's speedscope JSON here")
    parser.add_argument("eval_args", nargs=argparse.REMAINDER, help="-- then raylm eval's arguments")
    args = parser.parse_args()
    rest = args.eval_args[1:] if args.eval_args[:1] == ["--"] else args.eval_args
    work = Path(tempfile.mkdtemp(prefix="raylm-profile-"))
    out = args.keep or work / "profile.json"
    command = [sys.executable, "-m", "raylm", "eval", "--no-progress", "--dtype", "float32", "--device", "cpu",
               "--actors", "1", "--output", str(work / "out"), *rest]
    start = time.perf_counter()
    proc = subprocess.run(["py-spy", "record", "--idle", "--subprocesses", "--rate", str(RATE), "--format",
                           "speedscope", "--output", str(out), "--", *command], env=env(), capture_output=True,
                          text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"raylm eval failed under py-spy ({proc.returncode}):\n{proc.stderr[-3000:]}")
    sampled = threads(json.loads(out.read_text()))
    driver = next(name for name in sampled if "raylm-tokenise" not in name and "MainThread" not in name
                  and any("run_eval" in s for s in sampled[name]))
    pid = driver.split()[1]
    tokenise = [name for name in sampled if name.split()[1] == pid and "raylm-tokenise" in name]
    actor = max((name for name in sampled if any(f.endswith("ScoringActor.start") for s in sampled[name] for f in s)),
                key=lambda name: len(sampled[name]))
    print(f"raylm eval {' '.join(rest)}: {wall:.1f} s under py-spy, {RATE} samples/s")
    print_table("driver, main thread (the critical path)", ["stage", "s", "%"], table(sampled[driver], DRIVER))
    for name in tokenise:
        thread = name.split('"')[1]
        print_table(f"driver, {thread} thread", ["stage", "s", "%"], table(sampled[name], TOKENISE))
    print_table("scoring actor, main thread", ["stage", "s", "%"], table(sampled[actor], ACTOR))


if __name__ == "__main__":
    main()
