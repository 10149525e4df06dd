"""raylm against lm-evaluation-harness 0.4.13 (HFLM) at bfloat16 and float16, on the same HellaSwag and WinoGrande
requests: how far apart the per-request loglikelihoods are, how many predictions differ, and whether lm-eval's own
numbers tie where they do; and which of the two stays closer to the float32 numbers.

lm-eval runs through tests/golden/make_stories260K.py (the script that made the golden values) with only HFLM's
dtype changed (bench/lmeval_at_dtype.py), once at float32 for the reference and once per dtype; raylm runs as
`raylm eval --dtype D --device cpu --log-samples`. lm-eval takes log_softmax in the model dtype and sums in it, so
its loglikelihoods come out on the dtype's grid (-59.5, -53.75 in bfloat16) and its choices can tie exactly; raylm
takes float32 log-softmax of the same low-precision logits and sums in float64.

    PYTHONPATH=$PWD python bench/bf16_vs_lmeval.py                    # everything: about an hour on 2 cores
    PYTHONPATH=$PWD python bench/bf16_vs_lmeval.py --models stories,gpt2-small --rows 300
    PYTHONPATH=$PWD python bench/bf16_vs_lmeval.py --models stories,tiny:llama --rows 20 --dtypes bfloat16  # quick

Models: `stories` (the golden stories260K), `gpt2-small` (random 124M with the GPT-2 tokenizer, as in the other
benchmarks), `tiny:<family>` for each family of the architecture matrix (tests/tiny_families.py), or
`tiny` for all of them. The tiny models have a 128-token context, and within HellaSwag's first 32 documents are
endings longer than that (135 tokens with the stories tokenizer; sooner with the Qwen2 tokenizer class Qwen2's
config picks), which neither tool can score in it, so they get at most TINY_ROWS documents per task.

Columns (absolute values throughout): `max ΔLL` and `max ΔLL/LL` between the tools per request; `differ`:
documents whose predicted choice (acc: argmax loglikelihood) differs; `tie`: of those, where lm-eval's two
loglikelihoods are equal; `1 step`: where they are one step of lm-eval's dtype grid apart; `other`: the rest
(lm-eval's largest gap there in brackets). `vs f32` columns: mean |loglikelihood - lm-eval's float32
loglikelihood| for each tool at the dtype.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (CACHE, LMEVAL_REF, REPO, STORIES, env, gpt2_small, print_table, raylm_cmd,  # noqa: E402
                    raylm_logliks)

LMEVAL_AT_DTYPE = Path(__file__).resolve().parent / "lmeval_at_dtype.py"
TASKS = ("hellaswag", "winogrande")
TINY_ROWS = 16
MANTISSA_BITS = {"bfloat16": 7, "float16": 10, "float32": 23}

COLUMNS = ["requests", "max ΔLL", "max ΔLL/LL", "differ", "tie", "1 step", "other (gap)", "raylm vs f32",
           "lm-eval vs f32"]

Logliks = dict[int, list[float]]


def tiny_families() -> list[str]:
    sys.path.insert(0, str(REPO / "tests"))
    import tiny_families as fam

    return list(fam.FAMILIES)


def tiny_model(family: str) -> Path:
    """The architecture matrix's seed-0 model of `family`, with the stories260K tokenizer, made once and cached."""
    path = CACHE / "families" / f"{family}-s0"
    if not (path / "config.json").exists():
        sys.path.insert(0, str(REPO / "tests"))
        import tiny_families as fam
        from transformers import AutoTokenizer

        fam.build(family, path.parent)
        AutoTokenizer.from_pretrained(STORIES).save_pretrained(path)
    return path


def model_path(name: str) -> Path:
    if name == "stories":
        return STORIES
    if name == "gpt2-small":
        return gpt2_small()
    if name.startswith("tiny:"):
        return tiny_model(name.split(":", 1)[1])
    raise SystemExit(f"unknown model {name!r} (stories, gpt2-small, tiny, tiny:<family>)")


class RunFailed(Exception):
    """A tool's command failed: its table row says so and the next model runs."""


