"""`raylm report`: finished runs as one self-contained HTML page (raylm.results.page)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def add_report_command(sub: argparse._SubParsersAction) -> None:
    rp = sub.add_parser("report", help="one self-contained HTML page: each run's results and config, and the "
                                       "paired comparison of two runs or more")
    rp.add_argument("runs", type=Path, nargs="+", metavar="RUN",
                    help="raylm eval outputs, sweep outputs (every point) or lm-eval --output_path directories; "
                         "with two runs or more, each is compared with the first (needs their samples: "
                         "--log-samples)")
    rp.add_argument("--output", type=Path, default=Path("report.html"),
                    help="the HTML file to write (default: report.html); open it in any browser")
    rp.set_defaults(run=run_report)


def run_report(args: argparse.Namespace) -> int:
    from raylm.results.page import report_page, write_report

    page, refused = report_page(args.runs)
    if refused is not None:
        print(f"raylm: warning: runs not compared: {refused}", file=sys.stderr)
    print(f"report written to {write_report(args.output, page)}")
    return 0
