"""`raylm compare`: finished runs compared document by document (raylm.results.compare)."""

from __future__ import annotations

import argparse
from pathlib import Path


def add_compare_command(sub: argparse._SubParsersAction) -> None:
    cp = sub.add_parser("compare", help="paired differences between runs scored on the same documents")
    cp.add_argument("runs", type=Path, nargs="+", metavar="RUN",
                    help="raylm eval outputs (with --log-samples), sweep outputs (every point) or lm-eval "
                         "--output_path directories (with --log_samples); each run is compared with the first")
    cp.add_argument("--output", type=Path, help="directory for comparison.json and comparison.csv")
    cp.set_defaults(run=run_compare)


def run_compare(args: argparse.Namespace) -> int:
    from raylm.results.compare import compare_runs, format_comparison, write_comparison

    comparison = compare_runs(args.runs)
    print(format_comparison(comparison))
    if args.output is not None:
        print(f"comparison written to {write_comparison(args.output, comparison)}")
    return 0
