"""Requests that share a token prefix -> one packed row: the prefix once, then each request's own tokens.

A HellaSwag document asks for the same context with four endings, and WinoGrande's two options share the start
of the sentence. Scoring each request separately runs that shared prefix through the model once per request.
Packed, the prefix is computed once and every branch attends to it through a block mask, with position ids that
restart each branch where the prefix ends, so each branch sees exactly what it would see alone.

Only consecutive requests are grouped (a task emits a document's requests together), and only when the shared
part is a real fraction of the request: two unrelated texts that both start with BOS gain nothing from packing
and would pay for a longer attention span.

The masks a packed batch needs (raylm.scoring.attention decides their layout per model) are built here too: every
row of a batch that holds a packed row gets them, so a plain row next to a packed one keeps its sliding window.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from raylm.scoring.attention import ONE_TENSOR, MaskLayout

# A request joins a group only if at least this fraction of its longest member's input is shared.
SHARE_FRACTION = 1 / 8

PREFIX = -1  # segment id of the shared prefix: visible to every branch
PAD_SEGMENT = -2  # segment id of right padding: sees only padding, so no query row is fully masked


@dataclass(frozen=True)
class PackedRow:
    """One model row. `segments` says which branch each column belongs to (PREFIX for the shared part);
    `predict_cols[b]` are the columns whose outputs predict request `requests[b]`'s continuation tokens."""

    tokens: list[int]
    positions: list[int]
    segments: list[int]
    requests: list[int]
    predict_cols: list[list[int]]

    @property
    def branched(self) -> bool:
        return len(self.requests) > 1


def common_prefix_length(a: Sequence[int], b: Sequence[int], limit: int) -> int:
    n = min(len(a), len(b), limit)
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def plan_groups(inputs: Sequence[Sequence[int]], doc_ids: Sequence[int] | None, max_row_tokens: int,
                max_members: int | None, share: bool = True) -> list[list[int]]:
    """Consecutive request indices that will share a row, each group's packed length within max_row_tokens."""
    groups: list[list[int]] = []
    prefix = 0
    for i, tokens in enumerate(inputs):
        group = groups[-1] if groups else None
        if share and group and (doc_ids is None or doc_ids[i] == doc_ids[group[0]]) \
                and (max_members is None or len(group) < max_members):
            shared = common_prefix_length(inputs[group[0]], tokens, prefix)
            longest = max(len(tokens), *(len(inputs[j]) for j in group))
            packed = sum(len(inputs[j]) for j in group) + len(tokens) - len(group) * shared
            if shared >= max(1, longest * SHARE_FRACTION) and packed <= max_row_tokens:
                group.append(i)
                prefix = shared
                continue
        groups.append([i])
        prefix = len(tokens)
    return groups


def pack(group: Sequence[int], inputs: Sequence[Sequence[int]], n_targets: Sequence[int]) -> PackedRow:
    """Lay out one group: shared prefix columns, then each member's remaining tokens in order."""
    first = inputs[group[0]]
    shared = len(first)
    for j in group[1:]:
        shared = common_prefix_length(first, inputs[j], shared)
    tokens = list(first[:shared])
    positions = list(range(shared))
    segments = [PREFIX] * shared
    predict_cols: list[list[int]] = []
    for branch, j in enumerate(group):
        start = len(tokens)
        own = inputs[j][shared:]
        tokens.extend(own)
        positions.extend(range(shared, shared + len(own)))
        segments.extend([branch] * len(own))
        n = len(inputs[j])
        # Input index t lives at column t inside the prefix and at start + (t - shared) after it; a column in
        # the prefix can predict the first continuation token of several branches (endings that start alike).
        predict_cols.append([t if t < shared else start + t - shared for t in range(n - n_targets[j], n)])
    return PackedRow(tokens, positions, segments, list(group), predict_cols)


def visibility(segments: torch.Tensor, positions: torch.Tensor, window: int | None) -> torch.Tensor:
    """[rows, q, k] bool: a column sees earlier columns of its own branch and of the shared prefix and, with a
    sliding window, only keys whose position is less than `window` behind its own (q - k < window, as
    transformers' sliding_window_overlay has it)."""
    width = segments.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool).tril()
    same = segments[:, :, None] == segments[:, None, :]
    visible = causal & (same | (segments[:, None, :] == PREFIX))
    if window is not None:
        visible &= (positions[:, :, None] - positions[:, None, :]) < window
    return visible


def additive_mask(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """[rows, 1, q, k]: 0 where visible, the dtype's minimum elsewhere."""
    mask = torch.zeros(visible.shape, dtype=dtype)
    mask.masked_fill_(~visible, torch.finfo(dtype).min)
    return mask[:, None]


def branch_inputs(batch: Sequence[PackedRow], width: int, layout: MaskLayout, dtype: torch.dtype
                  ) -> dict[str, torch.Tensor | dict[str, torch.Tensor]]:
    """Branch positions and the masks `layout` asks for: one 4D tensor, or a dict of them keyed by layer type."""
    positions = torch.zeros(len(batch), width, dtype=torch.long)
    segments = torch.full((len(batch), width), PAD_SEGMENT, dtype=torch.long)
    for r, row in enumerate(batch):
        positions[r, :len(row.tokens)] = torch.tensor(row.positions)
        segments[r, :len(row.tokens)] = torch.tensor(row.segments)
    masks = {key: additive_mask(visibility(segments, positions, window), dtype) for key, window in layout}
    return {"position_ids": positions, "attention_mask": masks[ONE_TENSOR] if ONE_TENSOR in masks else masks}
