"""raylm against lm-evaluation-harness 0.4.13 (HFLM) on generation: GSM8K chain-of-thought 8-shot (the same eight
exemplars before every question), 40 questions, `--gen_kwargs max_gen_toks=32`, whole-command wall time side by side
in one run, and the generations of both compared document by document.

Both commands get the same task YAMLs: lm-eval's own gsm8k_cot pointed at the offline mirror
(tests/golden/make_generation_tasks.py writes gsm8k_cot_local into the work directory), the same model (by default
a seeded random GPT-2-small, 124M, with the real GPT-2 tokenizer) at float32 on the CPU, and each logs its samples:
lm-eval its samples_<task>_<date>.jsonl under --output_path, raylm the same jsonl under OUTPUT/samples/.

    PYTHONPATH=$PWD python bench/generation.py                 # both tools, side by side
    PYTHONPATH=$PWD python bench/generation.py --lmeval-only   # lm-eval's half alone
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import REPO, env, model_path, print_table, raylm_cmd, timed  # noqa: E402

TASK = "gsm8k_cot_local"
MAKE_TASKS = REPO / "tests" / "golden" / "make_generation_tasks.py"
LMEVAL_BATCH = 16


def generation_tasks(work: Path) -> Path:
    out = work / "tasks"
    subprocess.run([sys.executable, str(MAKE_TASKS), str(out)], check=True, env=env(), stdout=subprocess.DEVNULL)
    return out


def lmeval_cmd(model: Path, tasks: Path, shots: int, limit: int, gen_kwargs: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32",
            "--device", "cpu", "--tasks", TASK, "--include_path", str(tasks), "--num_fewshot", str(shots),
            "--limit", str(limit), "--gen_kwargs", gen_kwargs, "--batch_size", str(LMEVAL_BATCH), "--log_samples",
            "--output_path", str(out)]


def ours_cmd(model: Path, tasks: Path, shots: int, limit: int, gen_kwargs: str, out: Path) -> list[str]:
    return raylm_cmd(model, TASK, limit, out, extra=("--include-path", str(tasks), "--num-fewshot", str(shots),
                                                     "--gen-kwargs", gen_kwargs))


def generations(out: Path) -> dict[int, list]:
    """doc_id -> resps from the one samples_<TASK>_*.jsonl under `out` (a line per filter; resps are the same)."""
    files = sorted(out.rglob(f"samples_{TASK}_*.jsonl"))
    if len(files) != 1:
        sys.exit(f"expected one samples_{TASK}_*.jsonl under {out}, found {len(files)}")
    docs: dict[int, list] = {}
    for line in files[0].read_text(encoding="utf-8").splitlines():
        sample = json.loads(line)
        docs.setdefault(int(sample["doc_id"]), sample["resps"])
    return docs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small", help="gpt2-small (random 124M) or stories (stories260K)")
    parser.add_argument("--limit", type=int, default=40, help="questions")
    parser.add_argument("--num-fewshot", type=int, default=8)
    parser.add_argument("--gen-kwargs", default="max_gen_toks=32", help="both tools' generation arguments")
    parser.add_argument("--repeats", type=int, default=1, help="alternating runs of each tool; best of N")
    parser.add_argument("--lmeval-only", action="store_true", help="time lm-eval alone (no raylm command)")
    args = parser.parse_args()
    model = model_path(args.model)
    work = Path(tempfile.mkdtemp(prefix="raylm-generation-"))
    tasks = generation_tasks(work)
    settings = (model, tasks, args.num_fewshot, args.limit, args.gen_kwargs)
    lm_walls, ray_walls = [], []
    for i in range(args.repeats):
        # A fresh output directory each time: raylm would resume from the previous run's checkpoint.
        lm_walls.append(timed(lmeval_cmd(*settings, work / f"lmeval-{i}"), "lm-eval"))
        if not args.lmeval_only:
            ray_walls.append(timed(ours_cmd(*settings, work / f"raylm-{i}"), "raylm"))
    label = f"{TASK} {args.num_fewshot}-shot, {args.limit} docs, {args.gen_kwargs}"
    lm_wall = min(lm_walls)
    theirs = generations(work / "lmeval-0")
    rows = [[label, f"lm-eval 0.4.13 (batch {LMEVAL_BATCH})", lm_wall, 1.0, "(reference)"]]
    checks = [f"runs: lm-eval {', '.join(f'{w:.1f}' for w in lm_walls)} s"]
    if ray_walls:
        ours = generations(work / "raylm-0")
        same = sum(ours.get(doc) == resps for doc, resps in theirs.items())
        rows.append([label, "raylm --actors 1", min(ray_walls), lm_wall / min(ray_walls), f"{same}/{len(theirs)}"])
        checks[0] += f", raylm {', '.join(f'{w:.1f}' for w in ray_walls)} s"
        if ours.keys() != theirs.keys():
            checks.append(f"documents: lm-eval logged {len(theirs)}, raylm {len(ours)}")
        checks += [f"doc {doc}: lm-eval {resps!r} | raylm {ours.get(doc)!r}"
                   for doc, resps in sorted(theirs.items()) if ours.get(doc) != resps]
    print_table(f"{args.model}: generation, whole-command wall time (best of {args.repeats})",
                ["task", "tool", "wall s", "lm-eval / tool", "identical generations"], rows)
    print("\n" + "\n".join(checks) + f"\n\nwork directory: {work}")


if __name__ == "__main__":
    main()
