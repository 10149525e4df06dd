"""lm-eval's command-line spellings for `raylm eval`, so an `lm_eval --model hf --model_args ... --tasks ...` line
runs unchanged as `raylm eval --model_args ... --tasks ...`.

Two steps, both before argparse sees anything: `translate` rewrites lm-eval's flag spellings (`--num_fewshot`,
`-f`, `--output_path`, `--gen_kwargs`, ...) to raylm's and refuses, by name and in one line, the lm-eval flags
raylm has no equivalent for (caching, trackers); `apply_model_args` then spreads `--model_args` over raylm's own
settings (pretrained, dtype, revision, peft, ...), refusing keys raylm does not take and keys that contradict a
flag. Values are read as lm-eval reads them (key=val pairs split on top-level commas, or one JSON object).
"""

from __future__ import annotations

import argparse
import ast
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Callable

from raylm.config import parse_batch_size
from raylm.errors import RaylmError

# lm-eval flag -> raylm flag, where the spelling differs by more than "_" for "-" (which any flag accepts).
RENAMED = {"-o": "--output-path", "-t": "--tasks", "-f": "--num-fewshot",
           "-b": "--batch-size", "-s": "--log-samples", "-L": "--limit", "-a": "--model-args", "-M": "--model",
           "-E": "--samples", "-v": "--verbosity", "-x": "--predict-only"}
# lm-eval 0.4.13 flags (`lm_eval run`) raylm does not take, and why: refused by name rather than ignored.
REFUSED = {
    "--use_cache": "caches model responses in SQLite; raylm resumes from its own checkpoint under --output",
    "-c": "(--use_cache) caches model responses in SQLite; raylm resumes from its own checkpoint under --output",
    "--cache_requests": "caches built requests; raylm rebuilds them each run (and checkpoints their scores)",
    "--check_integrity": "runs lm-eval's task test suite, which raylm does not ship",
    "--write_out": "prints prompts; raylm's --log-samples writes every request's strings",
    "-w": "(--write_out) prints prompts; raylm's --log-samples writes every request's strings",
    "--show_config": "prints the task configs; raylm writes them to results.json (configs)",
    "--max_batch_size": "caps lm-eval's auto batch size; raylm's --batch-size auto fills a token budget",
    "--trackio_args": "logs to Trackio, which raylm does not do",
    "--hf_hub_log_args": "pushes results to the Hugging Face hub, which raylm does not do",
    "--config": "reads lm-eval's YAML run config; raylm's equivalent is a sweep file (raylm sweep)",
    "-C": "(--config) reads lm-eval's YAML run config; raylm's equivalent is a sweep file (raylm sweep)",
}
# lm-eval's names for HFLM, the model raylm evaluates like, and raylm's own RayLM (lm-eval's "raylm" once raylm.api is
# imported), which takes HFLM's arguments.
HF_MODEL_TYPES = ("hf", "hf-auto", "huggingface", "raylm")


def other_model_types() -> frozenset[str]:
    """lm-eval's registered model types other than HFLM's (vllm, sglang, openai-completions, gguf, ...), from the
    installed lm-eval's own registry: `--model vllm` names a backend raylm does not run, not a hub model. Empty
    where lm-eval is not installed."""
    try:
        import lm_eval.models  # noqa: F401  (fills the registry with lm-eval's lazy entries)
        from lm_eval.api.registry import model_registry
    except ImportError:
        return frozenset()
    return frozenset(model_registry.keys()) - set(HF_MODEL_TYPES)


def translate(argv: Sequence[str], known: set[str]) -> list[str]:
    """argv with lm-eval's spellings of `known` raylm flags rewritten, or a one-line error for a flag lm-eval
    has and raylm does not. Only `raylm eval` takes lm-eval's spellings."""
    argv = list(argv)
    if not argv or argv[0] != "eval":
        return argv
    out = [argv[0]]
    for token in argv[1:]:
        name, eq, value = token.partition("=") if token.startswith("--") else (token, "", "")
        if name in REFUSED or name.replace("-", "_") in REFUSED:
            why = REFUSED.get(name) or REFUSED[name.replace("-", "_")]
            raise RaylmError(f"raylm eval does not take lm-eval's {name}: it {why}")
        if name in RENAMED:
            name = RENAMED[name]
        elif name.startswith("--") and name.replace("_", "-") in known:
            name = name.replace("_", "-")
        out.append(name + eq + value)
    return out


