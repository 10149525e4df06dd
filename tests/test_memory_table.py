"""The tables of what scoring and generation hold on a GPU in docs/numerics.md, recomputed from the budgets' own
code (raylm.scoring.memory, raylm.scoring.scorer): the numbers on the page are what the engine would size its
slots to, and the most a scoring pass may hold at the token budget it starts from.

`python tests/test_memory_table.py` prints both tables."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig

from raylm.models.devices import count_parameters
from raylm.scoring import memory
from raylm.scoring.memory import GIB, generation_tokens, kv_bytes_per_token, kv_share, slots_fitting, usable_bytes
from raylm.scoring.scorer import GPU_START_TOKEN_BUDGET, LOGITS_BUDGET_BYTES, ROW_TOKENS_MAX

PAGE = Path(__file__).parent.parent / "docs" / "numerics.md"
START, END = "<!-- generation memory table, computed: edit the code, not the table -->", "<!-- end of the table -->"
SCORING_START = "<!-- scoring memory table, computed: edit the code, not the table -->"
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


def scoring_activation_bytes_per_token(config: LlamaConfig) -> int:
    """What one token of a bfloat16 scoring pass holds at its widest moment, the MLP of one layer (layers run one
    after another, and a pass without a cache keeps no layer's keys): the residual stream and its normed copy
    (2 x hidden), the gate, the up projection and their product (3 x intermediate), and its row's attention mask
    across a row of ROW_TOKENS_MAX columns."""
    return 2 * (2 * config.hidden_size + 3 * config.intermediate_size + ROW_TOKENS_MAX)


def scoring_table() -> str:
    """Per model and card: weights, the logits budget and the activations at the token budget a GPU scorer starts
    from; where they overfill the card, the token budget its halvings on out-of-memory come to."""
    logits = LOGITS_BUDGET_BYTES["cuda"]
    rows = [f"| model | weights (bf16) | logits budget | activations at {GPU_START_TOKEN_BUDGET:,} tokens | total | "
            "card | token budget that fits |",
            "|---|---|---|---|---|---|---|"]
    for name, shape in SHAPES.items():
        config = LlamaConfig(vocab_size=LLAMA_VOCAB, **shape)
        weights = 2 * llama_parameters(config)
        per_token = scoring_activation_bytes_per_token(config)
        activations = GPU_START_TOKEN_BUDGET * per_token
        head = (f"| {name} | {weights / GIB:.1f} GiB | {logits / GIB:.0f} GiB | {activations / GIB:.1f} GiB | "
                f"{(weights + logits + activations) / GIB:.1f} GiB |")
        for card in CARDS_GIB:
            tokens = GPU_START_TOKEN_BUDGET
            while tokens > 1 and weights + logits + tokens * per_token > card * GIB:
                tokens //= 2
            fits = weights + logits + tokens * per_token <= card * GIB
            rows.append(f"{head} {card} GiB | {f'{tokens:,}' if fits else 'weights and logits do not fit'} |")
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


def test_a_gpu_of_its_own_budgets_its_free_memory_and_what_pytorch_holds_unused():
    assert usable_bytes(free=60 * GIB, total=80 * GIB, reserved=20 * GIB, allocated=15 * GIB) == 65 * GIB
    assert usable_bytes(60 * GIB, 80 * GIB, 20 * GIB, 15 * GIB, gpu_share=1.0) == 65 * GIB


@pytest.mark.parametrize("first", ["a", "b"])
def test_actors_sharing_a_gpu_each_budget_their_share_whichever_loads_first(first):
    """Two actors with --num-gpus 0.5 on one 80 GiB card, 10 and 20 GiB of weights: each measures the card's free
    memory with or without the other's weights on it yet; each budgets half the card less its own, so together
    they never plan for more than the card (measuring the whole card's free memory, the first would count the
    second's half as its own)."""
    total, weights = 80 * GIB, {"a": 10 * GIB, "b": 20 * GIB}
    second = "b" if first == "a" else "a"
    free = {first: total - weights[first], second: total - weights["a"] - weights["b"]}
    usable = {k: usable_bytes(free[k], total, weights[k], weights[k], gpu_share=0.5) for k in weights}
    assert usable == {"a": 30 * GIB, "b": 20 * GIB}
    assert sum(weights.values()) + sum(usable.values()) <= total


def test_a_share_of_a_gpu_is_no_more_than_the_card_has_free():
    """What else holds the card (another process, a neighbour over its share) leaves less than the share."""
    assert usable_bytes(free=5 * GIB, total=80 * GIB, reserved=10 * GIB, allocated=10 * GIB, gpu_share=0.5) == 5 * GIB
    assert usable_bytes(free=0, total=80 * GIB, reserved=50 * GIB, allocated=50 * GIB, gpu_share=0.5) == 0


def test_the_kv_budget_of_a_gpu_actor_is_kv_share_of_its_share(monkeypatch):
    """kv_bytes reads the device through torch.cuda and budgets KV_SHARE of what the share leaves."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (60 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device: 12 * GIB)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device: 10 * GIB)
    cuda = torch.device("cuda", 0)
    assert memory.kv_bytes(cuda) == kv_share(62 * GIB)
    assert memory.kv_bytes(cuda, gpu_share=0.5) == kv_share(30 * GIB)
    assert memory.kv_bytes(torch.device("cpu"), gpu_share=0.5) == memory.CPU_KV_BYTES


def test_the_memory_table_on_the_numerics_page_is_computed():
    text = PAGE.read_text()
    assert text.split(START)[1].split(END)[0].strip() == memory_table()


def test_the_scoring_memory_table_on_the_numerics_page_is_computed():
    text = PAGE.read_text()
    assert text.split(SCORING_START)[1].split(END)[0].strip() == scoring_table()


if __name__ == "__main__":
    print(scoring_table(), memory_table(), sep="\n\n")
