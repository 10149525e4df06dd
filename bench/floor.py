"""How close scoring comes to the compute floor: the minimal FLOPs (each distinct token of a task's token tree
once, attention from each to its ancestors, cached prefixes included, and the LM head only on positions that
predict continuation tokens) over this machine's fp32 matmul rate, measured in the same run.

Scoring is what one actor does with the task: its shards as `raylm eval` cuts them (token order, cut where
neighbours share least), one after another through one Scorer. The floor is the whole task's tree, so a prefix
two shards both compute counts against raylm.

    PYTHONPATH=$PWD python bench/floor.py --model gpt2-small --rows 200
    PYTHONPATH=$PWD python bench/floor.py --model gpt2-small --rows 20 --tasks mmlu_local --include-path DIR \\
        --num-fewshot 5          # DIR: python tests/offline_tasks.py MMLU_MIRROR DIR
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, build_task_requests, model_path, print_table  # noqa: E402

from raylm.config import EvalConfig  # noqa: E402
from raylm.evaluate import run_lmeval_requests, run_prompt, run_selection  # noqa: E402
from raylm.models.context import resolve_max_length  # noqa: E402
from raylm.models.loading import load_model, load_tokenizer  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402
from raylm.requests.encoding import Encoder  # noqa: E402
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS, cut  # noqa: E402
from raylm.scoring.scorer import Scorer, model_input  # noqa: E402
from raylm.scoring.tree import build_trie  # noqa: E402


def matmul_rate(hidden: int, vocab: int, tokens: int = 2048, repeats: int = 3) -> float:
    """Best fp32 FLOP/s over the shapes a forward pass is made of: projections, MLP and the LM head."""
    best = 0.0
    for n, k, m in ((tokens, hidden, 3 * hidden), (tokens, hidden, 4 * hidden), (tokens, 4 * hidden, hidden),
                    (tokens // 2, hidden, vocab)):
        a, b = torch.randn(n, k), torch.randn(k, m)
        torch.matmul(a, b)
        start = time.perf_counter()
        for _ in range(repeats):
            torch.matmul(a, b)
        best = max(best, 2 * n * k * m * repeats / (time.perf_counter() - start))
    return best


def tree_counts(inputs: list[list[int]], n_targets: list[int]) -> tuple[int, int, int]:
    """Distinct tree tokens, distinct predicting positions, and (query, key) pairs of attention: each distinct
    token attends to itself and all its ancestors once, whether they sit in its row or in a cached prefix."""
    trie = build_trie(range(len(inputs)), inputs, n_targets)
    return len(trie), len(trie.predicts), sum(d + 1 for d in trie.depth)


def minimal_flops(model, inputs: list[list[int]], n_targets: list[int]) -> tuple[float, int, int]:
    """2 x body parameters per distinct tree token, 4 x hidden x layers per attended (query, key) pair, plus
    2 x hidden x vocab per predicting position."""
    unique, head_positions, pairs = tree_counts(inputs, n_targets)
    embeddings = {id(p) for m in (model.get_input_embeddings(), model.get_output_embeddings()) for p in m.parameters()}
    positional = getattr(getattr(model, "transformer", None), "wpe", None)
    if positional is not None:
        embeddings |= {id(p) for p in positional.parameters()}
    body = sum(p.numel() for p in model.parameters() if id(p) not in embeddings)
    head = model.get_output_embeddings().weight.numel()
    attention = 4.0 * model.config.hidden_size * model.config.num_hidden_layers * pairs
    return 2.0 * body * unique + attention + 2.0 * head * head_positions, unique, head_positions


def score_as_an_actor(model, max_length: int, shards: list[pa.Table]) -> tuple[float, int]:
    """Wall seconds for one Scorer to score every shard in turn, and the token columns it ran."""
    scorer = Scorer(model, max_length)
    start = time.perf_counter()
    for shard in shards:
        scorer.score(shard["context"].to_pylist(), shard["continuation"].to_pylist())
    return time.perf_counter() - start, scorer.computed_tokens


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--rows", type=int, default=200, help="documents per task (lm-eval's --limit)")
    parser.add_argument("--quick", action="store_true", help="20 documents")
    parser.add_argument("--tasks", default="hellaswag", help="native tasks or lm-eval tasks and groups, as for eval")
    parser.add_argument("--include-path", type=Path, help="lm-eval task YAMLs, as for `raylm eval`")
    parser.add_argument("--num-fewshot", type=int)
    parser.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_REQUESTS)
    parser.add_argument("--repeats", type=int, default=3, help="best of N for both scoring and the matmul rate")
    args = parser.parse_args()
    spec = ModelSpec(str(model_path(args.model)), dtype="float32", device="cpu")
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    max_length = resolve_max_length(model.config, tokenizer)
    cfg = EvalConfig(spec, tuple(args.tasks.split(",")), DATA, limit=20 if args.quick else args.rows,
                     num_fewshot=args.num_fewshot, include_path=args.include_path)
    encoder = Encoder(tokenizer, max_length)
    tables, _ = build_task_requests(cfg, encoder)
    selection = run_selection(cfg)
    if selection is not None:
        tables.update(run_lmeval_requests(cfg, selection, encoder, run_prompt(cfg, encoder.tokenizer))[1])
    tasks = {}
    for task, (_, table) in tables.items():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        inputs = [model_input(c, k, max_length) for c, k in zip(contexts, continuations)]
        flops, unique, head_positions = minimal_flops(model, inputs, [len(k) for k in continuations])
        tasks[task] = {"shards": cut(table, args.shard_size), "requests": table.num_rows, "flops": flops,
                       "held": sum(len(x) for x in inputs), "unique": unique, "head": head_positions,
                       "scoring_s": float("inf")}
    first = next(iter(tasks.values()))["shards"][0]
    Scorer(model, max_length).score(first["context"].to_pylist()[:8], first["continuation"].to_pylist()[:8])
    rate = 0.0
    for _ in range(args.repeats):  # alternate, so both sides see the same moments of a noisy machine
        rate = max(rate, matmul_rate(model.config.hidden_size, model.config.vocab_size))
        for t in tasks.values():
            seconds, t["computed"] = score_as_an_actor(model, max_length, t["shards"])
            t["scoring_s"] = min(t["scoring_s"], seconds)
    rate = max(rate, matmul_rate(model.config.hidden_size, model.config.vocab_size))
    rows = dict(tasks)
    if len(tasks) > 1:
        rows[f"all {len(tasks)}"] = {k: sum(t[k] for t in tasks.values())
                                     for k in ("requests", "flops", "held", "unique", "computed", "head", "scoring_s")}
    out = [[name, t["requests"], t["held"], t["unique"], t["computed"], t["head"], t["flops"] / 1e12, rate / 1e9,
            t["scoring_s"], t["flops"] / rate, t["flops"] / t["scoring_s"] / 1e9, t["scoring_s"] * rate / t["flops"]]
           for name, t in rows.items()]
    print_table(f"{args.model}: scoring time against the compute floor ({torch.get_num_threads()} threads, shards "
                f"of {args.shard_size} requests, best of {args.repeats})",
                ["task", "requests", "tokens (per request)", "tokens (tree, once)", "tokens computed",
                 "head positions", "min TFLOP", "matmul GFLOP/s", "scoring s", "floor s", "achieved GFLOP/s",
                 "time / floor"], out)


if __name__ == "__main__":
    main()
