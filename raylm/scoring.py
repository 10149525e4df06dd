"""The scorer: plain torch, no Ray, so it can be called and tested in-process.

Requests are sorted by length and packed into batches under a token budget with left padding, so every row's
continuation ends at the last position and only those positions go through the LM head (`logits_to_keep`):
the vocabulary projection is never paid for context positions. Token log-probs come from float32 log-softmax
whatever the model dtype, and are summed per request in float64.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Iterator, Sequence

import numpy as np
import torch

log = logging.getLogger(__name__)

CPU_TOKEN_BUDGET = 4096
GPU_START_TOKEN_BUDGET = 65536


class Scorer:
    def __init__(self, model: torch.nn.Module, max_length: int, batch_size: int | None = None,
                 token_budget: int | None = None):
        """batch_size caps requests per batch (`--batch-size N`); None means "auto": fill a token budget."""
        self.model = model.eval()
        self.max_length = max_length
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        default_budget = GPU_START_TOKEN_BUDGET if self.device.type == "cuda" else CPU_TOKEN_BUDGET
        self.token_budget = token_budget or default_budget
        self._keeps_logits = "logits_to_keep" in inspect.signature(model.forward).parameters

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]]
              ) -> tuple[np.ndarray, np.ndarray]:
        """Loglikelihood (float64) and is-greedy for each (context, continuation) request, in input order."""
        inputs, targets = [], []
        for context, continuation in zip(contexts, continuations):
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            inputs.append(whole[:-1])
            targets.append(list(continuation))
        loglik = np.zeros(len(inputs), dtype=np.float64)
        greedy = np.zeros(len(inputs), dtype=bool)
        order = sorted(range(len(inputs)), key=lambda i: -len(inputs[i]))
        pending = order
        while pending:
            done = 0
            try:
                for batch in self._batches(pending, inputs):
                    self._score_batch(batch, inputs, targets, loglik, greedy)
                    done += len(batch)
            except torch.cuda.OutOfMemoryError:
                if self.token_budget <= max(len(inputs[i]) for i in pending[done:done + 1]):
                    raise
                self.token_budget //= 2
                log.warning("out of GPU memory; halving the token budget to %d", self.token_budget)
                torch.cuda.empty_cache()
            pending = pending[done:]
        return loglik, greedy

    def _batches(self, order: list[int], inputs: list[list[int]]) -> Iterator[list[int]]:
        """Longest first, so the first batch is the biggest and the padded width only shrinks."""
        batch: list[int] = []
        width = 0
        for i in order:
            width = max(width, len(inputs[i]))
            full = self.batch_size is not None and len(batch) >= self.batch_size
            if batch and (full or (len(batch) + 1) * width > self.token_budget):
                yield batch
                batch, width = [], len(inputs[i])
            batch.append(i)
        if batch:
            yield batch

    @torch.inference_mode()
    def _score_batch(self, batch: list[int], inputs: list[list[int]], targets: list[list[int]],
                     loglik: np.ndarray, greedy: np.ndarray) -> None:
        width = max(len(inputs[i]) for i in batch)
        keep = max(len(targets[i]) for i in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        mask = torch.zeros(len(batch), width, dtype=torch.long)
        target_ids = torch.zeros(len(batch), keep, dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, width - len(inputs[i]):] = torch.tensor(inputs[i])
            mask[row, width - len(inputs[i]):] = 1
            target_ids[row, keep - len(targets[i]):] = torch.tensor(targets[i])
        # Explicit positions make left padding invisible to the model: each row starts at position 0.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        kwargs = {"logits_to_keep": keep} if self._keeps_logits else {}
        out = self.model(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                         position_ids=positions.to(self.device), **kwargs)
        logits = out.logits[:, -keep:, :].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        target_ids = target_ids.to(self.device)
        token_lp = logprobs.gather(-1, target_ids.unsqueeze(-1)).squeeze(-1).double().cpu().numpy()
        hits = (logprobs.argmax(-1) == target_ids).cpu().numpy()
        for row, i in enumerate(batch):
            n = len(targets[i])
            loglik[i] = token_lp[row, keep - n:].sum()
            greedy[i] = bool(hits[row, keep - n:].all())
