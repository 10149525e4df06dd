"""What load_model changes about a model on the way in, and that it changes no result beyond float rounding."""

from __future__ import annotations

import logging
import re
import shutil
from functools import partial
from logging.handlers import BufferingHandler
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from conftest import DATA
from parity_fixtures import ADAPTER, STORIES
from transformers import AutoConfig, AutoModelForCausalLM
from transformers.activations import GELUTanh, NewGELUActivation

from raylm.errors import RaylmError
from raylm.models.loading import load_model
from raylm.models.spec import ModelSpec


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


def test_actor_context_length_needs_the_tokenizer_only_when_the_config_states_none(tiny_gpt2, monkeypatch):
    import raylm.models.loading as loading
    from raylm.models.context import context_length, resolve_max_length

    spec = ModelSpec(str(tiny_gpt2), "float32", "cpu")
    config = AutoConfig.from_pretrained(tiny_gpt2)
    tokenizer = loading.load_tokenizer(spec)
    tokenizer.model_max_length = 77
    loads = []
    monkeypatch.setattr(loading, "load_tokenizer", lambda s: loads.append(s) or tokenizer)

    assert context_length(spec, config, "causal") == resolve_max_length(config, tokenizer) == 128
    assert loads == []
    stateless = SimpleNamespace()  # a config with no context-length field of any name
    assert context_length(spec, stateless, "causal") == resolve_max_length(stateless, tokenizer) == 77
    assert loads == [spec]


def test_max_length_shortens_the_context_everywhere_and_never_extends_it(tiny_gpt2):
    """HFLM's max_length= is ModelSpec.max_length: the driver's encoder, an actor and `raylm ppl` all take it from
    the one resolver; longer than the model states is refused (GPT-2's position table would be indexed past)."""
    from raylm.corpus.run import model_max_length
    from raylm.errors import RaylmError
    from raylm.requests.driver import driver_encoder
    from raylm.models.context import context_length

    config = AutoConfig.from_pretrained(tiny_gpt2)
    short = ModelSpec(str(tiny_gpt2), "float32", "cpu", max_length=40)
    assert context_length(short, config, "causal") == 40
    assert driver_encoder(short).max_length == 40
    assert model_max_length(short)[1] == 40
    with pytest.raises(RaylmError, match="--max-length 129 exceeds the 128-token context"):
        context_length(ModelSpec(str(tiny_gpt2), max_length=129), config, "causal")
    with pytest.raises(RaylmError, match="--max-length must be a positive number of tokens, got 0"):
        ModelSpec(str(tiny_gpt2), max_length=0).validate()


def test_driver_and_corpus_context_length_read_a_home_relative_model_dir(tiny_gpt2, tmp_path, monkeypatch):
    """Config, tokenizer and weights all load from the same expanded path; `~/model` once reached the config
    loader unexpanded and failed as a hub id."""
    from raylm.corpus.run import model_max_length
    from raylm.requests.driver import driver_encoder

    (tmp_path / "model").symlink_to(tiny_gpt2, target_is_directory=True)
    monkeypatch.setenv("HOME", str(tmp_path))
    spec = ModelSpec("~/model", "float32", "cpu")
    assert driver_encoder(spec).max_length == 128
    assert model_max_length(spec)[1] == 128


def test_the_fused_gelu_at_bfloat16_moves_logits_less_than_bfloat16_itself(tmp_path):
    """At bfloat16 transformers' gelu_new rounds after each of its five ops, the fused kernel once, so the two differ
    by bfloat16 rounding: measured, the swap moves logits by about half what running in bfloat16 does (max 0.09 vs
    0.18 on the matrix's GPT-2, logits up to 7) and leaves them as near float32 on average (0.0156 vs 0.0157)."""
    import tiny_families as fam

    path = fam.build("gpt2", tmp_path)
    exact = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    plain = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    fused = load_model(ModelSpec(str(path), "bfloat16", "cpu"))
    assert any(isinstance(m, NewGELUActivation) for m in plain.modules())
    assert sum(isinstance(m, GELUTanh) for m in fused.modules()) == plain.config.n_layer
    ids = torch.randint(0, exact.config.vocab_size, (3, 100), generator=torch.Generator().manual_seed(0))
    with torch.inference_mode():
        expected = exact(input_ids=ids).logits
        by_plain, by_fused = (m(input_ids=ids).logits.float() for m in (plain, fused))
    swap, rounding = (by_fused - by_plain).abs(), (by_plain - expected).abs()
    assert swap.max() < rounding.max()
    assert (by_fused - expected).abs().mean() <= 1.1 * rounding.mean()


@pytest.fixture(scope="module")
def prompt_adapters(tiny_llama, tmp_path_factory) -> dict[str, Path]:
    """A prompt-tuning and a prefix-tuning adapter for tiny_llama, saved as a user saves theirs."""
    from peft import PrefixTuningConfig, PromptTuningConfig, get_peft_model

    out = {}
    for kind, config in (("PROMPT_TUNING", PromptTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4)),
                         ("PREFIX_TUNING", PrefixTuningConfig(task_type="CAUSAL_LM", num_virtual_tokens=4))):
        out[kind] = tmp_path_factory.mktemp(kind.lower())
        get_peft_model(AutoModelForCausalLM.from_pretrained(tiny_llama), config).save_pretrained(out[kind])
    return out


