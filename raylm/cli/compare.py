"""`raylm compare`: finished runs compared document by document (raylm.compare)."""

from __future__ import annotations

import argparse


def add_compare_command(sub: argparse._SubParsersAction) -> None:
    cp = sub.add_parser("compare", help="paired differences between runs scored on the same documents")
    cp.add_argument("runs", nargs="+", metavar="RUN",
                    help="raylm eval outputs (with --log-samples), raylm ppl outputs, sweep outputs (every point) or "
                         "lm-eval --output_path directories (with --log_samples), as local paths or storage URIs "
                         "(s3://bucket/run); each run is compared with the first (a corpus run with the first "
                         "corpus run, on bits per byte)")
    cp.add_argument("--output", help="directory (local path or storage URI) for comparison.json and comparison.csv")
    cp.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from raylm.compare.comparison import compare_runs
    from raylm.compare.find import find_runs
    from raylm.compare.output import format_comparison, write_comparison

    comparison = compare_runs([run for where in args.runs for run in find_runs(where)])
    print(format_comparison(comparison))
    if args.output is not None:
        print(f"comparison written to {write_comparison(args.output, comparison)}")
    return 0
