"""Options shared by the commands: how a model is loaded and scored, and where a command's output goes."""

from __future__ import annotations

import argparse
from pathlib import Path

from raylm.cluster.runtime import PLACEMENT_WAIT_S
from raylm.models.spec import DTYPES, PLL_VARIANTS, SCORERS, ModelSpec
from raylm.storage.location import is_uri


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """How a model is loaded, the same flags on every command that loads one (eval, ppl, kl, probe, membership)."""
    parser.add_argument("--dtype", default="auto", choices=list(DTYPES))
    parser.add_argument("--device", default="auto",
                        help="auto, cpu, cuda, or cuda:N (one actor on GPU N of this machine; docs/cluster.md)")
    parser.add_argument("--revision", help="model revision on the hub (branch, tag or commit)")
    parser.add_argument("--trust-remote-code", action="store_true", help="run code shipped with the model")
    parser.add_argument("--allow-pickle", action="store_true",
                        help="allow loading pickle weights (pytorch_model.bin) when a model has no safetensors")
    quant = parser.add_mutually_exclusive_group()
    quant.add_argument("--load-in-4bit", action="store_true", help="nf4 weights via bitsandbytes")
    quant.add_argument("--load-in-8bit", action="store_true", help="LLM.int8 weights via bitsandbytes")


def model_spec(args: argparse.Namespace, path: str, revision: str | None, **fields: object) -> ModelSpec:
    """A ModelSpec from add_model_options' flags (and a command's own `fields`: scorer, PLL, max length)."""
    quantization = "4bit" if args.load_in_4bit else "8bit" if args.load_in_8bit else None
    return ModelSpec(path, args.dtype, args.device, revision, args.trust_remote_code, args.allow_pickle,
                     quantization, **fields)


def add_scorer_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--scorer", default="auto", choices=list(SCORERS),
                        help="causal LM or masked LM (pseudo-log-likelihood); auto: from the model's config")
    parser.add_argument("--pll", default=PLL_VARIANTS[0], choices=list(PLL_VARIANTS),
                        help="a masked LM's PLL: original (Salazar et al.) or word-l2r (Kauf & Ivanova)")


PLACEMENT_TIMEOUT_HELP = ("how long actors no node can hold yet are waited for (an autoscaler adding nodes) before "
                          f"the run stops (default: {PLACEMENT_WAIT_S:g})")


def add_placement_timeout(parser: argparse.ArgumentParser, help: str = PLACEMENT_TIMEOUT_HELP) -> None:
    """--placement-timeout, the flag of every command that starts scoring actors (eval, sweep, ppl, kl)."""
    parser.add_argument("--placement-timeout", type=seconds, metavar="SECONDS", help=help)


def seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0 seconds, got {text!r}")
    return value


def task_names(values: str | list[str]) -> tuple[str, ...]:
    """Task names given comma- and/or space-separated (`--tasks a,b c`), empty pieces dropped."""
    items = [values] if isinstance(values, str) else values
    return tuple(t.strip() for item in items for t in item.split(",") if t.strip())


def output_arg(text: str) -> Path | str:
    """--output: a local directory, or a filesystem URI (s3://bucket/run, raylm.storage.location) kept as written,
    since a Path would fold its `//` into one and name a local directory `s3:`."""
    return text if is_uri(text) else Path(text)


def add_output_option(parser: argparse.ArgumentParser, default: Path | None, what: str) -> None:
    parser.add_argument("--output", type=output_arg, default=default,
                        help=f"directory for {what}; a path or a URI such as s3://bucket/run (docs/storage.md)")


def output_dir(args: argparse.Namespace) -> Path | str:
    if args.command == "sweep":
        return args.output or Path("raylm-sweeps") / args.file.stem
    return args.output

