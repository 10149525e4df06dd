"""4-bit (nf4) and 8-bit (LLM.int8) loading through bitsandbytes, for real on CPU, against fp32 of the same
weights: scores stay close, the weights really are quantised, and results.json records it."""

from __future__ import annotations

import numpy as np
import pytest

from raylm.cli import DEMO, build_parser, config_from_args
from raylm.encoding import Encoder, resolve_max_length
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.model_loading import ModelSpec, load_model, load_tokenizer, quantization_config
from raylm.report import results_dict
from raylm.requests import build_requests
from raylm.scoring import Scorer
from raylm.tasks import get_task

STORIES = str(DEMO / "models" / "stories260K-hf")
DEMO_DATA = DEMO / "data"

# Per-token loglikelihood differences measured on stories260K (real weights): 8-bit mean 0.011 / max 0.043,
# 4-bit mean 0.15 / max 0.45. The bounds leave room without letting a broken dequantisation through.
TOLERANCE = {"8bit": (0.05, 0.15), "4bit": (0.3, 0.9)}


@pytest.fixture(scope="module")
def requests_and_fp32():
    spec = ModelSpec(STORIES, "float32", "cpu")
    tokenizer, model = load_tokenizer(spec), load_model(spec)
    encoder = Encoder(tokenizer, resolve_max_length(model.config, tokenizer))
    task = get_task("hellaswag")
    table = build_requests(task, task.load_docs(DEMO_DATA)[:30], encoder)
    contexts, continuations = table["context"].to_pylist(), table["continuation"].to_pylist()
    reference, _ = Scorer(model, encoder.max_length).score(contexts, continuations)
    return contexts, continuations, reference, encoder.max_length, model.get_memory_footprint()


@pytest.mark.parametrize("bits", ["8bit", "4bit"])
def test_quantised_scores_close_to_fp32(requests_and_fp32, bits):
    import bitsandbytes as bnb

    contexts, continuations, reference, max_length, fp32_bytes = requests_and_fp32
    model = load_model(ModelSpec(STORIES, "float32", "cpu", quantization=bits))
    layer = model.model.layers[0].mlp.down_proj
    assert isinstance(layer, bnb.nn.Linear4bit if bits == "4bit" else bnb.nn.Linear8bitLt)
    assert model.get_memory_footprint() < fp32_bytes / 2
    loglik, _ = Scorer(model, max_length).score(contexts, continuations)
    per_token = np.abs(loglik - reference) / np.array([len(c) for c in continuations])
    mean_bound, max_bound = TOLERANCE[bits]
    assert 1e-6 < per_token.mean() < mean_bound
    assert per_token.max() < max_bound
    assert np.corrcoef(loglik, reference)[0, 1] > 0.99


def test_4bit_settings_are_nf4_double_quant_bf16_compute():
    import torch

    config = quantization_config("4bit")
    assert config.load_in_4bit and config.bnb_4bit_quant_type == "nf4" and config.bnb_4bit_use_double_quant
    assert config.bnb_4bit_compute_dtype == torch.bfloat16
    assert quantization_config("8bit").load_in_8bit
    with pytest.raises(RaylmError, match="unknown quantization '3bit'"):
        quantization_config("3bit")


def test_cli_flags_reach_results_json(ray_session, tmp_path):
    args = build_parser().parse_args(["eval", "--demo", "--load-in-8bit", "--tasks", "winogrande", "--limit", "4",
                                      "--device", "cpu", "--actors", "1", "--no-progress",
                                      "--output", str(tmp_path / "out")])
    result = evaluate(config_from_args(args))
    config = results_dict(result)["config"]
    assert config["quantization"] == "8bit" and config["model_args"]["quantization"] == "8bit"
    assert result.tasks["winogrande"].sums["docs"] == 4


def test_4bit_and_8bit_flags_exclude_each_other(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["eval", "--demo", "--load-in-4bit", "--load-in-8bit"])
    assert "not allowed with argument" in capsys.readouterr().err
