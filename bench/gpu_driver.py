"""Throughput of the Scorer on one accelerator: random-init models from configs, HellaSwag rows repeated, or
MMLU 5-shot's shape (--task mmlu-5shot: per subject one few-shot head, questions below it, four one-token choices
each, random token ids), which the scorer runs as a token tree with each subject's head cached once.

Prints docs/s, tokens/s and model FLOPs utilisation (MFU) against a peak rate (H200 bf16 dense: 790 TFLOP/s).
Uses only files in the repository (the packaged demo rows and tokenizer), so it runs on a bare machine.

    python bench/gpu_driver.py --shape llama-1b --docs 10000
    python bench/gpu_driver.py --device cpu --tiny --docs 20      # smoke test
    python bench/gpu_driver.py --shape llama-1b --task mmlu-5shot --docs 1140
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raylm.data.demo import DEMO_DATA, DEMO_MODEL  # noqa: E402
from raylm.models.loading import load_tokenizer  # noqa: E402
from raylm.models.spec import ModelSpec  # noqa: E402
from raylm.requests.encoding import Encoder  # noqa: E402
from raylm.requests.table import build_requests  # noqa: E402
from raylm.scoring.scorer import Scorer, model_input  # noqa: E402
from raylm.scoring.tree import build_trie  # noqa: E402
from raylm.tasks import get_task  # noqa: E402

H200_BF16_FLOPS = 790e12
MMLU_QUESTIONS_PER_SUBJECT = 20


def config(shape: str):
    from transformers import GPT2Config, LlamaConfig

    if shape == "gpt2-small":
        return GPT2Config()
    if shape == "llama-1b":
        return LlamaConfig(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                           num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048,
                           tie_word_embeddings=True)
    if shape == "llama-8b":
        return LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                           num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=2048)
    if shape == "tiny":
        return LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512)
    raise SystemExit(f"unknown --shape {shape}")


def body_and_head_params(model) -> tuple[int, int]:
    head = model.get_output_embeddings().weight
    skip = {id(head), id(model.get_input_embeddings().weight)}
    positional = getattr(getattr(model, "transformer", None), "wpe", None)
    if positional is not None:
        skip.add(id(positional.weight))
    return sum(p.numel() for p in model.parameters() if id(p) not in skip), head.numel()


def hellaswag_requests(docs: int, max_length: int) -> tuple[list, list]:
    tokenizer = load_tokenizer(ModelSpec(str(DEMO_MODEL)))
    task = get_task("hellaswag")
    sample = task.load_docs(DEMO_DATA)
    chosen = [type(d)(**{**d.__dict__, "doc_id": i}) for i in range(docs) for d in [sample[i % len(sample)]]]
    table = build_requests(task, chosen, Encoder(tokenizer, max_length))
    return table["context"].to_pylist(), table["continuation"].to_pylist()


def mmlu_5shot_requests(docs: int, vocab: int, seed: int = 0) -> tuple[list, list]:
    """MMLU 5-shot's shape: 20 questions per subject under a 400-800-token head, 20-100-token questions, four
    one-token choices (" A" .. " D" stand-ins)."""
    rnd = random.Random(seed)
    choices = [rnd.randrange(3, vocab) for _ in range(4)]
    contexts, continuations = [], []
    head: list[int] = []
    for q in range(docs):
        if q % MMLU_QUESTIONS_PER_SUBJECT == 0:
            head = [rnd.randrange(3, vocab) for _ in range(rnd.randint(400, 800))]
        question = head + [rnd.randrange(3, vocab) for _ in range(rnd.randint(20, 100))]
        for choice in choices:
            contexts.append(question)
            continuations.append([choice])
    return contexts, continuations


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", default="gpt2-small", help="gpt2-small, llama-1b, llama-8b (or tiny)")
    parser.add_argument("--docs", type=int, default=10_000)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--tiny", action="store_true", help="tiny Llama shape, for a CPU smoke test")
    parser.add_argument("--peak-flops", type=float, default=H200_BF16_FLOPS)
    parser.add_argument("--task", default="hellaswag", choices=["hellaswag", "mmlu-5shot"])
    args = parser.parse_args()
    shape = "tiny" if args.tiny else args.shape
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    with torch.device(args.device):
        model = AutoModelForCausalLM.from_config(config(shape), dtype=getattr(torch, args.dtype)).eval()
    max_length = 1024 if shape == "gpt2-small" else 2048 if shape.startswith("llama") else 512
    start = time.perf_counter()
    if args.task == "mmlu-5shot":
        contexts, continuations = mmlu_5shot_requests(args.docs, model.config.vocab_size)
    else:
        contexts, continuations = hellaswag_requests(args.docs, max_length)
    tokenize_s = time.perf_counter() - start

    inputs = [model_input(c, k, max_length) for c, k in zip(contexts, continuations)]
    trie = build_trie(range(len(inputs)), inputs, [len(k) for k in continuations])
    tokens, positions = len(trie), len(trie.predicts)  # each distinct tree token once, as the scorer computes them
    body, head = body_and_head_params(model)
    flops = 2.0 * body * tokens + 2.0 * head * positions

    scorer = Scorer(model, max_length)
    scorer.score(contexts[:64], continuations[:64])  # warm-up, and the first OOM probe
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
    sync()
    computed = scorer.computed_tokens
    start = time.perf_counter()
    scorer.score(contexts, continuations)
    sync()
    wall = time.perf_counter() - start
    share = (scorer.computed_tokens - computed) / sum(len(x) for x in inputs)
    label = shape if args.task == "hellaswag" else f"{shape} {args.task}"
    print(f"| {label} | {args.dtype} | {args.docs} | {len(contexts)} | {tokenize_s:.1f} | {wall:.2f} | "
          f"{args.docs / wall:.0f} | {tokens / wall:.0f} | {flops / wall / 1e12:.1f} | "
          f"{100 * flops / wall / args.peak_flops:.1f}% | {scorer.token_budget} | {share:.3f} |", flush=True)


if __name__ == "__main__":
    main()
