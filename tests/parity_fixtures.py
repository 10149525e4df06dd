"""What the lm-eval parity goldens (tests/golden/lmeval-0.4.13_parity.json) were made on, rebuilt the same way by
the tests and by tests/golden/make_parity.py: small data subsets of tests/data, lm-eval's own hellaswag and
winogrande YAMLs pointed at them, the real stories260K Llama with chat templates written into its
tokenizer_config.json, a seeded random GPT-2 on the real GPT-2 tokenizer, and a LoRA adapter kept in the repo.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from fixture_data import STORIES, data_dir
from offline_tasks import wikitext_pages, write_mirror_tasks, write_pages, write_reference_tasks

DATA = data_dir()
GPT2_TOKENIZER = DATA / "models" / "gpt2-tokenizer"
GOLDEN_DIR = Path(__file__).resolve().parent / "golden"
ADAPTER = GOLDEN_DIR / "stories260K-lora"  # seeded random LoRA (q_proj, v_proj, r=4), made by make_parity.py

# A Llama-3-style template that writes BOS itself (so HFLM's has_bos_prefix rule applies), and ChatML (no BOS).
LLAMA3_STYLE = ("{{ bos_token }}{% for message in messages %}<|start_header_id|>{{ message['role'] }}"
                "<|end_header_id|>\n\n{{ message['content'] | trim }}<|eot_id|>{% endfor %}"
                "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}")
CHATML = ("{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
SYSTEM = "Pick the most sensible ending."


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines(keepends=True)


def parity_data(out: Path) -> Path:
    """A --data-dir: 20 HellaSwag validation rows with a 60-row training pool (other validation rows), 20
    WinoGrande dev rows with train_s.jsonl as its pool."""
    hellaswag = lines(DATA / "hellaswag" / "validation.jsonl")
    winogrande = lines(DATA / "winogrande" / "dev.jsonl")
    (out / "hellaswag").mkdir(parents=True, exist_ok=True)
    (out / "winogrande").mkdir(parents=True, exist_ok=True)
    (out / "hellaswag" / "validation.jsonl").write_text("".join(hellaswag[:20]))
    (out / "hellaswag" / "train.jsonl").write_text("".join(hellaswag[100:160]))
    (out / "winogrande" / "dev.jsonl").write_text("".join(winogrande[:20]))
    shutil.copy(DATA / "winogrande" / "train_s.jsonl", out / "winogrande" / "train_s.jsonl")
    return out


def lmeval_yamls(out: Path, data: Path) -> Path:
    """lm-eval's own hellaswag and winogrande YAMLs, unchanged but for where their data comes from, as
    hellaswag_parity and winogrande_parity (an --include-path)."""
    import lm_eval.tasks

    root = Path(lm_eval.tasks.__file__).parent
    out.mkdir(parents=True, exist_ok=True)
    for task, include, files in (
            ("hellaswag_parity", root / "hellaswag" / "hellaswag.yaml",
             {"train": data / "hellaswag" / "train.jsonl", "validation": data / "hellaswag" / "validation.jsonl"}),
            ("winogrande_parity", root / "winogrande" / "default.yaml",
             {"train": data / "winogrande" / "train_s.jsonl", "validation": data / "winogrande" / "dev.jsonl"})):
        split_lines = "".join(f"    {split}: {path}\n" for split, path in files.items())
        (out / f"{task}.yaml").write_text(f"task: {task}\ninclude: {include}\ndataset_path: json\n"
                                          f"dataset_name: null\ndataset_kwargs:\n  data_files:\n{split_lines}")
    return out


def chat_model(out: Path, templates: str | dict[str, str]) -> Path:
    """stories260K with chat template(s) in its tokenizer_config.json: one template, or named ones (a list of
    {name, template}, as tokenizers with several templates store them)."""
    shutil.copytree(STORIES, out)
    config_path = out / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    config["chat_template"] = templates if isinstance(templates, str) else \
        [{"name": name, "template": text} for name, text in templates.items()]
    config_path.write_text(json.dumps(config, indent=2))
    return out


def tiny_gpt2(out: Path) -> Path:
    """A seeded random GPT-2 (2 layers, width 32, 128 positions) on the real GPT-2 tokenizer."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    GPT2LMHeadModel(GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=128, vocab_size=50257)).save_pretrained(out)
    AutoTokenizer.from_pretrained(GPT2_TOKENIZER).save_pretrained(out)
    return out


