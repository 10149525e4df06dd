"""4-bit (nf4) and 8-bit (LLM.int8) loading through bitsandbytes, for real on CPU, against fp32 of the same
weights: scores stay close, the weights really are quantised, and results.json records it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml
from conftest import run_cli

from raylm.cli import build_parser, config_from_args
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.models.context import resolve_max_length
from raylm.models.loading import load_model, load_tokenizer, quantization_config
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.requests.table import build_requests
from raylm.results.report import results_dict
from raylm.scoring.scorer import Scorer
from raylm.tasks import get_task

REPO = Path(__file__).resolve().parents[1]
STORIES = str(DEMO_MODEL)

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


# Runs `raylm sweep` with the named packages unimportable, as after `pip install --no-deps raylm`.
WITHOUT_PACKAGES = """
import importlib.abc, sys
missing = set(sys.argv[1].split(","))
class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in missing:
            raise ModuleNotFoundError(f"No module named {name!r}")
sys.meta_path.insert(0, Missing())
sys.argv = ["raylm", *sys.argv[2:]]
from raylm.cli import run
run()
"""


@pytest.mark.parametrize("missing", ["accelerate", "bitsandbytes"])
def test_demo_sweep_without_a_quantisation_package_fails_before_ray_in_one_line(tmp_path, missing):
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run([sys.executable, "-c", WITHOUT_PACKAGES, missing, "sweep", str(REPO / "jobs" / "demo.yaml"),
                           "--output", str(tmp_path / "out")], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        f"raylm: error: {REPO / 'jobs' / 'demo.yaml'}: 4bit loading needs bitsandbytes and accelerate, which "
        f"`pip install raylm` brings; {missing} is not installed here (pip install bitsandbytes accelerate)"]
    assert not (tmp_path / "out" / "sweep.json").exists()


@pytest.mark.slow  # a Ray of its own
def test_the_demo_sweep_runs_its_4bit_model_without_warnings_or_tracebacks(tmp_path):
    """The README's offline sweep, cut to its nf4 model and one document per task (the warnings come from loading,
    and nf4 matmuls on CPU are slow: WikiText's second page alone is 23k characters): the nf4 model loads
    (bitsandbytes and accelerate installed with raylm itself), and bitsandbytes' hub-kernel warning is not shown.
    Its fp32 model is a plain sweep model, as tests/test_sweep.py runs them."""
    demo = yaml.safe_load((REPO / "jobs" / "demo.yaml").read_text())
    demo["models"] = [model for model in demo["models"] if model.get("load_in_4bit")]
    demo["settings"]["limit"] = [1]
    sweep = tmp_path / "demo.yaml"
    sweep.write_text(yaml.safe_dump(demo))
    proc = run_cli("sweep", str(sweep), "--output", str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "stories260K-nf4" / "0shot-limit1-batchauto" / "results.json").read_text())
    assert results["config"]["quantization"] == "4bit" and results["n-samples"]["hellaswag"]["effective"] == 1
    assert "kernels-community" not in proc.stderr and "Traceback" not in proc.stderr
