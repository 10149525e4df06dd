"""The slow, obviously-correct generation every engine path is checked against: one request at a time, no KV
cache (the whole context plus what is generated so far runs through the model for every new token), greedy on a
float64 model, stopping as HF generate stops under lm-eval 0.4.13's HFLM (the model's eos ids, lm-eval's own
stop_sequences_criteria, max_gen_toks) and cut by lm-eval's own postprocess_generated_text."""

from __future__ import annotations

import torch
from lm_eval.models.utils import postprocess_generated_text
from lm_eval.models.utils_hf import stop_sequences_criteria


@torch.inference_mode()
def reference_generate(model64: torch.nn.Module, tokenizer, context: list[int], until: list[str], max_gen_toks: int,
                       eos_ids: set[int]) -> tuple[str, int]:
    """(text, new tokens) for one greedy request."""
    criteria = stop_sequences_criteria(tokenizer, list(until), len(context), 1)
    ids = list(context)
    for _ in range(max_gen_toks):
        logits = model64(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1]
        token = int(logits.argmax())
        ids.append(token)
        if token in eos_ids or bool(criteria(torch.tensor([ids]), None).all()):
            break
    new = ids[len(context):]
    text = tokenizer.decode(new, skip_special_tokens=True)
    return postprocess_generated_text(text, list(until), None), len(new)
