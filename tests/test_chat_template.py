"""Choosing and applying a chat template (raylm.models.chat), native prompts rebuilt from their parts
(raylm.tasks.prompt), and an adapter in the checkpoint fingerprint; the lm-eval parity of all three is
tests/test_parity_golden.py."""

from __future__ import annotations

import logging
import shutil

import pytest
from parity_fixtures import ADAPTER, CHATML, LLAMA3_STYLE, STORIES, chat_model
from transformers import AutoTokenizer

from raylm.errors import RaylmError
from raylm.models.chat import ChatTemplate, select_template
from raylm.models.identity import adapter_digest
from raylm.models.spec import ModelSpec
from raylm.tasks import hellaswag, winogrande
from raylm.tasks.base import with_fewshot
from raylm.tasks.prompt import PLAIN, PromptFormat, render
from raylm.data.demo import DEMO_DATA

NO_SYSTEM = "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}" \
            "{% endif %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"

# Qwen3's switch: an empty thinking block in the generation prompt when enable_thinking is false.
THINKING = "{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}\n{% endfor %}{% if add_generation_prompt %}" \
           "<|assistant|>\n{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n" \
           "{% endif %}{% endif %}"


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory):
    root = tmp_path_factory.mktemp("templates")
    return {"none": AutoTokenizer.from_pretrained(STORIES),
            "named": AutoTokenizer.from_pretrained(chat_model(root / "named", {"default": LLAMA3_STYLE,
                                                                                "chatml": CHATML})),
            "single": AutoTokenizer.from_pretrained(chat_model(root / "single", CHATML)),
            "nodefault": AutoTokenizer.from_pretrained(chat_model(root / "nodefault", {"a": CHATML, "b": CHATML})),
            "nosystem": AutoTokenizer.from_pretrained(chat_model(root / "nosystem", NO_SYSTEM))}


def test_lm_evals_choice_of_template(tokenizers, caplog):
    assert select_template(tokenizers["named"], None) == LLAMA3_STYLE
    assert select_template(tokenizers["named"], "chatml") == CHATML
    with caplog.at_level(logging.WARNING):
        assert select_template(tokenizers["single"], "anything") == CHATML
    assert "single chat template" in caplog.text
    for name, asked, message in (("none", None, "has no chat template"), ("named", "zephyr", "no template named"),
                                 ("nodefault", None, "none named 'default'")):
        with pytest.raises(RaylmError, match=message):
            select_template(tokenizers[name], asked)


def test_a_template_that_refuses_a_system_turn_is_applied_without_it(tokenizers):
    chat = ChatTemplate(tokenizers["nosystem"])
    text = chat([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}])
    assert text == "[user] Hi\n"


def test_enable_thinking_reaches_the_template_as_hflm_passes_it(tmp_path):
    """`--model_args enable_thinking=...,think_end_token=... --apply_chat_template`: the prompt is HFLM's, whose
    chat_template_args take enable_thinking; a template that reads it renders differently for True and False."""
    from lm_eval.models.huggingface import HFLM

    from raylm.cli import config_from_args, parse_args
    from raylm.evaluate import run_prompt

    path = chat_model(tmp_path / "thinking", THINKING)
    messages = [{"role": "user", "content": "2 + 2?"}]
    prompts = {}
    for enable in (True, False):
        cfg = config_from_args(parse_args(["eval", "--model_args", f"pretrained={path},enable_thinking={enable},"
                                           "think_end_token=</think>", "--apply_chat_template", "--tasks", "gsm8k"]))
        cfg.validate()
        assert (cfg.enable_thinking, cfg.think_end_token) == (enable, "</think>")
        prompt = run_prompt(cfg, AutoTokenizer.from_pretrained(path))
        prompts[enable] = prompt.chat_template(messages)
        hflm = HFLM(pretrained=str(path), enable_thinking=enable, think_end_token="</think>", device="cpu")
        assert prompts[enable] == hflm.apply_chat_template(messages) and prompt.thinking is enable
    assert prompts == {True: "<|user|>2 + 2?\n<|assistant|>\n",
                       False: "<|user|>2 + 2?\n<|assistant|>\n<think>\n\n</think>\n\n"}


