"""raylm against lm-evaluation-harness 0.4.13 (HFLM) on the same rows, whole-command wall time.

Native tasks (hellaswag, winogrande, wikitext): lm-eval runs through tests/golden/make_stories260K.py, the
script (and reference task YAMLs) that made the golden values. Any other name is an lm-eval task, group or tag:
lm-eval runs through the same script and raylm through its lm-eval task layer, both with the same --include-path
(by default the `<task>_local` YAMLs tests/offline_tasks.py writes for the tests' offline mirror, into the work
directory). Needs the `bench` extra (pip install -e .[bench]).

--tasks is comma-separated groups, each one command per tool; '+' joins tasks into a group, and `:shots=K`,
`:limit=N` (or `limit=all`) set a group's --num-fewshot and --limit (default: --rows).

    PYTHONPATH=$PWD python bench/vs_lmeval.py --model gpt2-small --rows 200 --tasks hellaswag
    PYTHONPATH=$PWD python bench/vs_lmeval.py --model stories --rows 0 --tasks hellaswag+winogrande,wikitext
    PYTHONPATH=$PWD python bench/vs_lmeval.py --model gpt2-small --rows 0 --repeats 3 \
        --tasks mmlu_local:shots=5:limit=20,arc_easy_local --lmeval-batch-size 16   # lm-eval's own tasks

lm-eval runs with batch_size=auto unless --lmeval-batch-size says otherwise. On a CPU, HFLM's auto detection
tries batches from 64 down and relies on an out-of-memory exception to back off; a CPU raises none, so on
MMLU's 5-shot prompts (about 700 tokens, 64 x 700 x 50,257 float32 logits and their log-softmax, over 20 GiB) the
kernel kills lm-eval instead. A fixed 16 fits.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DATA,
    LMEVAL_REF,
    MK_LOCAL_TASKS,
    env,
    max_abs_diff,
    model_path,
    print_fixed_cost_split,
    print_table,
    raylm_cmd,
    raylm_logliks,
    same_predictions,
    timed,
)

PERPLEXITY_METRICS = ("word_perplexity", "byte_perplexity", "bits_per_byte")
NATIVE = ("hellaswag", "winogrande", "wikitext")
LMEVAL_BOOTSTRAP_ITERS = 1000  # what lmeval_hf_ref.py runs with; raylm is given the same


@dataclass(frozen=True)
class Group:
    """Tasks run as one command per tool, with that command's few-shot count and limit."""

    tasks: tuple[str, ...]
    shots: int | None
    limit: int | None

    @property
    def name(self) -> str:
        return "+".join(self.tasks) + (f" {self.shots}-shot" if self.shots is not None else "")

    @property
    def lmeval(self) -> bool:
        return not set(self.tasks) <= set(NATIVE)


def parse_group(text: str, rows: int | None) -> Group:
    names, *options = text.split(":")
    settings = dict(option.split("=", 1) for option in options)
    unknown = set(settings) - {"shots", "limit"}
    if unknown:
        sys.exit(f"--tasks {text}: unknown option(s) {', '.join(sorted(unknown))} (use shots=K, limit=N|all)")
    limit = settings.get("limit", rows)
    group = Group(tuple(names.split("+")), int(settings["shots"]) if "shots" in settings else None,
                  None if limit in (None, "all", "0", 0) else int(limit))
    if group.lmeval and set(group.tasks) & set(NATIVE):
        sys.exit(f"--tasks {text}: a group is either native tasks (hellaswag, winogrande, wikitext) or lm-eval tasks")
    return group


def lmeval_logliks(out: Path, task: str) -> dict[int, list[float]]:
    samples = json.loads(out.read_text())["samples"][task]
    return {int(s["doc_id"]): [float(x) for x in s["loglikelihood"]] for s in samples}


