"""What load_model changes about a model on the way in, and that it changes no result beyond float rounding."""

from __future__ import annotations

import torch
from transformers import AutoModelForCausalLM
from transformers.activations import GELUTanh, NewGELUActivation

from raylm.model_loading import ModelSpec, load_model


def test_gelu_new_runs_as_the_fused_kernel_with_the_same_outputs(tiny_gpt2):
    plain = AutoModelForCausalLM.from_pretrained(tiny_gpt2, dtype=torch.float32).eval()
    loaded = load_model(ModelSpec(str(tiny_gpt2), "float32", "cpu"))
    assert any(isinstance(m, NewGELUActivation) for m in plain.modules())
    assert not any(isinstance(m, NewGELUActivation) for m in loaded.modules())
    assert sum(isinstance(m, GELUTanh) for m in loaded.modules()) == plain.config.n_layer
    ids = torch.randint(0, plain.config.vocab_size, (3, 100), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected, got = plain(input_ids=ids).logits, loaded(input_ids=ids).logits
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