def run(cmd: list[str], label: str) -> None:
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    if proc.returncode != 0:
        print(f"{label} failed ({proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr, flush=True)
        lines = proc.stderr.strip().splitlines() or ["?"]
        error = next((line for line in reversed(lines) if "Error" in line), lines[-1])
        raise RunFailed(f"{label} failed: {error.strip()[:70]}")


def lmeval_run(model: Path, dtype: str, rows: int, out: Path) -> dict[str, Logliks]:
    if not out.exists():
        run([sys.executable, str(LMEVAL_AT_DTYPE), dtype, str(LMEVAL_REF), str(model),
             ",".join(f"{t}_local" for t in TASKS), str(out), "--limit", str(rows), "--bootstrap-iters", "0"],
            f"lm-eval {model.name} {dtype}")
    samples = json.loads(out.read_text())["samples"]
    return {t: {int(s["doc_id"]): [float(x) for x in s["loglikelihood"]] for s in samples[f"{t}_local"]}
            for t in TASKS}


def raylm_run(model: Path, dtype: str, rows: int, out: Path) -> dict[str, Logliks]:
    if not (out / "results.json").exists():
        run(raylm_cmd(model, ",".join(TASKS), rows, out, extra=("--dtype", dtype)), f"raylm {model.name} {dtype}")
    return {t: raylm_logliks(out, t) for t in TASKS}


def grid_step(value: float, dtype: str) -> float:
    """The spacing of `dtype`'s numbers at `value`: one step of the grid lm-eval's sums are rounded to."""
    if value == 0:
        return 0.0
    return 2.0 ** (math.floor(math.log2(abs(value))) - MANTISSA_BITS[dtype])


def compare(ours: Logliks, theirs: Logliks, f32: Logliks | None, dtype: str) -> list[object]:
    """The table's columns after the model, dtype and task (the `vs f32` ones "n/a" without float32 numbers)."""
    docs = sorted(theirs)
    if sorted(ours) != docs:
        sys.exit(f"the tools scored different documents ({len(ours)} vs {len(docs)})")
    a = np.array([x for d in docs for x in ours[d]])
    b = np.array([x for d in docs for x in theirs[d]])
    diff = np.abs(a - b)
    differ = ties = steps = 0
    gaps = []
    for d in docs:
        mine, lm = int(np.argmax(ours[d])), int(np.argmax(theirs[d]))
        if mine == lm:
            continue
        differ += 1
        gap = theirs[d][lm] - theirs[d][mine]
        if gap == 0:
            ties += 1
        elif gap <= grid_step(max(abs(theirs[d][lm]), abs(theirs[d][mine])), dtype):
            steps += 1
        else:
            gaps.append(gap)
    other = f"{len(gaps)} ({max(gaps):.3g})" if gaps else "0"
    if f32 is None:
        near = ["n/a", "n/a"]
    else:
        ref = np.array([x for d in docs for x in f32[d]])
        near = [float(np.abs(a - ref).mean()), float(np.abs(b - ref).mean())]
    return [len(a), float(diff.max()), float((diff / np.abs(b).clip(min=1e-9)).max()), f"{differ}/{len(docs)}",
            ties, steps, other, *near]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="stories,gpt2-small,tiny",
                        help="comma-separated: stories, gpt2-small, tiny (every family), tiny:<family>")
    parser.add_argument("--dtypes", default="bfloat16,float16")
    parser.add_argument("--rows", type=int, default=300, help=f"documents per task (tiny models: at most {TINY_ROWS})")
    parser.add_argument("--work", type=Path, help="keep runs here and reuse them (default: a fresh temp dir)")
    args = parser.parse_args()
    names = [n for name in args.models.split(",")
             for n in ([f"tiny:{f}" for f in tiny_families()] if name == "tiny" else [name])]
    dtypes = args.dtypes.split(",")
    if not set(dtypes) <= {"bfloat16", "float16"}:
        sys.exit(f"--dtypes: use bfloat16 and/or float16, got {args.dtypes}")
    work = args.work or Path(tempfile.mkdtemp(prefix="raylm-bf16-vs-lmeval-"))
    work.mkdir(parents=True, exist_ok=True)
    table = []
    for name in names:
        model = model_path(name)
        rows = min(args.rows, TINY_ROWS) if name.startswith("tiny:") else args.rows
        tag = name.replace(":", "-")
        for dtype in dtypes:
            try:
                f32 = lmeval_run(model, "float32", rows, work / f"lmeval-{tag}-float32-{rows}.json")
                theirs = lmeval_run(model, dtype, rows, work / f"lmeval-{tag}-{dtype}-{rows}.json")
                ours = raylm_run(model, dtype, rows, work / f"raylm-{tag}-{dtype}-{rows}")
            except RunFailed as e:
                table.append([name, dtype, str(e)] + [""] * len(COLUMNS))
                continue
            for task in TASKS:
                table.append([name, dtype, task, *compare(ours[task], theirs[task], f32[task], dtype)])
                print(f"done: {name} {dtype} {task}", file=sys.stderr, flush=True)
    print_table(f"raylm vs lm-evaluation-harness 0.4.13 at low precision, CPU (runs kept in {work})",
                ["model", "dtype", "task", *COLUMNS], table)


if __name__ == "__main__":
    main()
