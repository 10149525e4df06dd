"""raylm against lm-evaluation-harness 0.4.13 (HFLM, batch_size=auto) on the same rows, whole-command wall time.

lm-eval runs through shared/golden/make/lmeval_ref.py, the script (and local task yamls) that made the golden
values; it needs the `bench` extra (pip install -e .[bench]).

    PYTHONPATH=$PWD python bench/vs_lmeval.py --model gpt2-small --rows 200 --tasks hellaswag
    PYTHONPATH=$PWD python bench/vs_lmeval.py --model stories --rows 0 --tasks hellaswag+winogrande,wikitext
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (LMEVAL_REF, model_path, max_abs_diff, print_fixed_cost_split, print_table,  # noqa: E402
                    raylm_cmd, raylm_logliks, same_predictions, timed)

PERPLEXITY_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")


def lmeval_logliks(out: Path, task: str) -> dict[int, list[float]]:
    samples = json.loads(out.read_text())["samples"][f"{task}_local"]
    return {int(s["doc_id"]): [float(x) for x in s["loglikelihood"]] for s in samples}


def compare(tasks: list[str], rows: int | None, model: Path, work: Path, repeats: int,
            fixed_cost: bool) -> tuple[list[object], list[object], list[str]]:
    """lm-eval and raylm commands over the same tasks and rows, alternating (both see the same moments of a noisy
    machine), best of `repeats` each; and what each task's check says. With fixed_cost, each tool also runs on
    1 document per task and the split is printed."""
    name = "+".join(tasks)
    lm_out = work / f"lmeval-{name}.json"

    def lmeval_cmd(n: int | None, out: Path) -> list[str]:
        return [sys.executable, str(LMEVAL_REF), str(model), ",".join(tasks), str(out), "--batch-size", "auto",
                *(["--limit", str(n)] if n else [])]

    lm_walls, ray_walls, lm_fixed, ray_fixed = [], [], [], []
    for i in range(repeats):
        lm_walls.append(timed(lmeval_cmd(rows, lm_out), f"lm-eval {name}"))
        # A fresh output directory each time: reusing one would resume from the previous run's checkpoint.
        ray_walls.append(timed(raylm_cmd(model, ",".join(tasks), rows, work / f"raylm-{name}-{i}"), f"raylm {name}"))
        if fixed_cost:
            lm_fixed.append(timed(lmeval_cmd(1, work / f"lmeval-{name}-1.json"), f"lm-eval {name}, 1 doc"))
            ray_fixed.append(timed(raylm_cmd(model, ",".join(tasks), 1, work / f"raylm-{name}-1-{i}"),
                                   f"raylm {name}, 1 doc"))
    if fixed_cost:
        print_fixed_cost_split(f"{name}: fixed cost (1 document per task) and the rest", "lm-eval 0.4.13",
                               lm_walls, lm_fixed, ray_walls, ray_fixed)
    ray_out = work / f"raylm-{name}-0"
    lm_wall, ray_wall = min(lm_walls), min(ray_walls)
    checks = [f"{name} runs: lm-eval {', '.join(f'{w:.1f}' for w in lm_walls)} s, raylm "
              f"{', '.join(f'{w:.1f}' for w in ray_walls)} s"]
    for task in tasks:
        if task == "wikitext":
            ours = json.loads((ray_out / "results.json").read_text())["results"][task]
            theirs = json.loads(lm_out.read_text())["results"][f"{task}_local"]
            worst = max(abs(ours[f"{m},none"] / theirs[f"{m},none"] - 1) for m in PERPLEXITY_METRICS)
            checks.append(f"{task}: metrics max relative difference {worst:.1e} "
                          f"({'ok' if worst <= 1e-6 else 'over 1e-6'})")
        else:
            ours, theirs = raylm_logliks(ray_out, task), lmeval_logliks(lm_out, task)
            checks.append(f"{task}: predictions {same_predictions(ours, theirs)}, "
                          f"max |dLL| {max_abs_diff(ours, theirs):.1e}")
    label = f"{name} ({rows or 'all'} docs)"
    return ([label, "lm-eval 0.4.13", lm_wall, 1.0], [label, "raylm --actors 1", ray_wall, lm_wall / ray_wall],
            checks)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small", help="gpt2-small (random 124M) or stories (stories260K)")
    parser.add_argument("--rows", type=int, default=200, help="HellaSwag (and WinoGrande) documents; 0: all")
    parser.add_argument("--wikitext-pages", type=int, help="WikiText pages (default: all 62)")
    parser.add_argument("--quick", action="store_true", help="20 HellaSwag documents, 2 WikiText pages")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each tool; best of N")
    parser.add_argument("--fixed-cost", action="store_true",
                        help="also time each tool on 1 document per task: fixed cost vs the rest, and the ceiling")
    parser.add_argument("--tasks", default="hellaswag,wikitext",
                        help="comma-separated; '+' joins tasks into one command per tool, e.g. hellaswag+winogrande")
    args = parser.parse_args()
    rows = 20 if args.quick else (args.rows or None)
    pages = 2 if args.quick else args.wikitext_pages
    model = model_path(args.model)
    work = Path(tempfile.mkdtemp(prefix="raylm-vs-lmeval-"))
    table, checks = [], []
    for group in args.tasks.split(","):
        tasks = group.split("+")
        theirs, ours, group_checks = compare(tasks, pages if tasks == ["wikitext"] else rows, model, work,
                                               args.repeats, args.fixed_cost)
        table += [theirs, ours]
        checks += group_checks
    print_table(f"{args.model}: raylm vs lm-evaluation-harness, whole-command wall time (best of {args.repeats})",
                ["task", "tool", "wall s", "lm-eval / tool"], table)
    print("\n" + "\n".join(checks))


if __name__ == "__main__":
    main()
