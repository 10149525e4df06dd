"""`raylm sweep`: a sweep file's models × tasks × settings in one Ray job (raylm.sweep)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from raylm.cli.options import add_output_option, add_placement_timeout, output_dir
from raylm.cluster.runtime import PLACEMENT_WAIT_S


def add_sweep_command(sub: argparse._SubParsersAction) -> None:
    sw = sub.add_parser("sweep", help="run a sweep file: models × tasks × settings in one Ray job")
    sw.add_argument("file", type=Path, help="sweep file, e.g. jobs/demo.yaml")
    add_output_option(sw, None, "results (default: raylm-sweeps/<file stem>)")
    add_placement_timeout(sw, "how long a model's actors no node can hold yet are waited for (an autoscaler adding "
                              f"nodes; default: the sweep file's placement_timeout, else {PLACEMENT_WAIT_S:g})")
    sw.add_argument("--dry-run", action="store_true",
                    help="print and write (plan.json in the output) each point's plan, the points already finished "
                         "and skipped, and the order the models run in: no weights loaded, no Ray started "
                         "(docs/dry-run.md)")
    sw.set_defaults(run=run_sweep_file)


def run_sweep_file(args: argparse.Namespace) -> int:
    from raylm.sweep.summary import SUMMARY_MD
    from raylm.sweep.run import run_sweep
    from raylm.sweep.config import load_sweep
    from raylm.storage.location import location

    out = location(output_dir(args))
    sweep = load_sweep(args.file)
    if args.placement_timeout is not None:
        sweep = replace(sweep, placement_timeout=args.placement_timeout)
    if args.dry_run:
        return _dry_run(sweep, out)
    runs = run_sweep(sweep, out)
    print((out / SUMMARY_MD).read_text(), end="")
    ran = sum(len(r.points_run) for r in runs.values())
    skipped = sum(len(r.points_skipped) for r in runs.values())
    print(f"{ran} point(s) run, {skipped} already finished; summary, plots and results under {out}")
    return 0


def _dry_run(sweep, out) -> int:
    from raylm.cluster.pricing import publish
    from raylm.sweep.dry_run import format_sweep_plan, sweep_plan

    plan = sweep_plan(sweep, out)
    return publish(format_sweep_plan(plan), plan, out)
