"""`raylm probe`: a masked LM's fill-mask predictions, for texts or for a probe file's matched sentences.

Runs in one process (plain torch, no Ray): a probe is a few hundred sentences, one forward pass each. For each
mask, the top-k tokens with their probabilities and the probability of everything else (from the same softmax,
so the k + 1 numbers sum to 1 and a cut or mis-normalised head shows). For a probe file, each target's
probability at each sentence's mask, and per sentence the log-ratio of every target against the first, the
number a matched-sentence study compares across fills (log P(she) - log P(he) for "The nurse said [MASK] ...").
"""

from __future__ import annotations

import csv
import io
import json
import math
import os
import time
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import torch

from raylm.errors import RaylmError
from raylm.models.loading import load_config, load_model, load_tokenizer, resolve_scorer
from raylm.models.spec import ModelSpec, check_model_path
from raylm.probe.file import ProbeFile
from raylm.probe.plot import plot_log_ratios
from raylm.probe.sentences import ProbeSentence, build_sentences, mask_positions, with_model_mask
from raylm.results.report import run_config
from raylm.scoring.mlm import mask_log_probs
from raylm.scoring.scorer import cpu_token_budget
from raylm.storage.atomic import write_atomic
from raylm.storage.location import Location, location

REST = "(rest)"


@dataclass(frozen=True)
class Prediction:
    """One mask's top-k (token, probability), most probable first, and the probability of every other token."""

    top: tuple[tuple[str, float], ...]
    rest: float


class Prober:
    """A masked LM's tokenizer, and the model itself once it is first needed, so that the sentences of a probe
    file are built and checked before seconds go into loading weights."""

    def __init__(self, spec: ModelSpec):
        check_model_path(spec)
        if resolve_scorer(spec, load_config(spec)) != "mlm":
            raise RaylmError(f"raylm probe needs a masked language model; '{spec.path}' is a causal LM")
        self.tokenizer = load_tokenizer(spec)
        if self.tokenizer.mask_token_id is None:
            raise RaylmError(f"the tokenizer of '{spec.path}' has no mask token")
        self.spec = spec

    @cached_property
    def model(self) -> torch.nn.Module:
        return load_model(self.spec, "mlm")

    def log_probs(self, rows: list[tuple[int, ...]]) -> list[torch.Tensor]:
        return mask_log_probs(self.model, rows, self.tokenizer.mask_token_id, self.tokenizer.pad_token_id,
                              cpu_token_budget(self.model.config))

    def predictions(self, logprobs: torch.Tensor, k: int) -> Prediction:
        top = logprobs.topk(min(k, logprobs.shape[-1]))
        others = logprobs.clone()
        others[top.indices] = -math.inf
        tokens = self.tokenizer.convert_ids_to_tokens(top.indices.tolist())
        return Prediction(tuple(zip(tokens, top.values.exp().tolist())), float(torch.logsumexp(others, 0).exp()))


def fill_masks(prober: Prober, texts: list[str], k: int) -> list[list[Prediction]]:
    """For each text, a Prediction for each of its masks in order ([MASK] or the model's own mask token)."""
    if k < 1:
        raise RaylmError(f"--top-k must be at least 1, got {k}")
    rows = []
    for text in texts:
        ids = tuple(prober.tokenizer(with_model_mask(text, prober.tokenizer))["input_ids"])
        if not mask_positions(ids, prober.tokenizer):
            raise RaylmError(f"--text {text!r} has no mask ([MASK] or the model's own {prober.tokenizer.mask_token})")
        rows.append(ids)
    return [[prober.predictions(lp, k) for lp in per_text] for per_text in prober.log_probs(rows)]


