"""What every side-by-side benchmark needs: the models, the commands, wall-clock timing and a printed table.

Each tool runs as its own command in a subprocess, so every wall time is what a user waits for: interpreter and
library start-up, model load, tokenisation and scoring.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from fixture_data import STORIES, data_dir  # noqa: E402

CACHE = Path(os.environ.get("RAYLM_BENCH_CACHE", "/tmp/raylm-bench"))
# The tests' data unpacked once into the benchmarks' cache, for this process and the scripts it runs (a task-YAML
# writer run on its own would unpack into a directory removed when it exits, and its YAMLs would point there).
os.environ.setdefault("RAYLM_TEST_SESSION_CACHE", str(CACHE / "session"))
DATA = data_dir()  # the tests' data (tests/data), unpacked
GPT2_TOKENIZER = DATA / "models" / "gpt2-tokenizer"
LMEVAL_REF = REPO / "tests" / "golden" / "make_stories260K.py"  # lm-eval's own runs, as the goldens were made
MK_LOCAL_TASKS = REPO / "tests" / "offline_tasks.py"


def env() -> dict[str, str]:
    out = {**os.environ, "RAY_AUTH_MODE": "disabled", "PYTHONPATH": str(REPO), "TOKENIZERS_PARALLELISM": "false",
           "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    out.pop("RAY_ADDRESS", None)
    return out


def gpt2_small() -> Path:
    """A seeded random GPT-2-small (124M) with the real GPT-2 tokenizer, made once and cached on disk."""
    path = CACHE / "gpt2-small"
    if not (path / "config.json").exists():
        import torch
        from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

        torch.manual_seed(0)
        GPT2LMHeadModel(GPT2Config()).save_pretrained(path)
        AutoTokenizer.from_pretrained(GPT2_TOKENIZER).save_pretrained(path)
    return path


def model_path(name: str) -> Path:
    return gpt2_small() if name == "gpt2-small" else STORIES


def timed(cmd: list[str], label: str) -> float:
    """Run a command to completion and return its wall time; a failing command stops the benchmark."""
    start = time.perf_counter()
    proc = subprocess.run(cmd, env=env(), capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        sys.exit(f"{label} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall


def raylm_cmd(model: Path, tasks: str, limit: int | None, out: Path, actors: int = 1,
              extra: tuple[str, ...] = ()) -> list[str]:
    cmd = [sys.executable, "-m", "raylm", "eval", "--model", str(model), "--tasks", tasks, "--data-dir", str(DATA),
           "--output", str(out), "--log-samples", "--no-progress", "--dtype", "float32", "--device", "cpu",
           "--actors", str(actors), *extra]
    return cmd + (["--limit", str(limit)] if limit else [])


def raylm_logliks(out: Path, task: str) -> dict[int, list[float]]:
    """doc_id -> loglikelihoods in request order, from raylm's samples Parquet."""
    table = pq.read_table(out / "samples" / f"{task}.parquet").sort_by([("doc_id", "ascending"),
                                                                      ("req_idx", "ascending")])
    docs: dict[int, list[float]] = {}
    for doc, ll in zip(table["doc_id"].to_pylist(), table["loglikelihood"].to_pylist()):
        docs.setdefault(doc, []).append(ll)
    return docs


def predictions(logliks: dict[int, list[float]]) -> dict[int, int]:
    return {doc: max(range(len(ll)), key=ll.__getitem__) for doc, ll in logliks.items()}


def same_predictions(a: dict[int, list[float]], b: dict[int, list[float]]) -> str:
    pa_, pb = predictions(a), predictions(b)
    if pa_.keys() != pb.keys():
        return f"docs differ ({len(pa_)} vs {len(pb)})"
    diff = sum(pa_[d] != pb[d] for d in pa_)
    return "identical" if diff == 0 else f"{diff}/{len(pa_)} differ"


def max_abs_diff(a: dict[int, list[float]], b: dict[int, list[float]]) -> float:
    return max((abs(x - y) for d in a for x, y in zip(a[d], b.get(d, []))), default=0.0)


def print_table(title: str, header: list[str], rows: list[list[object]]) -> None:
    cells = [header] + [[f"{c:.3g}" if isinstance(c, float) else str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    print(f"\n## {title}\n")
    for n, row in enumerate(cells):
        print("| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |")
        if n == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")


def dump(path: Path, data: object) -> None:
    path.write_text(json.dumps(data))


def print_fixed_cost_split(title: str, reference: str, ref_walls: list[float], ref_fixed: list[float],
                           raylm_walls: list[float], raylm_fixed: list[float]) -> None:
    """Split each tool's best wall time into a 1-document run (start-up, model load, exit: the fixed cost) and
    the rest (scoring the remaining documents), so a ratio says which of the two it comes from.

    The ceiling is the whole-run ratio raylm would reach if the rest took no time at all: a ratio above it can
    come only from a smaller fixed cost, not from faster scoring.
    """
    ref, ref_one, ours, ours_one = min(ref_walls), min(ref_fixed), min(raylm_walls), min(raylm_fixed)
    rest_ratio = (ref - ref_one) / (ours - ours_one) if ref > ref_one and ours > ours_one else "n/a (noise)"
    print_table(f"{title} ({reference} / tool)", ["tool", "whole run s", "1 doc per task s", "the rest s",
                                                   "ratio, whole", "ratio, the rest"],
                [[reference, ref, ref_one, ref - ref_one, 1.0, 1.0],
                 ["raylm --actors 1", ours, ours_one, ours - ours_one, ref / ours, rest_ratio]])
    print(f"\n1-doc runs: {reference} {', '.join(f'{w:.1f}' for w in ref_fixed)} s, raylm "
          f"{', '.join(f'{w:.1f}' for w in raylm_fixed)} s. Ceiling: with no time for the rest, raylm's whole run "
          f"could be at most {ref / ours_one:.2f}x faster than {reference} here.")


def build_task_requests(cfg, encoder) -> tuple[dict, dict[str, int]]:
    """Native tasks' request tables for cfg, as `raylm eval` builds them (raylm.evaluate's readers of the config),
    and each task's document count before --limit; raylm is imported only by the benchmarks that build requests."""
    from raylm.evaluate import run_prompt, run_task_docs
    from raylm.requests.native import encode_task_requests

    docs = run_task_docs(cfg)
    tables = encode_task_requests(docs, encoder, run_prompt(cfg, encoder.tokenizer))
    return tables, {name: original for name, (_, original) in docs.items()}
