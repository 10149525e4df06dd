"""`raylm eval ...`: argument parsing only; the work is in raylm.evaluate."""

from __future__ import annotations

import argparse
import logging
import sys
from importlib import resources
from pathlib import Path

from raylm.errors import RaylmError
from raylm.evaluate import DEFAULT_FEWSHOT_SEED, EvalConfig, evaluate
from raylm.model_loading import DTYPES, ModelSpec
from raylm.report import format_table, prepare_output, write_results, write_samples
from raylm.shards import DEFAULT_SHARD_REQUESTS
from raylm.tasks import TASKS

DEMO = resources.files("raylm") / "demo"


def _batch_size(text: str) -> int | None:
    if text == "auto":
        return None
    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be 'auto' or a positive integer, got {text!r}")
    return int(text)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raylm", description="Evaluate language models on Ray actors.")
    sub = parser.add_subparsers(dest="command", required=True)
    ev = sub.add_parser("eval", help="score benchmark tasks (HellaSwag, WinoGrande, WikiText)")
    ev.add_argument("--demo", action="store_true", help="packaged stories260K model and data samples, offline")
    ev.add_argument("--model", help="hub id or local directory")
    ev.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, from: {', '.join(TASKS)}")
    ev.add_argument("--limit", type=int, help="first N documents of each task")
    ev.add_argument("--num-fewshot", type=int, default=0)
    ev.add_argument("--batch-size", type=_batch_size, default=None, help="'auto' (token budget) or N requests")
    ev.add_argument("--actors", type=int, help="scoring actors (default: one per GPU, or one on CPU)")
    ev.add_argument("--dtype", default="auto", choices=list(DTYPES))
    ev.add_argument("--device", default="auto", help="auto, cpu or cuda")
    ev.add_argument("--revision", help="model revision on the hub")
    ev.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model")
    ev.add_argument("--data-dir", type=Path, help="local data laid out like shared/data (default: the hub)")
    ev.add_argument("--output", type=Path, default=Path("raylm-out"), help="directory for results.json")
    ev.add_argument("--log-samples", action="store_true", help="also write per-request samples as Parquet")
    ev.add_argument("--seed", type=int, default=DEFAULT_FEWSHOT_SEED, help="few-shot sampler seed")
    ev.add_argument("--shard-size", type=int, default=DEFAULT_SHARD_REQUESTS, help="requests per shard")
    ev.add_argument("--no-progress", action="store_true")
    quant = ev.add_mutually_exclusive_group()
    quant.add_argument("--load-in-4bit", action="store_true", help="nf4 weights via bitsandbytes (raylm[quant])")
    quant.add_argument("--load-in-8bit", action="store_true", help="LLM.int8 weights via bitsandbytes (raylm[quant])")
    ev.add_argument("--num-gpus", type=float, help="GPUs per actor; fractions pack several actors on one GPU")
    sw = sub.add_parser("sweep", help="run a sweep file: models × tasks × settings in one Ray job")
    sw.add_argument("file", type=Path, help="sweep file, e.g. jobs/demo.yaml")
    sw.add_argument("--output", type=Path, help="directory for results (default: raylm-sweeps/<file stem>)")
    return parser


def config_from_args(args: argparse.Namespace) -> EvalConfig:
    model, data_dir = args.model, args.data_dir
    if args.demo:
        model = model or str(DEMO / "models" / "stories260K-hf")
        data_dir = data_dir or Path(str(DEMO / "data"))
    if not model:
        raise RaylmError("--model is required (or use --demo)")
    quantization = "4bit" if args.load_in_4bit else "8bit" if args.load_in_8bit else None
    spec = ModelSpec(model, args.dtype, args.device, args.revision, args.trust_remote_code, quantization)
    tasks = tuple(t.strip() for t in args.tasks.split(",") if t.strip())
    return EvalConfig(spec, tasks, data_dir, args.limit, args.num_fewshot, args.seed, args.batch_size, args.actors,
                      args.shard_size, not args.no_progress, args.num_gpus)


def run_eval(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    cfg.validate()
    prepare_output(args.output)
    result = evaluate(cfg)
    if args.log_samples:
        write_samples(args.output, result)
    path = write_results(args.output, result)
    print(format_table(result))
    print(f"results written to {path}")
    return 0


def run_sweep_file(args: argparse.Namespace) -> int:
    from raylm.plots import SUMMARY_MD
    from raylm.sweep import run_sweep
    from raylm.sweep_config import load_sweep

    out = args.output or Path("raylm-sweeps") / args.file.stem
    runs = run_sweep(load_sweep(args.file), out)
    print((out / SUMMARY_MD).read_text(), end="")
    ran = sum(len(r.points_run) for r in runs.values())
    skipped = sum(len(r.points_skipped) for r in runs.values())
    print(f"{ran} point(s) run, {skipped} already finished; summary, plots and results under {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        return run_sweep_file(args) if args.command == "sweep" else run_eval(args)
    except RaylmError as e:
        print(f"raylm: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