def test_template_arguments_hflm_refuses_are_refused(tokenizers):
    with pytest.raises(RaylmError, match="--apply-chat-template NAME"):
        ChatTemplate(tokenizers["named"], args={"chat_template": "chatml"})


def test_plain_rendering_rebuilds_the_tasks_own_requests():
    """Each native document keeps what its strings are made of: rendered in plain text, with or without few-shot
    examples, they are the strings the task built (which the golden tests match against lm-eval's)."""
    docs = winogrande.load_docs(DEMO_DATA)[:30]
    shots = with_fewshot(winogrande.TASK, docs, winogrande.load_fewshot_pool(DEMO_DATA), 3, 1234)
    for doc in [*hellaswag.load_docs(DEMO_DATA)[:30], *docs, *shots]:
        assert render(doc, PLAIN) is doc
        rebuilt = render(doc, PromptFormat(system_instruction="S:"))
        assert rebuilt.contexts == tuple("S:" + c for c in doc.contexts)
        assert rebuilt.continuations == doc.continuations


def test_an_adapters_contents_are_in_the_fingerprint(tmp_path):
    adapter = tmp_path / "adapter"
    shutil.copytree(ADAPTER, adapter)
    spec = ModelSpec(str(STORIES), peft=str(adapter))
    before = adapter_digest(spec)
    weights = adapter / "adapter_model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-3] ^= 0xFF
    weights.write_bytes(bytes(data))
    assert adapter_digest(spec) != before
    assert adapter_digest(ModelSpec(str(STORIES))) is None
    assert adapter_digest(ModelSpec(str(STORIES), peft="org/lora", peft_revision="a" * 40)) == \
        f"hub:org/lora@{'a' * 40}"


@pytest.mark.parametrize("knob", [{"add_bos_token": True}, {"prefix_token_id": 0}])
def test_hflms_tokenisation_knobs_are_refused_for_a_masked_lm(tiny_bert, knob):
    from raylm.requests.driver import driver_encoder

    with pytest.raises(RaylmError, match="applies to causal LMs"):
        driver_encoder(ModelSpec(str(tiny_bert), **knob))


def test_sweep_files_take_the_prompt_adapter_and_tokenisation_keys(tmp_path):
    from raylm.sweep.config import load_sweep

    path = tmp_path / "sweep.yaml"
    path.write_text(f"""models:
  - path: {STORIES}
    peft: {ADAPTER}
    add_bos_token: false
    prefix_token_id: 2
tasks: [hellaswag]
apply_chat_template: chatml
fewshot_as_multiturn: false
system_instruction: Pick one.
chat_template_args: {{enable_thinking: false}}
metadata: {{max_seq_lengths: [4096]}}
settings:
  limit: [0.1, 20]
""")
    sweep = load_sweep(path)
    (model,) = sweep.models
    assert model.name == f"stories260K-hf-{ADAPTER.name}"
    assert (model.spec.peft, model.spec.add_bos_token, model.spec.prefix_token_id) == (str(ADAPTER), False, 2)
    configs = [sweep.config(model, point) for point in sweep.points]
    assert [c.limit for c in configs] == [0.1, 20]
    assert {(c.apply_chat_template, c.multiturn, c.system_instruction) for c in configs} == {("chatml", False,
                                                                                               "Pick one.")}
    assert configs[0].chat_template_args == {"enable_thinking": False}
    assert configs[0].metadata == {"max_seq_lengths": [4096]}
    path.write_text(path.read_text().replace("limit: [0.1, 20]", "limit: [1.5]"))
    with pytest.raises(RaylmError, match="line 13: settings.limit: limit must be"):
        load_sweep(path)
