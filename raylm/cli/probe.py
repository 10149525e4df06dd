"""`raylm probe`: a masked LM's fill-mask predictions (raylm.probe.run)."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.cli.options import add_model_options, add_output_option, model_spec
from raylm.storage.location import prepare_output
from raylm.storage.lock import output_lock
from raylm.storage.ownership import check_results_owner


def add_probe_command(sub: argparse._SubParsersAction) -> None:
    probe = sub.add_parser("probe", help="a masked LM's top-k fill-mask predictions, or a probe file's matched "
                                         "templates x target words")
    probe.add_argument("--model", required=True, help="hub id or local directory of a masked LM")
    what = probe.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", action="append", help="text with one or more [MASK] (or the model's own mask "
                                                      "token); repeat for several texts")
    what.add_argument("--probes", type=Path, help="probe file (YAML): templates, fill values and target words")
    probe.add_argument("--top-k", type=int, default=5, help="predictions shown per mask")
    add_output_option(probe, Path("raylm-out"), "a probe file's CSVs, summary and chart")
    add_model_options(probe)
    probe.set_defaults(run=run_probe_command)


def run_probe_command(args: argparse.Namespace) -> int:
    from raylm.probe.file import load_probes
    from raylm.probe.run import Prober, fill_masks, format_predictions, run_probe_file

    spec = model_spec(args, args.model, args.revision)
    spec.validate()
    if args.probes is not None:
        probes = load_probes(args.probes)
        out = prepare_output(args.output)
        with output_lock(out):
            check_results_owner(out, "probe")
            print(run_probe_file(Prober(spec), probes, out, args.top_k), end="")
        print(f"probe results written to {out} (probe.csv, topk.csv, summary.csv, summary.md, probe.png)")
    else:
        print(format_predictions(args.text, fill_masks(Prober(spec), args.text, args.top_k)))
    return 0
