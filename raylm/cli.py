"""`raylm eval ...`: argument parsing only; the work is in raylm.evaluate."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from raylm.corpus.read import DEFAULT_DOCS_PER_BATCH, FORMATS as CORPUS_FORMATS
from raylm.storage.atomic import write_atomic
from raylm.errors import RaylmError, RemoteError
from raylm.cli_lmeval import PairsAction, apply_model_args, parse_pairs, read_samples, translate
from raylm.config import (DEFAULT_BOOTSTRAP_ITERS, DEFAULT_FEWSHOT_SEED, DEFAULT_OTHER_SEED, DEFAULT_RANDOM_SEED,
                          EvalConfig, parse_batch_size)
from raylm.data.demo import DEMO_DATA, DEMO_MODEL
from raylm.evaluate import evaluate
from raylm.models.spec import DTYPES, PLL_VARIANTS, SCORERS, ModelSpec
from raylm.storage.lock import output_lock
from raylm.storage.ownership import check_results_owner
from raylm.results.report import format_table, prepare_output, write_results, write_samples
from raylm.requests.shards import DEFAULT_SHARD_REQUESTS
from raylm.tasks import TASKS

ERROR_LOG = "raylm-error.log"  # under the output directory: the remote traceback of an error raised in an actor


def _batch_size(text: str) -> int | None:
    try:
        return parse_batch_size(text, "")
    except RaylmError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seeds(text: str) -> tuple[int | None, ...]:
    """lm-eval's --seed: one integer for all four generators, or random,numpy,torch,fewshot ('None': unseeded)."""
    try:
        values = [None if v.strip().lower() == "none" else int(v) for v in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer or four comma-separated integers/None, got {text!r}") \
            from None
    if len(values) not in (1, 4):
        raise argparse.ArgumentTypeError(f"must be one value or four (random,numpy,torch,fewshot), got {text!r}")
    return tuple(values * 4 if len(values) == 1 else values)


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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raylm", description="Evaluate language models on Ray actors.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="score native and lm-evaluation-harness loglikelihood tasks")
    ev.add_argument("--demo", action="store_true", help="packaged stories260K model and data samples, offline")
    ev.add_argument("--model", help="hub id or local directory (or lm-eval's model type hf, with --model-args)")
    ev.add_argument("--model-args", nargs="+", action=PairsAction, metavar="KEY=VALUE",
                    help="lm-eval's --model_args: pretrained=...,dtype=...,revision=...,peft=..., or a JSON object")
    ev.add_argument("--tasks", nargs="+", default=[",".join(TASKS)],
                    help=f"comma- or space-separated: native ({', '.join(TASKS)}) or any lm-eval task, group, tag or "
                         "pattern")
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
    ev.add_argument("--peft", metavar="PATH", help="adapter (local directory or hub id) loaded onto the model, as "
                                                   "HFLM's peft= (pip install \"raylm[peft]\")")
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
                    "to, up to 16; else one on CPU; see docs/cluster.md)")
    add_model_options(ev)
    ev.add_argument("--data-dir", type=Path, help="local data laid out like shared/data (default: the hub)")
    ev.add_argument("--output", type=Path, default=Path("raylm-out"),
                    help="directory for results.json and the checkpoint a rerun resumes from")
    ev.add_argument("--overwrite", action="store_true", help="discard results a different run left in --output")
    ev.add_argument("--log-samples", action="store_true", help="also write per-request samples as Parquet")
    ev.add_argument("--seed", type=_seeds, default=DEFAULT_SEEDS,
                    help="lm-eval's --seed: S for all of random,numpy,torch,fewshot, or four values "
                         f"(default {','.join(map(str, DEFAULT_SEEDS))})")
    ev.add_argument("--decontaminate", type=Path, metavar="DIR",
                    help="a `raylm contamination` output: every metric again on the clean documents alone, as "
                         "<metric>_decontaminate (lm-eval's name)")
    ev.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_REQUESTS, help="requests per shard")
    ev.add_argument("--no-progress", action="store_true")
    ev.add_argument("--num-gpus", type=float, help="GPUs per actor; fractions pack several actors on one GPU")
    add_scorer_options(ev)
    sw = sub.add_parser("sweep", help="run a sweep file: models × tasks × settings in one Ray job")
    sw.add_argument("file", type=Path, help="sweep file, e.g. jobs/demo.yaml")
    sw.add_argument("--output", type=Path, help="directory for results (default: raylm-sweeps/<file stem>)")
    sw.set_defaults(run=run_sweep_file)
    add_corpus_commands(sub)
    add_probe_command(sub)
    add_contamination_command(sub)
    add_membership_command(sub)
    return parser


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """How a model is loaded, the same flags on every command that loads one (eval, ppl, kl, probe)."""
    parser.add_argument("--dtype", default="auto", choices=list(DTYPES))
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda")
    parser.add_argument("--revision", help="model revision on the hub (branch, tag or commit)")
    parser.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="allow loading pickle weights (pytorch_model.bin) when a model has no safetensors")
    quant = parser.add_mutually_exclusive_group()
    quant.add_argument("--load-in-4bit", action="store_true", help="nf4 weights via bitsandbytes")
    quant.add_argument("--load-in-8bit", action="store_true", help="LLM.int8 weights via bitsandbytes")


