"""Tiny seeded random causal LMs, one per architecture family raylm is asked to score (tests/test_architectures.py).

Each is hidden 32, 2 layers, 4 heads, the stories260K tokenizer's 512-token vocabulary and a 128-token context, so
real HellaSwag rows get left-truncated; windowed families get a 16-token window, so real contexts (40-128 tokens)
reach well past it while WinoGrande's shortest stay inside it.

Weights are initialised with a large std on purpose: at transformers' default 0.02 a 2-layer model's attention is
nearly uniform and its next-token distribution nearly flat, so attending to a few wrong keys moves a loglikelihood
by ~1e-5 and a broken mask could hide under float tolerance. At 0.3 the same mistake moves it by nats.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
import transformers as tf

VOCAB, HIDDEN, LAYERS, HEADS, MLP = 512, 32, 2, 4, 64
CONTEXT = 128
WINDOW = 16
INIT_STD = 0.3
SPECIAL = {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}  # stories260K: <unk>=0, <s>=1, </s>=2


def _llama_like(cls, **extra) -> tf.PreTrainedConfig:
    """The keyword set Llama's descendants share (Mistral, Qwen2, Gemma, OLMo, Cohere2, Phi-3)."""
    return cls(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
               num_attention_heads=HEADS, num_key_value_heads=2, max_position_embeddings=CONTEXT,
               initializer_range=INIT_STD, tie_word_embeddings=False, **SPECIAL, **extra)


def _gemma_like(cls, **extra) -> tf.PreTrainedConfig:
    return _llama_like(cls, head_dim=HIDDEN // HEADS, query_pre_attn_scalar=HIDDEN // HEADS, sliding_window=WINDOW,
                       final_logit_softcapping=8.0, **extra)


FAMILIES: dict[str, Callable[[], tf.PreTrainedConfig]] = {
    "gpt2": lambda: tf.GPT2Config(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=CONTEXT,
                                  n_inner=MLP, initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2),
    "llama": lambda: _llama_like(tf.LlamaConfig),
    "mistral": lambda: _llama_like(tf.MistralConfig, sliding_window=WINDOW),
    # layer_types come out [full, sliding]: layers at index >= max_window_layers slide.
    "qwen2": lambda: _llama_like(tf.Qwen2Config, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    # Gemma-2's attention softcap is applied by its eager attention (sdpa is refused); layers [sliding, full].
    "gemma2": lambda: _gemma_like(tf.Gemma2Config, attn_logit_softcapping=5.0),
    "gemma3": lambda: _gemma_like(tf.Gemma3TextConfig, layer_types=["sliding_attention", "full_attention"]),
    "gpt_neox": lambda: tf.GPTNeoXConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                         num_attention_heads=HEADS, intermediate_size=MLP,
                                         max_position_embeddings=CONTEXT, rotary_pct=0.5, initializer_range=INIT_STD,
                                         **SPECIAL),
    "opt": lambda: tf.OPTConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, ffn_dim=MLP, max_position_embeddings=CONTEXT,
                                word_embed_proj_dim=HIDDEN, init_std=INIT_STD, dropout=0.0, **SPECIAL),
    "phi": lambda: tf.PhiConfig(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=MLP, num_hidden_layers=LAYERS,
                                num_attention_heads=HEADS, max_position_embeddings=CONTEXT,
                                rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                 "partial_rotary_factor": 0.5},
                                initializer_range=INIT_STD, **SPECIAL),
    "phi3": lambda: _llama_like(tf.Phi3Config, original_max_position_embeddings=CONTEXT, sliding_window=WINDOW),
    "falcon": lambda: tf.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                      num_attention_heads=HEADS, max_position_embeddings=CONTEXT, alibi=False,
                                      initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2),
    "falcon_alibi": lambda: tf.FalconConfig(vocab_size=VOCAB, hidden_size=HIDDEN, num_hidden_layers=LAYERS,
                                            num_attention_heads=HEADS, max_position_embeddings=CONTEXT, alibi=True,
                                            initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2),
    # BLOOM states no context length; its tests pass CONTEXT explicitly.
    "bloom": lambda: tf.BloomConfig(vocab_size=VOCAB, hidden_size=HIDDEN, n_layer=LAYERS, n_head=HEADS,
                                    initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2),
    "mpt": lambda: tf.MptConfig(vocab_size=VOCAB, d_model=HIDDEN, n_layers=LAYERS, n_heads=HEADS, expansion_ratio=2,
                                max_seq_len=CONTEXT, initializer_range=INIT_STD, bos_token_id=1, eos_token_id=2),
    "gptj": lambda: tf.GPTJConfig(vocab_size=VOCAB, n_embd=HIDDEN, n_layer=LAYERS, n_head=HEADS, n_positions=CONTEXT,
                                  rotary_dim=4, n_inner=MLP, initializer_range=INIT_STD, bos_token_id=1,
                                  eos_token_id=2),
    "olmo": lambda: _llama_like(tf.OlmoConfig),
    "olmo2": lambda: _llama_like(tf.Olmo2Config),
    # layer_types default to 3 sliding + 1 full per 4 layers; with 2 layers they are given. Full layers use no RoPE.
    "cohere2": lambda: _llama_like(tf.Cohere2Config, sliding_window=WINDOW,
                                   layer_types=["sliding_attention", "full_attention"], logit_scale=0.5),
}


def build(family: str, directory: Path, seed: int = 0, context: int = CONTEXT) -> Path:
    """Random-initialise `family` under `seed` and save it with save_pretrained into directory/family-seed; a
    `context` other than CONTEXT widens its position range (few-shot prompts run to hundreds of tokens)."""
    out = directory / f"{family}-s{seed}" if context == CONTEXT else directory / f"{family}-s{seed}-c{context}"
    torch.manual_seed(seed)
    config = FAMILIES[family]()
    if context != CONTEXT:
        config.max_position_embeddings = context  # n_positions / max_seq_len through each config's attribute_map
    tf.AutoModelForCausalLM.from_config(config).save_pretrained(out)
    return out
