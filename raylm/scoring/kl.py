"""KL(P || Q) between two models' next-token distributions at scored positions: plain torch, no Ray.

Requests are the same (context, continuation) pairs the Scorer takes, so a corpus is windowed once and both
models see identical inputs. Both distributions are log-softmaxed in float32 and compared in log space,
sum p * (log p - log q) with p = exp(log p): a token Q gives almost no mass costs a large but finite amount,
never inf or nan. Per-position values are summed per request in float64.

Two models that share a tokenizer may still differ in logits width: Pythia's sizes pad their embedding matrices
to different multiples (50,304 rows for pythia-160m, 50,688 for pythia-12b, for the same 50,277-id tokenizer).
Given `width`, both distributions are taken over the first `width` ids only, each renormalised there: the rows
past the tokenizer's ids are padding no text is encoded to (raylm.corpus.run decides the width, from the configs,
before any weights load).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from raylm.errors import RaylmError
from raylm.models.devices import input_device
from raylm.scoring.batching import TokenBudget, budget_batches, halving_on_oom
from raylm.scoring.scorer import model_input

# Two models' logits plus temporaries per kept position: a smaller budget than the Scorer's.
CPU_TOKEN_BUDGET = 2048
GPU_TOKEN_BUDGET = 16384


@dataclass
class KLScores:
    """Per request: summed KL(P||Q) and NLL of each model over its continuation, and argmax disagreements."""

    kl: np.ndarray
    nll_p: np.ndarray
    nll_q: np.ndarray
    disagree: np.ndarray


class KLScorer:
    def __init__(self, model_p: torch.nn.Module, model_q: torch.nn.Module, max_length: int,
                 token_budget: int | None = None, width: int | None = None):
        """`width`: compare over the first `width` ids (models whose logits differ in width); None: all of them,
        which must then be as wide in both."""
        self.model_p, self.model_q = model_p.eval(), model_q.eval()
        self.max_length = max_length
        self.width = width
        self.device = input_device(model_p)  # where P's distribution, and so the comparison, lives
        self.budget = TokenBudget(token_budget or (GPU_TOKEN_BUDGET if self.device.type == "cuda"
                                                   else CPU_TOKEN_BUDGET))
        self._keeps_logits = {id(m): "logits_to_keep" in inspect.signature(m.forward).parameters
                              for m in (model_p, model_q)}

    @property
    def token_budget(self) -> int:
        return self.budget.tokens

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]) -> KLScores:
        inputs, targets = [], []
        for context, continuation in zip(contexts, continuations):
            inputs.append(model_input(context, continuation, self.max_length))
            targets.append(list(continuation))
        n = len(inputs)
        out = KLScores(np.zeros(n), np.zeros(n), np.zeros(n), np.zeros(n, dtype=np.int64))

        def batches(pending: list[int], budget: int):
            for batch in budget_batches(pending, lambda i: len(inputs[i]), budget):
                yield batch, batch, len(batch) == 1

        halving_on_oom(list(range(n)), batches, lambda batch: self._score_batch(batch, inputs, targets, out),
                       self.budget)
        return out

    @torch.inference_mode()
    def _score_batch(self, batch: list[int], inputs: list[list[int]], targets: list[list[int]],
                     out: KLScores) -> None:
        width = max(len(inputs[i]) for i in batch)
        keep = max(len(targets[i]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        target_ids = torch.zeros(len(batch), keep, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, width - len(inputs[i]):] = torch.tensor(inputs[i])
            mask[row, width - len(inputs[i]):] = 1
            target_ids[row, keep - len(targets[i]):] = torch.tensor(targets[i])
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logp = self._logprobs(self.model_p, ids, mask, positions, keep)
        logq = self._logprobs(self.model_q, ids, mask, positions, keep).to(logp.device)
        if logp.shape[-1] != logq.shape[-1]:
            raise RaylmError(f"the two models' logits are {logp.shape[-1]} and {logq.shape[-1]} ids wide, which their "
                             "configs did not say; KL compares distributions over the same ids")
        kl = (logp.exp() * (logp - logq)).sum(-1).double().cpu().numpy()
        target_ids = target_ids.to(logp.device).unsqueeze(-1)
        nll_p = -logp.gather(-1, target_ids).squeeze(-1).double().cpu().numpy()
        nll_q = -logq.gather(-1, target_ids).squeeze(-1).double().cpu().numpy()
        disagree = (logp.argmax(-1) != logq.argmax(-1)).cpu().numpy()
        for row, i in enumerate(batch):
            scored = slice(keep - len(targets[i]), keep)
            out.kl[i] = kl[row, scored].sum()
            out.nll_p[i] = nll_p[row, scored].sum()
            out.nll_q[i] = nll_q[row, scored].sum()
            out.disagree[i] = int(disagree[row, scored].sum())

    def _logprobs(self, model: torch.nn.Module, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor,
                  keep: int) -> torch.Tensor:
        """float32 log-softmax over the last `keep` positions (and the first `width` ids); left padding hidden by
        explicit positions."""
        kwargs = {"logits_to_keep": keep} if self._keeps_logits[id(model)] else {}
        device = input_device(model)
        logits = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                       **kwargs).logits[:, -keep:, :self.width]
        return torch.log_softmax(logits.float(), dim=-1)
