"""One model over several devices (raylm.models.devices), proven without a GPU.

- The plan: a model larger than one device, planned on the meta device against a fake per-GPU budget (an 8B Llama
  shape over two 10 GiB GPUs), is balanced over both, never split inside a layer, and one that does not fit is
  refused before any weight is read.
- The run: a model dispatched by accelerate over the CPU and a disk offload folder (the hooks that move activations
  between GPUs are the ones that carry it) scores real rows exactly as the undispatched model, packed rows and the
  LM-head gather included, for an untied (Llama) and a tied-embedding (GPT-2) model, and so does the KL scorer.
- The wiring: load_model hands from_pretrained a device map for one GPU (weights straight to the GPU, not through
  host memory) and a planned one for several; the scorer feeds token ids to the first layer's device.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig

import tiny_families as fam
from conftest import DATA, STORIES
from task_requests import build_task_requests
from raylm.config import EvalConfig
from raylm.errors import RaylmError
from raylm.models import devices
from raylm.models.devices import Budget, input_device, plan_device_map
from raylm.models.loading import load_model
from raylm.models.spec import ModelSpec
from raylm.requests.encoding import Encoder
from raylm.scoring.kl import KLScorer
from raylm.scoring.scorer import Scorer

GIB = 2**30
LLAMA_8B = dict(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192)


def test_an_8b_model_is_planned_over_two_gpus_it_does_not_fit_one_of():
    """Llama-3-8B's 15 GiB of bf16 weights over two 10 GiB GPUs: layers balanced (the embedding and the first half
    on GPU 0, the rest with the head on GPU 1), no layer split, each GPU within its budget, nothing on the CPU or
    disk."""
    from transformers.integrations.accelerate import compute_module_sizes

    config = LlamaConfig(**LLAMA_8B)
    budget = Budget({0: 10 * GIB, 1: 10 * GIB})
    plan = plan_device_map(config, torch.bfloat16, budget)
    assert set(plan.values()) == {0, 1}
    assert plan["model.embed_tokens"] == 0 and plan["lm_head"] == 1
    layers = [plan[f"model.layers.{i}"] for i in range(config.num_hidden_layers)]
    assert layers == sorted(layers) and abs(layers.count(0) - layers.count(1)) <= 2
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    sizes = compute_module_sizes(meta)
    sizes = sizes[0] if isinstance(sizes, tuple) else sizes
    assert sizes[""] > 10 * GIB
    for gpu in (0, 1):
        assert sum(sizes[name] for name, d in plan.items() if d == gpu) <= budget.max_memory[gpu]

    with pytest.raises(RaylmError, match=r"weights \(15.0 GiB in bfloat16\) do not fit the devices given \(GPU 0: "
                                         r"6.0 GiB, GPU 1: 6.0 GiB\)"):
        plan_device_map(config, torch.bfloat16, Budget({0: 6 * GIB, 1: 6 * GIB}))


@pytest.fixture(scope="module")
def family(tmp_path_factory):
    """tests/tiny_families.py's Llama (untied head) and GPT-2 (head tied to the token embedding) with the stories
    tokenizer, saved for from_pretrained."""
    root = tmp_path_factory.mktemp("device-map")
    paths = {}
    for name in ("llama", "gpt2"):
        paths[name] = fam.build(name, root)
        AutoTokenizer.from_pretrained(STORIES).save_pretrained(paths[name])
    return paths


@pytest.fixture(scope="module")
def real(family):
    encoder = Encoder(AutoTokenizer.from_pretrained(STORIES), fam.CONTEXT)
    tables, _ = build_task_requests(EvalConfig(ModelSpec(str(family["llama"])), ("hellaswag", "winogrande"), DATA,
                                               limit=6), encoder)
    contexts, continuations = [], []
    for _, table in tables.values():
        contexts += table["context"].to_pylist()
        continuations += table["continuation"].to_pylist()
    return contexts, continuations


def dispatched(path, tmp_path, cpu_share: float):
    """The model loaded by load_model over "cpu" (a share of its weights' bytes) and "disk" (the rest). accelerate
    keeps room on the CPU for the largest module it may have to bring back, so the share that leaves some modules on
    the CPU is near 1."""
    weights = sum(p.numel() * p.element_size() for p in AutoModelForCausalLM.from_pretrained(path).parameters())
    budget = Budget({"cpu": int(weights * cpu_share), "disk": 4 * weights}, offload_folder=str(tmp_path / "offload"))
    return load_model(ModelSpec(str(path), dtype="float32", device="cpu"), budget=budget)


@pytest.mark.parametrize("name", ["llama", "gpt2"])
def test_scoring_through_a_model_dispatched_over_cpu_and_disk_equals_the_model_on_one_device(family, name, real,
                                                                                            tmp_path):
    """Llama's plan puts its embedding and first layer on the CPU and the last layer, the norm and the LM head on
    disk; GPT-2's keeps the tied embedding and head on the CPU and its blocks on disk."""
    whole = load_model(ModelSpec(str(family[name]), dtype="float32", device="cpu"))
    spread = dispatched(family[name], tmp_path, cpu_share=0.9)
    assert set(spread.hf_device_map.values()) == {"cpu", "disk"}, spread.hf_device_map
    assert spread.hf_device_map["lm_head"] == {"llama": "disk", "gpt2": "cpu"}[name]
    contexts, continuations = real
    expected, expected_greedy = Scorer(whole, fam.CONTEXT).score(contexts, continuations)
    scorer = Scorer(spread, fam.CONTEXT)
    assert scorer.device == torch.device("cpu")
    got, greedy = scorer.score(contexts, continuations)
    assert scorer.packed_rows > 0  # prefix packing runs through the dispatched model too
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-5)
    assert np.array_equal(greedy, expected_greedy)
    alone, _ = Scorer(spread, fam.CONTEXT, share_prefixes=False).score(contexts, continuations)
    np.testing.assert_allclose(alone, expected, rtol=1e-6, atol=1e-5)


