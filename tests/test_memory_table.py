"""The table of what fits in generation's memory budget in docs/numerics.md, recomputed from the budget's own code
(raylm.scoring.memory): the numbers on the page are what the engine would size its slots to.

`python tests/test_memory_table.py` prints the table."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from raylm.models.devices import count_parameters
from raylm.scoring.memory import GIB, generation_tokens, kv_bytes_per_token, kv_share, slots_fitting

PAGE = Path(__file__).parent.parent / "docs" / "numerics.md"
START, END = "<!-- generation memory table: tests/test_memory_table.py -->", "<!-- end of the table -->"
CARDS_GIB = (24, 40, 80, 141)
LLAMA_VOCAB = 128256
# The published configs' shapes.
SHAPES = {
    "Llama-3.2-1B": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=64, tie_word_embeddings=True),
    "Llama-3.1-8B": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                         num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
    "Llama-3.1-70B": dict(hidden_size=8192, intermediate_size=28672, num_hidden_layers=80, num_attention_heads=64,
                          num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
# gsm8k_cot, 8-shot: the exemplars every request shares, a question after them, and lm-eval's max_gen_toks.
PREFIX, QUESTION, NEW_TOKENS = 1100, 100, 256


def llama_parameters(config: LlamaConfig) -> int:
    """A Llama's parameters from its shape (building a 70B model on the meta device takes seconds)."""
    h, layers, head_dim = config.hidden_size, config.num_hidden_layers, config.head_dim
    attention = h * head_dim * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    per_layer = attention + 3 * h * config.intermediate_size + 2 * h
    embeddings = config.vocab_size * h * (1 if config.tie_word_embeddings else 2)
    return embeddings + layers * per_layer + h


def memory_table() -> str:
    rows = ["| model | weights (bf16) | keys and values per token | card | KV budget | cached tokens | slots, "
            "prefix held once | slots, prefix in every row |",
            "|---|---|---|---|---|---|---|---|"]
    for name, shape in SHAPES.items():
        config = LlamaConfig(vocab_size=LLAMA_VOCAB, **shape)
        weights = 2 * llama_parameters(config)
        per_token = kv_bytes_per_token(config, torch.bfloat16)
        for card in CARDS_GIB:
            head = f"| {name} | {weights / GIB:.1f} GiB | {per_token // 1024} KiB | {card} GiB |"
            if weights >= card * GIB:
                rows.append(f"{head} weights do not fit | | | |")
                continue
            budget = kv_share(card * GIB - weights)
            tokens = budget // per_token
            once = slots_fitting(tokens, PREFIX, QUESTION + NEW_TOKENS, QUESTION)
            copied = slots_fitting(tokens, PREFIX + QUESTION, PREFIX + QUESTION + NEW_TOKENS, PREFIX + QUESTION)
            rows.append(f"{head} {budget / GIB:.1f} GiB | {tokens:,} | {once:,} | {copied:,} |")
    return "\n".join(rows)


def test_the_parameter_count_from_the_shape_is_the_models():
    for tied in (True, False):
        config = LlamaConfig(vocab_size=300, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                             num_attention_heads=4, num_key_value_heads=2, head_dim=16, tie_word_embeddings=tied)
        assert llama_parameters(config) == count_parameters(config, "AutoModelForCausalLM")


@pytest.mark.parametrize("slots", [1, 7])
def test_the_slots_that_fit_hold_no_more_than_the_budget(slots):
    budget = generation_tokens(slots, PREFIX, QUESTION + NEW_TOKENS, QUESTION)
    assert slots_fitting(budget, PREFIX, QUESTION + NEW_TOKENS, QUESTION) == slots
    assert slots_fitting(budget - 1, PREFIX, QUESTION + NEW_TOKENS, QUESTION) == slots - 1


def test_the_memory_table_on_the_numerics_page_is_computed():
    text = PAGE.read_text()
    assert text.split(START)[1].split(END)[0].strip() == memory_table()


if __name__ == "__main__":
    print(memory_table())
