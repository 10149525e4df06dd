"""KL(P || Q) between two models' next-token distributions at scored positions: plain torch, no Ray.

Requests are the same (context, continuation) pairs the Scorer takes, so a corpus is windowed once and both
models see identical inputs. Both distributions are log-softmaxed in float32 and compared in log space,
sum p * (log p - log q) with p = exp(log p): a token Q gives almost no mass costs a large but finite amount,
never inf or nan. Per-position values are summed per request in float64.

Logits stay within a budget, as the Scorer's do (LOGITS_BUDGET_BYTES): only positions that predict a continuation
token reach either LM head (raylm.scoring.scorer.gather_head_inputs), batches are cut so that no forward pass
computes more of them than the budget holds, and a request that predicts more (an 8k window on a 128k vocabulary
is 4 GiB of float32 logits per model) runs in pieces, each continuing from both models' KV caches of the pieces
before it, as generation runs over its cache. Rows are right-padded with no mask, so that the model builds its own
attention for each request exactly as for one request alone.

Two models that share a tokenizer may still differ in logits width: Pythia's sizes pad their embedding matrices
to different multiples (50,304 rows for pythia-160m, 50,688 for pythia-12b, for the same 50,277-id tokenizer).
Given `width`, both distributions are taken over the first `width` ids only, each renormalised there: the rows
past the tokenizer's ids are padding no text is encoded to (raylm.corpus.run decides the width, from the configs,
before any weights load).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from transformers import DynamicCache

from raylm.errors import RaylmError
from raylm.models.devices import input_device
from raylm.scoring.batching import TokenBudget, budget_batches, halving_on_oom
from raylm.scoring.scorer import (forward, gather_head_inputs, logits_budget_bytes, max_predicted_positions,
                                  model_input)

# Two models' activations per token: a smaller token budget than the Scorer's.
CPU_TOKEN_BUDGET = 2048
GPU_TOKEN_BUDGET = 16384
# At the peak a predicted position holds four float32 rows of the vocabulary (P's and Q's log-probs, their
# difference, P's probabilities): one model's logits may take this share of the budget.
LOGITS_SHARE = 4


def planned_kl_tokens(contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], max_length: int
                      ) -> tuple[int, int]:
    """(tokens in requests, tokens each model computes) of one KLScorer.score call, with no model: every request
    with a continuation runs its input once, in one row of its own (a long one in pieces over the KV cache, which
    split the input without repeating a token), whatever the batches and the token budget."""
    inputs = [model_input(c, t, max_length) for c, t in zip(contexts, continuations)]
    return sum(len(x) for x in inputs), sum(len(x) for x, t in zip(inputs, continuations) if t)


@dataclass
class KLScores:
    """Per request: summed KL(P||Q) and NLL of each model over its continuation, and argmax disagreements."""

    kl: np.ndarray
    nll_p: np.ndarray
    nll_q: np.ndarray
    disagree: np.ndarray


# One forward pass: its rows' tokens, and per predicted position (row, column, request, continuation index).
Pass = tuple[list[list[int]], list[tuple[int, int, int, int]]]


class KLScorer:
    def __init__(self, model_p: torch.nn.Module, model_q: torch.nn.Module, max_length: int,
                 token_budget: int | None = None, width: int | None = None, logits_budget: int | None = None):
        """`width`: compare over the first `width` ids (models whose logits differ in width); None: all of them,
        which must then be as wide in both. `logits_budget` (bytes; default logits_budget_bytes for P's device)
        bounds the logits of both models and the comparison's temporaries in one forward pass."""
        self.model_p, self.model_q = model_p.eval(), model_q.eval()
        self.max_length = max_length
        self.width = width
        self.device = input_device(model_p)  # where P's distribution, and so the comparison, lives
        self.budget = TokenBudget(token_budget or (GPU_TOKEN_BUDGET if self.device.type == "cuda"
                                                   else CPU_TOKEN_BUDGET))
        self.computed_tokens = 0  # token columns each model has run so far (padding excluded), as Scorer counts
        budget = logits_budget or logits_budget_bytes(self.device.type)
        self.max_predicted = min(max_predicted_positions(m, m.get_output_embeddings(), budget // LOGITS_SHARE)
                                 for m in (model_p, model_q))

    @property
    def token_budget(self) -> int:
        return self.budget.tokens

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> KLScores:
        inputs, targets = [], []
        for context, continuation in zip(contexts, continuations):
            inputs.append(model_input(context, continuation, self.max_length))
            targets.append(list(continuation))
        # Per request, per continuation token: KL, NLL under P, NLL under Q, argmax disagreement.
        values = [np.zeros((4, len(t))) for t in targets]

        def batches(pending: list[int], budget: int) -> Iterator[tuple[list[Pass], list[int], bool]]:
            for batch in budget_batches(pending, lambda i: len(inputs[i]), budget, weight=lambda i: len(targets[i]),
                                        max_weight=self.max_predicted):
                yield self._passes(batch, inputs, targets), batch, len(batch) == 1

        predicting = [i for i, t in enumerate(targets) if t]
        halving_on_oom(predicting, batches, lambda passes: self._score(passes, targets, values), self.budget)
        sums = np.array([v.sum(axis=1) for v in values]).reshape(len(values), 4)
        return KLScores(sums[:, 0], sums[:, 1], sums[:, 2], sums[:, 3].astype(np.int64))

    def _passes(self, batch: list[int], inputs: list[list[int]], targets: list[list[int]]) -> list[Pass]:
        """One pass for a batch; a request alone that predicts more than the budget holds, one pass per piece of at
        most max_predicted predicted positions, each over the cache of those before (its context runs with the
        first)."""
        if len(batch) > 1 or len(targets[batch[0]]) <= self.max_predicted:
            rows = [inputs[i] for i in batch]
            return [(rows, [(r, len(inputs[i]) - len(targets[i]) + t, i, t) for r, i in enumerate(batch)
                            for t in range(len(targets[i]))])]
        i = batch[0]
        first = len(inputs[i]) - len(targets[i])  # the input column that predicts the first continuation token
        passes, start = [], 0
        for lo in range(0, len(targets[i]), self.max_predicted):
            hi = min(len(targets[i]), lo + self.max_predicted)
            passes.append(([inputs[i][start:first + hi]], [(0, first + t - start, i, t) for t in range(lo, hi)]))
            start = first + hi
        return passes

    @torch.inference_mode()
    def _score(self, passes: list[Pass], targets: list[list[int]], values: list[np.ndarray]) -> None:
        """Run the passes in order, the KV caches carried from each to the next when there are several."""
        caches = (DynamicCache(), DynamicCache()) if len(passes) > 1 else (None, None)
        for rows, predicts in passes:
            logp = self._logprobs(self.model_p, rows, predicts, caches[0])
            logq = self._logprobs(self.model_q, rows, predicts, caches[1]).to(logp.device)
            self.computed_tokens += sum(len(row) for row in rows)  # once both passes ran (not a pass out of memory)
            if logp.shape[-1] != logq.shape[-1]:
                raise RaylmError(f"the two models' logits are {logp.shape[-1]} and {logq.shape[-1]} ids wide, which "
                                 "their configs did not say; KL compares distributions over the same ids")
            target_ids = torch.tensor([targets[i][t] for _, _, i, t in predicts], device=logp.device)[:, None]
            nll_p = -logp.gather(-1, target_ids).squeeze(-1)
            nll_q = -logq.gather(-1, target_ids).squeeze(-1)
            disagree = logp.argmax(-1) != logq.argmax(-1)
            kl = (logp - logq).mul_(logp.exp()).sum(-1)
            per_position = torch.stack([kl.double(), nll_p.double(), nll_q.double(), disagree.double()]).cpu().numpy()
            for k, (_, _, i, t) in enumerate(predicts):
                values[i][:, t] = per_position[:, k]

    def _logprobs(self, model: torch.nn.Module, rows: list[list[int]], predicts: list[tuple[int, int, int, int]],
                  cache: DynamicCache | None) -> torch.Tensor:
        """float32 log-softmax at the predicted positions only (over the first `width` ids), one row per position."""
        width = max(len(row) for row in rows)
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.tensor(row)
        flat = torch.tensor([r * width + col for r, col, _, _ in predicts], dtype=torch.long)
        device = input_device(model)
        with gather_head_inputs(model.get_output_embeddings(), flat, len(rows), width):
            logits = forward(model, ids.to(device), cache).logits
        return torch.log_softmax(logits[0, :, :self.width].float(), dim=-1)