def merged_model(out: Path) -> Path:
    """stories260K with ADAPTER merged into its weights (peft's merge_and_unload), saved as a plain model."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(STORIES, dtype=torch.float32)
    PeftModel.from_pretrained(base, ADAPTER).merge_and_unload().save_pretrained(out)
    # The tokenizer's own files, not a re-save: a re-saved Llama tokenizer encodes newlines differently.
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(STORIES / name, out / name)
    return out


def make_adapter(out: Path) -> Path:
    """The seeded random LoRA kept as ADAPTER (run once by make_parity.py; both of its matrices random, so it
    moves every score)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(7)
    base = AutoModelForCausalLM.from_pretrained(STORIES, dtype=torch.float32)
    base.name_or_path = STORIES.name  # what adapter_config.json names the base by: not a path on this machine
    config = LoraConfig(r=4, lora_alpha=16, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    get_peft_model(base, config).save_pretrained(out)
    return out


def task_dir(out: Path, data: Path, local_tasks: Path | None = None) -> Path:
    """One --include-path holding everything the goldens ran: the mirror's `<task>_local` YAMLs (arc_easy_local,
    ...; copied from `local_tasks` when given), the parity hellaswag/winogrande YAMLs, and the reference tasks
    (tests/offline_tasks.py; the goldens ran its wikitext_local) with WikiText-2's first page."""
    if local_tasks is not None:
        shutil.copytree(local_tasks, out)
    else:
        write_mirror_tasks(DATA / "hf", out)
    lmeval_yamls(out, data)
    pages = write_pages(wikitext_pages(DATA / "wikitext-2" / "test.txt")[:1], out / "pages.jsonl")
    return write_reference_tasks(data, pages, out)


def wikitext_data(out: Path) -> Path:
    """A --data-dir whose wikitext-2/test.txt holds the first article (the page wikitext_local reads)."""
    from raylm.tasks.wikitext import split_pages

    pages = split_pages(lines(DATA / "wikitext-2" / "test.txt"))
    (out / "wikitext-2").mkdir(parents=True, exist_ok=True)
    (out / "wikitext-2" / "test.txt").write_text("".join(pages[:1]))
    return out


# The golden runs: lm-eval 0.4.13's simple_evaluate with HFLM on each model and settings. Model keys:
# "chat" (LLAMA3_STYLE as "default" and CHATML as "chatml"), "chatml" (CHATML alone), "stories", "gpt2".
RUNS: dict[str, dict] = {
    "chat-0shot": dict(model="chat", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"], limit=8,
                       num_fewshot=0, apply_chat_template=True, system_instruction=SYSTEM),
    "chat-2shot-multiturn": dict(model="chat", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"],
                                 limit=8, num_fewshot=2, apply_chat_template=True, fewshot_as_multiturn=True),
    "chat-2shot-singleturn": dict(model="chat", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"],
                                  limit=5, num_fewshot=2, apply_chat_template=True, fewshot_as_multiturn=False,
                                  system_instruction=SYSTEM),
    "chatml-1shot-multiturn": dict(model="chatml", tasks=["hellaswag_parity", "arc_easy_local"], limit=5,
                                   num_fewshot=1, apply_chat_template=True, fewshot_as_multiturn=True),
    "system-2shot-plain": dict(model="stories", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"],
                               limit=5, num_fewshot=2, system_instruction=SYSTEM),
    "peft": dict(model="stories", peft=True, tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local",
                                                    "wikitext_local"], limit=4, num_fewshot=0),
    "add_bos_token-false": dict(model="stories", add_bos_token=False,
                                tasks=["hellaswag_parity", "arc_easy_local", "wikitext_local"], limit=4,
                                num_fewshot=0),
    "gpt2-add_bos_token-prefix": dict(model="gpt2", add_bos_token=True, prefix_token_id=198,
                                      tasks=["hellaswag_parity", "wikitext_local"], limit=4, num_fewshot=0),
    "prefix_token_id-eos": dict(model="stories", prefix_token_id=2, tasks=["arc_easy_local", "wikitext_local"],
                                limit=3, num_fewshot=0),
    "limit-fraction": dict(model="stories", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"],
                           limit=0.01, num_fewshot=0),
    "samples-2shot": dict(model="stories", tasks=["hellaswag_parity", "winogrande_parity", "arc_easy_local"],
                          samples={"hellaswag_parity": [1, 4, 9], "winogrande_parity": [0, 19],
                                   "arc_easy_local": [2, 3, 50]}, num_fewshot=2),
}
