"""The scorer: plain torch, no Ray, so it can be called and tested in-process.

Consecutive requests that share a token prefix (a document's endings) are packed into one row that runs the
prefix once (raylm.scoring.packing), where the model's attention plan allows it (raylm.scoring.attention). Rows
are sorted by length and packed into batches under a token budget with right padding. A batch holding a packed
row gets branch positions and the plan's masks; any other batch gets no mask and no positions, so the model builds
its own causal, sliding-window or ALiBi attention exactly as for one request. Only the hidden states that predict
continuation tokens reach the LM head: the vocabulary projection, as costly as the whole body for a GPT-2-sized
model, is never paid for context positions. Token log-probs come from float32 logits whatever the model dtype,
and are summed per request in float64.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch

from raylm.errors import RaylmError
from raylm.models.devices import input_device
from raylm.scoring.attention import AttentionPlan, attention_plan
from raylm.scoring.batching import budget_batches, halving_on_oom
from raylm.scoring.packing import PackedRow, branch_inputs, pack, plan_groups

log = logging.getLogger(__name__)

# On CPU a batch should keep a layer's widest activation (the MLP's) in cache: the elementwise ops between
# matmuls go memory-bound beyond that. Measured (bench/floor.py, 2-core Xeon): GPT-2-small (MLP 3072) ran 1.5x
# slower at 4k tokens than at 1k; stories260K (MLP 172) was fastest at 4k, per-call overhead dominating below.
CPU_ACTIVATION_BYTES = 12 * 2**20
CPU_TOKEN_BUDGET_MIN, CPU_TOKEN_BUDGET_MAX = 256, 4096
GPU_START_TOKEN_BUDGET = 65536


class HeadMisuse(RaylmError):
    """The model did not compute its logits by running its output-embedding module once on the hidden states."""


class Scorer:
    def __init__(self, model: torch.nn.Module, max_length: int, batch_size: int | None = None,
                 token_budget: int | None = None, share_prefixes: bool = True, plan: AttentionPlan | None = None):
        """batch_size caps requests per batch (`--batch-size N`); None means "auto": fill a token budget.

        `plan` defaults to the static rule for the model (raylm.scoring.attention.attention_plan); requests share
        rows only where both it and `share_prefixes` allow. It may be replaced later (a start-up check's verdict).
        """
        self.model = model.eval()
        self.max_length = max_length
        self.batch_size = batch_size
        self.share_prefixes = share_prefixes
        self.plan = plan or attention_plan(model)
        self.packed_rows = 0  # rows holding more than one request, scored so far
        self.device = input_device(model)  # where token ids go: the first layer's device
        if token_budget is None:
            token_budget = GPU_START_TOKEN_BUDGET if self.device.type == "cuda" else cpu_token_budget(model.config)
        self.token_budget = token_budget
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (LM head) to score with")
        self._head = head
        self._mask_dtype = getattr(model, "dtype", torch.float32)

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
              doc_ids: Sequence[int] | None = None, token_logprobs: bool = False
              ) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Loglikelihood (float64) and is-greedy for each (context, continuation) request, in input order; with
        token_logprobs, also each request's continuation-token log-probs in order (float64 arrays), from the same
        forward pass.

        With doc_ids, only requests of the same document share a prefix; without, any consecutive ones may.
        """
        inputs, n_targets, targets = [], [], []
        for context, continuation in zip(contexts, continuations):
            whole = (list(context) + list(continuation))[-(self.max_length + 1):]
            inputs.append(whole[:-1])
            targets.append(list(continuation))
            n_targets.append(len(continuation))
        loglik = np.zeros(len(inputs), dtype=np.float64)
        greedy = np.zeros(len(inputs), dtype=bool)
        per_token: list[np.ndarray] | None = [np.zeros(0)] * len(inputs) if token_logprobs else None

        def batches(pending: list[int], budget: int) -> Iterator[tuple[list[PackedRow], list[int], bool]]:
            rows = self._plan(pending, inputs, n_targets, doc_ids, budget)
            for batch in budget_batches(rows, lambda r: len(r.tokens), budget, lambda r: len(r.requests),
                                        self.batch_size):
                yield batch, [i for row in batch for i in row.requests], len(batch) == 1 and not batch[0].branched

        self.token_budget = halving_on_oom(list(range(len(inputs))), batches,
                                           lambda batch: self._score_batch(batch, targets, loglik, greedy, per_token),
                                           self.token_budget)
        return (loglik, greedy) if per_token is None else (loglik, greedy, per_token)

    def _plan(self, pending: list[int], inputs: list[list[int]], n_targets: list[int],
              doc_ids: Sequence[int] | None, token_budget: int) -> list[PackedRow]:
        sub_inputs = [inputs[i] for i in pending]
        sub_docs = [doc_ids[i] for i in pending] if doc_ids is not None else None
        groups = plan_groups(sub_inputs, sub_docs, token_budget, self.batch_size,
                             self.share_prefixes and self.plan.pack)
        return [pack([pending[j] for j in g], inputs, n_targets) for g in groups]

    @torch.inference_mode()
    def _score_batch(self, batch: list[PackedRow], targets: list[list[int]], loglik: np.ndarray,
                     greedy: np.ndarray, per_token: list[np.ndarray] | None = None) -> None:
        width = max(len(row.tokens) for row in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for r, row in enumerate(batch):
            ids[r, :len(row.tokens)] = torch.tensor(row.tokens)
        kwargs = self._model_inputs(batch, width)
        columns: dict[int, int] = {}  # flat (row, column) -> index among the gathered hidden states
        picks, target_ids, owners = [], [], []
        for r, row in enumerate(batch):
            for request, cols in zip(row.requests, row.predict_cols):
                for col, target in zip(cols, targets[request]):
                    picks.append(columns.setdefault(r * width + col, len(columns)))
                    target_ids.append(target)
                    owners.append(request)
        flat = torch.tensor(list(columns), device=self.device)
        with gather_head_inputs(self._head, flat, len(batch), width):
            logits = self.model(input_ids=ids.to(self.device), use_cache=False, **kwargs).logits
        if tuple(logits.shape[:2]) != (1, len(columns)):
            raise HeadMisuse(f"{type(self.model).__name__} returned logits of shape {tuple(logits.shape)} for "
                             f"{len(columns)} gathered positions: it does not return what its LM head computed, "
                             "so raylm cannot score it")
        logits = logits[0].float()
        self.packed_rows += sum(row.branched for row in batch)
        picks_t = torch.tensor(picks, device=logits.device)  # the head's device, for a model spread over several
        target_t = torch.tensor(target_ids, device=logits.device)
        target_logit = logits[picks_t, target_t]
        log_normaliser, argmax = _log_normaliser_and_argmax(logits)
        token_lp = (target_logit - log_normaliser[picks_t]).double().cpu().numpy()
        hits = (argmax[picks_t] == target_t).cpu().numpy()
        owners_np = np.asarray(owners)
        starts = np.flatnonzero(np.r_[True, owners_np[1:] != owners_np[:-1]])
        loglik[owners_np[starts]] = np.add.reduceat(token_lp, starts)
        greedy[owners_np[starts]] = np.logical_and.reduceat(hits, starts)
        if per_token is not None:
            for request, part in zip(owners_np[starts].tolist(), np.split(token_lp, starts[1:])):
                per_token[request] = part

    def _model_inputs(self, batch: list[PackedRow], width: int) -> dict:
        """Branch positions and the plan's masks for a batch holding a packed row (every row of it: a plain row
        next to a packed one needs its sliding window too); nothing otherwise."""
        if not any(row.branched for row in batch):
            return {}
        inputs = branch_inputs(batch, width, self.plan.masks, self._mask_dtype)
        mask = inputs["attention_mask"]
        return {"position_ids": inputs["position_ids"].to(self.device),
                "attention_mask": {k: m.to(self.device) for k, m in mask.items()} if isinstance(mask, dict)
                else mask.to(self.device)}


@contextmanager
def gather_head_inputs(head: torch.nn.Module, flat: torch.Tensor, rows: int, width: int) -> Iterator[None]:
    """Feed the LM head only the hidden states at `flat` (indices into rows x width), as one (1, N) batch.

    Done as a hook on the head rather than by calling its weights directly, so the model's own head code (final
    softcapping, logit scaling) still applies to what it returns. A model that calls its head twice, slices before
    it, or projects with the embedding matrix itself would score garbage through the hook, so unless the head ran
    exactly once on the whole (rows, width) batch this raises instead.
    """
    seen: list[tuple[int, ...] | None] = []

    def gather(_module, args):
        if not args:
            seen.append(None)
            return None
        hidden = args[0]
        seen.append(tuple(hidden.shape[:-1]))
        # A model spread over devices hands the head hidden states on the last layer's device.
        return (hidden.reshape(-1, hidden.shape[-1]).index_select(0, flat.to(hidden.device)).unsqueeze(0),
                *args[1:])

    handle = head.register_forward_pre_hook(gather)
    try:
        yield
    finally:
        handle.remove()
    if seen != [(rows, width)]:
        raise HeadMisuse(f"the model's LM head ({type(head).__name__}) ran on inputs {seen}, not once on ({rows}, "
                         f"{width}): this model does not compute its logits through get_output_embeddings() once, so "
                         "raylm cannot score it")


def cpu_token_budget(config) -> int:
    """The largest power-of-two token count whose MLP activations fit CPU_ACTIVATION_BYTES, within bounds."""
    width = getattr(config, "intermediate_size", None) or getattr(config, "n_inner", None) or 4 * config.hidden_size
    fits = CPU_ACTIVATION_BYTES // (4 * width)
    return max(CPU_TOKEN_BUDGET_MIN, min(CPU_TOKEN_BUDGET_MAX, 1 << max(0, fits.bit_length() - 1)))


def _log_normaliser_and_argmax(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logsumexp and argmax over the vocabulary in two passes, reusing `logits` as scratch (it is overwritten).

    torch.logsumexp plus argmax reads the (positions x vocabulary) logits four times and allocates a copy; on
    CPU that was a tenth of GPT-2-small's scoring time. max() yields the argmax (first maximal index, as argmax)
    with the maximum, and the exp-sum runs in place.
    """
    top, argmax = logits.max(dim=-1)
    return top + logits.sub_(top[:, None]).exp_().sum(dim=-1).log(), argmax