def model_spec(args: argparse.Namespace, path: str, revision: str | None, **fields: object) -> ModelSpec:
    """A ModelSpec from add_model_options' flags (and a command's own `fields`: scorer, PLL, max length)."""
    quantization = "4bit" if args.load_in_4bit else "8bit" if args.load_in_8bit else None
    return ModelSpec(path, args.dtype, args.device, revision, args.trust_remote_code, args.allow_pickle,
                     quantization, **fields)


def eval_parser(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The `eval` subcommand's parser (argparse keeps subparsers in its private action table)."""
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices["eval"]


def eval_options(parser: argparse.ArgumentParser) -> set[str]:
    """Every long option `raylm eval` takes, for lm-eval's spellings of them (raylm.cli_lmeval.translate)."""
    return {s for a in eval_parser(parser)._actions for s in a.option_strings if s.startswith("--")}


def add_scorer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scorer", default="auto", choices=list(SCORERS),
                        help="causal LM or masked LM (pseudo-log-likelihood); auto: from the model's config")
    parser.add_argument("--pll", default=PLL_VARIANTS[0], choices=list(PLL_VARIANTS),
                        help="a masked LM's PLL: original (Salazar et al.) or word-l2r (Kauf & Ivanova)")


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
    tasks = tuple(t.strip() for item in args.tasks for t in item.split(",") if t.strip())
    random_seed, numpy_seed, torch_seed, fewshot_seed = args.seed
    chat_args = args.chat_template_args if isinstance(args.chat_template_args, dict) else \
        parse_pairs(args.chat_template_args, "--chat-template-args") if args.chat_template_args else None
    return EvalConfig(spec, tasks, data_dir, args.limit, args.num_fewshot, fewshot_seed, args.batch_size, args.actors,
                      args.shard_size, not args.no_progress, args.output, args.overwrite, args.num_gpus,
                      include_path=args.include_path, bootstrap_iters=args.bootstrap_iters, random_seed=random_seed,
                      numpy_seed=numpy_seed, torch_seed=torch_seed, log_samples=args.log_samples,
                      decontaminate=args.decontaminate, samples=args.samples,
                      metadata=parse_pairs(args.metadata, "--metadata") if args.metadata else None,
                      apply_chat_template=args.apply_chat_template, fewshot_as_multiturn=args.fewshot_as_multiturn,
                      system_instruction=args.system_instruction, chat_template_args=chat_args)


