"""raylm against the naive per-ending loop (one forward pass per request), side by side, whole-command wall time.

    PYTHONPATH=$PWD python bench/vs_loop.py --model gpt2-small --tasks hellaswag --rows 200
    PYTHONPATH=$PWD python bench/vs_loop.py --model stories --tasks hellaswag,winogrande
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (  # noqa: E402
    DATA,
    build_task_requests,
    max_abs_diff,
    model_path,
    print_fixed_cost_split,
    print_table,
    raylm_cmd,
    raylm_logliks,
    same_predictions,
    timed,
)


def naive_loop(model_dir: str, tasks: list[str], rows: int | None, out: Path) -> None:
    """For each request: one forward pass over context + continuation, sum the continuation tokens' log-probs."""
    import torch
    from transformers import AutoModelForCausalLM

    from raylm.config import EvalConfig
    from raylm.models.context import resolve_max_length
    from raylm.models.loading import load_tokenizer
    from raylm.models.spec import ModelSpec
    from raylm.requests.encoding import Encoder

    spec = ModelSpec(model_dir)
    tokenizer = load_tokenizer(spec)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    max_length = resolve_max_length(model.config, tokenizer)
    tables, _ = build_task_requests(EvalConfig(spec, tuple(tasks), DATA, limit=rows), Encoder(tokenizer, max_length))
    result: dict[str, dict[int, list[float]]] = {}
    with torch.inference_mode():
        for task, (_, table) in tables.items():
            docs = result.setdefault(task, {})
            for doc, context, ending in zip(table["doc_id"].to_pylist(), table["context"].to_pylist(),
                                            table["continuation"].to_pylist()):
                whole = (context + ending)[-(max_length + 1):]
                logits = model(input_ids=torch.tensor([whole[:-1]])).logits[0, -len(ending):]
                logprobs = torch.log_softmax(logits.float(), dim=-1)
                docs.setdefault(doc, []).append(float(logprobs.gather(-1, torch.tensor(ending)[:, None]).sum()))
    out.write_text(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small", help="gpt2-small (random 124M) or stories (stories260K)")
    parser.add_argument("--tasks", default="hellaswag")
    parser.add_argument("--rows", type=int, help="documents per task (default: all)")
    parser.add_argument("--quick", action="store_true", help="20 documents per task")
    parser.add_argument("--repeats", type=int, default=2, help="alternating runs of each tool; best of N")
    parser.add_argument("--fixed-cost", action="store_true",
                        help="also time each tool on 1 document per task: fixed cost vs the rest, and the ceiling")
    parser.add_argument("--loop-only", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    rows = 20 if args.quick else args.rows
    tasks = args.tasks.split(",")
    model = model_path(args.model)
    if args.loop_only:
        naive_loop(str(model), tasks, rows, args.loop_only)
        return
    work = Path(tempfile.mkdtemp(prefix="raylm-vs-loop-"))

    def loop_cmd(n: int | None, out: str) -> list[str]:
        return [sys.executable, __file__, "--model", args.model, "--tasks", args.tasks,
                *(["--rows", str(n)] if n else []), "--loop-only", str(work / out)]

    loop_walls, raylm_walls, loop_fixed, raylm_fixed = [], [], [], []
    for i in range(args.repeats):  # alternating, so both tools see the same moments of a noisy machine
        loop_walls.append(timed(loop_cmd(rows, "loop.json"), "loop"))
        # A fresh output directory each time: reusing one would resume from the previous run's checkpoint.
        raylm_walls.append(timed(raylm_cmd(model, args.tasks, rows, work / f"raylm-{i}"), "raylm"))
        if args.fixed_cost:
            loop_fixed.append(timed(loop_cmd(1, "loop-1.json"), "loop, 1 doc"))
            raylm_fixed.append(timed(raylm_cmd(model, args.tasks, 1, work / f"raylm-1-{i}"), "raylm, 1 doc"))
    loop_wall, raylm_wall = min(loop_walls), min(raylm_walls)
    loop = {t: {int(d): v for d, v in docs.items()} for t, docs in json.loads((work / "loop.json").read_text()).items()}
    n_docs = sum(len(d) for d in loop.values())
    n_req = sum(len(v) for d in loop.values() for v in d.values())
    checks = [f"{t}: {same_predictions(raylm_logliks(work / 'raylm-0', t), loop[t])}, max |dLL| "
              f"{max_abs_diff(raylm_logliks(work / 'raylm-0', t), loop[t]):.1e}" for t in tasks]
    print_table(f"{args.model}, {args.tasks}, {n_docs} docs / {n_req} requests, whole-command wall time "
                f"(best of {args.repeats}; loop {', '.join(f'{w:.1f}' for w in loop_walls)} s, raylm "
                f"{', '.join(f'{w:.1f}' for w in raylm_walls)} s)",
                ["tool", "wall s", "docs/s", "requests/s", "loop / tool"],
                [["per-ending loop", loop_wall, n_docs / loop_wall, n_req / loop_wall, 1.0],
                 ["raylm --actors 1", raylm_wall, n_docs / raylm_wall, n_req / raylm_wall, loop_wall / raylm_wall]])
    print("\npredictions (argmax loglikelihood per doc): " + "; ".join(checks))
    if args.fixed_cost:
        print_fixed_cost_split(f"{args.model}, {args.tasks}: fixed cost (1 document per task) and the rest",
                               "per-ending loop", loop_walls, loop_fixed, raylm_walls, raylm_fixed)


if __name__ == "__main__":
    main()