def test_a_prompt_learning_adapter_is_refused_in_one_line_wherever_it_is_given(prompt_adapters, tiny_llama,
                                                                               tmp_path, capsys):
    """Prompt and prefix tuning act only through PeftModel's forward, so scoring the base with them loaded would
    report the base's numbers under the adapter's name. Every way of naming an adapter (--peft, --model_args peft=,
    a sweep file's peft, RayLM(peft=)) is refused before any actor starts, and an actor refuses it too; a LoRA,
    which changes the model's own layers, passes the same check."""
    from raylm.api import RayLM
    from raylm.cli import main
    from raylm.sweep.config import load_sweep

    for kind, adapter in prompt_adapters.items():
        message = f"adapter '{adapter}' is {kind}, a prompt-learning adapter, which raylm cannot score"
        spec = ModelSpec(str(tiny_llama), "float32", "cpu", peft=str(adapter))
        for refuse in (spec.validate, partial(load_model, spec), partial(RayLM, str(tiny_llama), peft=str(adapter))):
            with pytest.raises(RaylmError, match=re.escape(message)) as error:
                refuse()
            assert "\n" not in str(error.value)
        for model in (["--model", str(tiny_llama), "--peft", str(adapter)],
                      ["--model_args", f"pretrained={tiny_llama},peft={adapter}"]):
            assert main(["eval", *model, "--tasks", "winogrande", "--data-dir", str(DATA),
                         "--output", str(tmp_path / "out")]) == 2
            stderr = capsys.readouterr().err
            assert message in stderr and stderr.count("\n") == 1
            assert not (tmp_path / "out").exists()
        sweep = tmp_path / f"{kind}.yaml"
        sweep.write_text(f"models:\n  - path: {tiny_llama}\n    peft: {adapter}\ntasks: [winogrande]\n")
        with pytest.raises(RaylmError, match=re.escape(f"{sweep}: {message}")):
            load_sweep(sweep)
    ModelSpec(str(STORIES), peft=str(ADAPTER)).validate()


def test_whether_a_model_is_local_is_decided_where_its_spec_is_made_not_in_each_working_directory(tmp_path,
                                                                                                    monkeypatch):
    """'org/name' is a hub id unless it exists where the spec is made (the driver): then it is that directory,
    made absolute, for every actor whatever its working directory; else a hub id even where it happens to exist."""
    from raylm.models.spec import looks_local, model_source

    here, elsewhere = tmp_path / "driver", tmp_path / "actor"
    (here / "org" / "name").mkdir(parents=True)
    (elsewhere / "org" / "name").mkdir(parents=True)
    (tmp_path / "empty").mkdir()
    monkeypatch.chdir(here)
    local = ModelSpec("org/name", peft="org/name")
    monkeypatch.chdir(tmp_path / "empty")
    hub = ModelSpec("org/name", peft="org/name")
    monkeypatch.chdir(elsewhere)
    directory = str(here.resolve() / "org" / "name")  # as os.getcwd() names the working directory
    assert (local.path, local.peft) == (directory, directory)
    assert looks_local(local.path) and model_source(local) == directory
    assert (hub.path, hub.peft) == ("org/name",) * 2
    assert not looks_local(hub.path) and model_source(hub) == "org/name"


def test_the_context_length_and_the_scorer_read_one_wrapped_config_as_lm_eval_does():
    """lm-eval's HFLM reads `config.text_config` first, and nothing else, for the context length and the vocabulary;
    every reader of a wrapped config in raylm asks text_config, so a config that wraps its language model under
    another name (here `decoder`, which transformers' get_text_config would pick) is read as a whole by all."""
    from transformers import GPT2Config, PretrainedConfig

    from raylm.models.context import config_max_length
    from raylm.models.loading import text_config

    config = PretrainedConfig(n_positions=32, vocab_size=100)
    config.decoder = GPT2Config(n_positions=64, vocab_size=200)
    assert text_config(config) is config and config_max_length(config) == 32
    config.text_config = GPT2Config(n_positions=128, vocab_size=300)
    assert text_config(config) is config.text_config and config_max_length(config) == 128


def test_the_load_report_of_a_model_that_loads_is_logged_as_transformers_logs_it(tiny_llama, tmp_path):
    """load_model holds transformers' warnings while it loads, to put them on a failed load's error
    (raylm.models.load_warnings; tests/test_cli.py shows the failure): those of a load that succeeds still reach
    transformers' handlers, once."""
    from safetensors.torch import load_file, save_file

    path = tmp_path / "model"
    shutil.copytree(tiny_llama, path)
    weights = load_file(path / "model.safetensors")
    save_file({**weights, "model.spare.weight": torch.zeros(2)}, path / "model.safetensors", metadata={"format": "pt"})
    seen = BufferingHandler(capacity=1000)
    logger = logging.getLogger("transformers")
    logger.addHandler(seen)
    try:
        load_model(ModelSpec(str(path), "float32", "cpu"))
    finally:
        logger.removeHandler(seen)
    reports = [r.getMessage() for r in seen.buffer if "LlamaForCausalLM LOAD REPORT" in r.getMessage()]
    assert len(reports) == 1 and "model.spare.weight" in reports[0] and "UNEXPECTED" in reports[0]