def cli_value(text: str) -> Any:
    """lm-eval's reading of one key=value value (lm_eval._cli.utils.handle_cli_value_string)."""
    if text.lower() == "true":
        return True
    if text.lower() == "false":
        return False
    if text.isnumeric():
        return int(text)
    try:
        return float(text)
    except ValueError:
        try:
            return ast.literal_eval(text)
        except (ValueError, SyntaxError):
            return text


def _split_top_level(text: str) -> list[str]:
    """Split on commas outside brackets and quotes (lm-eval's split_top_level)."""
    parts, buf, depth, quote = [], [], 0, None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[({":
            depth += 1
        elif char in "])}":
            depth = max(depth - 1, 0)
        elif char == "," and depth == 0:
            parts.append("".join(buf))
            buf = []
            continue
        buf.append(char)
    parts.append("".join(buf))
    return [p for p in parts if p]


def parse_pairs(values: Sequence[str], what: str) -> dict[str, Any]:
    """`key=val,key2=val2` (one or several tokens) or one JSON object, as lm-eval's MergeDictAction reads them."""
    if len(values) == 1 and values[0].lstrip().startswith("{"):
        try:
            parsed = json.loads(values[0])
        except json.JSONDecodeError as e:
            raise RaylmError(f"{what}: not valid JSON ({e.msg}); use double quotes for strings") from None
        if not isinstance(parsed, dict):
            raise RaylmError(f"{what}: a JSON object is needed, got {type(parsed).__name__}")
        return parsed
    out: dict[str, Any] = {}
    for value in values:
        for item in _split_top_level(value):
            key, eq, raw = item.partition("=")
            if not eq or not key:
                raise RaylmError(f"{what}: expected key=value, got {item!r}")
            out[key.strip()] = cli_value(raw)
    return out


class PairsAction(argparse.Action):
    """Collects `key=val` tokens (any number, repeated flags merge) for apply_model_args to read."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest) or []), *values])


def read_samples(text: str) -> dict[str, list[int]]:
    """lm-eval's --samples: a JSON object of task -> document indices, or the path of a file holding one."""
    if not text.lstrip().startswith("{") and Path(text).is_file():
        try:
            text = Path(text).read_text()
        except OSError as e:
            raise RaylmError(f"--samples: cannot read {text}: {e.strerror}") from e
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise RaylmError(f"--samples: {text[:60]!r} is neither a JSON object nor a file holding one ({e.msg})") \
            from None
    if not isinstance(value, dict):
        raise RaylmError("--samples must be a JSON object of task -> document indices")
    return value


def _text(key: str) -> Callable[[Any], Any]:
    return lambda v: str(v)


def _flag(key: str) -> Callable[[Any], Any]:
    def check(v: Any) -> bool:
        if not isinstance(v, bool):
            raise RaylmError(f"--model_args {key}={v!r}: must be True or False")
        return v
    return check


def _count(key: str) -> Callable[[Any], Any]:
    def check(v: Any) -> int:
        if not isinstance(v, int) or isinstance(v, bool):
            raise RaylmError(f"--model_args {key}={v!r}: must be an integer")
        return v
    return check


def _dtype(key: str) -> Callable[[Any], Any]:
    aliases = {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16", "fp32": "float32"}
    return lambda v: aliases.get(str(v), str(v))


# --model_args key -> (raylm's argparse dest, how the value becomes raylm's). HFLM's own defaults are raylm's.
MODEL_ARGS: dict[str, tuple[str, Callable[[str], Callable[[Any], Any]]]] = {
    "pretrained": ("model", _text), "dtype": ("dtype", _dtype), "revision": ("revision", _text),
    "trust_remote_code": ("trust_remote_code", _flag), "peft": ("peft", _text),
    "add_bos_token": ("add_bos_token", _flag), "prefix_token_id": ("prefix_token_id", _count),
    "max_length": ("max_length", _count), "device": ("device", _text), "batch_size": ("batch_size", _text),
    "load_in_4bit": ("load_in_4bit", _flag), "load_in_8bit": ("load_in_8bit", _flag),
}
# HFLM arguments about its prompts and generations, which raylm reads into its run's settings.
HFLM_PROMPT_ARGS = ("chat_template_args", "enable_thinking", "think_end_token")
# HFLM arguments accepted at the one value that leaves raylm's behaviour as HFLM's.
ACCEPTED_AT = {"use_fast_tokenizer": True, "backend": "causal", "parallelize": False}


def apply_output_path(args: argparse.Namespace, parser: argparse.ArgumentParser, default_model: str | None) -> None:
    """lm-eval's --output_path: its layout for the results and samples (raylm.results.lmeval_output), and raylm's
    own output folder (--output: results.json, the checkpoint) beside them, one per command line (run_eval names
    it, raylm.cli.run_dirs), so that the same line resumes and a line with other tasks adds its own results."""
    if args.output_path is None:
        return
    if args.output != parser.get_default("output"):
        raise RaylmError("--output and --output_path: choose one (--output_path writes lm-eval's layout, with "
                         "raylm's own folder inside it)")
    model = args.model or default_model
    if model is None:
        return  # refused with the rest of the run's settings: --model is required
    from raylm.results.lmeval_output import Layout

    args.lmeval_layout = Layout.of(args.output_path, {"pretrained": model, **({"peft": args.peft} if args.peft
                                                                                else {})})


def apply_model_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Spread --model_args over args; `--model hf` (lm-eval's model type) then means HFLM, whose `pretrained` is
    raylm's --model. Every key raylm does not take, or that contradicts a flag also given, is a one-line error."""
    given = parse_pairs(args.model_args, "--model_args") if args.model_args else {}
    if isinstance(args.chat_template_args, list):
        args.chat_template_args = parse_pairs(args.chat_template_args, "--chat-template-args")
    if args.model in other_model_types() and not Path(args.model).exists():
        raise RaylmError(f"--model {args.model} is lm-eval's {args.model} model type, which raylm does not run: raylm "
                         f"evaluates as lm-eval's hf model (HFLM); use --model hf")
    if args.model in HF_MODEL_TYPES and "pretrained" in given:
        args.model = None
    elif args.model in HF_MODEL_TYPES:
        raise RaylmError(f"--model {args.model} is lm-eval's model type; name the model with --model_args "
                         "pretrained=... (or pass it as --model)")
    elif given and "pretrained" in given and args.model is not None:
        raise RaylmError(f"--model {args.model} with --model_args pretrained=...: raylm evaluates as lm-eval's hf "
                         "model (HFLM); pass --model hf, or the model as --model alone")
    for key, value in given.items():
        if key in ACCEPTED_AT:
            if value != ACCEPTED_AT[key] and not (key == "backend" and value == "default"):
                raise RaylmError(f"--model_args {key}={value!r} is not supported: raylm runs HFLM's "
                                 f"{key}={ACCEPTED_AT[key]!r}")
            continue
        if key == "enable_thinking":
            args.enable_thinking = _flag(key)(value)
            continue
        if key == "think_end_token":
            args.think_end_token = value
            continue
        if key == "chat_template_args":
            extra = value if isinstance(value, dict) else parse_pairs([str(value)], "chat_template_args")
            args.chat_template_args = {**(args.chat_template_args or {}), **extra}
            continue
        if key not in MODEL_ARGS:
            raise RaylmError(f"--model_args {key}= is not supported by raylm (it takes "
                             f"{', '.join([*MODEL_ARGS, *HFLM_PROMPT_ARGS])})")
        dest, convert = MODEL_ARGS[key]
        converted = convert(key)(value)
        if dest == "batch_size":
            converted = parse_batch_size(converted, "--model_args batch_size")
        current, default = getattr(args, dest), parser.get_default(dest)
        if current != default and current != converted:
            raise RaylmError(f"--model_args {key}={value!r} contradicts --{dest.replace('_', '-')} {current!r}")
        setattr(args, dest, converted)
    if args.enable_thinking is not None and args.apply_chat_template:
        # HFLM: chat_template_args | {"enable_thinking": ...}, which apply only with --apply-chat-template
        args.chat_template_args = {**(args.chat_template_args or {}), "enable_thinking": args.enable_thinking}
