"""`raylm contamination`: task n-grams against a streamed training corpus (raylm.contamination)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.cli.options import add_output_option, task_names
from raylm.corpus import SCAN_ROWS_PER_BATCH
from raylm.corpus.read import FORMATS as CORPUS_FORMATS
from raylm.storage.location import prepare_output


def add_contamination_command(sub: argparse._SubParsersAction) -> None:
    from raylm.contamination import DEFAULT_NGRAM

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
    scan.add_argument("--docs-per-batch", type=int, default=SCAN_ROWS_PER_BATCH)
    add_output_option(scan, Path("raylm-out") / "contamination",
                      "contamination.json, matches.parquet and contamination.png")
    scan.add_argument("--no-progress", action="store_true",
                      help="no progress bar on stderr (it counts the corpus's bytes scanned)")
    scan.set_defaults(run=run_contamination_command)


def run_contamination_command(args: argparse.Namespace) -> int:
    from raylm.contamination.report import format_table, run_contamination
    from raylm.contamination.scan import ScanConfig

    tasks = task_names(args.tasks)
    cfg = ScanConfig(tasks, tuple(args.corpus), args.fmt, args.text_column, args.ngram, args.data_dir,
                     args.include_path, args.limit, args.limit_docs, args.actors, args.docs_per_batch,
                     not args.no_progress)
    cfg.validate()
    out = prepare_output(args.output)
    report = run_contamination(cfg, out)
    print(format_table(report))
    print(f"wall time {report['config']['wall_time_s']:.1f} s; contamination.json, matches.parquet and "
          f"contamination.png written to {out}")
    return 0