def run_eval(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    cfg.validate()
    prepare_output(args.output)
    with output_lock(args.output):
        result = evaluate(cfg)
        if args.log_samples:
            write_samples(args.output, result)
        path = write_results(args.output, result)
    print(format_table(result))
    print(f"results written to {path}")
    return 0


# --- raylm ppl / raylm kl: perplexity and KL divergence over streamed corpora (raylm.corpus.run) ---

def add_corpus_commands(sub: argparse._SubParsersAction) -> None:
    ppl = sub.add_parser("ppl", help="perplexity of a model over a corpus (Parquet, JSONL or text), streamed")
    kl = sub.add_parser("kl", help="mean KL(P||Q) per token between --model (P) and --model-b (Q) over a corpus")
    kl.add_argument("--model-b", required=True, help="hub id or local directory of Q (same tokenizer as P)")
    kl.add_argument("--model-b-revision", help="Q's revision on the hub (--revision is P's; the other model flags "
                                               "apply to both)")
    for p in (ppl, kl):
        p.add_argument("--model", required=True, help="hub id or local directory")
        p.add_argument("--data", required=True, help="file, directory or glob; local or any pyarrow filesystem URI")
        p.add_argument("--format", dest="fmt", default="auto", choices=list(CORPUS_FORMATS),
                       help="auto: from the file extension; txt is one document per non-empty line")
        p.add_argument("--text-column", default="text", help="column holding the documents (Parquet, JSONL)")
        p.add_argument("--max-length", type=int, help="tokens per window (default and upper bound: the model's)")
        p.add_argument("--stride", type=int, help="new tokens scored per window (default: max length, disjoint)")
        p.add_argument("--actors", type=int, help="model actors (default: one per GPU the cluster has or can grow "
                       "to, up to 16; else one on CPU)")
        p.add_argument("--limit-docs", type=int, help="first N documents only")
        p.add_argument("--docs-per-batch", type=int, default=DEFAULT_DOCS_PER_BATCH)
        add_model_options(p)
        p.add_argument("--output", type=Path, default=Path("raylm-out") / p.prog.split()[-1],
                       help="directory for results.json (default: raylm-out/ppl or raylm-out/kl)")
        p.add_argument("--no-progress", action="store_true")
        p.set_defaults(run=run_corpus_command)
    add_scorer_options(ppl)


def run_corpus_command(args: argparse.Namespace) -> int:
    from raylm.corpus.run import CorpusConfig, run_corpus

    spec_b = model_spec(args, args.model_b, args.model_b_revision) if args.command == "kl" else None
    spec = model_spec(args, args.model, args.revision, scorer=getattr(args, "scorer", "auto"),
                      pll=getattr(args, "pll", PLL_VARIANTS[0]))
    cfg = CorpusConfig(spec, args.data, spec_b, args.fmt, args.text_column,
                       args.max_length, args.stride, args.actors, args.limit_docs, args.docs_per_batch,
                       not args.no_progress)
    cfg.validate()
    prepare_output(args.output)
    result = run_corpus(cfg, args.output)
    for key, value in result.metrics.items():
        print(f"{args.command:<4} {key:<24} {value:>16.6f}" if isinstance(value, float) else
              f"{args.command:<4} {key:<24} {value:>16d}")
    if result.scorer == "mlm":
        print(f"pseudo-perplexities of a masked LM ({args.pll} PLL): not comparable with a causal LM's perplexity")
    print(f"wall time {result.wall_s:.1f} s; results written to {args.output / 'results.json'}")
    return 0

# --- end raylm ppl / raylm kl ---

# --- raylm probe: a masked LM's fill-mask predictions (raylm.probe.run) ---

def add_probe_command(sub: argparse._SubParsersAction) -> None:
    probe = sub.add_parser("probe", help="a masked LM's top-k fill-mask predictions, or a probe file's matched "
                                         "templates x target words")
    probe.add_argument("--model", required=True, help="hub id or local directory of a masked LM")
    what = probe.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", action="append", help="text with one or more [MASK] (or the model's own mask "
                                                      "token); repeat for several texts")
    what.add_argument("--probes", type=Path, help="probe file (YAML): templates, fill values and target words")
    probe.add_argument("--top-k", type=int, default=5, help="predictions shown per mask")
    probe.add_argument("--output", type=Path, default=Path("raylm-out"), help="directory for a probe file's CSVs, "
                                                                               "summary and chart")
    add_model_options(probe)
    probe.set_defaults(run=run_probe_command)


def run_probe_command(args: argparse.Namespace) -> int:
    from raylm.probe.file import load_probes
    from raylm.probe.run import Prober, fill_masks, format_predictions, run_probe_file

    spec = model_spec(args, args.model, args.revision)
    spec.validate()
    if args.probes is not None:
        probes = load_probes(args.probes)
        prepare_output(args.output)
        with output_lock(args.output):
            check_results_owner(args.output, "probe")
            print(run_probe_file(Prober(spec), probes, args.output, args.top_k), end="")
        print(f"probe results written to {args.output} (probe.csv, topk.csv, summary.csv, summary.md, probe.png)")
    else:
        print(format_predictions(args.text, fill_masks(Prober(spec), args.text, args.top_k)))
    return 0

# --- end raylm probe ---

# --- raylm contamination: task n-grams against a streamed training corpus (raylm.contamination) ---

def add_contamination_command(sub: argparse._SubParsersAction) -> None:
    from raylm.contamination import DEFAULT_DOCS_PER_BATCH, DEFAULT_NGRAM

    scan = sub.add_parser("contamination", help="which task documents a training corpus holds (lm-eval's 13-gram "
                                                "overlap), streamed over Ray Data")
    scan.add_argument("--tasks", required=True, help="comma-separated, as for `raylm eval`: native or any lm-eval "
                                                     "task, group, tag or pattern")
    scan.add_argument("--corpus", required=True, nargs="+", help="files, directories or globs of one format; local "
                                                                 "or any pyarrow filesystem URI (s3://...)")
    scan.add_argument("--format", dest="fmt", default="auto", choices=list(CORPUS_FORMATS),
                      help="auto: from the file extension; txt is one document per line")
    scan.add_argument("--text-column", default="text", help="column holding the documents (Parquet, JSONL)")
    scan.add_argument("--ngram", type=int, default=DEFAULT_NGRAM, help="words per n-gram (lm-eval's 13)")
    scan.add_argument("--include-path", type=Path, help="directory of your own lm-eval task YAMLs (lm-eval's flag)")
    scan.add_argument("--data-dir", type=Path, help="native tasks' local data, as for `raylm eval`")
    scan.add_argument("--limit", type=int, help="first N documents of each task")
    scan.add_argument("--limit-docs", type=int, help="first N corpus documents only")
    scan.add_argument("--actors", type=int, help="scanning actors (default: all CPUs but one)")
    scan.add_argument("--docs-per-batch", type=int, default=DEFAULT_DOCS_PER_BATCH)
    scan.add_argument("--output", type=Path, default=Path("raylm-out") / "contamination",
                      help="directory for contamination.json, matches.parquet and contamination.png")
    scan.add_argument("--no-progress", action="store_true")
    scan.set_defaults(run=run_contamination_command)


def run_contamination_command(args: argparse.Namespace) -> int:
    from raylm.contamination.report import check_output, format_table, write_report
    from raylm.contamination.scan import ScanConfig, run_scan

    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    cfg = ScanConfig(tasks, tuple(args.corpus), args.fmt, args.text_column, args.ngram, args.data_dir,
                     args.include_path, args.limit, args.limit_docs, args.actors, args.docs_per_batch,
                     not args.no_progress)
    cfg.validate()
    prepare_output(args.output)
    check_output(args.output)
    report = write_report(run_scan(cfg, args.output), args.output)
    print(format_table(report))
    print(f"wall time {report['config']['wall_time_s']:.1f} s; contamination.json, matches.parquet and "
          f"contamination.png written to {args.output}")
    return 0


def add_membership_command(sub: argparse._SubParsersAction) -> None:
    member = sub.add_parser("membership", help="per-document Min-K%% Prob and zlib ratio of task documents under a "
                                               "model: weak, model-side evidence of training on them (no corpus)")
    member.add_argument("--model", required=True, help="hub id or local directory of a causal LM")
    member.add_argument("--tasks", required=True, help="comma-separated, as for `raylm eval` (rolling or choice "
                                                       "tasks); each document's decontamination query is scored")
    member.add_argument("--k", type=float, default=20.0, help="Min-K%% Prob's k, in percent of the tokens")
    member.add_argument("--max-length", type=int, help="tokens per rolling window (default and upper bound: the "
                                                       "model's context)")
    member.add_argument("--include-path", type=Path, help="directory of your own lm-eval task YAMLs")
    member.add_argument("--data-dir", type=Path, help="native tasks' local data, as for `raylm eval`")
    member.add_argument("--limit", type=int, help="first N documents of each task")
    member.add_argument("--actors", type=int, help="model actors (default: one per GPU, or one on CPU)")
    member.add_argument("--docs-per-batch", type=int, default=16)
    member.add_argument("--dtype", default="auto", choices=list(DTYPES))
    member.add_argument("--device", default="auto", help="auto, cpu or cuda")
    member.add_argument("--revision", help="model revision on the hub")
    member.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model")
    member.add_argument("--output", type=Path, default=Path("raylm-out") / "membership",
                        help="directory for membership.json and membership.parquet")
    member.add_argument("--no-progress", action="store_true")
    member.set_defaults(run=run_membership_command)


def run_membership_command(args: argparse.Namespace) -> int:
    from raylm.contamination.membership_run import MembershipConfig, format_table, run_membership

    spec = ModelSpec(args.model, args.dtype, args.device, args.revision, args.trust_remote_code,
                     max_length=args.max_length)
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    cfg = MembershipConfig(spec, tasks, args.k, args.data_dir, args.include_path, args.limit, args.actors,
                           args.docs_per_batch, not args.no_progress)
    cfg.validate()
    prepare_output(args.output)
    report = run_membership(cfg, args.output)
    print(format_table(report))
    print(f"wall time {report['config']['wall_time_s']:.1f} s; membership.json and membership.parquet written to "
          f"{args.output}")
    return 0

# --- end raylm contamination ---

def run_sweep_file(args: argparse.Namespace) -> int:
    from raylm.sweep.summary import SUMMARY_MD
    from raylm.sweep.run import run_sweep
    from raylm.sweep.config import load_sweep

    out = output_dir(args)
    runs = run_sweep(load_sweep(args.file), out)
    print((out / SUMMARY_MD).read_text(), end="")
    ran = sum(len(r.points_run) for r in runs.values())
    skipped = sum(len(r.points_skipped) for r in runs.values())
    print(f"{ran} point(s) run, {skipped} already finished; summary, plots and results under {out}")
    return 0


def output_dir(args: argparse.Namespace) -> Path:
    if args.command == "sweep":
        return args.output or Path("raylm-sweeps") / args.file.stem
    return args.output


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, lm-eval's spellings and --model_args included (raylm.cli_lmeval), as raylm's settings."""
    parser = build_parser()
    args = parser.parse_args(translate(argv, eval_options(parser)))
    if args.command == "eval":
        apply_model_args(args, eval_parser(parser))
    return args


def error_message(error: RaylmError, out: Path) -> str:
    """The one line to print; an actor's traceback goes to a file under the output directory, named in the line."""
    if not isinstance(error, RemoteError):
        return str(error)
    path = out / ERROR_LOG
    try:
        write_atomic(path, error.traceback.rstrip("\n").encode() + b"\n")
    except OSError as e:
        return f"{error} (its traceback could not be saved to {path}: {e.strerror or e})"
    return f"{error} (full traceback in {path})"


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    # lm-eval narrates every task it loads and builds at INFO (57 of them for MMLU); its warnings still show.
    logging.getLogger("lm_eval").setLevel(logging.WARNING)
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except RaylmError as e:
        print(f"raylm: error: {e}", file=sys.stderr)
        return 2
    if args.command == "eval" and args.verbosity:
        logging.getLogger().setLevel(args.verbosity)
    try:
        return getattr(args, "run", run_eval)(args)
    except RaylmError as e:
        print(f"raylm: error: {error_message(e, output_dir(args))}", file=sys.stderr)
        return 2


def run() -> None:
    """The `raylm` command: main(), then a prompt exit.

    By the time main() returns, everything the command promises is on disk (results are written atomically)
    and printed. Ray's atexit shutdown and the interpreter's teardown of torch, transformers and Ray took 3.5 s
    after a 16 s demo run on 2 cores; shutting Ray down here and skipping the teardown takes about 1.2 s. The
    explicit shutdown is what stops a Ray this process started (GCS, raylet, actors), since os._exit runs no
    atexit handler; attached to a cluster, it only disconnects.
    """
    code = main()
    if "ray" in sys.modules:  # a command that failed before Ray started need not import it to exit
        from raylm.cluster.runtime import disconnect

        disconnect()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
