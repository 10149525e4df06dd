"""minicons' side of bench/vs_minicons.py, run inside minicons' own virtual environment (transformers 4.57.x:
minicons 0.3.39 calls tokenizer.batch_encode_plus, which transformers 5 removed), as one whole command.

Input JSON: {"model": DIR, "variant": "original" | "word-l2r", "batch_size": N, "threads": N,
             "pairs": [[context, continuation], ...]}
Output JSON: {"minicons": VERSION, "transformers": VERSION, "token_scores": [[...], ...]}

Each pair is scored as conditional_score(context, continuation, separator="") with a per-token "reduction":
minicons then sees exactly context + continuation as one text and masks and scores only the continuation's
tokens, as raylm does. Its per-token scores come back as float32 (minicons casts them).

Usage: MINICONS_VENV/bin/python bench/minicons_score.py IN.json OUT.json
"""

from __future__ import annotations

import json
import sys
from importlib.metadata import version

import torch
from minicons.scorer import MaskedLMScorer
from transformers import AutoModelForMaskedLM, AutoTokenizer

METRICS = {"original": "original", "word-l2r": "within_word_l2r"}  # minicons' names for the two PLLs


def main(src: str, dst: str) -> None:
    job = json.loads(open(src, encoding="utf-8").read())
    torch.set_num_threads(job["threads"])
    model = AutoModelForMaskedLM.from_pretrained(job["model"], dtype=torch.float32)
    scorer = MaskedLMScorer(model, device="cpu", tokenizer=AutoTokenizer.from_pretrained(job["model"]))
    pairs, size = job["pairs"], job["batch_size"]
    scores: list[list[float]] = []
    for i in range(0, len(pairs), size):
        chunk = pairs[i:i + size]
        scores += scorer.conditional_score([c for c, _ in chunk], [k for _, k in chunk], separator="",
                                           reduction=lambda x: x.tolist(), PLL_metric=METRICS[job["variant"]])
    with open(dst, "w", encoding="utf-8") as f:
        json.dump({"minicons": version("minicons"), "transformers": version("transformers"), "token_scores": scores},
                  f)


if __name__ == "__main__":
    main(*sys.argv[1:])