def compare(group: Group, model: Path, work: Path, repeats: int, fixed_cost: bool, include_path: Path,
            lmeval_batch: str = "auto") -> tuple[list[object], list[object], list[str]]:
    """lm-eval and raylm commands over the same tasks and rows, alternating (both see the same moments of a noisy
    machine), best of `repeats` each; and what each task's check says. With fixed_cost, each tool also runs on
    1 document per task and the split is printed."""
    name = group.name.replace(" ", "-")
    lm_out = work / f"lmeval-{name}.json"

    def lmeval_cmd(n: int | None, out: Path) -> list[str]:
        if group.lmeval:
            cmd = [sys.executable, str(LMEVAL_REF), str(model), ",".join(group.tasks), str(out), "--include-path",
                   str(include_path), "--batch-size", lmeval_batch, "--bootstrap-iters", str(LMEVAL_BOOTSTRAP_ITERS),
                   *(["--num-fewshot", str(group.shots)] if group.shots is not None else [])]
        else:
            cmd = [sys.executable, str(LMEVAL_REF), str(model), ",".join(f"{t}_local" for t in group.tasks), str(out),
                   "--batch-size", lmeval_batch, "--bootstrap-iters", "0",
                   *(["--num-fewshot", str(group.shots)] if group.shots is not None else [])]
        return cmd + (["--limit", str(n)] if n else [])

    def ours_cmd(n: int | None, out: Path) -> list[str]:
        extra = ("--include-path", str(include_path), "--bootstrap-iters", str(LMEVAL_BOOTSTRAP_ITERS)) \
            if group.lmeval else ()
        extra += ("--num-fewshot", str(group.shots)) if group.shots is not None else ()
        return raylm_cmd(model, ",".join(group.tasks), n, out, extra=extra)

    lm_walls, ray_walls, lm_fixed, ray_fixed = [], [], [], []
    for i in range(repeats):
        lm_walls.append(timed(lmeval_cmd(group.limit, lm_out), f"lm-eval {name}"))
        # A fresh output directory each time: reusing one would resume from the previous run's checkpoint.
        ray_walls.append(timed(ours_cmd(group.limit, work / f"raylm-{name}-{i}"), f"raylm {name}"))
        if fixed_cost:
            lm_fixed.append(timed(lmeval_cmd(1, work / f"lmeval-{name}-1.json"), f"lm-eval {name}, 1 doc"))
            ray_fixed.append(timed(ours_cmd(1, work / f"raylm-{name}-1-{i}"), f"raylm {name}, 1 doc"))
    if fixed_cost:
        print_fixed_cost_split(f"{name}: fixed cost (1 document per task) and the rest", "lm-eval 0.4.13",
                               lm_walls, lm_fixed, ray_walls, ray_fixed)
    ray_out = work / f"raylm-{name}-0"
    lm_wall, ray_wall = min(lm_walls), min(ray_walls)
    checks = [f"{name} runs: lm-eval {', '.join(f'{w:.1f}' for w in lm_walls)} s, raylm "
              f"{', '.join(f'{w:.1f}' for w in ray_walls)} s"]
    checks += lmeval_checks(lm_out, ray_out) if group.lmeval else native_checks(group.tasks, lm_out, ray_out)
    label = f"{group.name} ({group.limit or 'all'} docs)"
    return ([label, "lm-eval 0.4.13", lm_wall, 1.0], [label, "raylm --actors 1", ray_wall, lm_wall / ray_wall],
            checks)


def native_checks(tasks: tuple[str, ...], lm_out: Path, ray_out: Path) -> list[str]:
    checks = []
    for task in tasks:
        if task == "wikitext":
            ours = json.loads((ray_out / "results.json").read_text())["results"][task]
            theirs = json.loads(lm_out.read_text())["results"][f"{task}_local"]
            worst = max(abs(ours[f"{m},none"] / theirs[f"{m},none"] - 1) for m in PERPLEXITY_METRICS)
            checks.append(f"{task}: metrics max relative difference {worst:.1e} "
                          f"({'ok' if worst <= 1e-6 else 'over 1e-6'})")
        else:
            ours, theirs = raylm_logliks(ray_out, task), lmeval_logliks(lm_out, f"{task}_local")
            checks.append(f"{task}: predictions {same_predictions(ours, theirs)}, "
                          f"max |dLL| {max_abs_diff(ours, theirs):.1e}")
    return checks


