"""Pseudo-log-likelihood scoring of masked language models: plain torch, no Ray, so it runs and is tested in-process.

PLL (Salazar et al., 2020): a request's loglikelihood is the sum over its continuation tokens of
log P(token | every other token), each token masked in its own copy of the input. Context tokens are never masked;
tokens the request marks UNSCORED (special tokens) are never scored. "word-l2r" (Kauf & Ivanova, 2023; minicons'
`within_word_l2r`) also masks, in each copy, the later tokens of the masked token's word, so a word's first piece
cannot be read off its own later pieces and a multi-piece word's score is a chain-rule probability.

Speed: every copy of every request is one model row. Rows go longest first into batches under a token budget
(raylm.scoring.batching), so a request's copies share a batch when they fit and short requests of different
documents share one. The encoder runs over whole rows (each copy's bidirectional attention differs everywhere, so
there is no shared work to skip), but the head (transform and vocabulary projection, about a fifth of BERT-base's
work per position) runs only at each row's one scored position. Log-softmax runs in float32 (float64 for a float64
model), sums in float64.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch

from raylm.models.loading import load_model, load_tokenizer
from raylm.models.spec import PLL_VARIANTS, ModelSpec
from raylm.requests.masked import UNSCORED
from raylm.scoring.batching import TokenBudget, budget_batches, halving_on_oom
from raylm.scoring.scorer import GPU_START_TOKEN_BUDGET, cpu_token_budget

log = logging.getLogger(__name__)

# config.prefix_sharing for a masked LM: every masked copy is a row of its own, nothing is packed.
MASKED_PREFIX_SHARING = "unpacked (masked LM: each masked copy is its own row)"


@dataclass(frozen=True)
class MaskedCopy:
    """One model row: request `request`'s tokens with `masked` columns replaced by the mask token; `target` is
    the column scored."""

    request: int
    width: int
    target: int
    masked: tuple[int, ...]


def masked_copies(start: int, word_ids: Sequence[int], variant: str) -> Iterator[tuple[int, tuple[int, ...]]]:
    """(scored column, masked columns) of each copy of a request whose continuation starts at column `start`."""
    if variant not in PLL_VARIANTS:
        raise ValueError(f"unknown PLL variant {variant!r} (use {', '.join(PLL_VARIANTS)})")
    for k, word in enumerate(word_ids):
        if word == UNSCORED:
            continue
        later = [start + j for j in range(k + 1, len(word_ids)) if word_ids[j] == word] \
            if variant == "word-l2r" else []
        yield start + k, (start + k, *later)


@contextmanager
def head_at_masked_positions(model: torch.nn.Module, flat: torch.Tensor) -> Iterator[None]:
    """Within the block, the model's logits are (1, len(flat), vocab): the rows `flat` of (batch x width).

    Every *ForMaskedLM is encoder -> position-wise head, the head shaped differently per family (BERT's `cls`,
    RoBERTa's `lm_head`, DistilBERT's inline vocab_transform/projector, ELECTRA's generator head, DeBERTa's
    `cls` or `lm_predictions`, ModernBERT's `head` + `decoder`); what they share is that forward reads the
    encoder's output as outputs[0]. A forward hook on `model.base_model` that replaces the last hidden state
    with the gathered rows makes whatever head the family has see only those rows, its own code (biases, norms,
    tied weights) unchanged. Hooking get_output_embeddings(), as the causal scorer does, would be only the
    decoder for most families, leaving the transform to run at every position.
    """
    encoder = model.base_model
    if encoder is model:
        raise ValueError(f"{type(model).__name__} has no separate encoder (base_model) to cut its head from")

    def gather(_module: torch.nn.Module, _args: object, output: object) -> object:
        hidden = output[0]
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat).unsqueeze(0)
        if isinstance(output, tuple):
            return (picked, *output[1:])
        output["last_hidden_state"] = picked
        return output

    handle = encoder.register_forward_hook(gather)
    try:
        yield
    finally:
        handle.remove()


def padded_batch(rows: Sequence[Sequence[int]], pad_token_id: int, device: torch.device
                 ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Right-padded ids, and an attention mask only when some row is padded (the model's fast path otherwise)."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_token_id, dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    for i, row in enumerate(rows):
        ids[i, :len(row)] = torch.as_tensor(row)
    if bool((lengths == width).all()):
        return ids.to(device), None
    return ids.to(device), (torch.arange(width)[None, :] < lengths[:, None]).long().to(device)


@torch.inference_mode()
def log_probs_at(model: torch.nn.Module, ids: torch.Tensor, attention_mask: torch.Tensor | None,
                 flat: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the vocabulary at the positions `flat` of (batch x width), in float32 or wider."""
    with head_at_masked_positions(model, flat):
        logits = model(input_ids=ids, attention_mask=attention_mask).logits[0]
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def mask_log_probs(model: torch.nn.Module, rows: Sequence[Sequence[int]], mask_token_id: int, pad_token_id: int,
                   token_budget: int) -> list[torch.Tensor]:
    """For each row, the log-softmax over the vocabulary at each of its mask tokens (masks x vocab, in column
    order): fill-mask, with every mask of a row masked at once and the head run only at the masks."""
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [torch.empty(0)] * len(rows)
    for batch in budget_batches(range(len(rows)), lambda i: len(rows[i]), token_budget):
        ids, attention = padded_batch([rows[i] for i in batch], pad_token_id, device)
        where = (ids == mask_token_id).nonzero()
        logprobs = log_probs_at(model, ids, attention, where[:, 0] * ids.shape[1] + where[:, 1]).cpu()
        counts = torch.bincount(where[:, 0].cpu(), minlength=len(batch)).tolist()
        for i, part in zip(batch, logprobs.split(counts)):
            out[i] = part
    return out


class MaskedScorer:
    def __init__(self, model: torch.nn.Module, mask_token_id: int, pad_token_id: int, variant: str = "original",
                 batch_size: int | None = None, token_budget: int | None = None):
        """batch_size caps masked copies (model rows) per batch (`--batch-size N`); None fills a token budget."""
        if variant not in PLL_VARIANTS:
            raise ValueError(f"unknown PLL variant {variant!r} (use {', '.join(PLL_VARIANTS)})")
        self.model = model.eval()
        self.mask_token_id = mask_token_id
        self.pad_token_id = pad_token_id
        self.variant = variant
        self.batch_size = batch_size
        self.device = next(model.parameters()).device
        if token_budget is None:
            token_budget = GPU_START_TOKEN_BUDGET if self.device.type == "cuda" else cpu_token_budget(model.config)
        self.budget = TokenBudget(token_budget)

    @property
    def token_budget(self) -> int:
        return self.budget.tokens

    @classmethod
    def from_spec(cls, spec: ModelSpec, batch_size: int | None = None) -> MaskedScorer:
        """spec's masked LM, scored with spec's PLL variant; the mask and pad ids come from its tokenizer
        (RoBERTa's config states no mask id)."""
        tokenizer = load_tokenizer(spec)
        return cls(load_model(spec, "mlm"), tokenizer.mask_token_id, tokenizer.pad_token_id, spec.pll, batch_size)

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
              followings: Sequence[Sequence[int]], word_ids: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
        """PLL (float64) and is-greedy (every scored position's argmax is its token) per request, in input order.

        The model sees context + continuation + following; word_ids gives each continuation token its word (or
        UNSCORED). A request with nothing to score gets 0.0 and True: an empty sum and an empty conjunction.
        """
        rows = [list(c) + list(k) + list(f) for c, k, f in zip(contexts, continuations, followings)]
        copies = [MaskedCopy(i, len(rows[i]), target, masked) for i in range(len(rows))
                  for target, masked in masked_copies(len(contexts[i]), word_ids[i], self.variant)]
        loglik = np.zeros(len(rows), dtype=np.float64)
        greedy = np.ones(len(rows), dtype=bool)

        def batches(pending: list[MaskedCopy], budget: int) -> Iterator[tuple[list[MaskedCopy], list[MaskedCopy],
                                                                                 bool]]:
            for batch in budget_batches(pending, lambda c: c.width, budget, max_members=self.batch_size):
                yield batch, batch, len(batch) == 1

        halving_on_oom(copies, batches, lambda batch: self._score_batch(batch, rows, loglik, greedy), self.budget)
        return loglik, greedy

    def _score_batch(self, batch: list[MaskedCopy], rows: list[list[int]], loglik: np.ndarray,
                     greedy: np.ndarray) -> None:
        ids, attention = padded_batch([rows[c.request] for c in batch], self.pad_token_id, self.device)
        width = ids.shape[1]
        masked_rows = [r for r, c in enumerate(batch) for _ in c.masked]
        masked_cols = [col for c in batch for col in c.masked]
        ids[masked_rows, masked_cols] = self.mask_token_id
        flat = torch.tensor([r * width + c.target for r, c in enumerate(batch)], device=self.device)
        targets = torch.tensor([rows[c.request][c.target] for c in batch], device=self.device)
        logprobs = log_probs_at(self.model, ids, attention, flat)
        token_lp = logprobs.gather(1, targets[:, None])[:, 0].double().cpu().numpy()
        hits = (logprobs.argmax(dim=-1) == targets).cpu().numpy()
        owners = np.array([c.request for c in batch])
        np.add.at(loglik, owners, token_lp)
        np.logical_and.at(greedy, owners, hits)
