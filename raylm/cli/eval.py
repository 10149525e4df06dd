"""`raylm eval`: its flags, lm-eval's spellings of them (raylm.cli.lmeval) and the run they ask for; the work is
in raylm.evaluate."""

from __future__ import annotations

import argparse
import logging
from dataclasses import replace
from pathlib import Path

from raylm.cli.lmeval import PairsAction, parse_pairs, read_samples
from raylm.cli.options import (add_model_options, add_output_option, add_placement_timeout, add_scorer_options,
                                 model_spec, task_names)
from raylm.cli.run_dirs import eval_dir
from raylm.config import (DEFAULT_BOOTSTRAP_ITERS, DEFAULT_FEWSHOT_SEED, DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED,
                          EvalConfig, parse_batch_size)
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.errors import RaylmError
from raylm.evaluate import evaluate
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS
from raylm.results.lmeval_output import write_lmeval_output
from raylm.results.wandb_log import log_to_wandb, require_wandb
from raylm.results.report import format_table, logged_samples, results_dict, write_results, write_samples
from raylm.storage.location import prepare_output
from raylm.storage.lock import output_lock
from raylm.tasks import TASKS

log = logging.getLogger(__name__)


def _batch_size(text: str) -> int | None:
    try:
        return parse_batch_size(text, "")
    except RaylmError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seeds(text: str) -> tuple[int | None, ...]:
    """lm-eval's --seed (its _int_or_none_list_arg_type(3, 4, "0,1234,1234,1234")): one integer for all four
    generators, or random,numpy,torch[,fewshot] ('None': unseeded), a missing fewshot seed filled from the
    defaults with lm-eval's warning."""
    try:
        values = [None if v.strip().lower() == "none" else int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or four comma-separated integers/None, got {text!r}") \
            from None
    if len(values) == 1:
        return tuple(values * 4)
    if len(values) not in (3, 4):
        raise argparse.ArgumentTypeError(f"must be one value, or three or four (random,numpy,torch[,fewshot]), got "
                                         f"{text!r}")
    if len(values) == 3:
        log.warning("--seed %s: no fewshot seed given; it is the default %s (as lm-eval fills it)", text,
                    DEFAULT_SEEDS[3])
    return (*values, *DEFAULT_SEEDS[len(values):])


DEFAULT_SEEDS = (DEFAULT_RANDOM_SEED, DEFAULT_OTHER_SEED, DEFAULT_OTHER_SEED, DEFAULT_FEWSHOT_SEED)


def _limit(text: str) -> int | float:
    """lm-eval's --limit: N documents, or below 1 a fraction of each task's."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    # Checked with the rest of the run's settings (EvalConfig.validate), so a bad value is a one-line error.
    return int(value) if value >= 1 and value.is_integer() else value


def _bool(text: str) -> bool:
    if text.lower() in ("true", "1", "yes"):
        return True
    if text.lower() in ("false", "0", "no"):
        return False
    raise argparse.ArgumentTypeError(f"must be true or false, got {text!r}")


def add_eval_command(sub: argparse._SubParsersAction) -> None:
    ev = sub.add_parser("eval", help="score native tasks and lm-evaluation-harness tasks (likelihood and "
                                     "generation)")
    ev.add_argument("--demo", action="store_true", help="packaged stories260K model and data samples, offline")
    ev.add_argument("--model", help="hub id or local directory (or lm-eval's model type hf, with --model-args)")
    ev.add_argument("--model-args", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --model_args: pretrained=...,dtype=...,revision=...,peft=..., or a JSON object")
    ev.add_argument("--tasks", nargs="+", default=[",".join(TASKS)],
                    help=f"comma- or space-separated: native ({', '.join(TASKS)}) or any lm-eval task, group, tag, "
                         "pattern or task file (path/to/task.yaml, globs too), or one folder of task files")
    ev.add_argument("--include-path", type=Path, help="directory of your own lm-eval task YAMLs (lm-eval's flag)")
    ev.add_argument("--limit", type=_limit, help="first N documents of each task, or below 1 a fraction of them")
    ev.add_argument("--samples", type=read_samples, metavar="JSON|FILE",
                    help='lm-eval\'s --samples: {"task": [document indices]} (not with --limit)')
    ev.add_argument("--metadata", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --metadata for its tasks (merged over the model's arguments, as lm-eval does)")
    ev.add_argument("--apply-chat-template", nargs="?", const=True, default=False, metavar="NAME",
                    help="render prompts with the tokenizer's chat template (or the one named), as lm-eval does")
    ev.add_argument("--fewshot-as-multiturn", nargs="?", const=True, default=None, type=_bool, metavar="BOOL",
                    help="few-shot examples as chat turns (default: true with --apply-chat-template)")
    ev.add_argument("--system-instruction", metavar="TEXT", help="system instruction put before every prompt")
    ev.add_argument("--chat-template-args", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="extra arguments for the chat template, e.g. enable_thinking=false")
    ev.add_argument("--gen-kwargs", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --gen_kwargs for its generate_until tasks: max_gen_toks=...,do_sample=...,"
                         "temperature=...,top_k=...,top_p=...,until=[...], or a JSON object")
    ev.add_argument("--peft", metavar="PATH", help="adapter (local directory or hub id) loaded onto the model, as "
                                                   "HFLM's peft= (pip install -e \".[peft]\")")
    ev.add_argument("--add-bos-token", nargs="?", const=True, default=None, type=_bool, metavar="BOOL",
                    help="HFLM's add_bos_token (default: the tokenizer's own)")
    ev.add_argument("--prefix-token-id", type=int, metavar="ID",
                    help="HFLM's prefix_token_id: the token empty contexts and rolling windows start from "
                         "(default BOS, else EOS)")
    ev.add_argument("--verbosity", type=str.upper, choices=("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
                    help="log level (lm-eval's --verbosity)")
    ev.add_argument("--num-fewshot", type=int, help="few-shot examples (default: each lm-eval task's own; native 0)")
    ev.add_argument("--max-length", type=int, help="context length requests are left-truncated to and rolling "
                                                   "windows cut to (lm-eval's max_length; default: the model's)")
    ev.add_argument("--bootstrap-iters", type=int, default=DEFAULT_BOOTSTRAP_ITERS,
                    help="bootstrap draws for the stderr of lm-eval metrics that need them (0: no stderr)")
    ev.add_argument("--batch-size", type=_batch_size, default=None, help="'auto' (token budget) or N requests")
    ev.add_argument("--actors", type=int, help="scoring actors (default: one per GPU the cluster has or can grow "
                    "to, up to 16, and no more than the work left needs; else one on CPU; none when nothing is left "
                    "to score; see docs/cluster.md)")
    add_placement_timeout(ev)
    add_model_options(ev)
    ev.add_argument("--data-dir", type=Path, help="a folder with the native tasks' files, laid out as in "
                    "docs/task-options.md (default: the hub)")
    add_output_option(ev, None, "results.json and the checkpoint a rerun resumes from (default: "
                                "raylm-out/<model>/<tasks and settings>-<digest>, one per command line)")
    ev.add_argument("--output-path", metavar="DIR|FILE.json",
                    help="lm-eval's --output_path and its layout: DIR/<model>/results_<date>.json and "
                         "samples_<task>_<date>.jsonl, or FILE_<date>.json; raylm's own folder (the checkpoint a "
                         "rerun resumes from) is DIR/<model>/.raylm/<run>, or .FILE.raylm/<run> beside FILE.json")
    ev.add_argument("--overwrite", action="store_true", help="discard results a different run left in --output")
    ev.add_argument("--log-samples", action="store_true",
                    help="also write per-request samples as Parquet, and every task's as lm-eval's jsonl")
    ev.add_argument("--predict-only", action="store_true",
                    help="lm-eval's --predict_only: responses and samples only, lm-eval tasks' metrics replaced by "
                         "its 'bypass' (implies --log-samples)")
    ev.add_argument("--confirm-run-unsafe-code", action="store_true",
                    help="lm-eval's --confirm_run_unsafe_code: on a node that cannot sandbox (no bubblewrap, no user "
                         "namespaces), run code tasks' programs without a sandbox, as lm-eval does; a node that can "
                         "sandbox always does")
    ev.add_argument("--wandb-args", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --wandb_args: log the results (and samples) to Weights & Biases through lm-eval's "
                         "WandbLogger, these being wandb.init's arguments (pip install 'raylm[wandb]')")
    ev.add_argument("--wandb-config-args", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --wandb_config_args: added to the W&B run's config")
    ev.add_argument("--seed", type=_seeds, default=DEFAULT_SEEDS,
                    help="lm-eval's --seed: S for all of random,numpy,torch,fewshot, or three or four values, "
                         f"a missing one taken from the default ({','.join(map(str, DEFAULT_SEEDS))})")
    ev.add_argument("--decontaminate", type=Path, metavar="DIR",
                    help="a `raylm contamination` output: every metric again on the clean documents alone, as "
                         "<metric>_decontaminate (lm-eval's name)")
    ev.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_REQUESTS, help="requests per shard")
    ev.add_argument("--no-progress", action="store_true",
                    help="no progress bar on stderr (it counts requests as their shards finish, with retries and, "
                         "for generation tasks, documents and tokens generated)")
    ev.add_argument("--num-gpus", type=float, help="GPUs per actor; fractions pack several actors on one GPU")
    add_scorer_options(ev)
    # HFLM's enable_thinking and think_end_token, given only in --model_args (raylm.cli.lmeval.apply_model_args)
    ev.set_defaults(enable_thinking=None, think_end_token=None)
    ev.add_argument("--dry-run", action="store_true",
                    help="print and write (plan.json in --output) what the run would score, compute and cost, from "
                         "the config, tokenizer and data alone: no weights loaded, no Ray started (docs/dry-run.md)")


def eval_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `eval` subcommand's parser (argparse keeps subparsers in its private action table)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["eval"]


def eval_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option `raylm eval` takes, for lm-eval's spellings of them (raylm.cli.lmeval.translate)."""
    return {s for a in eval_parser(parser)._actions for s in a.option_strings if s.startswith("--")}


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    model, data_dir = args.model, args.data_dir
    if args.demo:
        model = model or str(DEMO_MODEL)
        data_dir = data_dir or DEMO_DATA
    if not model:
        raise RaylmError("--model is required (or use --demo)")
    if args.load_in_4bit and args.load_in_8bit:
        raise RaylmError("--load-in-4bit and --load-in-8bit: choose one")
    spec = model_spec(args, model, args.revision, scorer=args.scorer, pll=args.pll, max_length=args.max_length,
                      peft=args.peft, add_bos_token=args.add_bos_token, prefix_token_id=args.prefix_token_id)
    tasks, include_path = task_names(args.tasks), args.include_path
    if len(tasks) == 1 and tasks[0] not in TASKS and Path(tasks[0]).is_dir():
        from raylm.tasks.lmeval.names import task_folder

        tasks = task_folder(tasks[0], include_path)
    if any(name.endswith(".yaml") for name in tasks):
        from raylm.tasks.lmeval.names import task_files

        tasks, include_path = task_files(tasks, include_path)
    random_seed, numpy_seed, torch_seed, fewshot_seed = args.seed
    chat_args = args.chat_template_args if isinstance(args.chat_template_args, dict) else \
        parse_pairs(args.chat_template_args, "--chat-template-args") if args.chat_template_args else None
    return EvalConfig(spec, tasks, data_dir, args.limit, args.num_fewshot, fewshot_seed, args.batch_size, args.actors,
                      args.shard_size, not args.no_progress, args.output, args.overwrite, args.num_gpus,
                      include_path=include_path, bootstrap_iters=args.bootstrap_iters, random_seed=random_seed,
                      numpy_seed=numpy_seed, torch_seed=torch_seed,
                      log_samples=args.log_samples or args.predict_only,  # lm-eval forces it so
                      decontaminate=args.decontaminate, samples=args.samples, predict_only=args.predict_only,
                      metadata=parse_pairs(args.metadata, "--metadata") if args.metadata else None,
                      apply_chat_template=args.apply_chat_template, fewshot_as_multiturn=args.fewshot_as_multiturn,
                      system_instruction=args.system_instruction, chat_template_args=chat_args,
                      enable_thinking=args.enable_thinking, think_end_token=args.think_end_token,
                      confirm_run_unsafe_code=args.confirm_run_unsafe_code,
                      placement_timeout_s=args.placement_timeout,
                      gen_kwargs=parse_pairs(args.gen_kwargs, "--gen_kwargs") if args.gen_kwargs else None)


def run_eval(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    cfg.validate()
    layout = getattr(args, "lmeval_layout", None)
    if args.output is None:  # a folder of this command line's own, inside --output_path's layout if given
        args.output = eval_dir(cfg, layout.work_dir if layout is not None else None)
        cfg = replace(cfg, output=args.output)
        print(f"writing to {args.output}; the same command resumes from it", flush=True)
    if args.dry_run:
        from raylm.evaluate.dry_run import print_plan

        return print_plan(cfg)
    out = prepare_output(args.output)
    wandb = (parse_pairs(args.wandb_args, "--wandb_args"),
             parse_pairs(args.wandb_config_args, "--wandb_config_args") if args.wandb_config_args else None) \
        if args.wandb_args else None
    if wandb is not None:
        require_wandb()
    with output_lock(out):
        result = evaluate(cfg)
        if cfg.log_samples:
            write_samples(out, result, sample_logs=layout is None)
        path = write_results(out, result)
        if layout is not None:
            path = write_lmeval_output(layout, results_dict(result), logged_samples(result) if cfg.log_samples
                                       else None, cfg.model.lmeval_model_args(), result.wall_s)
    if wandb is not None:  # after the results are on disk, as lm-eval logs them
        log_to_wandb(*wandb, results_dict(result), logged_samples(result) if cfg.log_samples else None)
    print(format_table(result))
    print(f"results written to {path}")
    return 0

