"""How close scoring comes to the compute floor: the minimal FLOPs (each distinct token of the requests' token tree
once, attention from each to its ancestors, cached prefixes included, and the LM head only on positions that
predict continuation tokens) over this machine's fp32 matmul rate, measured in the same run.

    PYTHONPATH=$PWD python bench/floor.py --model gpt2-small --rows 200
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA, model_path, print_table  # noqa: E402

from raylm.config import EvalConfig  # noqa: E402
from raylm.evaluate import build_task_requests  # noqa: E402
from raylm.models.context import resolve_max_length  # noqa: E402
from raylm.models.loading import load_model, load_tokenizer  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402
from raylm.requests.encoding import Encoder  # noqa: E402
from raylm.scoring.scorer import Scorer  # noqa: E402
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt2-small")
    parser.add_argument("--rows", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="20 documents")
    parser.add_argument("--tasks", default="hellaswag")
    parser.add_argument("--repeats", type=int, default=3, help="best of N for both scoring and the matmul rate")
    args = parser.parse_args()
    rows = 20 if args.quick else args.rows
    spec = ModelSpec(str(model_path(args.model)), dtype="float32", device="cpu")
    tokenizer = load_tokenizer(spec)
    model = load_model(spec)
    max_length = resolve_max_length(model.config, tokenizer)
    tables, _ = build_task_requests(EvalConfig(spec, tuple(args.tasks.split(",")), DATA, limit=rows),
                                    Encoder(tokenizer, max_length))
    out = []
    for task, (_, table) in tables.items():
        contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
        doc_ids = table["doc_id"].to_pylist()
        inputs = [(c + k)[-(max_length + 1):][:-1] for c, k in zip(contexts, continuations)]
        flops, unique, head_positions = minimal_flops(model, inputs, [len(k) for k in continuations])
        loop_tokens = sum(len(x) for x in inputs)
        Scorer(model, max_length).score(contexts[:8], continuations[:8], doc_ids[:8])  # warm-up
        rate, scoring_s = 0.0, float("inf")
        for _ in range(args.repeats):  # alternate, so both sides see the same moments of a noisy machine
            rate = max(rate, matmul_rate(model.config.hidden_size, model.config.vocab_size))
            start = time.perf_counter()
            Scorer(model, max_length).score(contexts, continuations, doc_ids)
            scoring_s = min(scoring_s, time.perf_counter() - start)
        rate = max(rate, matmul_rate(model.config.hidden_size, model.config.vocab_size))
        floor_s = flops / rate
        out.append([task, len(contexts), loop_tokens, unique, head_positions, flops / 1e12, rate / 1e9,
                    scoring_s, floor_s, flops / scoring_s / 1e9, scoring_s / floor_s])
    print_table(f"{args.model}: scoring time against the compute floor ({torch.get_num_threads()} threads)",
                ["task", "requests", "tokens (per request)", "tokens (tree, once)", "head positions",
                 "min TFLOP", "matmul GFLOP/s", "scoring s", "floor s", "achieved GFLOP/s", "time / floor"], out)


if __name__ == "__main__":
    main()
