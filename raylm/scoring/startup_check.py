"""The start-up check: before a model no test has proven may pack requests, score a few packed and alone.

The static rule (raylm.scoring.attention) knows the families tests/test_architectures.py proves; for anything
else (remote code, an architecture added to transformers later) it can only guess the mask layout. Each actor
therefore scores a synthetic probe that reaches past any window the config states, plus the first real requests
it is given, both packed under the guessed layout (in tree rows, and over a cached prefix) and one request per
row, and packs only if every request agrees within float tolerance. Any difference, or an exception while packed,
means: score this model unpacked.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raylm.models.loading import text_config
from raylm.scoring.attention import AttentionPlan
from raylm.scoring.scorer import Scorer

# Per request: |packed - alone| <= ATOL_PER_TOKEN[dtype] * tokens + RTOL[dtype] * |loglikelihood|. The check exists to
# catch a wrong mask, so it is as tight as each dtype's noise allows. Packed-vs-alone noise, measured on CPU, is at
# most 5e-7 nats per token in float32. In bfloat16 it grows with the logits (half a bfloat16 step of a logit of 21 is
# 0.06): up to 0.016 nats per token on the architecture matrix's tiny models, up to 0.053 per token and 1.7% of
# |loglikelihood| on stories260K's real rows. The relative term of 2^-8 (one rounding of a loglikelihood) lets
# stories260K's probe pass (0.44 of the bound; 1.8x over the token term alone), while every wrong layout of the
# windowed families still fails at bfloat16, by 1.45x or more (tests/test_architectures.py's bfloat16 controls).
# float16 has 3 more fraction bits: the same token term, a relative term 8x smaller.
ATOL_PER_TOKEN = {torch.float64: 1e-8, torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 2e-2}
RTOL = {torch.float64: 1e-5, torch.float32: 1e-5, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
REAL_REQUESTS = 8  # the first requests of an actor's first shard or batch that join the probe

Requests = tuple[Sequence[Sequence[int]], Sequence[Sequence[int]]]  # contexts and continuations


@dataclass(frozen=True)
class CheckResult:
    agrees: bool
    max_abs: float  # largest |packed - alone| over all requests, nats (inf if packed scoring raised)
    requests: int
    packed_rows: int
    error: str | None  # the exception packed scoring raised, if any

    def verdict(self) -> str:
        if self.error is not None:
            return f"unpacked (start-up check: packed scoring raised {self.error})"
        if self.packed_rows == 0:
            return f"unpacked (start-up check: none of {self.requests} requests could be packed)"
        state = "packed" if self.agrees else "unpacked"
        return f"{state} (start-up check: max |Δ| {self.max_abs:.2g} over {self.requests} requests)"


def longest_window(config, max_length: int) -> int:
    """The widest local-attention span the config states (any integer field named *window* or *chunk*, not a
    layer count such as Qwen2's max_window_layers), so the probe can reach past it; 0 when none."""
    spans = [v for k, v in text_config(config).to_dict().items() if isinstance(v, int) and not isinstance(v, bool)
             and ("window" in k or "chunk" in k) and "layers" not in k and 0 < v < max_length]
    return max(spans, default=0)


def probe_requests(config, max_length: int, seed: int = 0) -> Requests:
    """Synthetic documents whose packed rows reach past every stated window: one long context with three endings
    (two start with the same token, so one prefix column predicts two branches, as HellaSwag's do), and two
    contexts that differ near their end with one shared continuation (as WinoGrande's options do)."""
    vocab = text_config(config).vocab_size
    rnd = np.random.default_rng(seed)
    tail = 12
    length = max(1, min(max_length - tail, max(longest_window(config, max_length) + 24, 48)))
    context = rnd.integers(3, vocab, length).tolist()
    first = int(rnd.integers(3, vocab))
    contexts = [context] * 3
    continuations = [[first, *rnd.integers(3, vocab, 5).tolist()], [first], rnd.integers(3, vocab, 9).tolist()]
    shared_end = rnd.integers(3, vocab, 6).tolist()
    for option in (rnd.integers(3, vocab, 2).tolist(), rnd.integers(3, vocab, 4).tolist()):
        contexts.append(context[: max(1, length - 8)] + option)
        continuations.append(shared_end)
    return contexts, continuations


def packing_check(model: torch.nn.Module, max_length: int, plan: AttentionPlan, real: Requests) -> CheckResult:
    """Score the probe and `real` requests packed under `plan`'s layout and alone; agree within tolerance or not.

    Packed twice: with the usual budget (a document's requests in one tree row) and with rows so short that the
    shared contexts run into a KV cache first and the rows below attend to it (raylm.scoring.tree), so a window
    that fails to reach across a cached prefix is caught as well."""
    candidate = plan.packed("start-up check")
    alone_plan = plan.unpacked("start-up check")
    probe = probe_requests(model.config, max_length)
    short_rows = max(16, len(probe[0][0]) // 4)
    packed_scorers = [Scorer(model, max_length, plan=candidate),
                      Scorer(model, max_length, plan=candidate, token_budget=short_rows)]
    sets = [s for s in (probe, real) if len(s[0])]
    n_requests = sum(len(s[0]) for s in sets)
    diffs, tokens, magnitudes = [], [], []
    for contexts, continuations in sets:
        alone, _ = Scorer(model, max_length, plan=alone_plan).score(contexts, continuations)
        for packed_scorer in packed_scorers:
            try:
                packed, _ = packed_scorer.score(contexts, continuations)
            except Exception as e:  # noqa: BLE001 - any failure of packed scoring means: do not pack this model
                error = f"{type(e).__name__}: {e}".splitlines()[0][:200]
                return CheckResult(False, math.inf, n_requests, sum(p.packed_rows for p in packed_scorers), error)
            diffs.append(np.abs(packed - alone))
            tokens.append(np.array([len(c) for c in continuations]))
            magnitudes.append(np.abs(alone))
    diff, n_tokens, magnitude = np.concatenate(diffs), np.concatenate(tokens), np.concatenate(magnitudes)
    dtype = getattr(model, "dtype", torch.float32)
    atol, rtol = ATOL_PER_TOKEN.get(dtype, ATOL_PER_TOKEN[torch.bfloat16]), RTOL.get(dtype, RTOL[torch.bfloat16])
    packed_rows = sum(p.packed_rows for p in packed_scorers)
    agrees = bool(np.all(diff <= atol * n_tokens + rtol * magnitude)) and packed_rows > 0
    return CheckResult(agrees, float(diff.max()), n_requests, packed_rows, None)


def checked_plan(model: torch.nn.Module, max_length: int, plan: AttentionPlan, real: Requests) -> AttentionPlan:
    """The plan to score with: `plan` itself unless it waits for a check, else packed or unpacked by the check."""
    if not plan.needs_check:
        return plan
    result = packing_check(model, max_length, plan, real)
    return plan.packed(result.verdict()) if result.agrees else plan.unpacked(result.verdict())