def lmeval_checks(lm_out: Path, ray_out: Path) -> list[str]:
    """Per task lm-eval logged samples of (groups expand to their subtasks): the same predictions and
    loglikelihoods; then every metric of every task and group lm-eval reports."""
    theirs = json.loads(lm_out.read_text())
    checks = []
    for task in theirs["samples"]:
        ours, lm_evals = raylm_logliks(ray_out, task), lmeval_logliks(lm_out, task)
        checks.append(f"{task}: predictions {same_predictions(ours, lm_evals)}, "
                      f"max |dLL| {max_abs_diff(ours, lm_evals):.1e}")
    ours = json.loads((ray_out / "results.json").read_text())["results"]
    differ = [f"{name} {key}" for name, metrics in theirs["results"].items() for key, value in metrics.items()
              if "," in key and "_stderr" not in key and isinstance(value, float) and ours[name][key] != value]
    checks.append(f"metrics of {len(theirs['results'])} tasks and groups: "
                  f"{'identical' if not differ else 'differ: ' + ', '.join(differ)}")
    return checks


def local_tasks(work: Path) -> Path:
    """lm-eval's own task YAMLs pointed at the offline mirror (tests/offline_tasks.py), for both tools."""
    out = work / "local-tasks"
    subprocess.run([sys.executable, str(MK_LOCAL_TASKS), str(DATA / "hf"), str(out)], check=True, env=env(),
                   stdout=subprocess.DEVNULL)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small", help="gpt2-small (random 124M) or stories (stories260K)")
    parser.add_argument("--rows", type=int, default=200,
                        help="documents per task of every group without :limit; 0: all")
    parser.add_argument("--wikitext-pages", type=int, help="WikiText pages (default: all 62)")
    parser.add_argument("--quick", action="store_true", help="20 HellaSwag documents, 2 WikiText pages")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each tool; best of N")
    parser.add_argument("--fixed-cost", action="store_true",
                        help="also time each tool on 1 document per task: fixed cost vs the rest, and the ceiling")
    parser.add_argument("--tasks", default="hellaswag,wikitext",
                        help="comma-separated groups, one command per tool each; '+' joins tasks into a group, "
                             "e.g. hellaswag+winogrande; ':shots=K', ':limit=N' set a group's few-shot count and "
                             "limit, e.g. mmlu_local:shots=5:limit=20; names other than the native three are "
                             "lm-eval tasks")
    parser.add_argument("--lmeval-batch-size", default="auto",
                        help="lm-eval's --batch_size (default auto; see above for CPU runs on long prompts)")
    parser.add_argument("--include-path", type=Path,
                        help="lm-eval task YAMLs for both tools (default: mk_local_tasks.py's, for the mirror)")
    args = parser.parse_args()
    rows = 20 if args.quick else (args.rows or None)
    pages = 2 if args.quick else args.wikitext_pages
    model = model_path(args.model)
    work = Path(tempfile.mkdtemp(prefix="raylm-vs-lmeval-"))
    groups = [parse_group(text, rows) for text in args.tasks.split(",")]
    groups = [Group(g.tasks, g.shots, pages) if g.tasks == ("wikitext",) else g for g in groups]
    include_path = args.include_path or (local_tasks(work) if any(g.lmeval for g in groups) else None)
    table, checks = [], []
    for group in groups:
        theirs, ours, group_checks = compare(group, model, work, args.repeats, args.fixed_cost, include_path,
                                             args.lmeval_batch_size)
        table += [theirs, ours]
        checks += group_checks
    if len(groups) > 1:
        lm_total = sum(row[2] for row in table[0::2])
        ray_total = sum(row[2] for row in table[1::2])
        table += [["all groups", "lm-eval 0.4.13", lm_total, 1.0], ["all groups", "raylm --actors 1", ray_total,
                                                                     lm_total / ray_total]]
    print_table(f"{args.model}: raylm vs lm-evaluation-harness, whole-command wall time (best of {args.repeats})",
                ["task", "tool", "wall s", "lm-eval / tool"], table)
    print("\n" + "\n".join(checks))


if __name__ == "__main__":
    main()
