"""lm-eval command lines run as `raylm eval` with `lm_eval` replaced and nothing else changed (raylm.cli.lmeval):
each real lm-eval 0.4.13 line below is parsed by raylm's own parser into the settings lm-eval would run it with,
and the lm-eval flags raylm has no equivalent for are refused by name, in one line, with exit status 2."""

from __future__ import annotations

import argparse
import logging
import shlex
from pathlib import Path

import pytest

from raylm.cli import config_from_args, main, parse_args
from raylm.cli.run_dirs import eval_dir
from raylm.errors import RaylmError

# (lm-eval command line, the raylm settings it must give: EvalConfig fields, "model.<ModelSpec field>", "output":
# the folder raylm's own folder for the line is made in)
LINES = [
    ("lm_eval --model hf --model_args pretrained=EleutherAI/pythia-160m,dtype=float32 --tasks hellaswag "
     "--device cpu --batch_size 8",
     {"model.path": "EleutherAI/pythia-160m", "model.dtype": "float32", "model.device": "cpu", "batch_size": 8,
      "tasks": ("hellaswag",)}),
    # The Open LLM Leaderboard v2's shape: an instruct model with its chat template and multiturn few-shot.
    ("lm_eval --model hf --model_args pretrained=meta-llama/Llama-3.1-8B-Instruct,dtype=bfloat16,revision=main "
     "--tasks mmlu,arc_easy --num_fewshot 5 --apply_chat_template --fewshot_as_multiturn --batch_size auto "
     "--output_path results --log_samples",
     {"model.path": "meta-llama/Llama-3.1-8B-Instruct", "model.dtype": "bfloat16", "model.revision": "main",
      "tasks": ("mmlu", "arc_easy"), "num_fewshot": 5, "apply_chat_template": True, "multiturn": True,
      "batch_size": None, "output": Path("results/meta-llama__Llama-3.1-8B-Instruct/.raylm"), "log_samples": True}),
    ("lm_eval --model hf --model_args pretrained=Qwen/Qwen3-0.6B,enable_thinking=False "
     "--apply_chat_template chatml --fewshot_as_multiturn false --system_instruction 'Answer briefly.' "
     "--tasks arc_easy arc_challenge",
     {"apply_chat_template": "chatml", "multiturn": False, "system_instruction": "Answer briefly.",
      "chat_template_args": {"enable_thinking": False}, "tasks": ("arc_easy", "arc_challenge")}),
    ("lm_eval --model hf --model_args pretrained=huggyllama/llama-7b,peft=tloen/alpaca-lora-7b,load_in_4bit=True "
     "--tasks piqa --limit 0.1 --seed 42",
     {"model.peft": "tloen/alpaca-lora-7b", "model.quantization": "4bit", "limit": 0.1,
      "seeds": (42, 42, 42, 42)}),
    ("lm_eval --model hf --model_args pretrained=gpt2,add_bos_token=True,prefix_token_id=50256,max_length=512,"
     "trust_remote_code=True --tasks lambada_openai --limit 100 --include_path my_tasks",
     {"model.add_bos_token": True, "model.prefix_token_id": 50256, "model.max_length": 512,
      "model.trust_remote_code": True, "limit": 100, "include_path": Path("my_tasks")}),
    ("lm_eval --model hf --model_args pretrained=gpt2 --tasks arc_easy --samples '{\"arc_easy\": [5, 0, 3]}' "
     "--metadata max_seq_lengths=[4096,8192] --seed 0,1234,1234,7",
     {"samples": {"arc_easy": [0, 3, 5]}, "metadata": {"max_seq_lengths": [4096, 8192]},
      "seeds": (0, 1234, 1234, 7)}),
    ("lm_eval --model hf --model_args '{\"pretrained\": \"gpt2\", \"dtype\": \"float16\", "
     "\"chat_template_args\": {\"enable_thinking\": false}}' --tasks hellaswag --apply_chat_template",
     {"model.path": "gpt2", "model.dtype": "float16", "chat_template_args": {"enable_thinking": False},
      "multiturn": True}),
    ("lm_eval -a pretrained=gpt2 -t hellaswag,winogrande -f 5 -b 4 -o out -s -L 10 --trust_remote_code",
     {"model.path": "gpt2", "tasks": ("hellaswag", "winogrande"), "num_fewshot": 5, "batch_size": 4,
      "output": Path("out/gpt2/.raylm"), "log_samples": True, "limit": 10, "model.trust_remote_code": True}),
    # lm-eval's tracker names the folder after the adapter; a .json path is a file name, its folder beside it.
    ("lm_eval --model_args pretrained=huggyllama/llama-7b,peft=tloen/alpaca-lora-7b --tasks piqa "
     "--output_path runs/", {"output": Path("runs/tloen__alpaca-lora-7b/.raylm")}),
    ("lm_eval --model_args pretrained=gpt2 --tasks piqa --output_path runs/gpt2.json",
     {"output": Path("runs/.gpt2.raylm")}),
    ("lm_eval --model_args pretrained=gpt2,enable_thinking=False --apply_chat_template "
     "--chat_template_args reasoning_effort=low --tasks arc_easy",
     {"chat_template_args": {"reasoning_effort": "low", "enable_thinking": False}}),
    ("lm_eval --model_args pretrained=gpt2 --model_args dtype=half --tasks wikitext --verbosity DEBUG",
     {"model.path": "gpt2", "model.dtype": "float16", "tasks": ("wikitext",)}),
    # The lm-eval line for sampled GSM8K, and lm-eval's JSON form.
    ("lm_eval --model hf --model_args pretrained=gpt2 --tasks gsm8k --gen_kwargs temperature=0.8 top_p=0.95 "
     "'until=[\"\\n\\n\"]' --gen_kwargs do_sample=True,max_gen_toks=32",
     {"tasks": ("gsm8k",), "gen_kwargs": {"temperature": 0.8, "top_p": 0.95, "until": ["\n\n"], "do_sample": True,
                                          "max_gen_toks": 32}}),
    # lm-eval's --predict_only forces --log_samples (EvaluatorConfig)
    ("lm_eval --model_args pretrained=gpt2 --tasks arc_easy --predict_only", {"predict_only": True,
                                                                             "log_samples": True}),
    ("lm_eval -a pretrained=gpt2 -t arc_easy -x -o out", {"predict_only": True, "log_samples": True}),
    ("lm_eval --model raylm --model_args pretrained=gpt2 --tasks hellaswag", {"model.path": "gpt2"}),  # RayLM
    # HFLM's thinking switches: enable_thinking reaches the chat template, think_end_token the generations.
    ("lm_eval --model hf --model_args pretrained=Qwen/Qwen3-0.6B,enable_thinking=True,think_end_token=</think> "
     "--apply_chat_template --tasks gsm8k",
     {"enable_thinking": True, "think_end_token": "</think>", "chat_template_args": {"enable_thinking": True}}),
    ("lm_eval --model_args pretrained=gpt2,enable_thinking=False --tasks gsm8k",
     {"enable_thinking": False, "chat_template_args": None}),
    ("lm_eval --model_args pretrained=gpt2 --tasks gsm8k --seed 1,2,3", {"seeds": (1, 2, 3, 1234)}),
    ("lm_eval --model_args pretrained=gpt2 --tasks humaneval --confirm_run_unsafe_code",
     {"confirm_run_unsafe_code": True}),
    ("lm_eval --model_args pretrained=gpt2 --tasks gsm8k --gen_kwargs '{\"max_gen_toks\": 16, \"top_k\": 5}'",
     {"gen_kwargs": {"max_gen_toks": 16, "top_k": 5}}),
]

