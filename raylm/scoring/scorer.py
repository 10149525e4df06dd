"""The scorer: plain torch, no Ray, so it can be called and tested in-process.

Where the model's attention plan allows it (raylm.scoring.attention), a call's requests are scored as one token
tree (raylm.scoring.tree): every distinct prefix runs once, small subtrees as tree rows (raylm.scoring.packing),
big ones below a path cached once in a KV cache. Rows with no cached path are sorted by length and packed into
batches under a token budget with right padding. A batch holding a tree row or running over a cache gets true
positions and the plan's masks; any other batch gets no mask and no positions, so the model builds its own causal,
sliding-window or ALiBi attention exactly as for one request. Only the hidden states that predict
continuation tokens reach the LM head: the vocabulary projection, as costly as the whole body for a GPT-2-sized
model, is never paid for context positions. Token log-probs come from float32 logits whatever the model dtype,
and are summed per request in float64.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import numpy as np
import torch
from transformers import DynamicCache

from raylm.errors import InputError, RaylmError
from raylm.models.devices import input_device
from raylm.models.loading import text_config
from raylm.scoring.attention import AttentionPlan, attention_plan
from raylm.requests.table import LONG, NO_CONTEXT, unscorable
from raylm.scoring.batching import TokenBudget, budget_batches, halving_on_oom
from raylm.scoring.packing import PackedRow, branch_inputs, chain_row
from raylm.scoring.tree import Step, plan_requests, plan_tree

log = logging.getLogger(__name__)

# On CPU a batch should keep a layer's widest activation (the MLP's) in cache: the elementwise ops between
# matmuls go memory-bound beyond that. Measured (bench/floor.py, 2-core Xeon): GPT-2-small (MLP 3072) ran 1.5x
# slower at 4k tokens than at 1k; stories260K (MLP 172) was fastest at 4k, per-call overhead dominating below.
CPU_ACTIVATION_BYTES = 12 * 2**20
CPU_TOKEN_BUDGET_MIN, CPU_TOKEN_BUDGET_MAX = 256, 4096
GPU_START_TOKEN_BUDGET = 65536
# A tree row's masks are rows x width x (cached + width): a row wider than this is split below a cached path.
ROW_TOKENS_MAX = 4096
# The logits of one forward pass (float32, and the model's own dtype before that) stay within this many bytes:
# positions that predict x vocabulary is what grows without bound (a 15k-token rolling row on a 128k vocabulary
# is 8 GB), so rows and batches are cut to it, and a long row runs in pieces over the KV cache of the ones before.
LOGITS_BUDGET_BYTES = {"cpu": 2 * 2**30, "cuda": 8 * 2**30}
# Overrides the budget above on every device, in GiB: read where the model runs (an actor's own environment).
LOGITS_BUDGET_ENV = "RAYLM_LOGITS_BUDGET_GIB"


class RequestDoesNotFit(RaylmError):
    """One request the scorer cannot score: it predicts more positions than the logits budget holds and cannot be
    cut (its model is scored unpacked, so no KV cache carries one piece into the next), or its continuation is
    longer than the model's context or follows no context token, so some continuation token has no input
    position to be predicted from."""

    def __init__(self, request: int, message: str):
        super().__init__(message)
        self.request = request


class CacheIgnored(RaylmError):
    """The model ran without the KV cache raylm gave it: scores over a cached prefix would be wrong."""


class HeadMisuse(RaylmError):
    """The model did not compute its logits by running its output-embedding module once on the hidden states."""


class Scorer:
    def __init__(self, model: torch.nn.Module, max_length: int, batch_size: int | None = None,
                 token_budget: int | None = None, share_prefixes: bool = True, plan: AttentionPlan | None = None,
                 logits_budget: int | None = None):
        """batch_size caps requests per batch (`--batch-size N`); None means "auto": fill a token budget.
        `logits_budget` (bytes; default logits_budget_bytes for the device) bounds one forward pass's logits.

        `plan` defaults to the static rule for the model (raylm.scoring.attention.attention_plan); requests share
        rows only where both it and `share_prefixes` allow. It may be replaced later (a start-up check's verdict).
        """
        self.model = model.eval()
        self.max_length = max_length
        self.batch_size = batch_size
        self.share_prefixes = share_prefixes
        self.plan = plan or attention_plan(model)
        self.packed_rows = 0  # rows holding several requests or continuing a cached path, scored so far
        self.computed_tokens = 0  # token columns run through the model so far (padding excluded)
        self.tokens_in_requests = 0  # input tokens of the requests scored so far, as truncated to max_length
        self.requests_in_tries = 0  # requests planned through a token trie (some shared a prefix), so far
        self._cache: DynamicCache | None = None  # the tree walk's cached path while a call runs
        self.device = input_device(model)  # where token ids go: the first layer's device
        if token_budget is None:
            token_budget = GPU_START_TOKEN_BUDGET if self.device.type == "cuda" else cpu_token_budget(model.config)
        self.budget = TokenBudget(token_budget)
        head = model.get_output_embeddings()
        if head is None:
            raise ValueError(f"{type(model).__name__} has no output embeddings (LM head) to score with")
        self._head = head
        self._mask_dtype = getattr(model, "dtype", torch.float32)
        self.max_predicted = max_predicted_positions(model, head, logits_budget or logits_budget_bytes(
            self.device.type))

    @property
    def token_budget(self) -> int:
        return self.budget.tokens

    def score(self, contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]],
              *, token_logprobs: bool = False
              ) -> tuple[np.ndarray, np.ndarray] | tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """Loglikelihood (float64) and is-greedy for each (context, continuation) request, in input order; with
        token_logprobs, also each request's continuation-token log-probs in order (float64 arrays), from the same
        forward pass.

        Any requests may share a prefix: the tree finds what they share, whatever documents they come from.
        """
        inputs, n_targets = scorer_inputs(contexts, continuations, self.max_length)
        targets = [list(continuation) for continuation in continuations]
        self.tokens_in_requests += sum(len(x) for x in inputs)
        per_token = [np.zeros(n, dtype=np.float64) for n in n_targets]
        hits = [np.zeros(n, dtype=bool) for n in n_targets]

        def batches(pending: list[int], budget: int) -> Iterator[tuple[Step, list[int], bool]]:
            steps = self._plan(pending, inputs, n_targets, budget)
            last: dict[int, int] = {}
            for s, step in enumerate(steps):
                for row in step.rows:
                    last.update((request, s) for request in row.requests)
            members: list[list[int]] = [[] for _ in steps]
            for request, s in last.items():
                members[s].append(request)
            for step, done in zip(steps, members):
                # Where the plan takes masks, any row longer than one token can still be cut into pieces over
                # the KV cache (a smaller budget cuts them); an unpacked model's single row cannot.
                smallest = len(step.rows) == 1 and (len(step.rows[0].tokens) <= 1 or not self.plan.pack)
                yield step, done, smallest

        # A request with no continuation tokens has nothing to predict (loglikelihood 0, greedy as lm-eval's
        # all() of nothing): no row carries it, so it must not wait to be done.
        predicting = predicting_requests(n_targets)
        try:
            halving_on_oom(predicting, batches, lambda step: self._score_step(step, targets, per_token, hits),
                           self.budget)
        finally:
            self._cache = None  # the walk's cached path, released with the shard
        loglik = np.array([lp.sum() for lp in per_token], dtype=np.float64)
        greedy = np.array([h.all() for h in hits], dtype=bool)
        return (loglik, greedy, per_token) if token_logprobs else (loglik, greedy)

    def _plan(self, pending: list[int], inputs: list[list[int]], n_targets: list[int], token_budget: int
              ) -> list[Step]:
        """plan_passes with this scorer's settings; requests planned through a trie are counted."""
        steps, in_trie = plan_passes(pending, inputs, n_targets, token_budget, self.budget.ceiling, self.batch_size,
                                     self.share_prefixes, self.plan, self.max_predicted)
        self.requests_in_tries += len(pending) if in_trie else 0
        return steps

    @torch.inference_mode()
    def _score_step(self, step: Step, targets: list[list[int]], per_token: list[np.ndarray],
                    hits: list[np.ndarray]) -> None:
        batch = step.rows
        width = max(len(row.tokens) for row in batch)
        ids = torch.zeros(len(batch), width, dtype=torch.long)
        for r, row in enumerate(batch):
            ids[r, :len(row.tokens)] = torch.tensor(row.tokens)
        cache = self._cache_for(step)
        kwargs = self._model_inputs(batch, width, step.cached, cache is not None)
        columns: dict[int, int] = {}  # flat (row, column) -> index among the gathered hidden states
        picks, target_ids, owners = [], [], []
        for r, row in enumerate(batch):
            for col, request, t in row.predicts:
                picks.append(columns.setdefault(r * width + col, len(columns)))
                target_ids.append(targets[request][t])
                owners.append((request, t))
        flat = torch.tensor(list(columns), dtype=torch.long, device=self.device)
        with gather_head_inputs(self._head, flat, len(batch), width):
            logits = forward(self.model, ids.to(self.device), cache, **kwargs).logits
        if cache is not None and not step.keep:
            crop_cache(cache, step.cached)
        if tuple(logits.shape[:2]) != (1, len(columns)):
            raise HeadMisuse(f"{type(self.model).__name__} returned logits of shape {tuple(logits.shape)} for "
                             f"{len(columns)} gathered positions: it does not return what its LM head computed, "
                             "so raylm cannot score it")
        self.computed_tokens += sum(len(row.tokens) for row in batch)
        self.packed_rows += sum(row.branched and len(row.requests) > 1 or step.cached > 0 for row in batch)
        if not picks:
            return
        logits = logits[0].float()
        picks_t = torch.tensor(picks, device=logits.device)  # the head's device, for a model spread over several
        target_t = torch.tensor(target_ids, device=logits.device)
        target_logit = logits[picks_t, target_t]
        log_normaliser, argmax = _log_normaliser_and_argmax(logits)
        token_lp = (target_logit - log_normaliser[picks_t]).double().cpu().numpy()
        hit = (argmax[picks_t] == target_t).cpu().numpy()
        for (request, t), lp, h in zip(owners, token_lp.tolist(), hit.tolist()):
            per_token[request][t] = lp
            hits[request][t] = h

    def _cache_for(self, step: Step) -> DynamicCache | None:
        """The walk's cache cropped to the path `step` continues (a fresh one where a kept path starts at the root);
        None for a step over no cached path that keeps nothing."""
        if step.cached == 0:
            # No config: every layer keeps every key, so a sliding window is the mask's to apply, and crop works.
            self._cache = DynamicCache() if step.keep else None
        elif self._cache is None or self._cache.get_seq_length() < step.cached:
            raise RuntimeError(f"a step over {step.cached} cached tokens ran without them (steps out of walk order)")
        else:
            crop_cache(self._cache, step.cached)
        return self._cache

    def _model_inputs(self, batch: list[PackedRow], width: int, cached: int, over_cache: bool) -> dict:
        """True positions and the plan's masks for a batch holding a tree row or running over a cache (every row
        of it: a plain row next to a tree row needs its sliding window too); nothing otherwise."""
        if not over_cache and not any(row.branched for row in batch):
            return {}
        inputs = branch_inputs(batch, width, self.plan.masks, self._mask_dtype, cached)
        mask = inputs["attention_mask"]
        return {"position_ids": inputs["position_ids"].to(self.device),
                "attention_mask": {k: m.to(self.device) for k, m in mask.items()} if isinstance(mask, dict)
                else mask.to(self.device)}


def model_input(context: Sequence[int], continuation: Sequence[int], max_length: int) -> list[int]:
    """The tokens a request feeds the model, as lm-eval's HFLM cuts them: context and continuation left-truncated
    to their last max_length + 1 tokens, less the last, which is only predicted."""
    return (list(context) + list(continuation))[-(max_length + 1):][:-1]


def forward(model: torch.nn.Module, input_ids: torch.Tensor, cache: DynamicCache | None, **kwargs):
    """The model's forward pass, over `cache` (which it extends) where there is one.

    The cache is passed as `cache=`, the name transformers 5 takes. A release that takes it under another name
    would put it in **kwargs unread and attend to no prefix: the rows over a cached few-shot head would be scored
    without it. So a pass that did not extend the cache by its own width is refused."""
    if cache is None:
        return model(input_ids=input_ids, use_cache=False, **kwargs)
    before = cache.get_seq_length()
    out = model(input_ids=input_ids, cache=cache, use_cache=True, **kwargs)
    if cache.get_seq_length() != before + input_ids.shape[1]:
        raise CacheIgnored(f"{type(model).__name__} did not extend the KV cache it was given ({before} tokens, then "
                           f"{cache.get_seq_length()} after {input_ids.shape[1]} more): it takes the cache under "
                           "another argument than `cache`, as transformers releases before raylm's floor do")
    return out


def crop_cache(cache: DynamicCache, length: int) -> None:
    """Drop the cache's keys and values past `length` tokens (transformers' crop takes how many to remove): the
    scorer's tree walk and generation's prefix path both go back to a shorter prefix this way."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


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


def logits_budget_bytes(device_type: str) -> int:
    """The logits budget on a device of this type: LOGITS_BUDGET_BYTES, unless RAYLM_LOGITS_BUDGET_GIB says
    otherwise. The default suits a card that also holds an 8B model's weights and a pass's activations; a card
    with room to spare scores long rows in fewer pieces with more, and one short of room leaves more to the
    weights and activations with less."""
    value = os.environ.get(LOGITS_BUDGET_ENV)
    if value is None:
        return LOGITS_BUDGET_BYTES.get(device_type, LOGITS_BUDGET_BYTES["cuda"])
    why = "the logits budget must be a number of GiB above 0"
    try:
        gib = float(value)
    except ValueError as error:
        raise InputError(f"{LOGITS_BUDGET_ENV}={value!r}", why) from error
    if not 0 < gib < float("inf"):
        raise InputError(f"{LOGITS_BUDGET_ENV}={value!r}", why)
    return int(gib * 2**30)


def scorer_inputs(contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], max_length: int
                  ) -> tuple[list[list[int]], list[int]]:
    """Each request's model input (left-truncated to max_length) and how many of its last positions predict."""
    inputs, n_targets = [], []
    for i, (context, continuation) in enumerate(zip(contexts, continuations)):
        why = unscorable((context, continuation), max_length)
        if why in (LONG, NO_CONTEXT):
            raise RequestDoesNotFit(i, f"a continuation of {len(continuation)} tokens after {len(context)} "
                                       "context tokens cannot be scored: it must follow at least one context "
                                       f"token and be at most the model's {max_length} tokens long")
        inputs.append(model_input(context, continuation, max_length))
        n_targets.append(len(continuation))
    return inputs, n_targets


def predicting_requests(n_targets: Sequence[int]) -> list[int]:
    """The requests some row must carry: a request with no continuation tokens has nothing to predict
    (loglikelihood 0, greedy as lm-eval's all() of nothing), so no row carries it."""
    return [i for i, n in enumerate(n_targets) if n]


def plan_passes(pending: list[int], inputs: list[list[int]], n_targets: list[int], token_budget: int,
                budget_ceiling: int, batch_size: int | None, share_prefixes: bool, plan: AttentionPlan,
                max_predicted: int) -> tuple[list[Step], bool]:
    """The forward passes for `pending`, and whether a trie was built for them: a token tree
    (raylm.scoring.tree) where the plan packs, else one request per row; rows with no cached path in token-budget
    batches first, then the walk's cached steps. A plain function of the requests and the scorer's settings, so that
    a dry run counts the tokens a run computes (planned_tokens) without a model.

    Unshared, a request still runs in pieces over the KV cache (a tree of one request) where the plan takes
    masks and it does not fit whole: it predicts more positions than the logits budget holds, or it is wider
    than a budget that out of memory has cut below where it started (`budget_ceiling`)."""
    row_tokens = min(token_budget, ROW_TOKENS_MAX, max_predicted)
    in_trie = False
    if share_prefixes and plan.pack:
        free, cached, in_trie = plan_requests(pending, inputs, n_targets, row_tokens, batch_size)
    else:
        free, cached = [], []
        for i in pending:
            too_wide = token_budget < budget_ceiling and len(inputs[i]) > token_budget
            if plan.pack and (n_targets[i] > max_predicted or too_wide):
                rows, steps = plan_tree([i], inputs, n_targets, row_tokens, batch_size)
                free += rows
                cached += steps
            elif n_targets[i] > max_predicted:
                raise RequestDoesNotFit(i, f"{n_targets[i]} predicted tokens need more logits memory than the "
                                           f"budget holds ({max_predicted} positions) and this model is "
                                           f"scored unpacked ({plan.prefix_sharing}), so they cannot be "
                                           "cut: pass a smaller --max-length")
            else:
                free.append(chain_row(inputs[i], i, n_targets[i]))
    batched = budget_batches(free, lambda r: len(r.tokens), token_budget, lambda r: len(r.requests),
                             batch_size, lambda r: len(r.predicts), max_predicted)
    return [Step(batch) for batch in batched] + cached, in_trie


def planned_tokens(contexts: Sequence[Sequence[int]], continuations: Sequence[Sequence[int]], max_length: int,
                   token_budget: int, batch_size: int | None, share_prefixes: bool, plan: AttentionPlan,
                   max_predicted: int) -> tuple[int, int]:
    """What one Scorer.score call over these requests adds to its tokens_in_requests and computed_tokens, with no
    model: the same inputs and the same forward passes, at a token budget no out-of-memory error has cut."""
    inputs, n_targets = scorer_inputs(contexts, continuations, max_length)
    steps, _ = plan_passes(predicting_requests(n_targets), inputs, n_targets, token_budget, token_budget,
                           batch_size, share_prefixes, plan, max_predicted)
    return sum(len(x) for x in inputs), sum(len(row.tokens) for step in steps for row in step.rows)


def max_predicted_positions(model: torch.nn.Module, head: torch.nn.Module, budget: int) -> int:
    """How many positions' logits fit `budget` bytes: float32 logits, plus the model's own copy in its dtype."""
    vocab = getattr(head, "out_features", None) or text_config(model.config).vocab_size
    dtype = getattr(model, "dtype", torch.float32)
    per_position = vocab * (4 + (0 if dtype == torch.float32 else torch.finfo(dtype).bits // 8))
    return max(1, budget // per_position)


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
