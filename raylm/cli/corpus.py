"""`raylm ppl` and `raylm kl`: perplexity and KL divergence over streamed corpora (raylm.corpus.run)."""

from __future__ import annotations

import argparse

from raylm.cli.options import (add_model_options, add_output_option, add_placement_timeout, add_scorer_options,
                               model_spec)
from raylm.cli.run_dirs import corpus_dir
from raylm.corpus import CHECKPOINT_EVERY_S, SCORING_DOCS_PER_BATCH
from raylm.corpus.read import FORMATS as CORPUS_FORMATS
from raylm.models.spec import PLL_VARIANTS
from raylm.storage.location import prepare_output


def add_corpus_commands(sub: argparse._SubParsersAction) -> None:
    ppl = sub.add_parser("ppl", help="perplexity of a model over a corpus (Parquet, JSONL or text), streamed")
    kl = sub.add_parser("kl", help="mean KL(P||Q) per token between --model (P) and --model-b (Q) over a corpus")
    kl.add_argument("--model-b", required=True, help="hub id or local directory of Q (same tokenizer as P)")
    kl.add_argument("--model-b-revision", help="Q's revision on the hub (--revision is P's; the other model flags "
                                               "apply to both)")
    for p in (ppl, kl):
        p.add_argument("--model", required=True, help="hub id or local directory")
        p.add_argument("--data", required=True, help="file, directory or glob; local or any pyarrow filesystem URI")
        p.add_argument("--format", dest="fmt", default="auto", choices=list(CORPUS_FORMATS),
                       help="auto: from the file extension; txt is one document per non-empty line")
        p.add_argument("--text-column", default="text", help="column holding the documents (Parquet, JSONL)")
        p.add_argument("--domain-column", help="column whose values group the documents into domains, or 'path' "
                                               "(each file a domain): figures per domain and their macro average")
        p.add_argument("--max-length", type=int, help="tokens per window (default and upper bound: the model's)")
        p.add_argument("--stride", type=int, help="new tokens scored per window (default: max length, disjoint)")
        p.add_argument("--actors", type=int, help="model actors (default: one per GPU the cluster has or can grow "
                       "to, up to 16; else one on CPU)")
        add_placement_timeout(p, "how long the model actors may take to start, placed and loaded (Ray Data's "
                                 "wait_for_min_actors_s); default: as long as it takes")
        p.add_argument("--limit-docs", type=int, help="first N documents only")
        p.add_argument("--docs-per-batch", type=int, default=SCORING_DOCS_PER_BATCH)
        add_model_options(p)
        label = "kl-<model b>" if p is kl else "ppl"
        add_output_option(p, None, "results.json and the checkpoint a rerun resumes from (default: raylm-out/<model>/"
                                   f"{label}-<data>-<digest>, one per command line)")
        p.add_argument("--overwrite", action="store_true",
                       help="discard results and checkpoint a different run left in --output")
        p.add_argument("--checkpoint-every", type=float, default=CHECKPOINT_EVERY_S, metavar="SECONDS",
                       help="save the documents scored so far under --output this often, for a rerun of the same "
                            f"command to resume from (default {CHECKPOINT_EVERY_S:g})")
        p.add_argument("--no-progress", action="store_true",
                       help="no progress bar on stderr (it counts documents scored)")
        p.add_argument("--dry-run", action="store_true",
                       help="print and write (plan.json in --output) what the run would compute and cost, from the "
                            "models' configs, tokenizer and the corpus alone: no weights loaded, no Ray started "
                            "(docs/dry-run.md)")
        p.set_defaults(run=run_corpus_command)
    add_scorer_options(ppl)


def run_corpus_command(args: argparse.Namespace) -> int:
    from raylm.corpus.run import CorpusConfig, run_corpus

    spec_b = model_spec(args, args.model_b, args.model_b_revision) if args.command == "kl" else None
    spec = model_spec(args, args.model, args.revision, scorer=getattr(args, "scorer", "auto"),
                      pll=getattr(args, "pll", PLL_VARIANTS[0]))
    cfg = CorpusConfig(spec, args.data, spec_b, args.fmt, args.text_column,
                       args.max_length, args.stride, args.actors, args.limit_docs, args.docs_per_batch,
                       not args.no_progress, args.placement_timeout, args.domain_column, args.overwrite,
                       args.checkpoint_every)
    cfg.validate()
    if args.output is None:
        args.output = corpus_dir(cfg)
        print(f"writing to {args.output}; the same command resumes from it", flush=True)
    if args.dry_run:
        from raylm.corpus.dry_run import print_corpus_plan

        return print_corpus_plan(cfg, args.output)
    out = prepare_output(args.output)
    result = run_corpus(cfg, out)
    metrics = {k: v for k, v in result.metrics.items() if not isinstance(v, dict)}
    for key, value in metrics.items():
        print(f"{args.command:<4} {key:<24} {value:>16.6f}" if isinstance(value, float) else
              f"{args.command:<4} {key:<24} {value:>16d}")
    if "domains" in result.metrics:
        print(domain_table(result.metrics))
    if result.scorer == "mlm":
        print(f"pseudo-perplexities of a masked LM ({args.pll} PLL): not comparable with a causal LM's perplexity")
    print(f"wall time {result.wall_s:.1f} s; {result.docs_resumed} of {int(result.metrics['docs'])} documents "
          f"resumed from checkpoint; results written to {out / 'results.json'}")
    return 0


def domain_table(metrics: dict) -> str:
    """Every domain's documents, tokens and figures, then their macro average, as a plain-text table."""
    figures = list(metrics["macro"])
    rows = [[name, str(m["docs"]), str(m["tokens"]), *(f"{m[k]:.6f}" for k in figures)]
            for name, m in metrics["domains"].items()]
    rows.append(["macro average", "", "", *(f"{metrics['macro'][k]:.6f}" for k in figures)])
    header = ["domain", "docs", "tokens", *figures]
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
                     for r in [header, *rows])
