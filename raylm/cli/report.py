"""`raylm report`: finished runs as one self-contained HTML page (raylm.compare.page)."""

from __future__ import annotations

import argparse
import sys


def add_report_command(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="one self-contained HTML page: each run's results and config, and the "
                                       "paired comparison of two runs or more")
    rp.add_argument("runs", nargs="+", metavar="RUN",
                    help="raylm eval outputs, lm-eval --output_path directories, raylm ppl or kl outputs or sweep "
                         "outputs (every point), as local paths or storage URIs; with two runs or more, each is "
                         "compared with the first of its kind (needs their samples: --log-samples)")
    rp.add_argument("--output", default="report.html",
                    help="the HTML file to write, a local path or storage URI (default: report.html); open it in "
                         "any browser")
    rp.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from raylm.compare.find import find_runs
    from raylm.compare.page import report_page
    from raylm.storage.atomic import write_atomic
    from raylm.storage.location import location

    page, refused = report_page([run for where in args.runs for run in find_runs(where)])
    if refused is not None:
        print(f"raylm: warning: runs not compared: {refused}", file=sys.stderr)
    out = location(args.output)
    write_atomic(out, page.encode())
    print(f"report written to {out}")
    return 0
