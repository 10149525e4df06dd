"""A short run's fixed cost, this checkout against an earlier one (a git worktree): `raylm eval --demo` and
one-document runs of a native task, an lm-eval task and a generation task, whole commands alternating, best of N.

    git worktree add /tmp/before <commit>
    PYTHONPATH=$PWD python bench/startup.py --before /tmp/before --repeats 3

Each command gets a fresh --output, so neither resumes; raylm's cache (tokenised requests, weight digests, the
source digest) is warm for both after a first untimed run of each, as it is for a user's second run.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, REPO, env, gpt2_small, print_table  # noqa: E402


def runs(work: Path, mmlu: Path | None) -> dict[str, list[str]]:
    """Each case's `raylm eval` arguments (output directory appended per run); with `mmlu` (task YAMLs
    tests/offline_tasks.py wrote for a 57-subject MMLU mirror), also every subject's first 5 questions, 5-shot:
    57 tasks to build, where scoring while the later ones are built shows."""
    tasks = work / "tasks"
    if not tasks.exists():
        subprocess.run([sys.executable, str(REPO / "tests" / "golden" / "make_generation_tasks.py"), str(tasks)],
                       check=True, env=env(), stdout=subprocess.DEVNULL)
        subprocess.run([sys.executable, str(REPO / "tests" / "offline_tasks.py"), str(DATA / "hf"), str(tasks)],
                       check=True, env=env(), stdout=subprocess.DEVNULL)
    model = str(gpt2_small())
    common = ["--no-progress", "--dtype", "float32", "--device", "cpu", "--actors", "1", "--limit", "1"]
    return {
        "--demo": ["--demo"],
        "hellaswag, 1 doc": ["--model", model, "--tasks", "hellaswag", "--data-dir", str(DATA), *common],
        "arc_easy_local, 1 doc": ["--model", model, "--tasks", "arc_easy_local", "--include-path", str(tasks),
                                  *common],
        "gsm8k_cot_local 8-shot, 1 doc": ["--model", model, "--tasks", "gsm8k_cot_local", "--include-path",
                                          str(tasks), "--num-fewshot", "8", "--gen-kwargs", "max_gen_toks=32",
                                          *common],
        **({"mmlu_local 5-shot, 57 x 5 docs": ["--model", model, "--tasks", "mmlu_local", "--include-path", str(mmlu),
                                                "--num-fewshot", "5", *common[:-1], "5"]} if mmlu else {}),
    }


def timed_in(checkout: Path, args: list[str], out: Path, label: str) -> float:
    """Wall seconds of `raylm eval ARGS --output OUT` with `checkout`'s raylm (PYTHONPATH, which the driver's Ray
    workers inherit, comes before the editable install)."""
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "raylm", "eval", *args, "--output", str(out)],
                          env={**env(), "PYTHONPATH": str(checkout)}, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return wall


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="a checkout of the earlier commit")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", help="comma-separated starts of the case names to run (default: all)")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="count the first round too (raylm's cache already warm from an earlier run)")
    parser.add_argument("--mmlu", type=Path, help="task YAMLs for all 57 MMLU subjects (tests/offline_tasks.py)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="raylm-startup-"))
    cases = runs(work, args.mmlu)
    if args.only:
        cases = {name: a for name, a in cases.items() if name.startswith(tuple(args.only.split(",")))}
    checkouts = {"before": args.before.resolve(), "after": REPO}
    best: dict[tuple[str, str], float] = {}
    n = 0
    warm_up = 0 if args.no_warm_up else 1
    for repeat in range(args.repeats + warm_up):  # a first round warms raylm's cache and is not counted
        for case, case_args in cases.items():
            for label, checkout in checkouts.items():
                n += 1
                wall = timed_in(checkout, case_args, work / f"out-{n}", f"{label} {case}")
                if repeat >= warm_up:
                    best[label, case] = min(best.get((label, case), wall), wall)
    rows = [[case, best["before", case], best["after", case], best["before", case] / best["after", case]]
            for case in cases]
    print_table(f"whole-command wall time, best of {args.repeats} (s)", ["run", "before", "after", "before / after"],
                rows)


if __name__ == "__main__":
    main()
