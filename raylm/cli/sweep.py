"""`raylm sweep`: a sweep file's models × tasks × settings in one Ray job (raylm.sweep)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.cli.options import add_output_option, output_dir


def add_sweep_command(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser("sweep", help="run a sweep file: models × tasks × settings in one Ray job")
    sw.add_argument("file", type=Path, help="sweep file, e.g. jobs/demo.yaml")
    add_output_option(sw, None, "results (default: raylm-sweeps/<file stem>)")
    sw.set_defaults(run=run_sweep_file)


def run_sweep_file(args: argparse.Namespace) -> int:
    from raylm.sweep.summary import SUMMARY_MD
    from raylm.sweep.run import run_sweep
    from raylm.sweep.config import load_sweep
    from raylm.storage.location import location

    out = location(output_dir(args))
    runs = run_sweep(load_sweep(args.file), out)
    print((out / SUMMARY_MD).read_text(), end="")
    ran = sum(len(r.points_run) for r in runs.values())
    skipped = sum(len(r.points_skipped) for r in runs.values())
    print(f"{ran} point(s) run, {skipped} already finished; summary, plots and results under {out}")
    return 0
