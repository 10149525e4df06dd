"""The `raylm` command: one module per command (its flags, and the call into the package that does its work),
the flags several commands share in options.py, lm-eval's spellings of `raylm eval`'s flags in lmeval.py. Here:
the parser that holds them all, and the one-line errors and prompt exit every command shares."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from raylm.cli.compare import add_compare_command
from raylm.cli.contamination import add_contamination_command
from raylm.cli.corpus import add_corpus_commands
from raylm.cli.eval import (DEFAULT_SEEDS, add_eval_command, config_from_args, eval_options, eval_parser,
                            run_eval)
from raylm.cli.lmeval import apply_model_args, apply_output_path, translate
from raylm.cli.membership import add_membership_command
from raylm.cli.options import output_dir
from raylm.cli.probe import add_probe_command
from raylm.cli.report import add_report_command
from raylm.cli.sweep import add_sweep_command
from raylm.cli.tasks import add_tasks_command
from raylm.data.demo import DEMO_MODEL
from raylm.errors import RaylmError, RemoteError, first_line
from raylm.storage.atomic import write_atomic
from raylm.storage.location import location

# What callers (tests, benchmarks, the entry point) import from raylm.cli, wherever it is defined.
__all__ = ["DEFAULT_SEEDS", "ERROR_LOG", "build_parser", "config_from_args", "error_message", "eval_options",
           "eval_parser", "main", "parse_args", "run", "run_eval"]

ERROR_LOG = "raylm-error.log"  # under the output directory: the remote traceback of an error raised in an actor


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="raylm", description="Evaluate language models on Ray actors.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_eval_command(sub)
    add_sweep_command(sub)
    add_corpus_commands(sub)
    add_probe_command(sub)
    add_contamination_command(sub)
    add_membership_command(sub)
    add_compare_command(sub)
    add_report_command(sub)
    add_tasks_command(sub)
    return parser


def parse_args(argv: list[str]) -> argparse.Namespace:
    """The command line, lm-eval's spellings and --model_args included (raylm.cli.lmeval), as raylm's settings."""
    parser = build_parser()
    args = parser.parse_args(translate(argv, eval_options(parser)))
    if args.command == "eval":
        apply_model_args(args, eval_parser(parser))
        apply_output_path(args, eval_parser(parser), str(DEMO_MODEL) if args.demo else None)
    return args


def error_message(error: RaylmError, out: Path | str) -> str:
    """The one line to print; an actor's traceback goes to a file under the output directory, named in the line."""
    if not isinstance(error, RemoteError):
        return str(error)
    path = location(out) / ERROR_LOG
    try:
        write_atomic(path, error.traceback.rstrip("\n").encode() + b"\n")
    except OSError as e:
        return f"{error} (its traceback could not be saved to {path}: {e.strerror or e})"
    return f"{error} (full traceback in {path})"


def set_verbosity(level: str) -> None:
    """--verbosity for raylm's logs and, as lm-eval's own CLI sets it (simple_evaluate's setup_logging), for
    lm-eval's "lm_eval" logger, LMEVAL_LOG_LEVEL overriding it as there."""
    logging.getLogger().setLevel(level)
    try:
        from lm_eval.utils import setup_logging
    except ImportError:
        return
    setup_logging(verbosity=level)


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
        set_verbosity(args.verbosity)
    from raylm.cluster.waiting import Watchdog, stall_timeout, watch, wind_down

    global _signal_seen
    _signal_seen = None
    handlers = _take_signals()
    watchdog: Watchdog | None = None
    try:
        watchdog = Watchdog(stall_timeout())
        with watch(watchdog):
            return getattr(args, "run", run_eval)(args)
    except BaseException as e:
        stall = watchdog.reason if watchdog is not None else None
        if not (isinstance(e, KeyboardInterrupt) or _signal_seen is not None or stall is not None):
            if isinstance(e, RaylmError):
                print(f"raylm: error: {error_message(e, output_dir(args))}", file=sys.stderr)
                return 2
            raise
        if not isinstance(e, KeyboardInterrupt):  # what the stop made a stage raise on its way out
            logging.getLogger(__name__).warning("while stopping: %s", first_line(e))
        wind_down()
        if stall is not None:
            print(f"raylm: error: {stall}; {kept(args)}", file=sys.stderr)
            return 1
        signum = _signal_seen or signal.SIGINT
        print(f"raylm: {signal.Signals(signum).name} received, stopped; {kept(args)}", file=sys.stderr)
        return 128 + signum
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)


_signal_seen: int | None = None


def _take_signals() -> dict[int, object]:
    """SIGINT (Ctrl-C) and SIGTERM (a job stopped, a pod evicted) both stop a command the same way: the stages save
    what they have on the way out, then one line says which signal came. A signal the command was started with
    ignored (a background job's SIGINT) stays ignored. Returns the handlers to put back."""
    if threading.current_thread() is not threading.main_thread():
        return {}
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGINT, signal.SIGTERM)}
    for signum, handler in before.items():
        if handler is not signal.SIG_IGN:
            signal.signal(signum, _interrupt)
    return before


def _interrupt(signum: int, frame: object) -> None:
    global _signal_seen
    _signal_seen = signum
    raise KeyboardInterrupt


CHECKPOINTING = ("eval", "ppl", "kl", "membership", "sweep")  # the commands whose reruns resume


def kept(args: argparse.Namespace) -> str:
    """What a stopped command leaves for its rerun: one clause for the stop line."""
    if args.command not in CHECKPOINTING:
        return "nothing was written"
    out = output_dir(args)
    if out is None:
        return "nothing was written"
    return f"what was scored is kept in {location(out)}; the same command resumes from it"


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