def test_kl_through_a_dispatched_model_equals_kl_on_one_device(family, real, tmp_path):
    path = family["llama"]
    whole = load_model(ModelSpec(str(path), dtype="float32", device="cpu"))
    spread = dispatched(path, tmp_path, cpu_share=0.9)
    other = AutoModelForCausalLM.from_pretrained(path).eval()
    torch.manual_seed(3)
    with torch.no_grad():
        for w in other.parameters():
            w.add_(0.05 * torch.randn_like(w))
    contexts, continuations = real
    expected = KLScorer(whole, other, fam.CONTEXT).score(contexts, continuations)
    got = KLScorer(spread, other, fam.CONTEXT).score(contexts, continuations)
    np.testing.assert_allclose(got.kl, expected.kl, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got.nll_p, expected.nll_p, rtol=1e-6)
    assert np.array_equal(got.disagree, expected.disagree)


def test_input_device_is_the_embedding_hook_s_execution_device(family, tmp_path):
    spread = dispatched(family["llama"], tmp_path, cpu_share=0.0)  # everything on disk, run on the CPU
    assert spread.get_input_embeddings().weight.device.type == "meta"
    assert input_device(spread) == torch.device("cpu")
    assert input_device(AutoModelForCausalLM.from_pretrained(family["llama"])) == torch.device("cpu")


class Loaded(Exception):
    """Stops from_pretrained once the test has seen what it was asked for."""


@pytest.fixture
def from_pretrained_kwargs(monkeypatch):
    seen: dict = {}

    def capture(*args, **kwargs):
        seen.update(kwargs)
        raise Loaded

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", capture)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    return seen


def test_one_gpu_loads_weights_straight_onto_it(family, from_pretrained_kwargs):
    with pytest.raises(Loaded):
        load_model(ModelSpec(str(family["llama"]), dtype="bfloat16", device="auto"))
    assert from_pretrained_kwargs["device_map"] == {"": "cuda"}


def test_several_gpus_load_over_a_planned_device_map(family, from_pretrained_kwargs, monkeypatch):
    """--num-gpus 2 for one actor: each GPU's budget is WEIGHTS_FRACTION of its free memory, and the plan uses
    both. (The tiny model would fit one; it is spread because the actor holds two.)"""
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda i: (300_000, 10**9))  # 0.2 MB model, 0.25 MB each
    with pytest.raises(Loaded):
        load_model(ModelSpec(str(family["llama"]), dtype="float32", device="cuda"), gpus=2)
    assert set(from_pretrained_kwargs["device_map"].values()) == {0, 1}
    assert devices.gpu_budget(2).max_memory == {0: int(300_000 * devices.WEIGHTS_FRACTION)} | {
        1: int(300_000 * devices.WEIGHTS_FRACTION)}
    with pytest.raises(RaylmError, match="this process sees 2 CUDA device"):
        load_model(ModelSpec(str(family["llama"]), dtype="float32", device="cuda"), gpus=4)


def test_the_cpu_is_given_no_device_map(family, monkeypatch):
    tiny_llama = family["llama"]
    seen = {}
    original = transformers.AutoModelForCausalLM.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return original(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", spy)
    model = load_model(ModelSpec(str(tiny_llama), dtype="float32", device="cpu"))
    assert "device_map" not in seen and input_device(model) == torch.device("cpu")
    with pytest.raises(RaylmError, match="only on CUDA devices"):
        load_model(ModelSpec(str(tiny_llama), dtype="float32", device="cpu"), gpus=2)


def test_outside_an_actor_or_on_cpu_a_model_is_not_spread():
    """Only an actor Ray gave several GPUs spreads its model (Ray's GPU ids there); tests, the driver, a CPU spec
    and the fake-GPU drill (which moves the spec to the CPU) load onto one device."""
    from raylm.cluster.devices import assigned_gpus

    assert assigned_gpus(ModelSpec("unused", device="cuda")) == 1
    assert assigned_gpus(ModelSpec("unused", device="cpu")) == 1