REFUSED = [
    ("--model hf --model_args pretrained=gpt2 --tasks gsm8k --gen_kwargs num_beams=4", "num_beams"),
    ("--model gpt2 --tasks arc_easy,hellaswag --predict_only", "hellaswag is a raylm native task"),
    ("--model_args pretrained=gpt2 --tasks hellaswag --use_cache /tmp/cache", "--use_cache"),
    ("--model_args pretrained=gpt2 --tasks hellaswag --cache_requests true", "--cache_requests"),
    ("--model_args pretrained=gpt2 --tasks hellaswag --max_batch_size 64", "--max_batch_size"),
    ("--model_args pretrained=gpt2 --tasks hellaswag --write_out", "--write_out"),
    ("--model vllm --model_args pretrained=gpt2 --tasks hellaswag", "lm-eval's vllm model type"),
    ("--model sglang --tasks hellaswag", "lm-eval's sglang model type"),
    ("--model hf --tasks hellaswag", "pretrained=..."),
    ("--model_args pretrained=gpt2,parallelize=True --tasks hellaswag", "parallelize"),
    ("--model_args pretrained=gpt2,enable_thinking=True --tasks gsm8k", "enable_thinking=True needs think_end_token"),
    ("--model_args pretrained=gpt2,enable_thinking=True,think_end_token=</think> --tasks hellaswag",
     "enable_thinking=True is not compatible with loglikelihood tasks"),
    ("--model_args pretrained=gpt2,tokenizer=gpt2-large --tasks hellaswag", "tokenizer= is not supported"),
    ("--model_args pretrained=gpt2,dtype=bfloat16 --dtype float16 --tasks hellaswag", "contradicts --dtype"),
    ("--model gpt2 --tasks hellaswag --output out --output_path out", "--output and --output_path: choose one"),
    ("--model_args pretrained=gpt2 --tasks hellaswag --device mps", "--device mps (Apple's Metal) is not supported"),
    ("--model_args pretrained=gpt2,device=mps --tasks hellaswag", "--device mps (Apple's Metal) is not supported"),
]


