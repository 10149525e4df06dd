"""`raylm ppl --dry-run` and `raylm kl --dry-run`: what a corpus run would compute and cost, from its config, the
models' configs and tokenizer and the corpus alone. The run's own steps decide the lengths (raylm.corpus.run.
plan_corpus), the documents are read as the run reads them and cut into its batches (raylm.corpus.read.
read_documents, in this process), each batch is windowed as an actor windows it (raylm.requests.documents), and
the scorer's own planner counts the tokens its forward passes would run (raylm.scoring.shape for ppl,
raylm.scoring.kl.planned_kl_tokens for kl). raylm.cluster.pricing prices it as it prices `raylm eval`'s plan.
No weight is read, no Ray started, no actor asked for. plan.json's fields are described in docs/dry-run.md."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

from raylm.cluster.estimate import CPU_RUN_START_S, STREAM_START_S
from raylm.cluster.placement import Ask
from raylm.cluster.pricing import RATES_NOTE, cost_table, count, model_entry, model_line, price, publish
from raylm.corpus import READ_CPUS
from raylm.corpus.read import read_documents
from raylm.corpus.run import KL_PREFIX_SHARING, CorpusConfig, Plan, plan_corpus
from raylm.models.loading import load_tokenizer
from raylm.requests.documents import document_texts, window_documents
from raylm.requests.encoding import Encoder
from raylm.requests.masked import UNSCORED, MaskedEncoder
from raylm.scoring.kl import planned_kl_tokens
from raylm.scoring.mlm import MASKED_PREFIX_SHARING
from raylm.scoring.shape import DEVICES, ModelShape, model_shape
from raylm.storage.location import location, redact


def corpus_plan(cfg: CorpusConfig, out: str | os.PathLike[str] | None) -> dict[str, Any]:
    """The plan of `raylm ppl` (or `raylm kl`, with cfg.model_b) with this config, as plan.json holds it."""
    cfg.validate()
    plan = plan_corpus(cfg)
    cfg = plan.config
    shapes = [model_shape(spec, None) for spec in (cfg.model, cfg.model_b) if spec is not None]
    corpus = _count(plan, shapes[0])
    sharing = (KL_PREFIX_SHARING if cfg.model_b is not None else MASKED_PREFIX_SHARING if plan.scorer == "mlm"
               else shapes[0].shapes["cpu"].plan.prefix_sharing)
    ask = Ask(cfg.model.device, None, None, cfg.actors, READ_CPUS)
    return {
        "command": cfg.kind,
        "output": str(location(out)) if out is not None else None,
        "data": redact(cfg.data),
        "model": model_entry(cfg.model, shapes[0], sharing),
        "model_b": model_entry(cfg.model_b, shapes[1], sharing) if cfg.model_b is not None else None,
        "max_length": plan.max_length, "stride": plan.stride, "kl_width": plan.kl_width,
        "docs_per_batch": cfg.docs_per_batch,
        "corpus": corpus,
        # Each token runs through both models of a KL run, on one actor that holds both.
        "cost": price(ask, sum(s.parameters for s in shapes), sum(s.weights_bytes for s in shapes),
                      corpus["computed"], corpus["in_requests"], CPU_RUN_START_S + STREAM_START_S),
    }


def _count(plan: Plan, shape: ModelShape) -> dict[str, Any]:
    """Documents, scored tokens, windows, their tokens and the tokens computed per device type, batch by batch as
    the run's actors count them."""
    cfg = plan.config
    tokenizer = load_tokenizer(cfg.model)
    total: dict[str, Any] = {"documents": 0, "batches": 0, "tokens": 0, "windows": 0, "in_requests": 0,
                             "computed": {device: 0 for device in DEVICES}, "computed_exact": plan.scorer != "mlm"}
    encoder = Encoder(tokenizer, plan.max_length)
    scoring = {device: replace(s, max_length=plan.max_length) for device, s in shape.shapes.items()}
    for batch in read_documents(cfg.data, cfg.fmt, cfg.text_column, cfg.limit_docs, cfg.domain_column,
                                cfg.docs_per_batch):
        total["documents"] += batch.num_rows
        total["batches"] += 1
        if plan.scorer == "mlm":
            windowed = MaskedEncoder(tokenizer, plan.max_length).document_windows(document_texts(batch), plan.stride)
            windows = [w for doc in windowed for w in doc]
            total["tokens"] += sum(t != UNSCORED for w in windows for t in w.word_ids)
            total["windows"] += len(windows)
            total["in_requests"] += sum(w.length for w in windows)
            total["computed"] = {device: None for device in DEVICES}
            continue
        docs = window_documents(batch, encoder, plan.stride)
        total["tokens"] += sum(docs.tokens)
        total["windows"] += len(docs.contexts)
        if cfg.model_b is not None:
            counted = {device: planned_kl_tokens(docs.contexts, docs.continuations, plan.max_length)
                       for device in DEVICES}
        else:
            counted = {device: s.tokens(docs.contexts, docs.continuations) for device, s in scoring.items()}
        total["in_requests"] += counted["cpu"][0]
        for device, (_, computed) in counted.items():
            total["computed"][device] += computed
    return total


def format_corpus_plan(p: dict[str, Any]) -> str:
    """The plan as the tables the command prints."""
    c = p["corpus"]
    unit = "computed per model" if p["command"] == "kl" else "computed"
    lines = [f"corpus {p['data']}: {c['documents']:,} documents in {c['batches']:,} batches of "
             f"{p['docs_per_batch']}; windows of {p['max_length']:,} tokens, stride {p['stride']:,}",
             f"{'documents':>10} {'tokens':>12} {'windows':>9} {'request tokens':>15} {unit + ' (CPU)':>26} "
             f"{unit + ' (GPU)':>26}",
             f"{c['documents']:>10,} {c['tokens']:>12,} {c['windows']:>9,} {c['in_requests']:>15,} "
             f"{count(c['computed']['cpu']):>26} {count(c['computed']['cuda']):>26}", "",
             model_line(p["model"])]
    if p["model_b"] is not None:
        lines.append(model_line(p["model_b"]))
    lines += ["", *cost_table(p["cost"]), RATES_NOTE]
    return "\n".join(lines)


def print_corpus_plan(cfg: CorpusConfig, out: str | os.PathLike[str] | None) -> int:
    """`raylm ppl --dry-run`, `raylm kl --dry-run`: the plan printed, and written to the output folder."""
    plan_json = corpus_plan(cfg, out)
    return publish(format_corpus_plan(plan_json), plan_json, out)