def format_predictions(texts: list[str], predictions: list[list[Prediction]]) -> str:
    lines = []
    for text, per_text in zip(texts, predictions):
        for m, prediction in enumerate(per_text, 1):
            lines.append(f"{text}  (mask {m} of {len(per_text)})")
            width = max(len(REST), *(len(t) for t, _ in prediction.top))
            lines += [f"  {rank:>3}  {token:<{width}}  {p:.6f}" for rank, (token, p) in enumerate(prediction.top, 1)]
            lines.append(f"  {'':>3}  {REST:<{width}}  {prediction.rest:.6f}")
    return "\n".join(lines)


def run_probe_file(prober: Prober, probes: ProbeFile, out_dir: str | os.PathLike[str] | Location, k: int) -> str:
    """Score a probe file, write its outputs under out_dir, and return the summary table (Markdown)."""
    out_dir = location(out_dir)
    if k < 1:
        raise RaylmError(f"--top-k must be at least 1, got {k}")
    start = time.time()
    sentences = build_sentences(probes, prober.tokenizer)
    logprobs = [lp[0] for lp in prober.log_probs([s.ids for s in sentences])]
    targets = [t.text for t in probes.targets]
    names = list(probes.fill)
    scores = [[float(lp[t]) for t in s.targets] for s, lp in zip(sentences, logprobs)]
    template_text = [t.text for t in probes.templates]

    def base(s: ProbeSentence) -> list[Any]:
        fills = dict(s.fills)
        return [template_text[s.template], *(fills.get(n, "") for n in names), s.text]

    probe_rows = [[*base(s), target, prober.tokenizer.convert_ids_to_tokens(t), math.exp(v), v,
                   int((lp > v).sum()) + 1]
                  for s, lp, row in zip(sentences, logprobs, scores) for target, t, v in zip(targets, s.targets, row)]
    topk_rows = []
    for s, lp in zip(sentences, logprobs):
        prediction = prober.predictions(lp, k)
        topk_rows += [[*base(s), rank, token, p] for rank, (token, p) in enumerate(prediction.top, 1)]
        topk_rows.append([*base(s), "", REST, prediction.rest])
    ratios = [[v - row[0] for v in row[1:]] for row in scores]
    ratio_names = [f"log_ratio_{t}_vs_{targets[0]}" for t in targets[1:]]
    summary_header = ["template", *names, "sentence", *(f"logp_{t}" for t in targets), *ratio_names]
    summary_rows = [[*base(s), *row, *ratio] for s, row, ratio in zip(sentences, scores, ratios)]
    head = ["template", *names, "sentence"]
    markdown = _markdown(summary_header, summary_rows)
    write_atomic(out_dir / "probe.csv", _csv([*head, "target", "token", "probability", "log_probability", "rank"],
                                             probe_rows))
    write_atomic(out_dir / "topk.csv", _csv([*head, "rank", "token", "probability"], topk_rows))
    write_atomic(out_dir / "summary.csv", _csv(summary_header, summary_rows))
    write_atomic(out_dir / "summary.md", markdown.encode())
    plot_log_ratios(sentences, ratios, targets, template_text, names, out_dir / "probe.png",
                    f"{Path(prober.spec.path).name}: {len(sentences)} sentences")
    results = {"summary": [dict(zip(summary_header, row)) for row in summary_rows],
               "config": run_config(prober.spec, time.time() - start, command="probe", probes=str(probes.source),
                                    top_k=k, targets=targets)}
    write_atomic(out_dir / "results.json", json.dumps(results, indent=2, default=str).encode())
    return markdown


def _csv(header: list[str], rows: list[list[Any]]) -> bytes:
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(header)
    writer.writerows([[f"{v:.9g}" if isinstance(v, float) else v for v in row] for row in rows])
    return buffer.getvalue().encode()


def _markdown(header: list[str], rows: list[list[Any]]) -> str:
    cells = [[f"{v:.4f}" if isinstance(v, float) else str(v).replace("|", "\\|") for v in row] for row in rows]
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    return "\n".join(lines + ["| " + " | ".join(row) + " |" for row in cells]) + "\n"
