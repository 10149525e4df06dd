"""`raylm membership`: per-document Min-K% Prob and zlib ratio of task documents under a model
(raylm.contamination.membership_run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.cli.options import add_model_options, add_output_option, model_spec, task_names
from raylm.cli.run_dirs import membership_dir
from raylm.corpus import CHECKPOINT_EVERY_S, MEMBERSHIP_DOCS_PER_BATCH
from raylm.storage.location import prepare_output


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
    member.add_argument("--docs-per-batch", type=int, default=MEMBERSHIP_DOCS_PER_BATCH)
    add_model_options(member)
    add_output_option(member, None, "membership.json, membership.parquet and the checkpoint a rerun resumes from, "
                                    "one folder per command line (default: raylm-out/<model>/membership-<tasks>-"
                                    "<digest>)")
    member.add_argument("--overwrite", action="store_true",
                        help="discard the checkpoint a different run left in --output")
    member.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_S, metavar="SECONDS",
                        help="save the documents scored so far under --output this often, for a rerun of the same "
                             f"command to resume from (default {CHECKPOINT_EVERY_S:g})")
    member.add_argument("--no-progress", action="store_true",
                        help="no progress bar on stderr (it counts documents scored)")
    member.set_defaults(run=run_membership_command)


def run_membership_command(args: argparse.Namespace) -> int:
    from raylm.contamination.membership_run import MembershipConfig, format_table, run_membership

    spec = model_spec(args, args.model, args.revision, max_length=args.max_length)
    tasks = task_names(args.tasks)
    cfg = MembershipConfig(spec, tasks, args.k, args.data_dir, args.include_path, args.limit, args.actors,
                           args.docs_per_batch, not args.no_progress, args.overwrite, args.checkpoint_every)
    cfg.validate()
    if args.output is None:
        args.output = membership_dir(cfg)
        print(f"writing to {args.output}; the same command resumes from it", flush=True)
    out = prepare_output(args.output)
    report = run_membership(cfg, out)
    print(format_table(report))
    documents = sum(task["documents"] for task in report["tasks"].values())
    print(f"wall time {report['config']['wall_time_s']:.1f} s; {report['config']['docs_resumed']} of {documents} "
          f"documents resumed from checkpoint; membership.json and membership.parquet written to {out}")
    return 0