def settings(line: str):
    args = parse_args(shlex.split(line)[1:] if line.startswith("lm_eval") else shlex.split(line))
    return args, config_from_args(args)


def value(cfg, args, key: str):
    if key == "output":  # where this command line's own folder (results.json, the checkpoint) is made
        return Path(eval_dir(cfg, args.lmeval_layout.work_dir)).parent
    if key.startswith("model."):
        return getattr(cfg.model, key[len("model."):])
    return getattr(cfg, key)


@pytest.mark.parametrize("line,expected", LINES, ids=[str(i) for i in range(len(LINES))])
def test_an_lm_eval_command_line_runs_unchanged_as_raylm_eval(line, expected):
    args, cfg = settings("lm_eval eval " + line[len("lm_eval "):])
    for key, want in expected.items():
        assert value(cfg, args, key) == want, (line, key)


@pytest.mark.parametrize("line,named", REFUSED, ids=[n for _, n in REFUSED])
def test_an_lm_eval_flag_raylm_does_not_take_is_refused_by_name(line, named, capsys):
    assert main(["eval", *shlex.split(line)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("raylm: error: ") and named in err, err


def test_lm_evals_rules_for_chat_and_selection_flags_are_kept(capsys):
    for line, message in (("--model_args pretrained=gpt2 --tasks hellaswag --fewshot_as_multiturn",
                           "needs --apply-chat-template"),
                          ("--model_args pretrained=gpt2 --tasks arc_easy --limit 5 --samples '{\"arc_easy\": [1]}'",
                           "cannot be combined"),
                          ("--model gpt2 --tasks hellaswag --limit 2.5", "fraction of them below 1"),
                          ("--model gpt2 --tasks hellaswag --samples '{\"hellaswag\": [1, 1]}'", "more than once")):
        with pytest.raises((RaylmError, SystemExit)) as raised:
            config_from_args(parse_args(["eval", *shlex.split(line)])).validate()
        text = str(raised.value) if raised.type is RaylmError else capsys.readouterr().err
        assert message in text, (line, text)


@pytest.mark.parametrize("line", [line for line, expected in LINES if "gen_kwargs" in expected])
def test_gen_kwargs_are_read_as_lm_evals_own_parser_reads_them(line):
    """lm-eval's `run` parser (MergeDictAction) and raylm's give the same dict for the same tokens."""
    from lm_eval._cli.run import Run

    parser = argparse.ArgumentParser()
    Run.create(parser.add_subparsers())
    tokens = shlex.split(line)[1:]
    theirs = parser.parse_args(["run", *tokens]).gen_kwargs
    assert settings("lm_eval eval " + line[len("lm_eval "):])[1].gen_kwargs == theirs


def test_samples_may_be_a_file(tmp_path):
    path = tmp_path / "samples.json"
    path.write_text('{"hellaswag": [3, 1]}')
    assert config_from_args(parse_args(["eval", "--model", "gpt2", "--samples", str(path)])).samples == \
        {"hellaswag": [1, 3]}


def lm_evals_run_args(argv: list[str]) -> argparse.Namespace:
    """argv as lm-eval 0.4.13's own `run` parser reads it."""
    from lm_eval._cli.run import Run

    parser = argparse.ArgumentParser()
    Run.create(parser.add_subparsers())
    return parser.parse_args(["run", *argv])


def test_every_lm_eval_model_type_but_hfs_is_refused_by_name():
    """Read from lm-eval's own registry: a type is a backend raylm does not run, never a hub model of that name."""
    from lm_eval.api.registry import get_model, model_registry

    from raylm.cli.lmeval import HF_MODEL_TYPES, other_model_types

    assert {"vllm", "sglang", "openai-completions", "local-completions", "gguf"} <= other_model_types()
    assert other_model_types() == set(model_registry.keys()) - set(HF_MODEL_TYPES)
    for model_type in other_model_types():
        for extra in ([], ["--model_args", "pretrained=gpt2"]):
            with pytest.raises(RaylmError, match=f"lm-eval's {model_type} model type"):
                parse_args(["eval", "--model", model_type, *extra, "--tasks", "hellaswag"])
    assert get_model("hf-auto") is get_model("hf")  # the types raylm runs are lm-eval's HFLM


def test_batch_size_auto_n_is_lm_evals_schedule_and_raylms_token_budget():
    """lm-eval passes auto:N to HFLM, which re-detects its batch size N times over the run; raylm's token budget
    sizes every batch (auto with the most re-detections), so auto:N runs as auto; N is checked as HFLM reads it."""
    for line, theirs in (("--batch_size auto:4", "auto:4"), ("-b auto:1.5", "auto:1.5")):
        argv = ["--model_args", "pretrained=gpt2", "--tasks", "hellaswag", *line.split()]
        assert lm_evals_run_args(argv).batch_size == theirs
        assert float(theirs.split(":")[1]) > 0  # HFLM's batch_schedule
        assert settings("lm_eval eval " + shlex.join(argv))[1].batch_size is None
    assert settings("lm_eval eval --model_args pretrained=gpt2,batch_size=auto:8 --tasks x")[1].batch_size is None
    for bad in ("auto:0", "auto:x", "auto:-2"):
        with pytest.raises((RaylmError, SystemExit)):
            parse_args(["eval", "--model", "gpt2", "--batch_size", bad])


@pytest.fixture
def lm_eval_logger():
    """lm-eval's logger as it was, restored after the test changes it."""
    logger = logging.getLogger("lm_eval")
    saved = logger.level, list(logger.handlers), logger.propagate
    yield logger
    logger.setLevel(saved[0])
    logger.handlers[:], logger.propagate = saved[1], saved[2]
    logging.getLogger().setLevel(logging.INFO)


def test_verbosity_reaches_lm_evals_logger_as_lm_eval_sets_it(lm_eval_logger, monkeypatch, capsys):
    from lm_eval.utils import setup_logging

    monkeypatch.delenv("LMEVAL_LOG_LEVEL", raising=False)
    argv = ["--model_args", "pretrained=gpt2", "--tasks", "hellaswag", "--verbosity", "debug"]
    setup_logging(verbosity=lm_evals_run_args(argv).verbosity)  # what lm-eval's simple_evaluate does with it
    theirs = lm_eval_logger.level
    lm_eval_logger.setLevel(logging.WARNING)
    # fails in the run's checks, after the command line is read and before anything loads
    assert main(["eval", *argv, "--fewshot_as_multiturn"]) == 2
    assert lm_eval_logger.level == theirs == logging.DEBUG
    assert "needs --apply-chat-template" in capsys.readouterr().err


def test_wandb_args_are_read_as_lm_evals_own_parser_reads_them():
    """The dicts lm-eval hands WandbLogger (wandb.init's arguments, the config's): raylm's run hands over the same."""
    from raylm.cli.lmeval import parse_pairs

    argv = ["--model_args", "pretrained=gpt2", "--tasks", "hellaswag", "--wandb_args", "project=p,name=run 1",
            "job_type=eval", "--wandb_config_args", "suite=lm,shots=5"]
    theirs, args = lm_evals_run_args(argv), parse_args(["eval", *argv])
    assert parse_pairs(args.wandb_args, "") == theirs.wandb_args == {"project": "p", "name": "run 1",
                                                                     "job_type": "eval"}
    assert parse_pairs(args.wandb_config_args, "") == theirs.wandb_config_args == {"suite": "lm", "shots": 5}


def test_device_cuda_n_places_one_actor_on_that_gpu_of_the_one_machine():
    """lm-eval's --device cuda:1 is GPU 1 of this machine: raylm's one actor gets the spec with cuda:1, and Ray
    leaves the machine's GPUs visible to it (Ray would otherwise renumber the one GPU it hands the actor cuda:0)."""
    from dataclasses import replace

    from raylm.cluster.capacity import HEAD_RESOURCE, Capacity
    from raylm.cluster.runtime import plan_actors

    argv = ["--model_args", "pretrained=gpt2", "--tasks", "hellaswag", "--device", "cuda:1"]
    assert lm_evals_run_args(argv).device == "cuda:1"
    spec = settings("lm_eval eval " + shlex.join(argv))[1].model
    machine = Capacity(({"CPU": 8.0, "GPU": 2.0, HEAD_RESOURCE: 1.0},), (), "the Ray raylm started on this machine")
    recipe, n = plan_actors(spec, None, None, capacity=machine)
    assert n == 1 and recipe.spec == replace(spec, device="cuda:1") and recipe.options() == {
        "num_cpus": 0.5, "num_gpus": 1.0,
        "runtime_env": {"env_vars": {"RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES": "1"}}}
    assert plan_actors(replace(spec, device="cuda"), None, None, capacity=machine)[0].options() == {
        "num_cpus": 0.5, "num_gpus": 1.0}  # --device cuda: the GPUs Ray gives each actor
    for device, actors, capacity, message in (
            ("cuda:2", None, machine, r"this machine has 2 GPU\(s\)"),
            ("cuda:1", 2, machine, "one GPU for one actor"),
            ("cuda:0", None, Capacity(machine.live * 2, (), "x"), "names one GPU of one machine"),
            ("cuda:0", None, Capacity(machine.live, None, ""), "names one GPU of one machine")):
        with pytest.raises(RaylmError, match=message):
            plan_actors(replace(spec, device=device), actors, None, capacity=capacity)
